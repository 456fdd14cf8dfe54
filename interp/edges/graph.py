"""The edge graph of a model (EAP-IG's and MIB's convention, extended to grouped-query attention),
edge scores, and circuits as boolean [writer, reader] masks.

  writers  "input" (token + position embedding), every head "a{L}.h{H}" (its `hook_result`), every
           MLP "m{L}" (its `hook_mlp_out`)                                        [W = 1 + L (H + 1)]
  readers  every head's query input "a{L}.h{H}<q>", every key/value head's key and value inputs
           ("a{L}.h{G}<k>", "<v>"; "a{L}.kv{G}<k>" under grouped-query attention, where a key/value
           head is shared by a group of query heads), every MLP's input "m{L}", and "logits"
  edges    writer -> every later reader (a layer's MLP reads its own heads unless the residual is
           parallel). GPT-2 small has 32,491 edges; SmolLM2-135M 70,651.

Nothing here runs the model: see `interp.edges.intervene` (edge-level runs),
`interp.edges.attribution` (scores) and `interp.edges.evaluate` (faithfulness).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from interp.checks import check_finite_scores
from interp.config import Config
from interp.model.transformer import HookedTransformer

# The circuit sizes of MIB's circuit-localisation track, as fractions of all edges.
MIB_FRACTIONS: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


@dataclass(frozen=True)
class EdgeGraph:
    """Writers, readers and edges of a model. Edge (w, r) exists where `valid[w, r]`.

    Writer index: 0 = input, then per layer its heads and its MLP. Reader index: per layer its query
    heads, key heads, value heads (key/value heads under grouped-query attention) and MLP; last the
    logits. `n_upstream[r]` writers (a prefix of the writer order) feed reader r.
    """

    n_layers: int
    n_heads: int
    n_kv_heads: int
    has_mlp: bool
    parallel: bool
    writers: tuple[str, ...]
    readers: tuple[str, ...]
    n_upstream: tuple[int, ...]

    @classmethod
    def from_config(cls, cfg: Config) -> EdgeGraph:
        n_heads, n_kv = cfg.n_heads, cfg.n_kv_heads
        has_mlp = not cfg.attn_only
        kv_name = "h" if n_kv == n_heads else "kv"
        writers, readers, n_upstream = ["input"], [], []
        for layer in range(cfg.n_layers):
            upstream = len(writers)
            readers += [f"a{layer}.h{h}<q>" for h in range(n_heads)]
            readers += [f"a{layer}.{kv_name}{g}<{x}>" for x in "kv" for g in range(n_kv)]
            n_upstream += [upstream] * (n_heads + 2 * n_kv)
            writers += [f"a{layer}.h{h}" for h in range(n_heads)]
            if has_mlp:
                readers.append(f"m{layer}")
                n_upstream.append(upstream if cfg.parallel_residual else len(writers))
                writers.append(f"m{layer}")
        readers.append("logits")
        n_upstream.append(len(writers))
        return cls(
            cfg.n_layers, n_heads, n_kv, has_mlp, cfg.parallel_residual, tuple(writers), tuple(readers),
            tuple(n_upstream),
        )  # fmt: skip

    @property
    def n_writers(self) -> int:
        return len(self.writers)

    @property
    def n_readers(self) -> int:
        return len(self.readers)

    @property
    def valid(self) -> Bool[Tensor, "writer reader"]:
        upstream = torch.tensor(self.n_upstream)
        return torch.arange(self.n_writers)[:, None] < upstream[None, :]

    @property
    def n_edges(self) -> int:
        return sum(self.n_upstream)

    def edge_name(self, writer: int, reader: int) -> str:
        return f"{self.writers[writer]}->{self.readers[reader]}"

    def edge_index(self, name: str) -> tuple[int, int]:
        """(writer, reader) indices of an edge named as `edge_name` writes it ("a0.h1->a2.h3<q>")."""
        writer, reader = name.split("->")
        return self.writers.index(writer), self.readers.index(reader)

    def edges(self, mask: Bool[Tensor, "writer reader"] | None = None) -> list[tuple[int, int]]:
        """(writer, reader) index pairs of the valid edges (where `mask` too), in graph order."""
        mask = self.valid if mask is None else self.valid & mask
        return [tuple(pair) for pair in mask.nonzero().tolist()]

    def layer_readers(self, layer: int) -> tuple[slice, slice, slice, int | None]:
        """Reader slices of one layer: (queries, keys, values, mlp index or None)."""
        per_layer = self.n_heads + 2 * self.n_kv_heads + int(self.has_mlp)
        start = layer * per_layer
        q = slice(start, start + self.n_heads)
        k = slice(q.stop, q.stop + self.n_kv_heads)
        v = slice(k.stop, k.stop + self.n_kv_heads)
        return q, k, v, (v.stop if self.has_mlp else None)

    def head_writers(self, layer: int) -> slice:
        start = 1 + layer * (self.n_heads + int(self.has_mlp))
        return slice(start, start + self.n_heads)

    def reader_node(self, reader: int) -> str:
        """The component a reader belongs to ("a3.h2", "a3.kv1", "m3", "logits")."""
        return self.readers[reader].split("<")[0]


def edge_graph(model_or_cfg: HookedTransformer | Config) -> EdgeGraph:
    """The edge graph of a model (or of a config: no weights needed to count edges). In post-norm
    models (Gemma 2/3, OLMo 2) a head writes its share of the normalised attention output
    (`Block.head_contributions`: ln1_post at the run's scale)."""
    cfg = model_or_cfg.cfg if isinstance(model_or_cfg, HookedTransformer) else model_or_cfg
    return EdgeGraph.from_config(cfg)


@dataclass(kw_only=True)
class EdgeScores:
    """Per-edge scores [writer, reader] (0 where no edge), estimating m(edge ablated) - m(clean)."""

    graph: EdgeGraph
    scores: Float[Tensor, "writer reader"]
    method: str
    ablation: str
    steps: int
    n_prompts: int

    def top(self, n: int = 10) -> list[tuple[str, float]]:
        """The n edges with the largest |score|, strongest first."""
        flat = self.scores.masked_fill(~self.graph.valid, 0).abs().flatten()
        order = flat.argsort(descending=True)[:n]
        n_readers = self.graph.n_readers
        return [
            (self.graph.edge_name(i // n_readers, i % n_readers), float(self.scores.flatten()[i]))
            for i in order.tolist()
        ]

    def edge_values(self) -> Float[Tensor, " edge"]:
        return self.scores[self.graph.valid]


def prune(graph: EdgeGraph, keep: Bool[Tensor, "writer reader"]) -> Bool[Tensor, "writer reader"]:
    """Only the edges on a path from the input to the logits: a writer other than the input needs a
    kept edge into one of its readers, and a reader other than the logits needs a kept edge out of its
    component."""
    keep = keep & graph.valid
    reader_of_writer = _writer_reader_map(graph)  # [W, R]: reader r belongs to writer w's component
    while True:
        has_in = (keep.any(0).float() @ reader_of_writer.T.float()) > 0  # [W]
        has_in[0] = True
        has_out = keep.any(1)  # [W]
        alive = has_in & has_out
        reader_alive = (alive.float() @ reader_of_writer.float()) > 0
        reader_alive[-1] = True
        new = keep & alive[:, None] & reader_alive[None, :]
        if torch.equal(new, keep):
            return keep
        keep = new


def _writer_reader_map(graph: EdgeGraph) -> Bool[Tensor, "writer reader"]:
    """[w, r] = reader r is an input of writer w's component (q/k/v of a head, its key/value group)."""
    out = torch.zeros(graph.n_writers, graph.n_readers, dtype=torch.bool)
    group = graph.n_heads // graph.n_kv_heads
    for layer in range(graph.n_layers):
        q, k, v, mlp = graph.layer_readers(layer)
        heads = graph.head_writers(layer)
        for h in range(graph.n_heads):
            w = heads.start + h
            out[w, q.start + h] = True
            out[w, k.start + h // group] = True
            out[w, v.start + h // group] = True
        if mlp is not None:
            out[heads.stop, mlp] = True
    return out


def top_circuit(
    scores: EdgeScores, n_edges: int, connected: bool = True, signed: bool = False
) -> Bool[Tensor, "writer reader"]:
    """The n edges with the largest |score| (MIB's top-n), then only those connected input -> logits.
    signed: the n edges that help most instead (the most negative scores: ablating them lowers the
    metric most), as MIB's leaderboard ranks edges for CPR."""
    graph = scores.graph
    if not 0 <= n_edges <= graph.n_edges:
        raise ValueError(f"n_edges must lie in [0, {graph.n_edges}], got {n_edges}.")
    check_finite_edge_scores(scores)
    rank = -scores.scores if signed else scores.scores.abs()
    flat = rank.masked_fill(~graph.valid, -torch.inf).flatten()
    keep = torch.zeros(flat.numel(), dtype=torch.bool)
    keep[flat.argsort(descending=True, stable=True)[:n_edges]] = True
    keep = keep.view_as(scores.scores) & graph.valid
    return prune(graph, keep) if connected else keep


def check_finite_edge_scores(scores: EdgeScores) -> None:
    """Refuse scores with NaN or inf on the graph's edges, naming the first (NaN sorts as the largest
    |score|: it would be kept, or ranked, as the strongest edge)."""
    graph = scores.graph
    check_finite_scores(
        scores.scores.masked_fill(~graph.valid, 0), "the edge scores",
        lambda i: f"{graph.writers[i[0]]} -> {graph.readers[i[1]]}",
    )  # fmt: skip


def node_circuit(graph: EdgeGraph, keep: Bool[Tensor, "writer reader"]) -> list[str]:
    """The components the edges touch (writers with a kept outgoing edge, plus the logits)."""
    keep = keep & graph.valid
    nodes = [graph.writers[w] for w in keep.any(1).nonzero()[:, 0].tolist()]
    return nodes + (["logits"] if keep[:, -1].any() else [])


def random_scores(graph: EdgeGraph, seed: int = 0) -> EdgeScores:
    """Uniform random edge scores: the random-circuit baseline."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.rand(graph.n_writers, graph.n_readers, generator=generator).masked_fill(~graph.valid, 0)
    return EdgeScores(graph=graph, scores=scores, method="random", ablation="-", steps=0, n_prompts=0)


def mib_json(scores: EdgeScores, keep: Bool[Tensor, "writer reader"], cfg: Config) -> dict:
    """The circuit in MIB's submission format: {"cfg", "nodes": {name: {in_graph}}, "edges":
    {"a0.h1->a2.h3<q>": {score, in_graph}}}. Scores in MIB's sign: MIB attributes a loss (minus the
    metric), so its score is -(m(edge ablated) - m(clean)), positive where the edge helps, and its CPR
    ranks the largest signed scores first; interp's scores are written negated. MIB's graph has a key
    and a value input per query head, so a grouped-query model's circuit is refused: find it on
    `interp.ungrouped(model)`, whose edges are MIB's (what `interp circuit --mib-out` does)."""
    graph = scores.graph
    if graph.n_kv_heads != graph.n_heads:
        raise ValueError(
            "MIB's edge graph has a key and a value input per query head, and these scores are per key/value "
            f"head ({graph.n_kv_heads} shared by {graph.n_heads} query heads per layer): find the circuit "
            "on interp.ungrouped(model), the same model with its key/value heads copied to each query head"
        )
    alive = set(node_circuit(graph, keep))
    nodes = {name: {"in_graph": name in alive} for name in graph.writers}
    nodes["logits"] = {"in_graph": True}
    edges = {
        f"{graph.writers[w]}->{graph.readers[r]}": {
            "score": -float(scores.scores[w, r]) + 0.0,  # + 0.0: no -0.0 in the file
            "in_graph": bool(keep[w, r]),
        }
        for w, r in graph.edges()
    }
    mib_cfg = {"n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "parallel_attn_mlp": cfg.parallel_residual,
               "d_model": cfg.d_model}  # fmt: skip
    return {"cfg": mib_cfg, "nodes": nodes, "edges": edges}


def fraction_to_edges(graph: EdgeGraph, fraction: float) -> int:
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}.")
    return max(1, math.floor(fraction * graph.n_edges))
