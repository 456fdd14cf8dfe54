"""Edge circuits of tasks: IOI, induction and the user's own prompt pairs, found with `interp.edges`.

    task = ioi_task(model, n_prompts=64)     # or induction_task(model), file_task(model, "pairs.csv")
    result = find_edge_circuit(model, task, method="eap-ig", n_edges=200)
    result.to_json()                                     # the schema below
    interp.edges.mib_json(result.scores, result.circuit, model.cfg)   # MIB's submission format

Prompt-pair files (CSV with a header, or JSONL, one object per line) have the fields `clean`,
`corrupted`, `correct` and `incorrect` (answers: one token each, mind the leading space; `incorrect` is
optional with the probability metric). Clean and corrupted prompts may differ in length.

JSON schema ("interp-edge-circuit-1"):
  model     {name, n_layers, n_heads, n_kv_heads}
  task      {name, n_prompts, metric, clean_metric, corrupted_metric}   (metric means over prompts)
  method    {name, steps, ablation}
  graph     {n_nodes, n_edges}
  circuit   {requested_edges, n_edges, nodes: [name], edges: [{writer, reader, score}],
             faithfulness, faithfulness_ci: [low, high]}                 (95 % bootstrap over prompts)
  curve     {fractions, n_edges, faithfulness, ci_low, ci_high, cpr, cmd,
             random: {n_edges, faithfulness, cpr, cmd}} or null
  top_edges [{edge, score}]  the strongest edges by |score|, circuit or not
  seconds   {scores, circuit, curve}
Scores estimate m(edge ablated) - m(clean) in the metric's units (negative: the edge helps).
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from interp import edges
from interp.model import HookedTransformer
from interp.tasks.ioi import ioi_dataset_for

Progress = Callable[[str, int, int], None]  # (stage, done, total)
SCHEMA = "interp-edge-circuit-1"
METRICS = ("logit_diff", "prob")
TASKS = ("ioi", "induction")


@dataclass
class EdgeTask:
    """Prompt pairs and a per-prompt metric. clean, corrupted: [batch, pos] right-padded to one width."""

    name: str
    clean: Int[Tensor, "batch pos"]
    corrupted: Int[Tensor, "batch pos"]
    metric: edges.PromptMetric
    metric_name: str
    corrupted_metric: edges.PromptMetric | None = None  # the metric at the corrupted prompts' positions

    @property
    def n_prompts(self) -> int:
        return self.clean.shape[0]


def ioi_task(model: HookedTransformer, n_prompts: int = 64, seed: int = 0) -> EdgeTask:
    """IOI prompts against the ABC distribution (three other names); logit(IO) - logit(S) at END."""
    clean, abc, _ = ioi_dataset_for(model, n_prompts, seed)
    metric = edges.logit_diff_metric(clean.io_token, clean.s_token, clean.positions["END"])
    return EdgeTask("ioi", clean.tokens, abc.tokens, metric, "logit_diff(IO - S)")


def induction_task(
    model: HookedTransformer, n_prompts: int = 64, seq_len: int = 10, seed: int = 0
) -> EdgeTask:
    """[BOS] A A[:-1] -> A[-1] against [BOS] B A[:-1] (B random, B[-1] != A[-1]): the model must find
    A[-2] earlier and copy what followed it. Metric: logit(A[-1]) - logit(B[-1]) at the last position."""
    generator = torch.Generator().manual_seed(seed)
    bos = model.cfg.bos_token_id
    if bos is None and model.tokenizer is not None:
        bos = model.tokenizer.bos_token_id
    low = 1 if bos == 0 else 0
    high = model.cfg.d_vocab if model.tokenizer is None else min(model.cfg.d_vocab, len(model.tokenizer))
    if 2 * seq_len + int(model.cfg.default_prepend_bos) > model.cfg.n_ctx:
        raise ValueError(
            f"seq_len={seq_len} does not fit {model.cfg.model_name}'s context of {model.cfg.n_ctx}."
        )
    first = torch.randint(low, high, (n_prompts, seq_len), generator=generator)
    other = torch.randint(low, high, (n_prompts, seq_len), generator=generator)
    same = other[:, -1] == first[:, -1]
    other[same, -1] = (first[same, -1] + 1 - low) % (high - low) + low
    clean = torch.cat([first, first[:, :-1]], 1)
    corrupted = torch.cat([other, first[:, :-1]], 1)
    if model.cfg.default_prepend_bos and bos is not None:
        column = torch.full((n_prompts, 1), bos)
        clean, corrupted = torch.cat([column, clean], 1), torch.cat([column, corrupted], 1)
    metric = edges.logit_diff_metric(first[:, -1], other[:, -1])
    return EdgeTask("induction", clean, corrupted, metric, "logit_diff(A[-1] - B[-1])")


def read_pairs(path: str | Path) -> list[dict[str, str]]:
    """Rows of a CSV (with a header) or JSONL prompt-pair file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No prompt-pair file at {path}.")
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number} is not JSON ({error.msg}).") from error
    elif path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as file:
            rows = list(csv.DictReader(file))
    else:
        raise ValueError(f"{path} must be a .csv (with a header) or .jsonl file of prompt pairs.")
    if not rows:
        raise ValueError(f"{path} has no prompt pairs.")
    return rows


def file_task(model: HookedTransformer, path: str | Path, metric: str = "logit_diff") -> EdgeTask:
    """The user's prompt pairs (see the module docstring) with a logit-difference or probability metric."""
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r} is not one of {METRICS}.")
    rows = read_pairs(path)
    needed = ["clean", "corrupted", "correct"] + (["incorrect"] if metric == "logit_diff" else [])
    for number, row in enumerate(rows, 1):
        missing = [key for key in needed if not row.get(key)]
        if missing:
            raise ValueError(
                f"{path}: pair {number} lacks {', '.join(missing)}; every pair needs {', '.join(needed)} "
                f"(for a probability metric without an incorrect answer use --metric prob)."
            )
    if model.tokenizer is None:
        raise ValueError(f"{model.cfg.model_name} has no tokenizer, so it cannot read text prompt pairs.")

    def ids(text: str) -> list[int]:
        return model.to_tokens(text)[0].tolist()

    clean_ids = [ids(row["clean"]) for row in rows]
    corrupted_ids = [ids(row["corrupted"]) for row in rows]
    pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    clean, corrupted = edges.pad_pair(clean_ids, corrupted_ids, pad)
    clean_end = torch.tensor([len(row) - 1 for row in clean_ids])
    corrupted_end = torch.tensor([len(row) - 1 for row in corrupted_ids])
    correct = torch.tensor([model.to_single_token(row["correct"]) for row in rows])
    if metric == "prob":
        name = "p(correct)"
        made = edges.prob_metric(correct, clean_end), edges.prob_metric(correct, corrupted_end)
    else:
        incorrect = torch.tensor([model.to_single_token(row["incorrect"]) for row in rows])
        name = "logit_diff(correct - incorrect)"
        made = (
            edges.logit_diff_metric(correct, incorrect, clean_end),
            edges.logit_diff_metric(correct, incorrect, corrupted_end),
        )
    return EdgeTask(Path(path).name, clean, corrupted, made[0], name, made[1])


def make_task(
    model: HookedTransformer, task: str, n_prompts: int = 64, seed: int = 0, metric: str = "logit_diff"
) -> EdgeTask:
    """ "ioi", "induction", or the path of a prompt-pair file."""
    if task == "ioi":
        return ioi_task(model, n_prompts, seed)
    if task == "induction":
        return induction_task(model, n_prompts, seed=seed)
    if not Path(task).suffix:
        raise ValueError(
            f"Unknown task {task!r}: choose ioi, induction, or a .csv/.jsonl file of prompt pairs."
        )
    return file_task(model, task, metric)


@dataclass
class EdgeCircuitResult:
    """What `find_edge_circuit` found. circuit: [writer, reader] bool mask of the kept edges."""

    model: str
    task: EdgeTask
    scores: edges.EdgeScores
    circuit: Bool[Tensor, "writer reader"]
    requested_edges: int
    faithfulness: edges.Faithfulness
    clean_metric: float
    corrupted_metric: float
    curve: edges.FaithfulnessCurve | None
    seconds: dict[str, float]
    n_kv_heads: int

    @property
    def graph(self) -> edges.EdgeGraph:
        return self.scores.graph

    @property
    def nodes(self) -> list[str]:
        return edges.node_circuit(self.graph, self.circuit)

    def circuit_edges(self) -> list[tuple[str, str, float]]:
        """(writer, reader, score) of the circuit's edges, strongest first."""
        rows = [
            (self.graph.writers[w], self.graph.readers[r], float(self.scores.scores[w, r]))
            for w, r in self.graph.edges(self.circuit)
        ]
        return sorted(rows, key=lambda row: -abs(row[2]))

    def to_json(self, top: int = 50) -> dict:
        low, high = self.faithfulness.ci()
        graph = self.graph
        out = {
            "schema": SCHEMA,
            "model": {"name": self.model, "n_layers": graph.n_layers, "n_heads": graph.n_heads,
                      "n_kv_heads": self.n_kv_heads},
            "task": {"name": self.task.name, "n_prompts": self.task.n_prompts,
                     "metric": self.task.metric_name, "clean_metric": self.clean_metric,
                     "corrupted_metric": self.corrupted_metric},
            "method": {"name": self.scores.method, "steps": self.scores.steps,
                       "ablation": self.scores.ablation},
            "graph": {"n_nodes": graph.n_writers + 1, "n_edges": graph.n_edges},
            "circuit": {
                "requested_edges": self.requested_edges,
                "n_edges": int(self.circuit.sum()),
                "nodes": self.nodes,
                "edges": [{"writer": w, "reader": r, "score": s} for w, r, s in self.circuit_edges()],
                "faithfulness": float(self.faithfulness.faithfulness[0]),
                "faithfulness_ci": [float(low[0]), float(high[0])],
            },
            "curve": None,
            "top_edges": [{"edge": name, "score": score} for name, score in self.scores.top(top)],
            "seconds": self.seconds,
        }  # fmt: skip
        curve = self.curve
        if curve is not None:
            c_low, c_high = curve.result.ci()
            out["curve"] = {
                "fractions": list(curve.fractions),
                "n_edges": curve.n_edges,
                "faithfulness": curve.faithfulness.tolist(),
                "ci_low": c_low.tolist(),
                "ci_high": c_high.tolist(),
                "cpr": curve.cpr,
                "cmd": curve.cmd,
                "random": None
                if curve.random is None
                else {"n_edges": curve.random_n_edges, "faithfulness": curve.random.faithfulness.tolist(),
                      "cpr": curve.random_cpr, "cmd": curve.random_cmd},
            }  # fmt: skip
        return out


def find_edge_circuit(
    model: HookedTransformer,
    task: EdgeTask,
    method: edges.Method = "eap-ig",
    n_edges: int | None = None,
    fraction: float | None = None,
    steps: int = 5,
    ablation: edges.Ablation = "counterfactual",
    curve_fractions: tuple[float, ...] | None = edges.MIB_FRACTIONS,
    random_baseline: bool = True,
    batch_size: int = 16,
    progress: Progress | None = None,
) -> EdgeCircuitResult:
    """Score every edge, keep the top `n_edges` (or `fraction` of all edges) connected input -> logits,
    measure the circuit's faithfulness and, unless `curve_fractions` is None, the faithfulness curve."""
    graph = edges.edge_graph(model)
    if (n_edges is None) == (fraction is None):
        raise ValueError("Give exactly one of n_edges (--edges N) and fraction (--fraction F).")
    requested = edges.fraction_to_edges(graph, fraction) if fraction is not None else n_edges
    if not 0 < requested <= graph.n_edges:
        raise ValueError(f"The circuit size must lie in 1..{graph.n_edges} edges, got {requested}.")

    def stage(name: str) -> edges.Progress | None:
        return None if progress is None else (lambda done, total: progress(name, done, total))

    seconds = {}
    start = time.perf_counter()
    model.eval()
    scores = edges.edge_attribution(
        model,
        task.clean,
        task.corrupted,
        task.metric,
        method,
        steps,
        ablation,
        None,
        batch_size,
        stage("scores"),
    )
    seconds["scores"] = time.perf_counter() - start
    start = time.perf_counter()
    circuit = edges.top_circuit(scores, requested)
    faith = edges.faithfulness(
        model, task.clean, task.corrupted, task.metric, circuit, ablation, None, batch_size, stage("circuit")
    )
    corrupted_metric = task.corrupted_metric or task.metric
    chunks = torch.arange(task.n_prompts).split(batch_size)
    with torch.no_grad():
        corrupted_value = torch.cat([corrupted_metric(model(task.corrupted[c]), c).float() for c in chunks])
    seconds["circuit"] = time.perf_counter() - start
    curve = None
    if curve_fractions is not None:
        start = time.perf_counter()
        curve = edges.faithfulness_curve(
            model, task.clean, task.corrupted, task.metric, scores, curve_fractions, ablation, None,
            random_baseline, batch_size=batch_size, progress=stage("curve"),
        )  # fmt: skip
        seconds["curve"] = time.perf_counter() - start
    return EdgeCircuitResult(
        model.cfg.model_name, task, scores, circuit, requested, faith, float(faith.full.mean()),
        float(corrupted_value.mean()), curve, seconds, model.cfg.n_kv_heads,
    )  # fmt: skip
