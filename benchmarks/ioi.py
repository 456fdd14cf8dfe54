"""Timing and result of the full IOI circuit discovery on SmolLM2-135M (the `interp ioi` run).

    python benchmarks/ioi.py [--n-prompts 64] [--n-patching-prompts 16] [--threads 2] [--json out.json]

Target: the circuit found (discovery) in <= 90 s on a 2-core CPU with 64 prompts, and the whole
`interp ioi` within 3x the exact all-heads activation-patching sweep timed in the same process:
every head's z patched on 8 prompts of `make_ioi_dataset` (seed 0), the logits of the two answers
at END only, as `interp ioi` computes them (not benchmarks/patching.py's sweep, whose 8 prompts and
logits differ). Prints the report, the time of each stage, discovery, evaluation and held-out
validation separately, and the ratio. Run it alone (no other torch process).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

import interp
from circuits.finding import finding_report
from circuits.ioi import find_ioi_circuit
from circuits.sections import render_markdown, result_json
from interp import metrics
from interp.interventions.engine import RunOptions
from interp.interventions.patching import activation_patching
from interp.runtime.memory import keep_freed_memory
from interp.tasks.ioi import make_ioi_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description="IOI circuit discovery timing on SmolLM2-135M.")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n-prompts", type=int, default=64)
    parser.add_argument("--n-patching-prompts", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the JSON report here")
    args = parser.parse_args()
    keep_freed_memory()  # the allocator policy the interp command runs with
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    model = interp.load_model(args.model)
    model.eval()
    load_s = time.perf_counter() - start
    result = find_ioi_circuit(
        model, n_prompts=args.n_prompts, seed=args.seed, n_patching_prompts=args.n_patching_prompts
    )
    print(render_markdown(finding_report(result)))
    print(f"load {load_s:.1f} s")
    for stage, seconds in result.timings.items():
        print(f"{stage:<55} {seconds:7.1f} s")
    checks = ("evaluation", "validation on held-out prompts", "example attention patterns", "total")
    discovery = result.timings["total"] - sum(result.timings.get(name, 0.0) for name in checks[:-1])
    print(f"{'discovery (the circuit found; target <= 90 s)':<55} {discovery:7.1f} s")
    sweep = all_heads_sweep_seconds(model)
    ratio = result.timings["total"] / sweep
    print(f"{'exact all-heads sweep (z, 8 IOI prompts, same process)':<55} {sweep:7.1f} s")
    verdict = "met" if ratio <= 3 else "NOT met"
    print(f"interp ioi / all-heads sweep: {ratio:.1f}x (target <= 3x: {verdict})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            file.write(result_json(result))


def all_heads_sweep_seconds(
    model: interp.HookedTransformer, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Seconds of the exact activation-patching sweep over every head's z on 8 IOI prompts (logits of
    the two answers at END only, as `interp ioi` computes them), by `clock` (wall time; or
    `time.process_time`: this process's CPU time)."""
    clean, corrupted, _ = make_ioi_dataset(model, 8, seed=0)
    end = clean.positions["END"]

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return metrics.logit_diff(logits, clean.io_token, clean.s_token, pos=end)

    start = clock()
    activation_patching(
        model, clean.tokens, corrupted.tokens, metric, "z",
        options=RunOptions(logit_pos=end, logit_tokens=clean.answers),
    )  # fmt: skip
    return clock() - start


if __name__ == "__main__":
    main()
