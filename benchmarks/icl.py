"""Timing of `interp icl` on SmolLM2-135M, stage by stage, with its compute floor.

    python benchmarks/icl.py [--n-documents 60] [--threads 2] [--fresh-heads]

Target: under 3 minutes on an idle 2-core CPU, loading included. Runs what the command runs (load,
`icl_report`, the terminal report) and prints the time of each stage: the induction heads (the head
report, or its cache: --fresh-heads runs the report as a first run does), the attribution (one forward
and one backward pass over the discovery documents), the exact ablations on the first held-out
documents (the clean run, the top heads alone, the induction heads and the random same-layer sets),
the clean runs that score the other held-out documents.

The compute floor is the time of the matmuls alone: the token positions that went through the blocks
(counted by a pre-hook on each block; a position in a pass with gradients counts twice, for its
backward pass, which computes the inputs' gradients only: one matmul per forward matmul), times the
flops of one block's matmuls per position, plus the unembedding's logits (twice with gradients), at
this process's matmul rate at the MLP's shape (benchmarks/heads.py's `matmul_rate`).
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import time

import torch
from heads import block_flops, matmul_rate
from rich.console import Console

import interp
from circuits.finding import write_finding_report
from circuits.icl import ICLSettings, icl_report
from interp.runtime.memory import keep_freed_memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=interp.DEFAULT_MODEL)
    parser.add_argument("--n-documents", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fresh-heads", action="store_true", help="run the head report (a first run)")
    args = parser.parse_args()
    keep_freed_memory()  # the allocator policy the interp command runs with
    torch.set_num_threads(args.threads)
    began = time.perf_counter()
    model = interp.load_model(args.model)
    loaded = time.perf_counter() - began

    positions = {"forward": 0, "backward": 0}
    logits = {"forward": 0, "backward": 0}

    def count(module, inputs) -> None:
        tokens = inputs[0].shape[0] * inputs[0].shape[1]
        positions["forward"] += tokens
        positions["backward"] += tokens if torch.is_grad_enabled() else 0

    for block in model.blocks:
        block.register_forward_pre_hook(count)
    unembed = model._unembed

    def counted_unembed(x: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
        out = unembed(x, columns)
        logits["forward"] += out.numel()
        logits["backward"] += out.numel() if torch.is_grad_enabled() else 0
        return out

    model._unembed = counted_unembed
    rate, per_position = matmul_rate(model), block_flops(model)

    with tempfile.TemporaryDirectory() as cache:
        if args.fresh_heads:
            os.environ["INTERP_CACHE"] = cache  # an empty cache (the model is loaded): the head report runs
        result = icl_report(model, ICLSettings(n_documents=args.n_documents))
    rendered = time.perf_counter()
    write_finding_report(result, "table", None, Console(file=io.StringIO(), width=100))
    render = time.perf_counter() - rendered

    stages = {"load": loaded, **result.timings, "render": render}
    stages["interp icl"] = loaded + result.timings["total"] + render
    for name, seconds in stages.items():
        print(f"{name:24s}{seconds:8.1f} s")
    flops = (positions["forward"] + positions["backward"]) * per_position
    flops += 2 * model.cfg.d_model * (logits["forward"] + logits["backward"])
    print(
        f"token positions through the blocks: {positions['forward']:,} ({positions['backward']:,} with "
        f"gradients); logits: {logits['forward']:,}"
    )
    verdict = "under" if stages["interp icl"] <= 180 else "OVER"
    print(f"interp icl on {args.model}: {stages['interp icl']:.1f} s ({verdict} the 3-minute target)")
    print(f"compute floor of the matmuls at {rate / 1e9:.0f} GFLOP/s: {flops / rate:.1f} s")
    score = result.extras.score
    print(f"ICL score {score.score:+.3f} {score.ci}; induction class: "
          f"{[(c.heldout.drop, c.heldout.beyond_ci, c.verdict) for c in result.classes]}")  # fmt: skip


if __name__ == "__main__":
    main()
