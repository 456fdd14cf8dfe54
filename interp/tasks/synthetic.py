"""Seeded synthetic tasks for training and probing toy transformers.

Every task works on token ids only (no tokenizer) and yields `Batch`es:
`tokens` [batch, pos] and `loss_mask` [batch, pos - 1], which marks the next-token
predictions that count (prediction at position p is for token p + 1).

Train and eval data come from different seed streams: `split_generator(seed, "eval")`
never yields the same random numbers as `split_generator(seed, "train")`.

    task = InductionTask(d_vocab=64, n_ctx=48)
    for step, batch in zip(range(1000), task.batches(batch_size=32, seed=0)):
        loss = model(batch.tokens, return_type="loss", loss_per_token=True)  # [batch, pos-1]
        batch.masked_mean(loss).backward()

IOI prompts live in `interp.tasks.ioi` and its siblings (`ioi_prompts`, `ioi_templates`, `ioi_toy`).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch
from torch import Tensor

from interp.checks import check_count, check_int, check_number
from interp.model.transformer import next_token_loss

SPLITS = ("train", "eval")


def split_generator(seed: int, split: str = "train") -> torch.Generator:
    """A CPU torch.Generator for (seed, split); distinct pairs give distinct streams."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return torch.Generator().manual_seed(check_count(seed, "seed", 0) * len(SPLITS) + SPLITS.index(split))


def _as_generator(generator: torch.Generator | int | None) -> torch.Generator:
    if isinstance(generator, torch.Generator):
        return generator
    if generator is None:
        return torch.Generator().manual_seed(int(torch.randint(2**62, (1,))))
    return torch.Generator().manual_seed(check_count(generator, "the seed (generator)", 0))


def _check_bos(bos: int | None, d_vocab: int) -> int | None:
    """A BOS id within the vocabulary (None: no BOS)."""
    return None if bos is None else _token_id(bos, d_vocab, "bos")


def _token_id(token: int, d_vocab: int, what: str) -> int:
    """`token`, an id of the vocabulary 0..d_vocab-1 (`what` names it in the error)."""
    token = check_int(token, what)
    if not 0 <= token < d_vocab:
        raise ValueError(
            f"{what} {token} is not a token id of the vocabulary 0..{d_vocab - 1}; pass an id in it"
        )
    return token


def warn_if_duplicates(asked: int, distinct: int, what: str) -> None:
    """Warn when more sequences are asked for than there are distinct ones (so some are repeats,
    which a bootstrap over prompts would count as independent)."""
    if asked > distinct:
        warnings.warn(
            f"asked for {asked} {what}, but only {distinct} distinct ones exist, so at least "
            f"{asked - distinct} are repeats; ask for at most {distinct}, or use more tokens",
            RuntimeWarning,
            stacklevel=3,
        )


def _random_tokens(
    shape: tuple[int, ...],
    d_vocab: int,
    generator: torch.Generator,
    exclude: int | None | Collection[int],
) -> Tensor:
    """Uniform token ids in [0, d_vocab), skipping the ids `exclude` (e.g. the BOS id)."""
    skipped = sorted({exclude} if isinstance(exclude, int) else set(exclude or ()))
    tokens = torch.randint(d_vocab - len(skipped), shape, generator=generator)
    for token in skipped:  # ascending: the k-th draw becomes the k-th id not skipped
        tokens += (tokens >= token).long()
    return tokens


@dataclass
class Batch:
    """A training batch: tokens [batch, pos]; loss_mask [batch, pos-1] (bool) marks counted predictions;
    targets [batch, pos-1]: what the prediction at each position is of (None: the next token)."""

    tokens: Tensor
    loss_mask: Tensor
    targets: Tensor | None = None

    def __post_init__(self):
        batch, pos = self.tokens.shape
        if self.loss_mask.shape != (batch, pos - 1) or self.loss_mask.dtype != torch.bool:
            raise ValueError(
                f"loss_mask must be a bool tensor of shape [batch, pos-1] = {(batch, pos - 1)}, "
                f"got {self.loss_mask.dtype} {tuple(self.loss_mask.shape)}"
            )
        if self.targets is not None and self.targets.shape != (batch, pos - 1):
            raise ValueError(
                f"targets must have shape [batch, pos-1] = {(batch, pos - 1)}, "
                f"got {tuple(self.targets.shape)}"
            )

    def to(self, device: torch.device | str) -> Batch:
        targets = None if self.targets is None else self.targets.to(device)
        return Batch(self.tokens.to(device), self.loss_mask.to(device), targets)

    def loss_per_token(self, logits: Tensor) -> Tensor:
        """Cross-entropy in nats of each prediction: logits [batch, pos, d_vocab] -> [batch, pos-1]
        (`next_token_loss`, of the targets where there are)."""
        if self.targets is None:
            return next_token_loss(logits, self.tokens, per_token=True)
        return next_token_loss(logits, torch.cat([self.tokens[:, :1], self.targets], 1), per_token=True)

    def masked_mean(self, per_token: Tensor) -> Tensor:
        """Mean of per-token values [batch, pos-1] (e.g. loss_per_token=True) over counted predictions."""
        return per_token[self.loss_mask].mean()


class Task:
    """A seeded batch generator. Subclasses set `d_vocab`, `n_ctx` (tokens per row) and `sample`."""

    d_vocab: int
    n_ctx: int

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        raise NotImplementedError

    def batches(self, batch_size: int, seed: int = 0, split: str = "train") -> Iterator[Batch]:
        """Endless stream of batches from the (seed, split) stream."""
        generator = split_generator(seed, split)
        while True:
            yield self.sample(batch_size, generator)

    def eval_batch(self, batch_size: int, seed: int = 0) -> Batch:
        """A fixed batch from the eval stream (a seed stream of its own: its rows are other draws than
        training's, which a task of few distinct rows, toy IOI's, can repeat)."""
        return self.sample(batch_size, split_generator(seed, "eval"))


# ---------------------------------------------------------------- induction


def repeated_sequences(
    d_vocab: int,
    seq_len: int,
    batch: int,
    generator: torch.Generator | int | None = None,
    bos: int | None = 0,
    avoid: Sequence[int] = (),
) -> Tensor:
    """[BOS] r_1..r_n r_1..r_n: random tokens repeated once. Returns [batch, 1 + 2 * seq_len].

    Random tokens are uniform over the vocabulary except `bos` (1..d_vocab-1 for bos=0) and the ids
    `avoid` (a task's padding: a model trained on the task never reads it as a token).
    With bos=None there is no BOS and the shape is [batch, 2 * seq_len].
    `generator` may be a torch.Generator, an int seed, or None (fresh seed).
    """
    seq_len, batch = check_count(seq_len, "seq_len"), check_count(batch, "batch")
    d_vocab = check_count(d_vocab, "d_vocab", 2)
    bos = _check_bos(bos, d_vocab)
    if not isinstance(avoid, Sequence) or isinstance(avoid, str):
        raise TypeError(f"avoid must be a sequence of token ids, e.g. avoid=(0,), got {avoid!r}")
    skipped = {_token_id(token, d_vocab, "an id of avoid") for token in avoid} | ({bos} - {None})
    n_tokens = check_count(d_vocab - len(skipped), "the token ids left to draw (d_vocab less bos and avoid)")
    small = seq_len * math.log(n_tokens) < math.log(batch + 1) + 1  # else there are more than asked for
    distinct = n_tokens**seq_len if small else batch
    warn_if_duplicates(batch, distinct, f"repeated sequences of {seq_len} tokens over {n_tokens} token ids")
    half = _random_tokens((batch, seq_len), d_vocab, _as_generator(generator), skipped)
    tokens = torch.cat([half, half], dim=1)
    if bos is None:
        return tokens
    return torch.cat([torch.full((batch, 1), bos), tokens], dim=1)


def repeated_sequence_masks(seq_len: int, has_bos: bool = True) -> tuple[Tensor, Tensor]:
    """(first_half, second_half) bool masks [pos-1] over the predictions of `repeated_sequences`.

    first_half marks the predictions of r_2..r_n in the first copy, second_half those of
    r_2..r_n in the second copy (the ones an induction head can make). The predictions of
    r_1 are in neither: they are random in both copies. Both masks have seq_len - 1 entries.
    Use as `loss_per_token[:, second_half].mean()`.
    """
    offset = int(has_bos)
    predictions = torch.arange(offset + 2 * seq_len - 1)  # position p predicts token p+1
    first_half = (predictions >= offset) & (predictions <= offset + seq_len - 2)
    second_half = predictions >= offset + seq_len
    return first_half, second_half


class InductionTask(Task):
    """Random tokens with one span copied later in the sequence, so induction heads help.

    Each row: BOS, uniform random tokens, and a span of length m (uniform in
    [min_span, max_span]) copied to a later, non-overlapping place; start, gap and m vary
    per row so that fixed positional offsets do not solve the task. loss_mask marks the
    predictions of the copy's tokens 2..m (the first copied token is not predictable), or every
    prediction with loss_on_all_tokens=True: slower to learn, but the model stays calibrated
    on non-repeated tokens (trained on copies only, it predicts copies confidently everywhere).
    """

    def __init__(
        self,
        d_vocab: int,
        n_ctx: int,
        min_span: int = 2,
        max_span: int | None = None,
        bos: int = 0,
        loss_on_all_tokens: bool = False,
    ):
        n_ctx, min_span = check_count(n_ctx, "n_ctx"), check_count(min_span, "min_span")
        max_span = (n_ctx - 1) // 2 if max_span is None else check_count(max_span, "max_span")
        if not 2 <= min_span <= max_span or 1 + 2 * max_span > n_ctx:
            raise ValueError(
                f"need 2 <= min_span <= max_span and 1 + 2 * max_span <= n_ctx; "
                f"got min_span={min_span}, max_span={max_span}, n_ctx={n_ctx}"
            )
        self.d_vocab = check_count(d_vocab, "d_vocab", 2)
        self.n_ctx, self.bos = n_ctx, _check_bos(bos, self.d_vocab)
        self.min_span, self.max_span = min_span, max_span
        self.loss_on_all_tokens = loss_on_all_tokens

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        batch_size, n = check_count(batch_size, "batch_size"), self.n_ctx
        tokens = _random_tokens((batch_size, n), self.d_vocab, generator, self.bos)
        tokens[:, 0] = self.bos
        span = torch.randint(self.min_span, self.max_span + 1, (batch_size, 1), generator=generator)
        # Split the n - 1 - 2 * span free positions into before / between / after the two copies.
        free = n - 1 - 2 * span
        cuts = (torch.rand(batch_size, 2, generator=generator) * (free + 1)).long().sort(dim=1).values
        start = 1 + cuts[:, :1]  # [batch, 1] first copy at start..start+span-1
        copy = start + span + (cuts[:, 1:] - cuts[:, :1])  # [batch, 1] second copy
        pos = torch.arange(n)[None]  # [1, pos]
        in_copy = (pos >= copy) & (pos < copy + span)
        source = torch.where(in_copy, pos - copy + start, pos)
        tokens = tokens.gather(1, source)
        predictions = pos[:, :-1]
        loss_mask = (predictions >= copy) & (predictions <= copy + span - 2)
        return Batch(tokens, loss_mask | self.loss_on_all_tokens)


class PeriodicTask(Task):
    """Random tokens repeated with one fixed period: [BOS] r_1..r_P r_1..r_P r_1.. up to n_ctx.

    Loss on every prediction after the first period. A head attending to the fixed offset P - 1
    solves it without induction: the positional shortcut that head-type probes must not call
    induction (circuits.heads probes several repeat lengths for that reason).
    """

    def __init__(self, d_vocab: int, n_ctx: int, period: int, bos: int = 0):
        n_ctx, period = check_count(n_ctx, "n_ctx"), check_count(period, "period")
        if not 2 <= period < n_ctx - 1:
            raise ValueError(f"need 2 <= period < n_ctx - 1, got period={period}, n_ctx={n_ctx}")
        self.d_vocab = check_count(d_vocab, "d_vocab", 2)
        self.n_ctx, self.period, self.bos = n_ctx, period, _check_bos(bos, self.d_vocab)

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        batch_size = check_count(batch_size, "batch_size")
        cycle = _random_tokens((batch_size, self.period), self.d_vocab, generator, self.bos)
        body = cycle.repeat(1, -(-(self.n_ctx - 1) // self.period))[:, : self.n_ctx - 1]
        tokens = torch.cat([torch.full((batch_size, 1), self.bos), body], dim=1)
        predictions = torch.arange(self.n_ctx - 1)[None]  # prediction p is of token p + 1
        return Batch(tokens, (predictions >= self.period).expand(batch_size, -1))


# ---------------------------------------------------------------- in-context Markov chains


def _stationary_distribution(transitions: Tensor) -> Tensor:
    """pi with pi @ P = pi for each transition matrix [batch, k, k] -> [batch, k]."""
    batch, k, _ = transitions.shape
    system = transitions.double().transpose(1, 2) - torch.eye(k, dtype=torch.float64)
    system[:, -1] = 1.0  # replace one (redundant) equation by sum(pi) = 1
    rhs = torch.zeros(batch, k, dtype=torch.float64)
    rhs[:, -1] = 1.0
    pi = torch.linalg.solve(system, rhs).clamp(min=0)
    return (pi / pi.sum(-1, keepdim=True)).float()


def sample_markov_chains(
    n_states: int,
    seq_len: int,
    batch: int,
    alpha: float = 1.0,
    generator: torch.Generator | int | None = None,
) -> tuple[Tensor, Tensor]:
    """In-context Markov chains (Edelman et al. 2024): a fresh transition matrix per sequence.

    Rows of each matrix are Dirichlet(alpha, ..., alpha); the first state is drawn from the
    matrix's stationary distribution. Returns (states [batch, seq_len] with values in
    0..n_states-1, transitions [batch, n_states, n_states] with transitions[b, i, j] = P(j | i)).
    """
    n_states, seq_len = check_count(n_states, "n_states", 2), check_count(seq_len, "seq_len")
    batch, alpha = check_count(batch, "batch"), check_number(alpha, "alpha", 0, low_open=True)
    generator = _as_generator(generator)
    # torch's Dirichlet sampler takes no generator: seed numpy's from the torch stream.
    rng = np.random.default_rng(int(torch.randint(2**62, (1,), generator=generator)))
    transitions = torch.from_numpy(rng.dirichlet([alpha] * n_states, size=(batch, n_states))).float()
    states = torch.empty(batch, seq_len, dtype=torch.long)
    states[:, 0] = torch.multinomial(_stationary_distribution(transitions), 1, generator=generator)[:, 0]
    rows = torch.arange(batch)
    for t in range(1, seq_len):
        next_probs = transitions[rows, states[:, t - 1]]  # [batch, n_states]
        states[:, t] = torch.multinomial(next_probs, 1, generator=generator)[:, 0]
    return states, transitions


def in_context_bigram_probs(tokens: Tensor, n_states: int, alpha: float = 1.0) -> Tensor:
    """In-context bigram predictor: P(next=j) = (count(x_t -> j) + alpha) / (count(x_t -> .) + k alpha).

    The posterior mean of the current state's transition row under the Dirichlet(alpha) prior,
    from the transitions seen so far; the reference a statistical induction head approximates.
    tokens [batch, pos] -> probs [batch, pos, n_states] (probs[:, t] predicts tokens[:, t + 1]).
    """
    n_states = check_count(n_states, "n_states", 2)
    if tokens.is_floating_point() or tokens.numel() == 0 or tokens.min() < 0 or tokens.max() >= n_states:
        raise ValueError(
            f"tokens must be states 0..{n_states - 1} (integers, at least one), got "
            f"{tokens.dtype} {tuple(tokens.shape)}; pass the states of sample_markov_chains"
        )
    one_hot = torch.nn.functional.one_hot(tokens, n_states).float()  # [batch, pos, k]
    pairs = one_hot[:, :-1, :, None] * one_hot[:, 1:, None, :]  # [batch, pos-1, k, k]
    counts = torch.cat([torch.zeros_like(pairs[:, :1]), pairs.cumsum(1)], dim=1)  # [batch, pos, k, k]
    current_row = (counts * one_hot[..., None]).sum(2)  # [batch, pos, k]: counts from x_t
    return (current_row + alpha) / (current_row.sum(-1, keepdim=True) + n_states * alpha)


class MarkovChainTask(Task):
    """Next-token prediction on in-context Markov chains; tokens are the states, loss on all positions."""

    def __init__(self, n_states: int, n_ctx: int, alpha: float = 1.0):
        self.d_vocab, self.n_ctx = check_count(n_states, "n_states", 2), check_count(n_ctx, "n_ctx", 2)
        self.alpha = check_number(alpha, "alpha", 0, low_open=True)

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        batch_size = check_count(batch_size, "batch_size")
        states, _ = sample_markov_chains(self.d_vocab, self.n_ctx, batch_size, self.alpha, generator)
        return Batch(states, torch.ones(batch_size, self.n_ctx - 1, dtype=torch.bool))


# ---------------------------------------------------------------- k-hop induction


def hop_targets(tokens: Tensor, hops: int) -> Tensor:
    """The positions each induction lookup reaches from every position (Sanford, Hsu & Telgarsky 2024).

    One lookup from position p: the last q < p with tokens[q] == tokens[p], then q + 1 (the token
    after that occurrence); -1 where there is none (and from -1 on). hop_k(X) at p is the token at
    the k-th position reached. tokens [batch, pos] -> positions [batch, hops, pos]: row j holds
    hop j + 1's target from each position (hop 0 is the position itself).
    """
    batch, n = tokens.shape
    positions = torch.arange(n)
    earlier = positions[None, :, None] < positions[None, None, :]  # [1, key q, from p]: q < p
    same = tokens[:, :, None] == tokens[:, None, :]  # [batch, q, p]
    last = torch.where(same & earlier, positions[None, :, None], -1).amax(1)  # [batch, p]
    after = torch.where(last >= 0, last + 1, -1)  # [batch, p]: one lookup from each position
    reached, current = [], positions.expand(batch, n)
    for _ in range(check_count(hops, "hops")):
        current = torch.where(current >= 0, after.gather(1, current.clamp(min=0)), -1)
        reached.append(current)
    return torch.stack(reached, 1)


class HopTask(Task):
    """The k-hop induction task (Sanford, Hsu & Telgarsky 2024): [BOS] x_1..x_m a, with x uniform
    over the alphabet 1..d_vocab-1. The prediction at each position p is of hop_k(x) at p, the token
    that k successive induction lookups reach (`hop_targets`), counted where all k hops exist;
    a, the last token, is the answer at the query (the last x).

    At the query every row has all k hops, and the tokens reached by fewer hops (the query's own
    token for hop 0) all differ from a, so a model that makes fewer than k lookups is wrong there;
    rows that miss either are drawn again. Evaluations read the query.
    """

    def __init__(self, hops: int, d_vocab: int = 9, n_ctx: int = 32, bos: int = 0):
        self.hops = check_count(hops, "hops")
        self.d_vocab = check_count(d_vocab, "d_vocab (the alphabet and BOS)", self.hops + 2)
        self.n_ctx = check_count(n_ctx, "n_ctx", 4 * self.hops + 3)
        self.bos = _check_bos(bos, self.d_vocab)
        self.query = self.n_ctx - 2  # the last x: its prediction is of the answer a

    @functools.cached_property
    def chance(self) -> float:
        """The answer accuracy of a uniform guess: `chance_of` 4,096 rows of a fixed seed (1 / (d_vocab
        - 1 - hops) for one or two hops, whose tokens always differ; from three hops on, tokens recur and
        the figure is a mean, to about 0.001)."""
        return self.chance_of(self.sample(4096, torch.Generator().manual_seed(0)).tokens)

    def chance_of(self, tokens: Tensor) -> float:
        """The answer accuracy of a uniform guess on these rows: the mean over rows of 1 / the symbols
        that can be the answer (the alphabet less the tokens the fewer hops reach, which `sample`
        keeps apart from the answer; fewer than `hops` of them where they recur)."""
        reached = torch.cat([torch.full((len(tokens), 1), self.query), self.targets(tokens)[:, :-1]], 1)
        reached = tokens.gather(1, reached)  # [batch, hops]: the tokens of hops 0..k-1
        distinct = ((reached.sort(1).values.diff(dim=1) != 0).sum(1) + 1).tolist()
        return float(sum(Fraction(1, self.d_vocab - 1 - k) for k in distinct) / len(distinct))

    def targets(self, tokens: Tensor) -> Tensor:
        """Each hop's target position from the query: tokens [batch, n_ctx] -> [batch, hops]."""
        return hop_targets(tokens, self.hops)[:, :, self.query]

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        batch_size, n = check_count(batch_size, "batch_size"), self.n_ctx
        rows = torch.empty(0, n, dtype=torch.long)
        while len(rows) < batch_size:
            tokens = _random_tokens((2 * batch_size, n), self.d_vocab, generator, self.bos)
            tokens[:, 0] = self.bos
            reached = torch.cat([torch.full((2 * batch_size, 1), self.query), self.targets(tokens)], 1)
            reached_tokens = tokens.gather(1, reached.clamp(min=0))  # [rows, hops + 1]
            answer = reached_tokens[:, -1:]
            good = (reached >= 0).all(1) & (reached_tokens[:, :-1] != answer).all(1)
            tokens[:, -1] = answer[:, 0]
            rows = torch.cat([rows, tokens[good]])
        rows = rows[:batch_size]
        last_hop = hop_targets(rows, self.hops)[:, -1, :-1]  # [batch, pos-1]: the k-th hop's target
        targets = rows.gather(1, last_hop.clamp(min=0))
        return Batch(rows, last_hop >= 0, targets)
