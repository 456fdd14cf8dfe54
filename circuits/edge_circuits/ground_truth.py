"""Models whose edge circuit is known by construction, and a method's edge precision and recall on them
(docs/guide/edges.md, "Ground truth"): `planted_induction` (set by hand), `saturated_induction` (its
attention saturated) and `disabled_heads_induction` (trained with DISABLED_HEADS held off).

    truth = planted_induction()
    precision, recall = score_method(edge_circuit_finder("eap-ig"), truth)
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
from circuits.edge_circuits.tasks import EdgeTask, induction_task, repeated_sequence_pairs
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
TRUTH_THRESHOLD = 0.1  # an edge is true when ablating it alone moves m by this share of m(model) - m(none)
DISABLED_HEADS = ((0, 1), (0, 3), (1, 0), (1, 2))  # (layer, head) held off while training
DISABLED_HEADS_CHECKPOINT = SHIPPED_DIR / "ground-truth-disabled-heads"


@dataclass(kw_only=True)
class GroundTruth:
    """A model, a task, and the edges the task uses in it (circuit [writer, reader], by construction)."""

    name: str
    model: HookedTransformer
    task: EdgeTask
    circuit: Bool[Tensor, "writer reader"]

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
    """A hand-set 2-layer attention-only model, each weight reading and writing only named subspaces of
    the residual stream (tokens | positions | previous token | output | junk; no norms): a0.h0 a
    previous-token head, a1.h0 and a1.h1 induction heads (each half of the output), a0.h1, a0.h2, a1.h2
    distractors writing only junk; on "A A[:-1] -> A[-1]" against "B A[:-1]" (n_prompts), counterfactual
    ablation, exactly the 7 edges of PLANTED_INDUCTION_EDGES matter. sharpness: the induction heads'
    attention score on the matching key (others 0): low enough not to saturate."""
    n_ctx = 2 * seq_len
    tok, pos, prev, out, junk = 0, n_vocab, n_vocab + n_ctx, 2 * n_vocab + n_ctx, 3 * n_vocab + n_ctx
    n_junk, d_head = 8, max(n_vocab, n_ctx)
    d_model = junk + n_junk
    cfg = interp.Config(
        n_layers=2, d_model=d_model, n_heads=3, d_head=d_head, d_vocab=n_vocab, n_ctx=n_ctx,
        attn_only=True, normalization="none", attn_scale=1.0,
        default_prepend_bos=False, model_name="planted-induction",
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):  # its random weights are replaced: not the caller's draws
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
    """`planted_induction(sharpness=20)` (EAP sees ~0 gradient through the keys) with a0.h2 rewired to
    attend from the last position to seq_len - 1 and write `leak` x that token into the output (its
    edges: ~6% of the effect at 0.25, under TRUTH_THRESHOLD: the truth stays the 7 edges)."""
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
    """A A[:-1] -> A[-1] against B A[:-1] (random sequences of distinct tokens, B[-1] != A[-1], no BOS);
    metric logit(A[-1]) - logit(B[-1]) at the last position."""
    if not 2 <= seq_len <= n_vocab:
        raise ValueError(f"seq_len={seq_len} must lie in 2..n_vocab={n_vocab} (A's tokens are distinct).")
    generator = torch.Generator().manual_seed(seed)
    first = torch.stack([torch.randperm(n_vocab, generator=generator)[:seq_len] for _ in range(n_prompts)])
    other = torch.stack([torch.randperm(n_vocab, generator=generator)[:seq_len] for _ in range(n_prompts)])
    same = other[:, -1] == first[:, -1]
    other[same, -1] = (first[same, -1] + 1) % n_vocab
    return repeated_sequence_pairs("repeated-sequence", first, other)


def precision_recall(
    found: Bool[Tensor, "writer reader"], true: Bool[Tensor, "writer reader"]
) -> tuple[float, float]:
    """Edge precision |found & true| / |found| (NaN when nothing is found) and recall |found & true| /
    |true| (an empty true circuit is refused)."""
    if found.shape != true.shape:
        raise ValueError(f"found {tuple(found.shape)} and true {tuple(true.shape)} circuits differ in shape.")
    found, true = found.bool(), true.bool()
    n_true, n_found, hits = int(true.sum()), int(found.sum()), int((found & true).sum())
    if n_true == 0:
        raise ValueError("The true circuit has no edges: recall is undefined.")
    return (hits / n_found if n_found else float("nan")), hits / n_true


def edge_circuit_finder(method: edges.Method, steps: int = 5) -> CircuitFinder:
    """A CircuitFinder from an edge-scoring method: its top n edges by |score| (`edges.top_circuit`)."""

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
    """The edges whose counterfactual ablation alone moves the mean metric by at least `threshold` of
    m(model) - m(every edge ablated)."""
    graph = edges.edge_graph(model)
    single = edges.edge_attribution(model, task.clean, task.corrupted, task.metric, "exact", 1)
    whole = edges.faithfulness(model, task.clean, task.corrupted, task.metric, graph.valid)
    full_effect = float(whole.full.mean() - whole.empty.mean())
    return graph.valid & (single.scores.abs() >= threshold * abs(full_effect))


def train_disabled_heads(
    out: str | Path = DISABLED_HEADS_CHECKPOINT, steps: int = 1500, seed: int = 0
) -> HookedTransformer:
    """Train the disabled-heads induction model and write it to `out` (`interp.load_model(out)` reads
    it): 2 layers of 4 heads, d_model 32, DISABLED_HEADS' W_O zeroed before training and after each step."""
    cfg = interp.Config(
        n_layers=2, n_heads=4, d_model=32, d_vocab=32, n_ctx=24, attn_only=True, bos_token_id=0,
        model_name="ground-truth-disabled-heads", task="induction",
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):  # its random weights are replaced: not the caller's draws
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
    """The shipped disabled-heads model, its induction task (seq_len 10) on n_prompts prompts, and its
    thresholded truth measured on 64 other prompts."""
    model = interp.load_model(DISABLED_HEADS_CHECKPOINT)
    model.eval()
    heldout = induction_task(model, 64, seq_len=10, seed=seed + 1000)
    return GroundTruth(
        name="disabled-heads-induction", model=model, task=induction_task(model, n_prompts, 10, seed),
        circuit=thresholded_truth(model, heldout),
    )  # fmt: skip
