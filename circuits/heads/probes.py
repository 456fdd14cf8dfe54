"""Probe inputs: the sequences every head is scored on ([batch, pos] token ids, right-padded).

  repeated   [BOS] p_1..p_o r_1..r_L r_1..r_L [pad]: random tokens repeated once at three repeat lengths L
             (`induction_lengths`, none a multiple of another) after a random prefix of o <= max_prefix
             tokens, so a fixed-offset head matches the repeat at one length only
  random     [BOS] and random tokens, nothing repeated on purpose
  text       natural text (models with a tokenizer): skip-grams and `<score>_text`
  held_out   the repeated probe again from the held-out token family: what the causal checks run on

`TOKEN_FAMILIES` splits the vocabulary by token-id parity (never the BOS or a special token): the
repeated probe (which chooses candidates) draws even ids, the held-out probe odd ids, so they share no
token but the BOS; the random probe draws any token but the BOS. Seeds: seed, seed + 1 (random),
seed + 2 (held out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from jaxtyping import Bool, Int
from torch import Tensor

import interp

NATURAL_TEXT = (
    "The cat sat on the mat, and then the cat slept on the mat all afternoon.",
    "Alice gave Bob a book about the history of Paris, and Bob gave Alice a map of Paris.",
    "In 1969 the first people walked on the Moon; in 1972 the last people walked on the Moon.",
    "She opened the door, looked at the garden, closed the door, and looked at the garden again.",
    "Water boils at one hundred degrees Celsius at sea level, but at lower temperatures on mountains.",
    "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n",
    "$\\left( x + y \\right) = \\left( a \\right) + \\left[ b \\right]$",
    "so $f = \\left[ g \\right]$ and <b>bold</b> then <i>italic</i> then <b>bold again</b>",
    "<i>notes</i> on $\\left\\{ z \\right\\}$, <b>see</b> the table",
    "<b>Proof.</b> By $\\left| x \\right|$ and <i>induction</i> on $n$.",
)

TOKEN_FAMILIES = {"discovery": 0, "held_out": 1}  # family -> the parity of its token ids
FAMILY_NAMES = {"discovery": "even token ids", "held_out": "odd token ids"}
HELD_OUT_SEED_OFFSET = 2  # the held-out probe is drawn from seed + 2 (the random probe: seed + 1)
REFERENCE_SEED_OFFSET = 3  # the mean-ablation reference, of the held-out family: seed + 3
REFERENCE_COPIES = 4  # its sequences per held-out sequence: each position's mean over 4x as many
HELD_OUT_RULE = (  # in --save files' options: a file of another rule is refused
    f"scores on {FAMILY_NAMES['discovery']}, causal checks and scores again on fresh "
    f"{FAMILY_NAMES['held_out']} (seed + {HELD_OUT_SEED_OFFSET}), heads mean-ablated to their mean over "
    f"other sequences of that family (seed + {REFERENCE_SEED_OFFSET}), each effect against random heads of "
    "its layer over neither type's threshold (with the others ablated: in the head's place), with a CI "
    "over the sequences and the random heads; a previous-token head's on the induction heads after its layer"
)


@dataclass
class Probe:
    """Probe sequences: tokens [batch, pos], true lengths [batch] (right padding); repeated probes' rows
    also their repeat length L and first copy's start (the second copy starts at repeat_start + L)."""

    name: str
    tokens: Int[Tensor, "batch pos"]
    lengths: Int[Tensor, " batch"]
    str_tokens: list[str]  # of the first sequence, for attention plots
    repeat_len: Int[Tensor, " batch"] | None = None
    repeat_start: Int[Tensor, " batch"] | None = None

    def second_copy_predictions(self) -> Bool[Tensor, "batch pos_minus_1"]:
        """Mask of the predictions of the second copy's tokens 2..L (prediction p is of token p + 1)."""
        p = torch.arange(self.tokens.shape[1] - 1)[None]
        second = (self.repeat_start + self.repeat_len)[:, None]
        return (p >= second) & (p <= second + self.repeat_len[:, None] - 2)


@dataclass
class Probes:
    """The probes of one report and the settings they were made with."""

    repeated: Probe  # of the discovery family: its scores choose the causal checks' candidates
    random: Probe
    text: Probe | None  # None: no natural text (no tokenizer, or natural_text=())
    held_out: Probe  # the repeated probe's held-out twin: what the causal checks read
    reference: Probe  # more sequences like held_out's, none of them: what ablated heads' means are over
    induction_lengths: list[int]  # repeat lengths L of the repeated probe, longest first
    seq_len: int  # the longest repeat length
    max_prefix: int  # the longest random prefix before a repeat
    has_bos: bool
    natural_text: list[str]

    @property
    def skip_gram(self) -> Probe:
        """The probe skip-grams are scored on: natural text, else random tokens."""
        return self.text if self.text is not None else self.random


def token_texts(model: interp.HookedTransformer, tokens: Int[Tensor, " pos"]) -> list[str]:
    """Tokens as text ("t<id>" without a tokenizer)."""
    if model.tokenizer is None:
        return [f"t{t}" for t in tokens.tolist()]
    return model.to_str_tokens(tokens)


def bos_token(model: interp.HookedTransformer) -> int | None:
    """The BOS id if the model runs with one (0, interp.tasks' convention, if none is named), else None."""
    cfg = model.cfg
    if not cfg.default_prepend_bos:
        return None
    if cfg.bos_token_id is not None:
        return cfg.bos_token_id
    bos = getattr(model.tokenizer, "bos_token_id", None)
    return 0 if bos is None else bos


def induction_lengths(longest: int, n: int = 3) -> list[int]:
    """`n` repeat lengths from `longest` down to about half of it, none a multiple of another."""
    if longest < n + 2:
        raise ValueError(
            f"repeat lengths need room: the longest is {longest} tokens, {n} lengths need at least {n + 2} "
            "(raise seq_len, or use a model with a longer context)."
        )
    lengths: list[int] = []
    for spread in (True, False):  # first near the targets, then any length that fits
        for length in range(longest, 2, -1):
            target = longest * (1 - 0.45 * len(lengths) / max(1, n - 1))
            fits = length not in lengths and all(other % length and length % other for other in lengths)
            if len(lengths) < n and fits and (length <= target or not spread):
                lengths.append(length)
    return sorted(lengths, reverse=True)


def family_tokens(model: interp.HookedTransformer, family: str | None) -> Int[Tensor, " tokens"]:
    """The ids a random probe draws from: `family`'s parity without the BOS and special tokens, or
    (family=None) every id but the BOS."""
    bos = {bos_token(model)} - {None}
    if family is None:
        ids, excluded = torch.arange(model.cfg.d_vocab), bos
    else:
        ids = torch.arange(TOKEN_FAMILIES[family], model.cfg.d_vocab, 2)
        excluded = bos | set(getattr(model.tokenizer, "all_special_ids", None) or [])
    kept = ids[~torch.isin(ids, torch.tensor(sorted(excluded), dtype=torch.long))]
    if len(kept) < 2:
        raise ValueError(
            f"{model.cfg.model_name}'s vocabulary has {len(kept)} tokens for the {family or 'random'} "
            "probe; random probes need at least 2."
        )
    return kept


def _row_start_and_draws(
    model: interp.HookedTransformer, family: str | None, seed: int
) -> tuple[Int[Tensor, " bos"], Int[Tensor, " tokens"], torch.Generator]:
    """What a random probe's rows are made of: their start ([BOS], or empty without one), the tokens they
    draw from (`family_tokens`), and the generator of `seed`."""
    bos = bos_token(model)
    start = torch.tensor([] if bos is None else [bos], dtype=torch.long)
    return start, family_tokens(model, family), torch.Generator().manual_seed(seed)


def _random_rows(
    tokens: Int[Tensor, " tokens"], n_tokens: int, n_rows: int, generator: torch.Generator
) -> Int[Tensor, "n_rows n_tokens"]:
    """Tokens drawn uniformly from `tokens`."""
    return tokens[torch.randint(len(tokens), (n_rows, n_tokens), generator=generator)]


def repeated_probe(
    model: interp.HookedTransformer,
    n_samples: int,
    lengths: Sequence[int],
    max_prefix: int,
    seed: int,
    family: str = "discovery",
) -> Probe:
    """n_samples rows per repeat length L: [BOS] p_1..p_o r_1..r_L r_1..r_L [pad] of `family`'s tokens,
    o in [0, max_prefix]."""
    head, tokens_of_family, generator = _row_start_and_draws(model, family, seed)
    width = len(head) + max_prefix + 2 * max(lengths)
    rows, repeat_len, repeat_start = [], [], []
    for length in lengths:
        offsets = torch.randint(max_prefix + 1, (n_samples,), generator=generator).tolist()
        copies = _random_rows(tokens_of_family, length, n_samples, generator)
        prefixes = _random_rows(tokens_of_family, max_prefix + 1, n_samples, generator)
        for offset, copy, prefix in zip(offsets, copies, prefixes, strict=True):
            rows.append(torch.cat([head, prefix[:offset], copy, copy]))
            repeat_len.append(length)
            repeat_start.append(len(head) + offset)
    row_lengths = torch.tensor([len(row) for row in rows])
    tokens = torch.stack([torch.nn.functional.pad(row, (0, width - len(row))) for row in rows])
    return Probe(
        "repeated" if family == "discovery" else "held-out",
        tokens,
        row_lengths,
        token_texts(model, tokens[0, : row_lengths[0]]),
        repeat_len=torch.tensor(repeat_len),
        repeat_start=torch.tensor(repeat_start),
    )


def fresh_tokens(
    model: interp.HookedTransformer, probe: Probe, seed: int, family: str, copies: int = 1
) -> Probe:
    """`copies` of a repeated `probe`'s layout (lengths, repeat lengths and starts) with fresh random
    tokens of `family`: sequences real at exactly `probe`'s positions, drawn apart from it."""
    head, tokens_of_family, generator = _row_start_and_draws(model, family, seed)
    layout = probe.repeat_start.repeat(copies), probe.repeat_len.repeat(copies)
    tokens = torch.zeros(len(layout[0]), probe.tokens.shape[1], dtype=probe.tokens.dtype)
    for row, (start, length) in enumerate(zip(*(part.tolist() for part in layout), strict=True)):
        prefix = _random_rows(tokens_of_family, start - len(head), 1, generator)[0]
        copy = _random_rows(tokens_of_family, length, 1, generator)[0]
        tokens[row, : start + 2 * length] = torch.cat([head, prefix, copy, copy])
    return replace(
        probe, name="reference", tokens=tokens, lengths=probe.lengths.repeat(copies),
        repeat_len=layout[1], repeat_start=layout[0],
    )  # fmt: skip


def random_probe(model: interp.HookedTransformer, n_samples: int, n_tokens: int, seed: int) -> Probe:
    """[BOS] and n_tokens random tokens (any but the BOS) per row, nothing repeated on purpose."""
    head, any_token, generator = _row_start_and_draws(model, None, seed + 1)  # not the repeated probe's draws
    drawn = _random_rows(any_token, n_tokens, n_samples, generator)
    tokens = torch.cat([head.expand(n_samples, -1), drawn], dim=1)
    lengths = torch.full((n_samples,), tokens.shape[1])
    return Probe("random", tokens, lengths, token_texts(model, tokens[0]))


def text_probe(model: interp.HookedTransformer, texts: Sequence[str]) -> Probe:
    """Natural text, cut to the context and right-padded; needs a tokenizer."""
    if model.tokenizer is None:
        raise ValueError(
            f"{model.cfg.model_name} has no tokenizer: pass natural_text=() to skip text probes."
        )
    rows = [model.to_tokens(text)[0][: model.cfg.n_ctx] for text in texts]
    lengths = torch.tensor([len(row) for row in rows])
    tokens = torch.stack([torch.nn.functional.pad(r, (0, int(lengths.max()) - len(r))) for r in rows])
    return Probe("text", tokens, lengths, token_texts(model, tokens[0, : lengths[0]]))


def make_probes(
    model: interp.HookedTransformer,
    n_samples: int = 16,
    seed: int = 0,
    seq_len: int = 24,
    natural_text: Sequence[str] | str | None = None,
) -> Probes:
    """Stage 1 of `head_report`: the probes of the module docstring, n_samples sequences each (per repeat
    length: induction_lengths(seq_len), prefixes up to seq_len // 3); natural_text defaults to
    NATURAL_TEXT with a tokenizer, () skips it."""
    if n_samples < 2:
        raise ValueError(f"n_samples must be >= 2 (standard errors need two sequences), got {n_samples}.")
    cfg = model.cfg
    has_bos = bos_token(model) is not None
    max_prefix = max(1, min(seq_len // 3, (cfg.n_ctx - int(has_bos)) // 6))
    longest = min(seq_len, (cfg.n_ctx - int(has_bos) - max_prefix) // 2)
    lengths = induction_lengths(longest)
    if natural_text is None:
        natural_text = NATURAL_TEXT if model.tokenizer is not None else ()
    natural_text = [natural_text] if isinstance(natural_text, str) else list(natural_text)
    held_out = repeated_probe(model, n_samples, lengths, max_prefix, seed + HELD_OUT_SEED_OFFSET, "held_out")
    return Probes(
        repeated=repeated_probe(model, n_samples, lengths, max_prefix, seed),
        random=random_probe(model, n_samples, max_prefix + 2 * longest, seed),
        text=text_probe(model, natural_text) if natural_text else None,
        held_out=held_out,
        reference=fresh_tokens(model, held_out, seed + REFERENCE_SEED_OFFSET, "held_out", REFERENCE_COPIES),
        induction_lengths=lengths,
        seq_len=longest,
        max_prefix=max_prefix,
        has_bos=has_bos,
        natural_text=natural_text,
    )
