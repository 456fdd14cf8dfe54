"""Reproduce the IOI paper's circuit on GPT-2 small and compare with the heads it lists.

    python benchmarks/ioi_gpt2.py [--n-prompts 64] [--n-patching-prompts 16] [--threads 2]

Needs GPT-2 small from the Hugging Face hub (interp.load_model("gpt2")); offline it stops with a
message. Prints the circuit found, and per class the paper's heads that were found, missed, and
the extra heads found.
"""

from __future__ import annotations

import argparse
import sys

import torch

import interp
from circuits.finding import finding_report
from circuits.ioi import CLASSES, find_ioi_circuit
from circuits.sections import render_markdown
from interp.types import head_label

# Wang et al. 2022, figure 2 / section 3 (layer, head).
PAPER_CIRCUIT = {
    "name_mover": [(9, 6), (9, 9), (10, 0)],
    "negative_name_mover": [(10, 7), (11, 10)],
    "s_inhibition": [(7, 3), (7, 9), (8, 6), (8, 10)],
    "induction": [(5, 5), (5, 8), (5, 9), (6, 9)],
    "duplicate_token": [(0, 1), (0, 10), (3, 0)],
    "previous_token": [(2, 2), (4, 11)],
    "backup_name_mover": [(9, 0), (9, 7), (10, 1), (10, 2), (10, 6), (10, 10), (11, 2), (11, 9)],
}


def _names(heads) -> str:
    return ", ".join(head_label(layer, head) for layer, head in sorted(heads)) or "-"


def compare(found: dict[str, list[tuple[int, int]]]) -> list[str]:
    """One line per class: the paper's heads found, missed, and extra heads."""
    lines = []
    for cls in CLASSES:
        paper, ours = set(PAPER_CIRCUIT[cls]), set(found[cls])
        found_, missed, extra = _names(paper & ours), _names(paper - ours), _names(ours - paper)
        lines.append(f"{cls:<20} found {found_} | missed {missed} | extra {extra}")
    paper_all = {h for heads in PAPER_CIRCUIT.values() for h in heads}
    ours_all = {h for heads in found.values() for h in heads}
    lines.append(
        f"all classes: {len(paper_all & ours_all)} of the paper's {len(paper_all)} heads found, "
        f"{len(ours_all - paper_all)} extra"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description="The IOI circuit of GPT-2 small vs the paper's.")
    parser.add_argument("--n-prompts", type=int, default=64)
    parser.add_argument("--n-patching-prompts", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    try:
        model = interp.load_model("gpt2")
    except Exception as error:  # offline: transformers raises OSError, the hub client its own errors
        sys.exit(
            f"Could not load GPT-2 small from the Hugging Face hub ({type(error).__name__}: {error}).\n"
            "This script needs network access to the hub (or GPT-2 in the local Hugging Face cache)."
        )
    model.eval()
    result = find_ioi_circuit(
        model, n_prompts=args.n_prompts, seed=args.seed, n_patching_prompts=args.n_patching_prompts
    )
    print(render_markdown(finding_report(result)))
    print("\n".join(compare(result.extras.circuit)))


if __name__ == "__main__":
    main()
