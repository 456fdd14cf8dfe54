"""Circuit discovery methods side by side: EAP, EAP-IG, edge pruning and their ensemble.

    python benchmarks/edge_methods.py [--models toy-ioi toy-induction smollm2-135m] [--cache DIR]
                                      [--out docs/results/data/edge-methods.json]

Each model has its task (toy-ioi and smollm2-135m: IOI against ABC prompts; toy-induction:
induction). Every method scores the edges on 32 discovery prompts (seed 0), each in its own process
(time, CPU time, peak memory above the loaded model); every circuit is evaluated on 32 held-out
prompts (seed 1), counterfactual ablation, as `interp circuit` does:

  CPR   area under faithfulness over MIB's ten sizes, edges ranked by signed score (MIB's leaderboard)
  CMD   area between that curve and 1, edges ranked by |score|
  n@0.8 the smallest top-|score| circuit reaching faithfulness 0.8 (connected edges), with its
        faithfulness and 95% bootstrap CI over the held-out prompts

CPR and CMD have 95% CIs from the same bootstrap over prompts. Edge pruning (`edges.prune_edges`):
up to 100 steps of 8 prompts (it stops once the mask keeps the same edges for 10 steps at its final
size), starting from EAP-IG's circuit of 24% of the edges and shrinking to 2.4% (on SmolLM2, 1,696
edges), metric objective, learning rate 0.003 (its time includes its EAP-IG start); the
ensemble averages EAP-IG's and pruning's normalised ranks (its time is theirs together). Scores are
cached under --cache (with their times), so an interrupted run resumes, and pruning resumes from its
checkpoint there. Writes the JSON and prints a Markdown table.
--fresh N: each SmolLM2 circuit of the table's "edges for 0.8" (rebuilt from the cached scores: the
top-n whose connected circuit has that many edges) evaluated again on N new prompts (seed 2): the
size search on 32 prompts picks the first size that reaches 0.8 on them, which overstates it.
--planted: each method's edge precision and recall on the hand-set induction model whose circuit is
known (`circuits.edge_circuits.ground_truth.planted_induction`; pruning 100 steps towards 10 %).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import time
from pathlib import Path

import torch
from patching import timed  # benchmarks/patching.py

import interp
from circuits.edge_circuits import induction_task, ioi_task
from circuits.edge_circuits.find import smallest_faithful_size
from circuits.edge_circuits.ground_truth import edge_circuit_finder, planted_induction, score_method
from interp import edges
from interp.interventions.stats import bootstrap

N_PROMPTS = 32
PRUNE = edges.PruneSettings(
    density=0.024, steps=100, batch_size=8, objective="metric", lr=0.003, start_factor=10, ramp=0.6
)
METHODS = ("eap", "eap-ig", "prune", "ensemble")
TASKS = {"toy-ioi": "ioi", "toy-induction": "induction", "smollm2-135m": "ioi"}


def task_of(model: interp.HookedTransformer, name: str, seed: int):
    maker = ioi_task if TASKS[name] == "ioi" else induction_task
    return maker(model, N_PROMPTS, seed=seed)


def score(name: str, method: str, cache: str) -> None:
    """Score the edges in this process and save the scores with their time and memory."""
    torch.set_num_threads(1)
    model = interp.load_model(name).eval()
    task = task_of(model, name, 0)
    if method == "prune":
        checkpoint = Path(cache) / f"{name}-prune.ckpt"
        resumed = checkpoint.exists()

        def run():
            return edges.prune_edges(
                model, task.clean, task.corrupted, task.metric, PRUNE, checkpoint=checkpoint
            )
    else:
        resumed = False

        def run():
            return edges.edge_attribution(model, task.clean, task.corrupted, task.metric, method)

    cpu = time.process_time()
    scores, seconds, peak = timed(run)
    torch.save(
        {"scores": scores.scores, "seconds": None if resumed else seconds,
         "cpu_seconds": None if resumed else time.process_time() - cpu,
         "peak_bytes": None if resumed else peak},
        Path(cache) / f"{name}-{method}.pt",
    )  # fmt: skip


def scores_of(name: str, method: str, graph: edges.EdgeGraph, cache: Path) -> tuple[edges.EdgeScores, dict]:
    """The method's scores (cached, else made in a fresh process) and their cost."""
    if method == "ensemble":
        (first, _), (second, cost) = (scores_of(name, m, graph, cache) for m in ("eap-ig", "prune"))
        # pruning's run computes the EAP-IG ranks it starts from: the ensemble costs what pruning does
        return edges.ensemble([first, second]), cost
    path = cache / f"{name}-{method}.pt"
    if not path.exists():
        process = multiprocessing.get_context("spawn").Process(target=score, args=(name, method, str(cache)))
        process.start()
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(f"scoring {name} with {method} failed (exit code {process.exitcode})")
    saved = torch.load(path, weights_only=True)
    scores = edges.EdgeScores(graph=graph, scores=saved.pop("scores"), method=method,
                              ablation="counterfactual", steps=5, n_prompts=N_PROMPTS)  # fmt: skip
    return scores, saved


def evaluate(model, held, scores: edges.EdgeScores) -> dict:
    """CPR, CMD (with CIs) and the smallest circuit reaching 0.8, on the held-out prompts."""
    curve = edges.faithfulness_curve(
        model, held.clean, held.corrupted, held.metric, scores, random_baseline=False
    )
    fractions = curve.fractions

    def areas(result: edges.Faithfulness, absolute: bool):
        def statistic(samples: torch.Tensor) -> torch.Tensor:  # [n_boot, n] -> [n_boot]
            empty, full = result.empty[samples].mean(1), result.full[samples].mean(1)
            f = (result.values[:, samples].mean(-1) - empty) / (full - empty)  # [K, n_boot]
            f = (1 - f).abs() if absolute else f
            widths = torch.tensor(fractions[1:]) - torch.tensor(fractions[:-1])
            return ((f[1:] + f[:-1]) / 2 * widths[:, None]).sum(0)

        return [float(x) for x in bootstrap(statistic, result.full.shape[0])]

    size, _ = smallest_faithful_size(model, held, scores, 0.8)
    circuit = edges.top_circuit(scores, size)
    faith = edges.faithfulness(model, held.clean, held.corrupted, held.metric, circuit)
    low, high = faith.ci()
    return {
        "cpr": curve.cpr, "cpr_ci": areas(curve.signed_result, False), "cmd": curve.cmd,
        "cmd_ci": areas(curve.result, True), "n_edges_08": int(circuit.sum()),
        "faithfulness_08": float(faith.faithfulness[0]),
        "faithfulness_08_ci": [float(low[0]), float(high[0])],
        "curve": curve.faithfulness.tolist(), "curve_signed": curve.signed_result.faithfulness.tolist(),
    }  # fmt: skip


def planted() -> dict[str, list[float]]:
    """Each method's (precision, recall) of edges on the hand-set induction model whose circuit is known
    (`circuits.edge_circuits.ground_truth`), asked for the true circuit's size."""
    truth = planted_induction()

    def finder(method: str):
        def find(model, task, n_edges):
            if method in ("prune", "ensemble"):
                pruning = edges.PruneSettings(density=0.1, steps=100, lr=0.003, start_factor=10, ramp=0.6)
                pruned = edges.prune_edges(model, task.clean, task.corrupted, task.metric, pruning)
            if method == "prune":
                return edges.top_circuit(pruned, n_edges)
            scores = edges.edge_attribution(model, task.clean, task.corrupted, task.metric, "eap-ig")
            return edges.top_circuit(edges.ensemble([scores, pruned]), n_edges)

        return edge_circuit_finder(method) if method in edges.METHODS else find

    return {method: list(score_method(finder(method), truth)) for method in METHODS}


def fresh(n_prompts: int, cache: Path, out: Path) -> None:
    """The table's SmolLM2 circuits at "edges for 0.8", evaluated on `n_prompts` new prompts (seed 2)."""
    torch.set_num_threads(2)
    name = "smollm2-135m"
    model = interp.load_model(name).eval()
    task = ioi_task(model, n_prompts, seed=2)
    graph = edges.edge_graph(model)
    rows = [row for row in json.loads(out.read_text()).values() if row["model"] == name]

    def with_count(scores: edges.EdgeScores, count: int) -> torch.Tensor:
        low, high = count, graph.n_edges  # the smallest top-n whose connected circuit has `count` edges
        while low < high:
            middle = (low + high) // 2
            short = edges.top_circuit(scores, middle).sum() < count
            low, high = (middle + 1, high) if short else (low, middle)
        return edges.top_circuit(scores, low)

    circuits = torch.stack(
        [with_count(scores_of(name, row["method"], graph, cache)[0], row["n_edges_08"]) for row in rows]
    )
    result = edges.faithfulness(model, task.clean, task.corrupted, task.metric, circuits)
    low, high = result.ci()
    print(f"| SmolLM2-135M, IOI | edges | faithfulness on 32 prompts | on {n_prompts} new prompts |")
    print("| --- | ---: | ---: | ---: |")
    for i, row in enumerate(rows):
        print(f"| {row['method']} | {int(circuits[i].sum()):,} | {row['faithfulness_08']:.2f} | "
              f"{result.faithfulness[i]:.2f} [{low[i]:.2f}, {high[i]:.2f}] |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--cache", default="edge-methods-cache")
    parser.add_argument("--out", default="edge-methods.json")
    parser.add_argument(
        "--planted", action="store_true", help="only precision and recall on the planted model"
    )
    parser.add_argument("--fresh", type=int, default=0, help="SmolLM2's circuits again on N new prompts")
    options = parser.parse_args()
    if options.fresh:
        fresh(options.fresh, Path(options.cache), Path(options.out))
        return
    if options.planted:
        print(json.dumps(planted()))
        return
    cache = Path(options.cache)
    cache.mkdir(exist_ok=True)
    out = Path(options.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    torch.set_num_threads(1)
    for name in options.models:
        model = interp.load_model(name).eval()
        held = task_of(model, name, 1)
        graph = edges.edge_graph(model)
        for method in options.methods:
            scores, cost = scores_of(name, method, graph, cache)
            start = time.perf_counter()
            row = {"model": name, "task": TASKS[name], "method": method, "n_edges": graph.n_edges, **cost,
                   **evaluate(model, held, scores), "evaluation_seconds": None}  # fmt: skip
            row["evaluation_seconds"] = time.perf_counter() - start
            results[f"{name}/{method}"] = row
            out.write_text(json.dumps(results, indent=1))
            print(json.dumps({k: v for k, v in row.items() if "curve" not in k}), flush=True)
    print(markdown(results))
    print(json.dumps(docs_table(results), ensure_ascii=False))
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


def docs_table(results: dict) -> dict:
    """The table of docs/results/circuits.md (docs/results/data/circuits.json): the figures that do not
    depend on the machine (times and memory are printed, not documented, where the machine is shared)."""
    rows = [
        [f"{row['model']}, {row['task']}", row["method"],
         f"{row['cpr']:.2f} [{row['cpr_ci'][0]:.2f}, {row['cpr_ci'][1]:.2f}]",
         f"{row['cmd']:.2f} [{row['cmd_ci'][0]:.2f}, {row['cmd_ci'][1]:.2f}]",
         f"{row['n_edges_08']:,} of {row['n_edges']:,}",
         f"{row['faithfulness_08']:.2f} [{row['faithfulness_08_ci'][0]:.2f}, "
         f"{row['faithfulness_08_ci'][1]:.2f}]"]
        for row in results.values()
    ]  # fmt: skip
    columns = ["model, task", "method", "CPR ↑", "CMD ↓", "edges for faithfulness 0.8", "its faithfulness"]
    return {"columns": columns, "rows": rows, "align": "llrrrr"}


def markdown(results: dict) -> str:
    """The comparison table (Markdown)."""
    lines = [
        "| model, task | method | CPR ↑ | CMD ↓ | edges for 0.8 | faithfulness there | CPU s | peak GiB |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in results.values():
        cpu = "–" if row["cpu_seconds"] is None else f"{row['cpu_seconds']:.0f}"
        peak = "–" if row["peak_bytes"] is None else f"{row['peak_bytes'] / 2**30:.2f}"
        lines.append(
            f"| {row['model']}, {row['task']} | {row['method']} | {row['cpr']:.2f} [{row['cpr_ci'][0]:.2f}, "
            f"{row['cpr_ci'][1]:.2f}] | {row['cmd']:.2f} [{row['cmd_ci'][0]:.2f}, {row['cmd_ci'][1]:.2f}] | "
            f"{row['n_edges_08']:,} of {row['n_edges']:,} | {row['faithfulness_08']:.2f} "
            f"[{row['faithfulness_08_ci'][0]:.2f}, {row['faithfulness_08_ci'][1]:.2f}] | {cpu} | {peak} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
