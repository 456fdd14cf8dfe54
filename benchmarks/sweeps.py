"""Activation patching of SmolLM2's heads on IOI prompts: one process against `patching_sweep` on a
local Ray cluster (2 workers, one torch thread each), side by side in one run.

Run alone (other torch processes distort every figure):
    python benchmarks/sweeps.py [--prompts 8] [--layer-step 3] [--workers 2]
The merged results must equal the single run's to 1e-4 before any time is printed (else it stops
with an error). Prints both times, their ratio, and the largest difference between them.
"""

from __future__ import annotations

import argparse
import time

import torch

import interp
from interp import metrics
from interp.interventions.engine import RunOptions
from interp.interventions.patching import activation_patching
from interp.runtime.distributed import Workers, connect, patching_sweep
from interp.tasks.ioi import make_ioi_dataset


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--layer-step", type=int, default=3, help="Patch the heads of every n-th layer.")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    model = interp.load_model("smollm2-135m").eval()
    clean, corrupted, _ = make_ioi_dataset(model, args.prompts, seed=0)
    io, s, end = clean.io_token, clean.s_token, clean.positions["END"]
    layers = list(range(0, model.cfg.n_layers, args.layer_step))

    def metric(logits, rows):
        return metrics.logit_diff(logits, io[rows], s[rows], pos=end[rows])

    start = time.perf_counter()
    single = activation_patching(
        model, clean.tokens, corrupted.tokens, lambda logits: metric(logits, torch.arange(len(io))),
        "z", layers=layers, options=RunOptions(logit_pos=end),
    )  # fmt: skip
    single_s = time.perf_counter() - start

    connect("local", num_cpus=args.workers)
    start = time.perf_counter()
    sharded = patching_sweep(
        Workers("smollm2-135m", n_shards=args.workers, ray="local"), clean.tokens, corrupted.tokens, metric,
        "z", layers=layers, options=RunOptions(logit_pos=end),
    )  # fmt: skip
    ray_s = time.perf_counter() - start
    difference = (sharded.values - single.values).abs().max().item()
    if not difference < 1e-4:
        raise SystemExit(f"FAIL: the merged results differ from one process's by {difference:.2e} (> 1e-4)")
    print(f"SmolLM2, {args.prompts} IOI prompts, {len(single.index)} heads patched (layers {layers})")
    print(f"one process ({torch.get_num_threads()} threads): {single_s:.1f} s")
    print(f"Ray, {args.workers} workers x 1 thread (incl. worker start and model load): {ray_s:.1f} s")
    print(f"ratio {single_s / ray_s:.2f}x; max |difference| {difference:.2e}")


if __name__ == "__main__":
    main()
