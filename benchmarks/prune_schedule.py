"""Edge pruning's default schedule against a longer one, on SmolLM2-135M's IOI circuit of 300 edges.

    python benchmarks/prune_schedule.py [--seeds 0 1 2 3] [--edges 300] [--n-prompts 64]

For each seed of the prompts (`ioi_task` and IOI's held-out split, as `benchmarks/circuit.py`), one
EAP-IG ranking starts both masks: `edges.PruneSettings()` (the default: 45 steps at lr 0.0067, the
first mask 3x the final size, shrinking over 40 % of the steps) and the longer schedule (100 steps at
lr 0.003, 10x over 60 %). Prints each circuit's faithfulness with its 95 % CI on the held-out and on
the discovery prompts, and each mask's CPU seconds (one thread), then the means over the seeds. The
training is chaotic to rounding, so each seed is one draw: compare the means, not one seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

import interp
from circuits.edge_circuits.tasks import heldout_edge_task, ioi_task
from interp import edges
from interp.runtime.memory import keep_freed_memory

SCHEDULES = {
    "default (45 steps)": edges.PruneSettings(),
    "longer (100 steps)": edges.PruneSettings(steps=100, lr=0.003, start_factor=10, ramp=0.6),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--edges", type=int, default=300)
    parser.add_argument("--n-prompts", type=int, default=64)
    args = parser.parse_args()
    keep_freed_memory()
    torch.set_num_threads(1)
    model = interp.load_model(args.model).eval()
    density = args.edges / edges.edge_graph(model).n_edges
    held_out: dict[str, list[float]] = {name: [] for name in SCHEDULES}
    for seed in args.seeds:
        task = ioi_task(model, args.n_prompts, seed)
        heldout = heldout_edge_task(model, "ioi", args.n_prompts, seed)
        start = edges.edge_attribution(model, task.clean, task.corrupted, task.metric, "eap-ig")
        for name, schedule in SCHEDULES.items():
            began = time.process_time()
            pruning = dataclasses.replace(schedule, density=density)
            scores = edges.prune_edges(model, task.clean, task.corrupted, task.metric, pruning, start=start)
            seconds = time.process_time() - began
            circuit = edges.top_circuit(scores, args.edges)
            found, held = (
                edges.faithfulness(model, prompts.clean, prompts.corrupted, prompts.metric, circuit)
                for prompts in (task, heldout)
            )
            held_out[name].append(float(held.faithfulness[0]))
            print(
                f"seed {seed}  {name:<20} {int(circuit.sum()):4d} edges  mask {seconds:6.1f} CPU s  "
                f"held-out {_with_ci(held)}  discovery {_with_ci(found)}",
                flush=True,
            )
    for name, values in held_out.items():
        print(f"mean held-out faithfulness, {name}: {sum(values) / len(values):.3f} over seeds {args.seeds}")


def _with_ci(result: edges.Faithfulness) -> str:
    low, high = result.ci()
    return f"{float(result.faithfulness[0]):.3f} [{float(low[0]):.3f}, {float(high[0]):.3f}]"


if __name__ == "__main__":
    main()
