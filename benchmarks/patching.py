"""Activation patching speed: interp vs TransformerLens's patching on a TransformerBridge.

Run alone (two torch processes on two cores distort every figure):
    python benchmarks/patching.py [--no-tl] [--batch-size N]

SmolLM2-135M, 8 IOI prompts of 14 tokens ("When Mary and John went to the store, John gave a drink
to"; corrupted: the two names swapped, so the answer flips), metric: logit(IO) - logit(S) at the
last token. Times, side by side in one process: the patching of every head's output (hook_z,
all positions; 270 heads) by interp (batched, each run starting at the patched layer) and by
transformer_lens.patching.get_act_patch_attn_head_out_all_pos (one full forward per head); every
head's output at the last position only (interp: the blocks after the patched one at that
position, attending to the target's keys and values; TransformerLens: generic_activation_patch with
layer_pos_head_vector_patch_setter, one full forward per head); and interp's attribution patching
of every head. Before timing, checks the heads of the first and last
layers patched by both against each other (to 1e-4); after, the whole sweeps; it exits with an error
where they differ more. With --no-tl no reference check runs. Prints timings, ratios, and the peak
extra memory (RSS) of each.
"""

from __future__ import annotations

import argparse
import functools
import os
import threading
import time
from collections.abc import Callable

import torch

import interp
from interp import metrics
from interp.interventions.engine import RunOptions
from interp.interventions.patching import activation_patching, attribution_patching, compare_to_exact
from interp.io.sources import OFFLINE_MODELS
from interp.runtime.memory import keep_freed_memory

PAIRS = [("Mary", "John"), ("Tom", "James"), ("Anna", "Paul"), ("Sarah", "David"),
         ("Lisa", "Mark"), ("Emma", "Peter"), ("Kate", "Michael"), ("Laura", "Daniel")]  # fmt: skip
CLEAN = "When {io} and {s} went to the store, {s} gave a drink to"
CORRUPTED = "When {s} and {io} went to the store, {io} gave a drink to"  # the names swapped: answer flips


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def timed(fn: Callable[[], object]) -> tuple[object, float, int]:
    """(result, seconds, peak RSS above the starting RSS in bytes), RSS sampled every 5 ms."""
    start_rss, peak, done = rss_bytes(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    return result, seconds, max(peak[0], rss_bytes()) - start_rss


def ioi_prompts(
    model: interp.HookedTransformer,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(clean, corrupted, io, s): tokens [8, 14] and answer ids [8]."""
    clean = model.to_tokens([CLEAN.format(io=io, s=s) for io, s in PAIRS])
    corrupted = model.to_tokens([CORRUPTED.format(io=io, s=s) for io, s in PAIRS])
    io = torch.tensor([model.to_single_token(f" {io}") for io, _ in PAIRS])
    s = torch.tensor([model.to_single_token(f" {s}") for _, s in PAIRS])
    if clean.shape != (8, 14) or clean.shape != corrupted.shape:
        raise ValueError(
            f"expected 8 prompts of 14 tokens, got {tuple(clean.shape)} and {tuple(corrupted.shape)}"
        )
    return clean, corrupted, io, s


WIDTH = 52


def print_row(name: str, seconds: float, memory: int) -> None:
    print(f"{name:{WIDTH}}  {seconds:8.2f}  {memory / 2**20:8.0f}", flush=True)


def check_against_tl(model, bridge, clean, corrupted, clean_cache, metric) -> None:
    """The heads of the first and last layers patched by interp and by TransformerLens, to 1e-4, or
    SystemExit (untimed: runs before any timing)."""
    import pandas as pd
    from transformer_lens.patching import generic_activation_patch, layer_head_vector_patch_setter

    layers = [0, model.cfg.n_layers - 1]
    cells = pd.DataFrame([(layer, head) for layer in layers for head in range(model.cfg.n_heads)],
                         columns=["layer", "head"])  # fmt: skip
    ours = activation_patching(model, clean, corrupted, metric, "z", layers=layers,
                               options=RunOptions(logit_pos=-1))  # fmt: skip
    with torch.no_grad():
        theirs = generic_activation_patch(bridge, corrupted, clean_cache, lambda lg: metric(lg).mean(),
                                          layer_head_vector_patch_setter, "z", index_df=cells)  # fmt: skip
    diff = (ours.mean()[..., 0].flatten() - theirs.float().flatten()).abs().max().item()
    print(f"check before timing, layers {layers}: max |interp - TransformerLens| = {diff:.2e}")
    if not diff < 1e-4:
        raise SystemExit("FAIL: interp and TransformerLens differ by more than 1e-4; nothing timed")


def tl_at_position(bridge, corrupted, clean_cache, metric, pos: int) -> torch.Tensor:
    """TransformerLens's patch of every head's z at position `pos` alone: [layer * head]."""
    import pandas as pd
    from transformer_lens.patching import generic_activation_patch, layer_pos_head_vector_patch_setter

    cfg = bridge.cfg
    cells = pd.DataFrame([(layer, pos, head) for layer in range(cfg.n_layers) for head in range(cfg.n_heads)],
                         columns=["layer", "pos", "head"])  # fmt: skip
    with torch.no_grad():
        return generic_activation_patch(bridge, corrupted, clean_cache, lambda lg: metric(lg).mean(),
                                        layer_pos_head_vector_patch_setter, "z", index_df=cells)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--no-tl", action="store_true", help="skip TransformerLens's sweep (about 73 s)")
    parser.add_argument("--batch-size", type=int, default=None, help="patched runs per forward (interp)")
    args = parser.parse_args()

    model = interp.load_model("smollm2-135m").eval()
    clean, corrupted, io, s = ioi_prompts(model)
    metric = lambda logits: metrics.logit_diff(logits, io, s)  # noqa: E731
    with torch.no_grad():
        clean_ld, corrupted_ld = metric(model(clean)).mean(), metric(model(corrupted)).mean()
    n_heads = model.cfg.n_layers * model.cfg.n_heads
    threads = torch.get_num_threads()
    print(f"SmolLM2-135M fp32, {clean.shape[0]} IOI prompts x {clean.shape[1]} tokens, {threads} threads")
    print(f"logit diff: clean {clean_ld:.3f}, corrupted {corrupted_ld:.3f}; {n_heads} heads\n")

    if args.no_tl:
        print("--no-tl: no reference check runs (interp's sweeps are timed unchecked)\n")
    else:
        import transformer_lens.patching as tl_patching
        from transformer_lens.model_bridge import TransformerBridge
        from transformers import AutoModelForCausalLM

        tl_patching.tqdm = functools.partial(tl_patching.tqdm, disable=True)  # its progress bars

        path = OFFLINE_MODELS["smollm2-135m"]()
        hf = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        bridge = TransformerBridge.boot_transformers(
            "HuggingFaceTB/SmolLM2-135M", hf_model=hf, tokenizer=model.tokenizer
        )
        bridge.eval()
        with torch.no_grad():
            _, clean_cache = bridge.run_with_cache(clean)  # outside TransformerLens's timing
        check_against_tl(model, bridge, clean, corrupted, clean_cache, metric)
        print()

    print(f"{'':{WIDTH}}  {'seconds':>8}  {'peak MiB':>8}")
    ours, ours_s, ours_mem = timed(
        lambda: activation_patching(
            model, clean, corrupted, metric, "z", options=RunOptions(batch_size=args.batch_size, logit_pos=-1)
        )
    )
    print_row("interp activation_patching (z, all pos)", ours_s, ours_mem)
    last = clean.shape[1] - 1
    at_last, last_s, last_mem = timed(
        lambda: activation_patching(
            model,
            clean,
            corrupted,
            metric,
            "z",
            positions=[last],
            options=RunOptions(batch_size=args.batch_size, logit_pos=-1),
        )  # fmt: skip
    )
    print_row("interp activation_patching (z, last pos)", last_s, last_mem)
    attribution, attr_s, attr_mem = timed(
        lambda: attribution_patching(model, clean, corrupted, metric, "z", options=RunOptions(logit_pos=-1))
    )
    print_row("interp attribution_patching (z, all pos)", attr_s, attr_mem)
    tl_values = None
    if not args.no_tl:
        from transformer_lens.patching import get_act_patch_attn_head_out_all_pos

        def tl_sweep():
            with torch.no_grad():  # interp's engine runs without autograd; so must the reference
                return get_act_patch_attn_head_out_all_pos(
                    bridge, corrupted, clean_cache, lambda lg: metric(lg).mean()
                )

        tl_values, tl_s, tl_mem = timed(tl_sweep)
        print_row("TransformerLens get_act_patch_attn_head_out_all_pos", tl_s, tl_mem)
        tl_last, tl_last_s, tl_last_mem = timed(
            lambda: tl_at_position(bridge, corrupted, clean_cache, metric, last)
        )
        print_row("TransformerLens layer_pos_head_vector (last pos)", tl_last_s, tl_last_mem)
    print()
    exact = ours.mean()[..., 0]  # [layer, head]
    if tl_values is not None:
        diff = (exact - tl_values.float()).abs().max().item()
        print(
            f"max |interp - TransformerLens| = {diff:.2e}  ({'OK' if diff < 1e-4 else 'FAIL'}, target < 1e-4)"
        )
        if not diff < 1e-4:
            raise SystemExit("FAIL: the sweeps differ by more than 1e-4")
        print(f"speed-up vs TransformerLens: {tl_s / ours_s:.1f}x (target >= 2x)")
        diff = (at_last.mean()[..., 0].flatten() - tl_last.float().flatten()).abs().max().item()
        print(
            f"last position: max |interp - TransformerLens| = {diff:.2e}  ({'OK' if diff < 1e-4 else 'FAIL'})"
        )
        if not diff < 1e-4:
            raise SystemExit("FAIL: the last-position sweeps differ by more than 1e-4")
        print(f"last position: speed-up vs TransformerLens: {tl_last_s / last_s:.1f}x")
        print(f"attribution vs TransformerLens's exact sweep: {tl_s / attr_s:.0f}x faster")
    print(f"attribution vs interp's exact sweep: {ours_s / attr_s:.0f}x faster (target >= 50x)")
    correlation = compare_to_exact(attribution, ours).attrs["correlation"]
    print(f"correlation of attribution with exact patching: {correlation:.3f}")


if __name__ == "__main__":
    keep_freed_memory()  # the allocator policy the interp command runs with
    main()
