"""The hop sweep: which depths solve which number of hops (Sanford, Hsu & Telgarsky 2024 predict
depth ~ log2 K: an attention-only transformer of L layers composes up to 2^(L-2) lookups).

    python docs/results/hop_sweep.py [--depths 1,2,3] [--hops 1,2,3] [--seeds 0] [--steps 4000] [--workers 2]

Each (depth, hops, seed) trains `interp train --task hop --hops K --layers L` with the task's
defaults otherwise (one thread per run, `--workers` runs at once) and measures the answer's accuracy
on 512 held-out sequences (the eval stream, which training never draws). Writes
docs/results/data/hop-sweep.json (every run, the machine, the date, the command) and prints the
table of accuracy per depth and hops.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def train_and_score(depth: int, hops: int, seed: int, steps: int) -> dict:
    """Train one model and return its held-out accuracy (the answer is the top prediction at the query)."""
    torch.set_num_threads(1)
    from interp.training import ToyModelSettings, train_toy_model

    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        settings = ToyModelSettings(
            task="hop", n_layers=depth, n_heads=4, d_model=64, steps=steps, hops=hops, seed=seed
        )
        model, _ = train_toy_model(settings, out, checkpoint_every=0)
    from circuits.hop import hop_task_of

    task = hop_task_of(model)
    batch = task.eval_batch(512, seed)
    with torch.no_grad():
        predicted = model(batch.tokens)[:, task.query].argmax(-1)
    accuracy = (predicted == batch.tokens[:, -1]).float().mean().item()
    seconds = time.perf_counter() - began
    print(f"depth {depth} hops {hops} seed {seed}: accuracy {accuracy:.3f} ({seconds:.0f} s)", flush=True)
    return {"depth": depth, "hops": hops, "seed": seed, "steps": steps, "accuracy": accuracy,
            "chance": task.chance_of(batch.tokens), "seconds": seconds}  # fmt: skip


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what platform knows."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def table(runs: list[dict]) -> str:
    """Markdown: one row per depth, one column per number of hops, the mean accuracy over seeds."""
    depths = sorted({run["depth"] for run in runs})
    hops = sorted({run["hops"] for run in runs})
    lines = ["| layers | " + " | ".join(f"K = {k}" for k in hops) + " |", "|---" + "|---:" * len(hops) + "|"]
    for depth in depths:
        cells = []
        for k in hops:
            accuracies = [run["accuracy"] for run in runs if run["depth"] == depth and run["hops"] == k]
            cells.append(" / ".join(f"{value:.2f}" for value in accuracies))
        lines.append(f"| {depth} | " + " | ".join(cells) + " |")
    chances = {run["hops"]: run["chance"] for run in runs}
    chance = ", ".join(f"K = {k}: {chances[k]:.2f}" for k in hops)
    return "\n".join(lines) + f"\n\nChance: {chance}."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="1,2,3")
    parser.add_argument("--hops", default="1,2,3")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(HERE / "data" / "hop-sweep.json"))
    args = parser.parse_args()
    grid = [
        (depth, hops, seed, args.steps)
        for depth in map(int, args.depths.split(","))
        for hops in map(int, args.hops.split(","))
        for seed in map(int, args.seeds.split(","))
    ]
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        runs = pool.starmap(train_and_score, grid)
    record = {
        "command": "python docs/results/hop_sweep.py " + " ".join(sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "machine": f"{cpu_name()}, {multiprocessing.cpu_count()} cores",
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(table(runs))


if __name__ == "__main__":
    main()
