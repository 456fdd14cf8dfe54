"""Peak memory of caching on SmolLM2-135M: a full cache, a cache of selected hooks, a cache that
stops after the blocks it needs, a cache moved to CPU as it is made, and streaming to disk.

Each mode runs in a fresh process (peak resident memory cannot be reset within one); the figure is
the peak resident set size (ru_maxrss) minus the resident size after loading the model and one
warm-up forward, and on CUDA also torch's peak allocated device memory. Run alone:
    python benchmarks/memory.py [--batch 8] [--pos 64]
Set INTERP_DEVICE=cuda to measure on a GPU (there "to CPU" keeps the cache off the device).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

import torch

import interp
from interp.runtime.memory import keep_freed_memory
from interp.runtime.streaming import cache_to_disk

MODES = {
    "forward only": "a forward pass, nothing cached",
    "full cache": "run_with_cache(tokens): every hook",
    "resid+pattern": "resid_post and pattern of all 30 layers, with logits",
    "layers 0-9, logits": "resid_post and pattern of layers 0-9, return_type='logits' (all blocks run)",
    "layers 0-9, stopped": "the same, return_type=None (stops after block 9)",
    "full cache to CPU": "run_with_cache(tokens, device='cpu')",
    "streaming resid+pattern": "cache_to_disk, batches of 2 prompts",
}


def resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def names_for(layers: range) -> list[str]:
    return [interp.act_name(kind, layer) for layer in layers for kind in ("resid_post", "pattern")]


def run_mode(mode: str, batch: int, pos: int) -> dict:
    torch.set_num_threads(2)
    model = interp.load_model("smollm2-135m").eval()
    tokens = torch.randint(1000, 20000, (batch, pos), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(model.device)
    with torch.no_grad():
        model(tokens[:1])
    baseline = resident_mib()
    if model.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        device_baseline = torch.cuda.memory_allocated() / 2**20
    start = time.perf_counter()
    cached_mib = 0.0
    with torch.no_grad():
        if mode == "forward only":
            model(tokens)
        elif mode == "streaming resid+pattern":
            with tempfile.TemporaryDirectory() as out:
                cache_to_disk(model, tokens, names_for(range(30)), out, batch_size=2)
        else:
            names, kwargs = {
                "full cache": (None, {}),
                "resid+pattern": (names_for(range(30)), {}),
                "layers 0-9, logits": (names_for(range(10)), {}),
                "layers 0-9, stopped": (names_for(range(10)), {"return_type": None}),
                "full cache to CPU": (None, {"device": "cpu"}),
            }[mode]
            _, cache = model.run_with_cache(tokens, names_filter=names, **kwargs)
            cached_mib = sum(t.numel() * t.element_size() for t in cache.cache_dict.values()) / 2**20
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    result = {"mode": mode, "peak_mib": peak - baseline, "cached_mib": cached_mib, "seconds": seconds}
    if model.device.type == "cuda":
        result["device_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20 - device_baseline
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--pos", type=int, default=64)
    parser.add_argument("--mode", help=argparse.SUPPRESS)  # one measurement, in a child process
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.batch, args.pos)))
        return
    print(f"SmolLM2-135M, {args.batch} prompts x {args.pos} tokens, device {interp.default_device()}")
    print(f"{'mode':26} {'peak MiB':>9} {'cached MiB':>11} {'seconds':>8}  what")
    for mode, what in MODES.items():
        child = [sys.executable, __file__, "--mode", mode, "--batch", str(args.batch), "--pos", str(args.pos)]
        result = json.loads(subprocess.run(child, capture_output=True, text=True, check=True).stdout)
        device = f"  device peak {result['device_peak_mib']:.0f} MiB" if "device_peak_mib" in result else ""
        print(
            f"{mode:26} {result['peak_mib']:9.0f} {result['cached_mib']:11.0f} {result['seconds']:8.2f}  "
            f"{what}{device}"
        )


if __name__ == "__main__":
    keep_freed_memory()  # the allocator policy the interp command runs with
    main()
