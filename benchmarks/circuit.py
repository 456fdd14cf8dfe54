"""Timing of the default `interp circuit --task ioi --edges 300` on SmolLM2-135M, stage by stage.

    python benchmarks/circuit.py [--edges 300] [--n-prompts 64] [--threads 1] [--curve] [--json out.json]

Target: within 5x the exact all-heads activation-patching sweep (every head's z on 8 IOI prompts,
`benchmarks/ioi.py`'s sweep) timed in the same process. Both are timed in CPU seconds of this process
(`time.process_time`, with `--threads 1` the default: on a shared machine wall time counts the other
processes' load, CPU time does not), wall seconds beside. Prints each stage (the result's `seconds`,
and the progress stages inside them: the EAP-IG start, the mask's steps, the faithfulness runs), the
mask's steps run, the circuit's held-out and discovery faithfulness with 95 % CIs, and the ratio.
Run it alone (no other torch process of yours).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from ioi import all_heads_sweep_seconds  # benchmarks/ioi.py

import interp
from circuits.edge_circuits import EdgeCircuitSettings, find_edge_circuit
from circuits.edge_circuits.tasks import heldout_edge_task, ioi_task
from interp.edges import MIB_FRACTIONS
from interp.runtime.memory import keep_freed_memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--edges", type=int, default=300)
    parser.add_argument("--n-prompts", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--curve", action="store_true", help="also the faithfulness curve (--curve)")
    parser.add_argument("--json", help="also write the result's JSON here")
    args = parser.parse_args()
    keep_freed_memory()  # the allocator policy the interp command runs with
    torch.set_num_threads(args.threads)

    model = interp.load_model(args.model).eval()
    task = ioi_task(model, args.n_prompts, args.seed)
    heldout = heldout_edge_task(model, "ioi", args.n_prompts, args.seed)
    spans: dict[str, list[float]] = {}
    steps = [0]

    def progress(stage: str, done: int, total: int) -> None:
        now = time.process_time()
        spans.setdefault(stage, [now, now])[1] = now
        if stage == "Edge pruning":
            steps[0] = done

    began_cpu, began_wall = time.process_time(), time.perf_counter()
    settings = EdgeCircuitSettings(n_edges=args.edges, curve_fractions=MIB_FRACTIONS if args.curve else None)
    result = find_edge_circuit(model, task, settings, heldout=heldout, progress=progress)
    total_cpu, total_wall = time.process_time() - began_cpu, time.perf_counter() - began_wall
    out = result.json_data()
    circuit = out["circuit"]
    print(f"circuit of {circuit['n_edges']} edges, mask steps run: {steps[0]}")
    print(
        f"faithfulness on {out['task']['n_heldout']} held-out prompts: {circuit['faithfulness']:.3f} "
        f"[{circuit['faithfulness_ci'][0]:.3f}, {circuit['faithfulness_ci'][1]:.3f}]; on the "
        f"{out['task']['n_prompts']} discovery prompts: {circuit['discovery_faithfulness']:.3f} "
        f"[{circuit['discovery_faithfulness_ci'][0]:.3f}, {circuit['discovery_faithfulness_ci'][1]:.3f}]"
    )
    if out["curve"] is not None:
        print("curve (held-out):", [round(f, 3) for f in out["curve"]["faithfulness"]])
    for stage, seconds in result.seconds.items():
        print(f"{stage + ' (wall)':<45} {seconds:7.1f} s")
    for stage, (first, last) in spans.items():
        print(f"{'  ' + stage + ' (CPU, first to last report)':<45} {last - first:7.1f} s")
    print(f"{'total (CPU)':<45} {total_cpu:7.1f} s   (wall {total_wall:.1f} s)")
    sweep_cpu = all_heads_sweep_seconds(model, clock=time.process_time)
    print(f"{'exact all-heads sweep (CPU, same process)':<45} {sweep_cpu:7.1f} s")
    ratio = total_cpu / sweep_cpu
    verdict = "met" if ratio <= 5 else "NOT met"
    print(f"interp circuit --edges {args.edges} / all-heads sweep (CPU time, {args.threads} thread(s)): "
          f"{ratio:.1f}x (target <= 5x: {verdict})")  # fmt: skip
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(out, file, indent=2)


if __name__ == "__main__":
    main()
