"""Forward-pass and caching speed: interp vs transformers (eager) vs TransformerLens's TransformerBridge.

Run alone (two torch processes on two cores distort every figure):
    python benchmarks/forward.py [--batch 32] [--pos 64] [--repeats 5]
Before timing, checks interp's logits against transformers' on the first 2 prompts x 8 tokens (to
1e-4; it stops with an error where they differ more). Prints the median time of each, the ratios the
project targets, and the size of a full cache.
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import time
from collections.abc import Callable

import torch

import interp
from interp.io.sources import OFFLINE_MODELS
from interp.runtime.memory import keep_freed_memory


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def check_logits(model: interp.HookedTransformer, hf: torch.nn.Module, tokens: torch.Tensor) -> None:
    """interp's logits against transformers' on the first 2 x 8 tokens, to 1e-4, or SystemExit."""
    tokens = tokens[:2, :8]
    difference = (model(tokens) - hf(tokens).logits).abs().max().item()
    batch, pos = tokens.shape
    print(f"max |interp - transformers| of the logits on {batch} x {pos} tokens: {difference:.1e}")
    if not difference < 1e-4:
        raise SystemExit("FAIL: interp's logits differ from transformers' by more than 1e-4; nothing timed")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--pos", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-bridge", action="store_true", help="skip TransformerBridge")
    args = parser.parse_args()
    torch.set_grad_enabled(False)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = OFFLINE_MODELS["smollm2-135m"]()
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    model = interp.load_model("smollm2-135m").eval()
    tokens = torch.randint(
        0, model.cfg.d_vocab, (args.batch, args.pos), generator=torch.Generator().manual_seed(0)
    )
    print(f"SmolLM2-135M, fp32, batch {args.batch} x {args.pos} tokens, {torch.get_num_threads()} threads")
    check_logits(model, hf, tokens)

    rows: dict[str, float] = {}
    rows["transformers forward (eager)"] = median_seconds(lambda: hf(tokens), args.repeats)
    rows["interp forward (no hooks)"] = median_seconds(lambda: model(tokens), args.repeats)
    rows["interp run_with_cache (all hooks)"] = median_seconds(
        lambda: model.run_with_cache(tokens), args.repeats
    )
    one = ["blocks.15.attn.hook_z"]
    rows["interp run_with_cache (1 hook)"] = median_seconds(
        lambda: model.run_with_cache(tokens, names_filter=one), args.repeats
    )
    if not args.no_bridge:
        from transformer_lens.model_bridge import TransformerBridge

        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        bridge = TransformerBridge.boot_transformers(
            "HuggingFaceTB/SmolLM2-135M", hf_model=hf, tokenizer=tokenizer
        )
        rows["TransformerBridge forward"] = median_seconds(lambda: bridge(tokens), args.repeats)
        rows["TransformerBridge run_with_cache (all)"] = median_seconds(
            lambda: bridge.run_with_cache(tokens), args.repeats
        )

    _, cache = model.run_with_cache(tokens)
    cache_bytes = sum(t.numel() * t.element_size() for t in cache.cache_dict.values())
    hf_time = rows["transformers forward (eager)"]
    print(f"\n{'':40s} {'seconds':>9s} {'x transformers':>15s}")
    for name, seconds in rows.items():
        print(f"{name:40s} {seconds:9.3f} {seconds / hf_time:15.2f}")
    print(f"\nfull cache: {len(cache)} activations, {cache_bytes / 2**20:.0f} MiB")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    print(f"peak resident memory of this process: {peak_mib:.0f} MiB")
    print("\ntargets: forward <= 1.05x transformers; full cache <= 1.3x transformers; 1-hook cache ~ forward")
    print(
        f"forward: {rows['interp forward (no hooks)'] / hf_time:.2f}x   full cache: "
        f"{rows['interp run_with_cache (all hooks)'] / hf_time:.2f}x   1-hook cache: "
        f"{rows['interp run_with_cache (1 hook)'] / rows['interp forward (no hooks)']:.2f}x forward"
    )


if __name__ == "__main__":
    keep_freed_memory()  # the allocator policy the interp command runs with
    main()
