"""Ground truth for edge-circuit methods: a model whose circuit is known by construction, and each
method's edge precision and recall against it.

`planted_induction()` builds a 2-layer attention-only model by hand. Its residual stream is split
into subspaces, and every weight reads and writes only the ones named here:

    tokens | positions | previous token | output | junk        (d_model = 3 V + n_ctx + 8)

    a0.h0  previous-token head: query and key read positions (key j matches query j + 1), value reads
           the token; writes the previous token's one-hot
    a1.h0  induction head: query reads the token, key the previous token (it attends to the position
           after the earlier copy of the current token), value reads the token; writes half the output
    a1.h1  a redundant copy of a1.h0 (the other half of the output)
    a0.h1, a0.h2, a1.h2  distractors: they attend (same token, the first position, junk) and write only
           the junk subspace, which nothing but a1.h2 reads
    unembedding reads the output subspace; the model has no norms (so nothing mixes the subspaces)

The task (`task`): "A A[:-1] -> A[-1]" against "B A[:-1]" (A, B random sequences of distinct tokens,
B[-1] != A[-1]), metric logit(A[-1]) - logit(B[-1]) at the last position. Under counterfactual
ablation (an ablated edge carries its writer's output on the corrupted prompt) exactly 7 edges
matter, the planted circuit:

    input -> a0.h0<v>, a0.h0 -> a1.h0<k>, a0.h0 -> a1.h1<k>, input -> a1.h0<v>, input -> a1.h1<v>,
    a1.h0 -> logits, a1.h1 -> logits

Every other edge carries what the corrupted run carries (positions; the last token, the same in both
prompts), or reaches no reader that reads its subspace. `tests/test_ground_truth.py` checks it: the
model solves the task, ablating any planted edge lowers the metric, ablating all the others at once
leaves it unchanged.

Every method recovers that circuit: its non-circuit edges score exactly 0. `saturated_induction()`
is the same model made harder for first-order attribution:

    a1.h0, a1.h1  the induction heads' attention is saturated (score 20 on the matching key): the
           gradient through their keys is ~0 at the clean prompt (EAP scores the key edges and the
           previous-token head's value edge ~0), yet swapping the previous token moves the attention
           and most of the metric with it
    a0.h2  rewired as a weak real distractor: attends (partly) from the last position to position
           seq_len - 1, where A[-1] and B[-1] stand, and writes leak x that token into the output

Its truth is the same 7 edges, now defined by a threshold: an edge is in the circuit when ablating
it alone (counterfactual) moves the metric by at least TRUTH_THRESHOLD of (model - every edge
ablated). The planted edges move it by >= 30%, a0.h2's two edges by ~6%, every other edge by 0;
`tests/test_ground_truth.py` checks this split and that the 7 edges alone keep >= 0.9 of the metric.

`disabled_heads_induction()` is trained, not hand-set: a 2-layer, 4-head attention-only model
(d_model 32, vocabulary 32, context 24) trained on the induction task with four heads forced off
(DISABLED_HEADS: their W_O zeroed before training and after every step, so they write nothing).
Its circuit lies within the other four heads' edges by construction; which of those edges it is,
is measured: the edges over TRUTH_THRESHOLD on 64 held-out prompts (`thresholded_truth`), not the
prompts the methods are given. The trained checkpoint ships in interp/data/ (`train_disabled_heads`
made it; training takes ~20 s on one thread).

    truth = planted_induction()
    found = edge_circuit_finder("eap-ig")(truth.model, truth.task, truth.n_edges)
    precision, recall = precision_recall(found, truth.circuit)
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Bool
from torch import Tensor

import interp
from circuits.edge_circuits.tasks import EdgeTask, induction_task
from interp import edges
from interp.io.checkpoint import SHIPPED_DIR
from interp.model import HookedTransformer
from interp.training import CHECKPOINTS, TrainConfig, make_task, train

# A method under test: (model, task, n_edges) -> its circuit of about n_edges edges, [writer, reader].
CircuitFinder = Callable[[HookedTransformer, EdgeTask, int], Bool[Tensor, "writer reader"]]

PLANTED_INDUCTION_EDGES = (
    ("input", "a0.h0<v>"), ("a0.h0", "a1.h0<k>"), ("a0.h0", "a1.h1<k>"), ("input", "a1.h0<v>"),
    ("input", "a1.h1<v>"), ("a1.h0", "logits"), ("a1.h1", "logits"),
)  # fmt: skip
# An edge is in a thresholded truth when ablating it alone moves the metric by at least this share
# of (model - every edge ablated).
TRUTH_THRESHOLD = 0.1
DISABLED_HEADS = ((0, 1), (0, 3), (1, 0), (1, 2))  # (layer, head) held off while training
DISABLED_HEADS_CHECKPOINT = SHIPPED_DIR / "ground-truth-disabled-heads"


@dataclass(kw_only=True)
class GroundTruth:
    """A model, a task, and the edges the task uses in it (circuit [writer, reader], by construction)."""

    name: str
    model: HookedTransformer
    task: EdgeTask
    circuit: Bool[Tensor, "writer reader"]
    ablation: edges.AblationKind = "counterfactual"

    @property
    def n_edges(self) -> int:
        return int(self.circuit.sum())


def circuit_of(graph: edges.EdgeGraph, pairs: tuple[tuple[str, str], ...]) -> Bool[Tensor, "writer reader"]:
    """The [writer, reader] mask of named edges ("a0.h0", "a1.h0<k>")."""
    mask = torch.zeros(graph.n_writers, graph.n_readers, dtype=torch.bool)
    for writer, reader in pairs:
        mask[graph.writers.index(writer), graph.readers.index(reader)] = True
    if not (mask <= graph.valid).all():
        raise ValueError(f"{pairs} names edges the graph does not have (a reader before its writer).")
    return mask


def planted_induction(
    n_vocab: int = 32, seq_len: int = 8, n_prompts: int = 32, seed: int = 0, sharpness: float = 4.0
) -> GroundTruth:
    """The hand-set induction model (module docstring) and its task on n_prompts prompts.
    sharpness: the induction heads' attention score on the matching key (others score 0), low enough
    that their attention is not saturated (gradient methods see the keys' edges)."""
    n_ctx = 2 * seq_len
    tok, pos, prev, out, junk = 0, n_vocab, n_vocab + n_ctx, 2 * n_vocab + n_ctx, 3 * n_vocab + n_ctx
    n_junk, d_head = 8, max(n_vocab, n_ctx)
    d_model = junk + n_junk
    cfg = interp.Config(
        n_layers=2, d_model=d_model, n_heads=3, d_head=d_head, d_vocab=n_vocab, n_ctx=n_ctx,
        attn_only=True, normalization="none", attn_scale=1.0,
        default_prepend_bos=False, model_name="planted-induction",
    )  # fmt: skip
    model = HookedTransformer(cfg)
    state = {name: torch.zeros_like(value) for name, value in model.state_dict().items()}
    state = {name.replace("_W_", "W_").replace("_b_", "b_"): value for name, value in state.items()}
    v, p = torch.arange(n_vocab), torch.arange(n_ctx)
    generator = torch.Generator().manual_seed(seed)
    to_junk = torch.randn(n_vocab, n_junk, generator=generator) / n_vocab**0.5
    state["W_E"][v, tok + v] = 1.0
    state["W_pos"][p, pos + p] = 1.0
    state["W_U"][out + v, v] = 1.0
    q0, k0, v0, o0 = (state[f"blocks.0.attn.{w}"] for w in ("W_Q", "W_K", "W_V", "W_O"))
    q0[0, pos + p, p] = 10.0  # previous-token head: query i matches key j = i - 1
    k0[0, pos + p[:-1], p[1:]] = 1.0
    v0[0, tok + v, v] = 1.0
    o0[0, v, prev + v] = 1.0
    q0[1, tok + v, v] = 2.0  # distractor: attends to earlier copies of its token, writes junk
    k0[1, tok + v, v] = 1.0
    v0[1, tok + v, v] = 1.0
    o0[1, v, junk:] = to_junk
    k0[2, pos, 0] = 3.0  # distractor: attends to the first position, writes junk
    q0[2, pos + p, 0] = 1.0
    v0[2, tok + v, v] = 1.0
    o0[2, v, junk:] = to_junk
    q1, k1, v1, o1 = (state[f"blocks.1.attn.{w}"] for w in ("W_Q", "W_K", "W_V", "W_O"))
    for head in (0, 1):  # induction heads, each half of the output
        q1[head, tok + v, v] = sharpness
        k1[head, prev + v, v] = 1.0
        v1[head, tok + v, v] = 1.0
        o1[head, v, out + v] = 2.0
    q1[2, junk:, :n_junk] = torch.eye(n_junk)  # distractor: reads junk and previous tokens, writes junk
    k1[2, junk:, :n_junk] = torch.eye(n_junk)
    v1[2, prev + v, v] = 1.0
    o1[2, v, junk:] = to_junk
    model.load_state_dict(state)
    model.eval()
    task = repeated_sequence_task(n_vocab, seq_len, n_prompts, seed)
    return GroundTruth(
        name="planted-induction", model=model, task=task,
        circuit=circuit_of(edges.edge_graph(model), PLANTED_INDUCTION_EDGES),
    )  # fmt: skip


def saturated_induction(
    n_vocab: int = 32, seq_len: int = 8, n_prompts: int = 32, seed: int = 0, sharpness: float = 20.0,
    leak: float = 0.25,
) -> GroundTruth:  # fmt: skip
    """The planted model with saturated induction heads and a weak real distractor (module
    docstring): `planted_induction(sharpness=20)` with a0.h2 rewired. leak: the distractor's output
    weight (its edges move the metric by ~6% of the full effect at 0.25, under TRUTH_THRESHOLD)."""
    truth = planted_induction(n_vocab, seq_len, n_prompts, seed, sharpness)
    n_ctx = 2 * seq_len
    pos, out = n_vocab, 2 * n_vocab + n_ctx
    state = truth.model.state_dict()
    state = {name.replace("_W_", "W_").replace("_b_", "b_"): value.clone() for name, value in state.items()}
    q0, k0, o0 = (state[f"blocks.0.attn.{w}"] for w in ("W_Q", "W_K", "W_O"))
    q0[2], k0[2], o0[2] = 0.0, 0.0, 0.0
    q0[2, pos + n_ctx - 2, 0] = 1.0  # the last position's query ...
    k0[2, pos + seq_len - 1, 0] = 3.0  # ... matches the key at seq_len - 1 (weight e^3 / (e^3 + 14) ~ 0.6)
    o0[2, torch.arange(n_vocab), out + torch.arange(n_vocab)] = leak  # value: the token (as before)
    truth.model.load_state_dict(state)
    truth.name = "saturated-induction"
    return truth


def repeated_sequence_task(n_vocab: int, seq_len: int, n_prompts: int, seed: int = 0) -> EdgeTask:
    """A A[:-1] -> A[-1] against B A[:-1], A and B random sequences of distinct tokens, B[-1] != A[-1]
    (no BOS). Metric: logit(A[-1]) - logit(B[-1]) at the last position."""
    if not 2 <= seq_len <= n_vocab:
        raise ValueError(f"seq_len={seq_len} must lie in 2..n_vocab={n_vocab} (A's tokens are distinct).")
    generator = torch.Generator().manual_seed(seed)
    first = torch.stack([torch.randperm(n_vocab, generator=generator)[:seq_len] for _ in range(n_prompts)])
    other = torch.stack([torch.randperm(n_vocab, generator=generator)[:seq_len] for _ in range(n_prompts)])
    same = other[:, -1] == first[:, -1]
    other[same, -1] = (first[same, -1] + 1) % n_vocab
    clean = torch.cat([first, first[:, :-1]], 1)
    corrupted = torch.cat([other, first[:, :-1]], 1)
    last = torch.full((n_prompts,), clean.shape[1] - 1)
    metric = edges.logit_diff_metric(first[:, -1], other[:, -1], last)
    return EdgeTask(
        name="repeated-sequence", clean=clean, corrupted=corrupted, metric=metric,
        metric_name="logit_diff(A[-1] - B[-1])",
    )  # fmt: skip


def precision_recall(
    found: Bool[Tensor, "writer reader"], true: Bool[Tensor, "writer reader"]
) -> tuple[float, float]:
    """Edge precision |found & true| / |found| and recall |found & true| / |true|. An empty found
    circuit has precision NaN (nothing claimed); an empty true circuit is refused."""
    if found.shape != true.shape:
        raise ValueError(f"found {tuple(found.shape)} and true {tuple(true.shape)} circuits differ in shape.")
    found, true = found.bool(), true.bool()
    n_true, n_found, hits = int(true.sum()), int(found.sum()), int((found & true).sum())
    if n_true == 0:
        raise ValueError("The true circuit has no edges: recall is undefined.")
    return (hits / n_found if n_found else float("nan")), hits / n_true


def edge_circuit_finder(method: edges.Method, steps: int = 5) -> CircuitFinder:
    """A CircuitFinder from an edge-scoring method: its top n edges (by |score|, MIB's top-n,
    connected input -> logits: `edges.top_circuit`)."""

    def find(model: HookedTransformer, task: EdgeTask, n_edges: int) -> Bool[Tensor, "writer reader"]:
        scores = edges.edge_attribution(model, task.clean, task.corrupted, task.metric, method, steps)
        return edges.top_circuit(scores, n_edges)

    return find


def score_method(find: CircuitFinder, truth: GroundTruth) -> tuple[float, float]:
    """(precision, recall) of the circuit `find` returns when asked for the true circuit's size."""
    return precision_recall(find(truth.model, truth.task, truth.n_edges), truth.circuit)


def thresholded_truth(
    model: HookedTransformer, task: EdgeTask, threshold: float = TRUTH_THRESHOLD
) -> Bool[Tensor, "writer reader"]:
    """The edges whose counterfactual ablation alone moves the metric (mean over the task's prompts)
    by at least `threshold` of (model - every edge ablated)."""
    graph = edges.edge_graph(model)
    single = edges.edge_attribution(model, task.clean, task.corrupted, task.metric, "exact", 1)
    whole = edges.faithfulness(model, task.clean, task.corrupted, task.metric, graph.valid)
    full_effect = float(whole.full.mean() - whole.empty.mean())
    return graph.valid & (single.scores.abs() >= threshold * abs(full_effect))


def train_disabled_heads(
    out: str | Path = DISABLED_HEADS_CHECKPOINT, steps: int = 1500, seed: int = 0
) -> HookedTransformer:
    """Train the disabled-heads induction model (module docstring) and write it to `out` (a
    checkpoint directory: `interp.load_model(out)` reads it). The shipped one was made with
    `python -c "from circuits.edge_circuits.ground_truth import train_disabled_heads as t; t()"`."""
    cfg = interp.Config(
        n_layers=2, n_heads=4, d_model=32, d_vocab=32, n_ctx=24, attn_only=True, bos_token_id=0,
        model_name="ground-truth-disabled-heads", task="induction",
    )  # fmt: skip
    model = HookedTransformer(cfg)
    model.init_weights(seed)

    def disable(*_) -> None:
        with torch.no_grad():
            for layer, head in DISABLED_HEADS:
                model.blocks[layer].attn.W_O[head] = 0.0

    disable()
    config = TrainConfig(steps=steps, lr=5e-3, seed=seed, eval_every=steps)
    task = make_task("induction", d_vocab=cfg.d_vocab, n_ctx=cfg.n_ctx)
    train(model, task, config, out=out, callback=disable, extra={"task": "induction"})
    shutil.rmtree(Path(out) / CHECKPOINTS)  # the resumable optimizer state: not shipped
    return model


def disabled_heads_induction(n_prompts: int = 32, seed: int = 0) -> GroundTruth:
    """The shipped disabled-heads model (module docstring), its induction task (`induction_task`,
    seq_len 10) on n_prompts prompts, and its thresholded truth measured on 64 other prompts."""
    model = interp.load_model(DISABLED_HEADS_CHECKPOINT)
    model.eval()
    heldout = induction_task(model, 64, seq_len=10, seed=seed + 1000)
    return GroundTruth(
        name="disabled-heads-induction", model=model, task=induction_task(model, n_prompts, 10, seed),
        circuit=thresholded_truth(model, heldout),
    )  # fmt: skip
