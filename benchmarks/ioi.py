"""Timing and result of the full IOI circuit discovery on SmolLM2-135M (the `interp ioi` run).

    python benchmarks/ioi.py [--n-prompts 64] [--n-patching-prompts 16] [--threads 2] [--json out.json]

Target: the circuit found (discovery) in <= 90 s on a 2-core CPU with 64 prompts. Prints the
report, the time of each stage, and discovery, evaluation and held-out validation separately. Run
it alone (no other torch process).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import interp
from circuits.ioi import find_ioi_circuit
from circuits.ioi.report import render_markdown


def main() -> None:
    parser = argparse.ArgumentParser(description="IOI circuit discovery timing on SmolLM2-135M.")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n-prompts", type=int, default=64)
    parser.add_argument("--n-patching-prompts", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the JSON report here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    model = interp.load_model(args.model)
    model.eval()
    load_s = time.perf_counter() - start
    result = find_ioi_circuit(
        model, n_prompts=args.n_prompts, seed=args.seed, n_patching_prompts=args.n_patching_prompts
    )
    print(render_markdown(result))
    print(f"load {load_s:.1f} s")
    for stage, seconds in result.timings.items():
        print(f"{stage:<55} {seconds:7.1f} s")
    checks = ("evaluation", "validation on held-out prompts", "example attention patterns", "total")
    discovery = result.timings["total"] - sum(result.timings.get(name, 0.0) for name in checks[:-1])
    print(f"{'discovery (the circuit found; target <= 90 s)':<55} {discovery:7.1f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(result.to_json(), file, indent=2)


if __name__ == "__main__":
    main()
