"""The allocator policy on a large run: a cached run of SmolLM2-135M (the residual stream before every
block, as `run_site_sets`' target run caches it) on one large batch, in a process that keeps freed
memory (`interp.runtime.memory.keep_freed_memory`, what the `interp` command does) and in one that does
not (glibc's default, what a script or notebook gets unless it opts in).

Each policy runs in a fresh process (the policy is a process's); the figure is the least of `--repeats`
runs after one warm-up. Run alone:
    python benchmarks/allocator.py [--batch 320] [--pos 56] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

import interp
from interp.interventions.engine import cached_run, start_names
from interp.runtime.memory import keep_freed_memory


def timed_run(batch: int, pos: int, repeats: int, keep: bool) -> float:
    """The least time (s) of `repeats` cached runs, in this process, under the policy `keep`."""
    keep_freed_memory(keep)
    model = interp.load_model("smollm2-135m")
    tokens = torch.randint(100, 20_000, (batch, pos), generator=torch.Generator().manual_seed(0))
    names = start_names(model)
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first a warm-up
            began = time.perf_counter()
            cached_run(model, tokens, names, logits=False)
            times.append(time.perf_counter() - began)
    return min(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=320)
    parser.add_argument("--pos", type=int, default=56)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--policy", choices=["keep", "return"], help=argparse.SUPPRESS)  # one process's
    args = parser.parse_args()
    if args.policy is not None:
        print(json.dumps(timed_run(args.batch, args.pos, args.repeats, args.policy == "keep")))
        return
    seconds = {}
    for policy in ("keep", "return"):
        command = [sys.executable, __file__, "--policy", policy, "--batch", str(args.batch), "--pos",
                   str(args.pos), "--repeats", str(args.repeats)]  # fmt: skip
        finished = subprocess.run(command, capture_output=True, text=True, check=True)
        seconds[policy] = json.loads(finished.stdout)
    print(f"cached run of the residual stream, SmolLM2-135M, {args.batch} prompts of {args.pos} tokens:")
    print(f"  freed memory kept (the interp command): {seconds['keep']:.2f} s")
    print(f"  glibc's default (a script that does not opt in): {seconds['return']:.2f} s")
    print(f"  ratio: {seconds['return'] / seconds['keep']:.2f}x")


if __name__ == "__main__":
    main()
