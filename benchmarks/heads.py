"""Timing of the full head report (scores, weight evidence, causal checks) on SmolLM2-135M, stage by stage.

    python benchmarks/heads.py [--n-samples 16] [--threads 2] [--dtype float32] [--against REV] [--ops N]

Target: within 2.2x the exact all-heads activation-patching sweep (every head's z on 8 IOI prompts,
`benchmarks/ioi.py`'s sweep) timed in the same process, in CPU seconds of this process
(`time.process_time`: on a shared machine wall time counts the other processes' load; run with
`--threads 1` there); and under 30 s after loading on an idle 2-core CPU. Prints the time of each
stage: probes, attention scores per probe, thresholds and summaries, weights, the induction and previous-token
causal checks, classification, and the total. The sub-stages of score_heads and causal_checks are
timed from their progress callbacks (the time from a stage's first call to its last).

The work of each stage is counted too (token positions through the blocks, hooks on every block, and
the logits the unembedding computes): with the flops of one block per position (its matmuls;
attention scores are a few percent here), those of the unembedding per logit, and this process's
measured matmul rate at the MLP's shape (in the model's dtype), it prints the stage's compute floor,
the time it would take with nothing but those matmuls at that rate. `--dtype bfloat16`
loads the model in bf16 (fast only on CPUs with bf16 units) and prints the typed and confirmed heads
(stderr) to compare with fp32's.

--ops N runs the report under torch.profiler and prints the N operators that took the most time
(self time: aten::mm is the matrix products, the floor's work), after the stages.

--against REV also runs the benchmark with circuits/ as of git revision REV (in a subprocess, back to
back with this one, same arguments) and prints both profiles side by side: on a shared machine,
compare these rather than absolute seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from ioi import all_heads_sweep_seconds  # benchmarks/ioi.py

import interp
from circuits import heads
from interp.runtime.memory import keep_freed_memory

ROOT = Path(__file__).resolve().parents[1]


def block_flops(model: interp.HookedTransformer) -> int:
    """Multiply-adds x 2 of one block's matmuls per token position (q, k, v, o and the MLP)."""
    block = model.blocks[0]
    return 2 * sum(p.numel() for name, p in block.named_parameters() if p.ndim >= 2)


def matmul_rate(model: interp.HookedTransformer, rows: int = 2048) -> float:
    """This process's matmul rate (flop/s) at the MLP's shape in the model's dtype, best of five."""
    d_model, d_mlp = model.cfg.d_model, model.cfg.d_mlp
    x, w = torch.randn(rows, d_model, dtype=model.dtype), torch.randn(d_mlp, d_model, dtype=model.dtype)
    torch.nn.functional.linear(x, w)
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(10):
            torch.nn.functional.linear(x, w)
        best = min(best, (time.perf_counter() - began) / 10)
    return 2 * rows * d_model * d_mlp / best


def profile(
    model_name: str, n_samples: int, threads: int, dtype: str = "float32", ops: int = 0
) -> dict[str, float]:
    """Seconds per stage of head_report's pipeline (circuits/heads/pipeline.py), "total", and per
    stage the token positions run through blocks ("<stage> positions") and the compute floor of the
    blocks' and the unembedding's matmuls in seconds ("<stage> floor"). ops > 0: the stages run under
    torch.profiler, and the `ops` operators with the most self time are printed."""
    torch.set_num_threads(threads)
    model = interp.load_model(model_name, dtype=getattr(torch, dtype))
    stages: dict[str, float] = {}
    positions, unembed_flops = [0], [0]

    def count(module, args) -> None:
        positions[0] += args[0].shape[0] * args[0].shape[1]

    for block in model.blocks:
        block.register_forward_pre_hook(count)
    unembed = model._unembed

    def counted_unembed(x: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
        logits = unembed(x, columns)
        unembed_flops[0] += 2 * logits.numel() * model.cfg.d_model
        return logits

    model._unembed = counted_unembed  # what model(...) and model.unembed(...) call
    rate, per_position = matmul_rate(model), block_flops(model)
    spans: dict[str, list[float]] = {}

    def progress(stage: str, done: int, total: int) -> None:
        now = time.perf_counter()
        span = spans.setdefault(stage, [now, now])
        span[1] = now

    def timed(name, fn, *fn_args, **fn_kwargs):
        began, positions[0], unembed_flops[0] = time.perf_counter(), 0, 0
        out = fn(*fn_args, **fn_kwargs)
        stages[name] = time.perf_counter() - began
        if positions[0]:
            stages[f"{name} positions"] = positions[0]
            stages[f"{name} floor"] = (positions[0] * per_position + unembed_flops[0]) / rate
        return out

    def sub_stages(parent: str, began: float) -> None:
        """Split stages[parent] by the progress spans reported during it (the rest: `parent` rest)."""
        inside = 0.0
        for stage, (first, last) in spans.items():
            if first >= began:
                stages[f"  {stage}"] = last - first
                inside += last - first
        stages[f"  {parent} (rest)"] = stages[parent] - inside

    operators = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if ops else None
    began_cpu = time.process_time()
    with nullcontext() if operators is None else operators:
        probes = timed("make_probes", heads.make_probes, model, n_samples)
        began, spans = time.perf_counter(), {}
        scores = timed("score_heads", heads.score_heads, model, probes, progress=progress)
        sub_stages("score_heads", began)
        weights = timed("weight_scores", heads.weight_scores, model, scores.candidates("previous_token", 12))
        began, spans = time.perf_counter(), {}
        effects = timed("causal_checks", heads.causal_checks, model, probes, scores, progress=progress)
        sub_stages("causal_checks", began)
        table = timed("head_table", heads.head_table, scores, weights, effects)
    stages["total CPU"] = time.process_time() - began_cpu
    stages["sweep CPU"] = all_heads_sweep_seconds(model, clock=time.process_time)
    if operators is not None:
        print(operators.key_averages().table(sort_by="self_cpu_time_total", row_limit=ops))
    stages["total"] = sum(
        seconds for name, seconds in stages.items() if not name.startswith(" ") and " " not in name
    )
    stages["matmul GFLOP/s"] = rate / 1e9
    for name in heads.SCORE_NAMES:
        count = int(table["types"].apply(lambda types, name=name: name in types).sum())
        print(f"{name}: {count} heads", file=sys.stderr)
    for name in ("induction", "previous_token"):
        confirmed = table[table[f"{name}_confirmed"].fillna(False).astype(bool)]
        pairs = list(zip(confirmed["layer"], confirmed["head"], strict=True))
        print(f"{name} confirmed: {pairs}", file=sys.stderr)
    found = effects["induction"].all_candidates if effects else None
    print(f"induction candidates ablated together: {found}", file=sys.stderr)
    return stages


def profile_at(rev: str, args: argparse.Namespace) -> dict[str, float]:
    """The profile with circuits/ as of `rev` (the rest of the tree as it is), in a subprocess."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", rev, "circuits"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, str(ROOT)]))
        command = [sys.executable, __file__, "--model", args.model, "--n-samples", str(args.n_samples)]
        command += ["--threads", str(args.threads), "--dtype", args.dtype, "--json"]
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=interp.DEFAULT_MODEL)
    parser.add_argument("--n-samples", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--against", metavar="REV", help="also profile circuits/ at this git revision")
    parser.add_argument("--ops", type=int, default=0, help="print the N operators taking the most time")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one line, for --against
    args = parser.parse_args()
    keep_freed_memory()  # the allocator policy the interp command runs with

    if args.json:
        print(json.dumps(profile(args.model, args.n_samples, args.threads, args.dtype)))
        return
    profiles = {}
    if args.against:
        profiles[args.against] = profile_at(args.against, args)
    profiles["this tree"] = profile(args.model, args.n_samples, args.threads, args.dtype, args.ops)
    names = list(dict.fromkeys(name for found in profiles.values() for name in found))
    extra = [
        name for name in names if name.endswith((" positions", " floor", " CPU")) or name == "matmul GFLOP/s"
    ]
    names = [name for name in names if name not in extra and name != "total"]
    print(f"{'stage (s)':40s}" + "".join(f"{label[:12]:>14s}" for label in profiles))
    for name in [*names, "total", *extra]:
        digits = 0 if name.endswith("positions") else 1
        cells = "".join(f"{found.get(name, float('nan')):14.{digits}f}" for found in profiles.values())
        print(f"{name:40s}{cells}")
    this = profiles["this tree"]
    total = this["total"]
    floor = sum(seconds for name, seconds in this.items() if name.endswith(" floor"))
    verdict = "under" if total <= 30 else "OVER"
    print(f"head_report total ({args.dtype}): {total:.1f} s ({verdict} the 30 s target)")
    ratio = this["total CPU"] / this["sweep CPU"]
    verdict = "met" if ratio <= 2.2 else "NOT met"
    print(
        f"interp heads / all-heads sweep (CPU time, {args.threads} thread(s)): {ratio:.2f}x "
        f"(target <= 2.2x: {verdict})"
    )
    print(
        f"compute floor of the matmuls (blocks and unembedding) at {this['matmul GFLOP/s']:.0f} GFLOP/s: "
        f"{floor:.1f} s "
        f"(the causal checks: {this.get('causal_checks floor', float('nan')):.1f} s)"
    )


if __name__ == "__main__":
    main()
