"""The default commands' work on an accelerator, in float32 and bfloat16: time and what each finds.

    python benchmarks/devices.py [--device cuda] [--dtypes float32,bfloat16] [--json out.json]

For each dtype, on `--device` (default: `interp.default_device()`): the forward pass against
transformers (eager, same device and dtype, 32 x 64 random tokens), the exact all-heads sweep
(`benchmarks/ioi.py`'s), the head report (`interp heads`), the IOI circuit (`interp ioi`) and the edge
circuit (`interp circuit --task ioi --edges 300`: no faithfulness curve, as the command runs without
--curve), each in wall seconds with the device synchronised, and its ratio to the sweep (timed after
one untimed warm-up sweep). Then what each dtype finds beside float32's: the confirmed head types, the
IOI classes, the edge circuit's held-out faithfulness. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from ioi import all_heads_sweep_seconds  # benchmarks/ioi.py

import interp
from circuits.edge_circuits import EdgeCircuitSettings, find_edge_circuit
from circuits.edge_circuits.tasks import heldout_edge_task, ioi_task
from circuits.heads import head_report
from circuits.heads.results import confirmed_rows
from circuits.ioi import find_ioi_circuit
from interp.io.sources import OFFLINE_MODELS


def synchronised_clock(device: torch.device) -> Callable[[], float]:
    """Wall seconds, read after the device has finished the work queued so far."""

    def clock() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    return clock


def timed(clock: Callable[[], float], label: str, fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of `fn()`, printed as soon as it is known."""
    began = clock()
    result = fn()
    seconds = clock() - began
    print(f"  {label:<28} {seconds:9.3f} s", flush=True)
    return seconds, result


def forward_seconds(model, hf, clock: Callable[[], float], repeats: int = 5) -> dict[str, float]:
    """Median seconds of one forward pass of interp and of transformers on the same tokens."""
    tokens = torch.randint(0, model.cfg.d_vocab, (32, 64), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(model.device)
    medians = {}
    for name, fn in (("transformers forward", lambda: hf(tokens)), ("interp forward", lambda: model(tokens))):
        with torch.no_grad():
            fn()
            runs = []
            for _ in range(repeats):
                began = clock()
                fn()
                runs.append(clock() - began)
            medians[name] = statistics.median(runs)
            print(f"  {name:<28} {medians[name]:9.3f} s (median of {repeats})", flush=True)
    return medians


def findings(model, clock: Callable[[], float], n_edges: int) -> tuple[dict[str, float], dict[str, Any]]:
    """Seconds of each command's work and what it found."""
    seconds, found = {}, {}
    all_heads_sweep_seconds(model, clock=clock)  # warm-up: the timed sweep is every ratio's denominator
    seconds["all-heads sweep"] = all_heads_sweep_seconds(model, clock=clock)
    print(f"  {'all-heads sweep':<28} {seconds['all-heads sweep']:9.3f} s", flush=True)
    seconds["interp heads"], report = timed(clock, "interp heads", lambda: head_report(model))
    confirmed = confirmed_rows(report.extras.rows(report)).to_dict("records")
    found["confirmed heads"] = {f"L{row['layer']}H{row['head']}": list(row["types"]) for row in confirmed}
    seconds["interp ioi"], ioi = timed(clock, "interp ioi", lambda: find_ioi_circuit(model))
    found["ioi classes"] = {
        name: [f"L{h.layer}H{h.head}" for h in hs] for name, hs in ioi.extras.class_heads.items()
    }
    task, heldout = ioi_task(model, 64, 0), heldout_edge_task(model, "ioi", 64, 0)
    settings = EdgeCircuitSettings(n_edges=n_edges, curve_fractions=None)  # the command's: no --curve
    seconds["interp circuit"], circuit = timed(
        clock, "interp circuit", lambda: find_edge_circuit(model, task, settings, heldout=heldout)
    )
    out = circuit.json_data()["circuit"]
    found["edge circuit held-out faithfulness"] = [out["faithfulness"], *out["faithfulness_ci"]]
    return seconds, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="default: interp.default_device()")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--edges", type=int, default=300)
    parser.add_argument("--json", help="also write every figure here")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    device = torch.device(args.device) if args.device else interp.default_device()
    clock = synchronised_clock(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {name}; torch {torch.__version__}")
    path = OFFLINE_MODELS["smollm2-135m"]()
    results: dict[str, Any] = {"device": name, "torch": torch.__version__, "dtypes": {}}
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        print(f"{dtype_name}:", flush=True)
        model = interp.load_model("smollm2-135m", device=device, dtype=dtype).eval()
        hf = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype, attn_implementation="eager"
        )
        hf = hf.to(device).eval()
        seconds = forward_seconds(model, hf, clock)
        del hf
        work, found = findings(model, clock, args.edges)
        seconds |= work
        results["dtypes"][dtype_name] = {"seconds": seconds, "found": found}
        sweep = seconds["all-heads sweep"]
        print(f"\n{dtype_name}, summary: {'seconds':>9} {'x sweep':>8}")
        for stage, value in seconds.items():
            ratio = f"{value / sweep:8.2f}" if "forward" not in stage else ""
            print(f"  {stage:<28} {value:9.3f} {ratio}")
        print(
            f"  interp forward / transformers forward: "
            f"{seconds['interp forward'] / seconds['transformers forward']:.2f}x"
        )
        print(f"  found: {json.dumps(found)}")
    reference = results["dtypes"].get("float32")
    for dtype_name, result in results["dtypes"].items():
        if reference is None or dtype_name == "float32":
            continue
        for key, value in result["found"].items():
            same = value == reference["found"][key]
            print(f"{dtype_name} vs float32, {key}: {'same' if same else 'DIFFERENT'}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(results, file, indent=2)


if __name__ == "__main__":
    main()
