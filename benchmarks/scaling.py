"""How EAP-IG and the exact all-heads patching sweep scale with prompts and with model size.

Run alone (two torch processes on two cores distort every figure):
    python benchmarks/scaling.py [--prompts 16,32,64,128,256] [--sizes 512x8,...,2048x20]
                                 [--size-prompts 4] [--methods eap-ig,patching] [--threads 2] [--quick]

(a) Prompts: SmolLM2-135M on `--prompts` IOI prompts. (b) Size: random-weight Llama models
(`transformers.LlamaConfig`, `--sizes` as d_model x layers: heads of 64 dims, grouped-query attention with
at most a third as many key/value heads, MLP 8/3 d_model, SmolLM2's tokenizer and tied embeddings, so
2048x20 is about 1B parameters) loaded through `interp.load_model`, on `--size-prompts` IOI prompts.
Methods, through the public API with its defaults: EAP-IG (`interp.edges.edge_attribution`, scoring
every edge against the ABC prompts) and the exact sweep of every head's z at all positions
(`activation_patching(..., "z")`, logit(IO) - logit(S) at END, as benchmarks/ioi.py).
Each point runs in a fresh process: the time of the call, and the peak resident memory above the
resident memory after loading the model and one warm-up forward (sampled every 5 ms, as
benchmarks/patching.py). Prints a table, a text curve and the log-log slope of each series (time ~
x^slope; 1 means cost linear in prompts or parameters). `--quick`: 8,16,32 prompts and sizes
256x4,384x6,512x8 on 2 prompts, to check the script runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import subprocess
import sys

import numpy as np
import torch
import transformers
from patching import rss_bytes, timed  # benchmarks/patching.py

import interp
from circuits.edge_circuits import ioi_task
from interp import edges, metrics
from interp.interventions.engine import RunOptions
from interp.interventions.patching import activation_patching
from interp.io.sources import OFFLINE_MODELS
from interp.runtime.memory import keep_freed_memory
from interp.tasks.ioi import make_ioi_dataset

PROMPTS = "16,32,64,128,256"
SIZES = "512x8,768x12,1024x16,1536x20,2048x20"
QUICK = {"prompts": "8,16,32", "sizes": "256x4,384x6,512x8", "size_prompts": 2}


def smollm2_tokenizer() -> transformers.PreTrainedTokenizerBase:
    path = OFFLINE_MODELS["smollm2-135m"]()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def key_value_heads(n_heads: int) -> int:
    """The most key/value heads that divide `n_heads` and are at most a third of them (SmolLM2's ratio)."""
    return max(k for k in range(1, n_heads + 1) if n_heads % k == 0 and 3 * k <= max(n_heads, 3))


def random_llama(size: str) -> interp.HookedTransformer:
    """A random-weight Llama of shape `size` ("d_model x layers") with SmolLM2's tokenizer."""
    d_model, n_layers = (int(part) for part in size.split("x"))
    n_heads = d_model // 64
    tokenizer = smollm2_tokenizer()
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=d_model, intermediate_size=8 * d_model // 3,
        num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=key_value_heads(n_heads),
        max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = interp.load_model(transformers.LlamaForCausalLM(config).eval(), tokenizer=tokenizer)
    gc.collect()
    return model


def run_point(method: str, size: str, n_prompts: int, threads: int) -> dict:
    """One measurement (in a fresh process): seconds, peak extra RSS, parameters."""
    torch.set_num_threads(threads)
    model = (interp.load_model(interp.DEFAULT_MODEL) if size == "smollm2" else random_llama(size)).eval()
    if method == "eap-ig":
        task = ioi_task(model, n_prompts)
        call = lambda: edges.edge_attribution(model, task.clean, task.corrupted, task.metric)  # noqa: E731
        tokens = task.clean
    else:
        clean, corrupted, _ = make_ioi_dataset(model, n_prompts, seed=0)
        end = clean.positions["END"]
        metric = lambda logits: metrics.logit_diff(logits, clean.io_token, clean.s_token, pos=end)  # noqa: E731
        call = lambda: activation_patching(  # noqa: E731
            model, clean.tokens, corrupted.tokens, metric, "z", options=RunOptions(logit_pos=end)
        )
        tokens = clean.tokens
    with torch.no_grad():
        model(tokens[:1])
    loaded = rss_bytes()
    _, seconds, peak = timed(call)
    return {
        "seconds": seconds, "peak_mib": peak / 2**20, "loaded_mib": loaded / 2**20,
        "parameters": interp.parameter_count(model), "tokens": tokens.shape[1],
    }  # fmt: skip


def measure(method: str, size: str, n_prompts: int, threads: int) -> dict | None:
    child = [
        sys.executable,
        __file__,
        "--point",
        json.dumps([method, size, n_prompts]),
        "--threads",
        str(threads),
    ]
    done = subprocess.run(child, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"  {method} {size} {n_prompts} prompts FAILED:\n{done.stderr[-2000:]}", flush=True)
        return None
    point = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  {method} {size} {n_prompts} prompts: {point['seconds']:.2f} s", flush=True)
    return point


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0]) if len(xs) > 1 else math.nan


def report(title: str, header: str, x_label: str, rows: list[tuple[str, float, dict]]) -> None:
    """Table, text curve (bars on a log scale) and log-log slopes of one series: (name, x, point)."""
    print(f"\n{title}; peak MiB: resident memory above `loaded`, the model's after a warm-up forward")
    print(f"{header:>12} {'params':>8} {'seconds':>9} {'peak MiB':>9} {'loaded MiB':>11}")
    for name, _, point in rows:
        millions, seconds, peak = point["parameters"] / 1e6, point["seconds"], point["peak_mib"]
        print(f"{name:>12} {millions:7.0f}M {seconds:9.2f} {peak:9.0f} {point['loaded_mib']:11.0f}")
    for key, unit in (("seconds", "s"), ("peak_mib", "MiB")):
        values = [max(point[key], 1e-3) for _, _, point in rows]
        low, high = min(values), max(values)
        span = math.log(high / low) if high > low else 1.0
        print(f"  {key} (log scale, {low:.3g} .. {high:.3g} {unit})")
        for (name, _, _), value in zip(rows, values, strict=True):
            print(f"  {name:>12} |{'#' * (1 + round(40 * math.log(value / low) / span))} {value:.3g}")
    xs = [x for _, x, _ in rows]
    time_slope = slope(xs, [point["seconds"] for _, _, point in rows])
    memory_slope = slope(xs, [max(point["peak_mib"], 1e-3) for _, _, point in rows])
    print(
        f"  log-log slope vs {x_label}: time {time_slope:.2f}, peak memory {memory_slope:.2f} (1 = linear)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", default=PROMPTS, help="SmolLM2 prompt counts; '' skips (a)")
    parser.add_argument("--sizes", default=SIZES, help="random Llama d_model x layers; '' skips (b)")
    parser.add_argument("--size-prompts", type=int, default=4, help="prompts at each model size")
    parser.add_argument("--methods", default="eap-ig,patching")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="small ranges, to check the script runs")
    parser.add_argument("--point", help=argparse.SUPPRESS)  # one measurement, in a child process
    args = parser.parse_args()
    if args.point:
        print(json.dumps(run_point(*json.loads(args.point), args.threads)))
        return
    if args.quick:
        args.prompts, args.sizes, args.size_prompts = QUICK["prompts"], QUICK["sizes"], QUICK["size_prompts"]
    prompts = [int(n) for n in args.prompts.split(",") if n]
    sizes = [size for size in args.sizes.split(",") if size]
    for method in args.methods.split(","):
        if method not in ("eap-ig", "patching"):
            raise SystemExit(f"unknown method {method!r}: eap-ig or patching")
        name = "EAP-IG (edge_attribution defaults)" if method == "eap-ig" else "exact all-heads z sweep"
        if prompts:
            rows = [(str(n), n, measure(method, "smollm2", n, args.threads)) for n in prompts]
            rows = [row for row in rows if row[2]]
            report(f"{name}, SmolLM2-135M, {args.threads} threads", "prompts", "prompts", rows)
        if sizes:
            rows = [(size, 0, measure(method, size, args.size_prompts, args.threads)) for size in sizes]
            rows = [(size, point["parameters"], point) for size, _, point in rows if point]
            report(
                f"{name}, random Llama, {args.size_prompts} prompts, {args.threads} threads",
                "d x layers",
                "parameters",
                rows,
            )


if __name__ == "__main__":
    keep_freed_memory()  # the allocator policy the interp command runs with
    main()
