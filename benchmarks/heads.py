"""Timing of the full head report (scores, weight evidence, causal checks) on SmolLM2-135M.

    python benchmarks/heads.py [--n-samples 16] [--threads 2]

Target: under 2 minutes after loading on a 2-core CPU. Prints the time of each stage.
"""

from __future__ import annotations

import argparse
import time

import torch

import interp
from circuits import heads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=interp.DEFAULT_MODEL)
    parser.add_argument("--n-samples", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    model = interp.load_model(args.model)
    print(f"load: {time.perf_counter() - start:.1f} s")

    stages: dict[str, float] = {}
    for name in ["probe_patterns", "copying_scores", "k_composition_scores", "induction_ablation_effects",
                 "previous_token_ablation_effects"]:  # fmt: skip
        original = getattr(heads, name)

        def timed(*a, _original=original, _name=name, **kw):
            t = time.perf_counter()
            out = _original(*a, **kw)
            stages[_name] = stages.get(_name, 0.0) + time.perf_counter() - t
            return out

        setattr(heads, name, timed)

    start = time.perf_counter()
    report = heads.head_report(model, n_samples=args.n_samples, progress=False)
    total = time.perf_counter() - start
    for name, seconds in stages.items():
        print(f"{name}: {seconds:.1f} s")
    print(f"head_report total: {total:.1f} s ({'under' if total < 120 else 'OVER'} the 120 s target)")
    for name in heads.SCORE_NAMES:
        print(f"{name}: {len(report.heads_of_type(name))} heads")
    print(f"induction candidates ablated together: {report.group_effects.get('induction')}")


if __name__ == "__main__":
    main()
