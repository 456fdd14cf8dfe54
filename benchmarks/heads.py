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

    def timed(name, fn, *fn_args):
        began = time.perf_counter()
        out = fn(*fn_args)
        stages[name] = time.perf_counter() - began
        return out

    # head_report's pipeline (circuits/heads/pipeline.py), one stage at a time
    probes = timed("make_probes", heads.make_probes, model, args.n_samples)
    scores = timed("score_heads", heads.score_heads, model, probes)
    weights = timed("weight_scores", heads.weight_scores, model, scores.candidates("previous_token", 12))
    effects = timed("causal_checks", heads.causal_checks, model, probes, scores)
    table = timed("classify", heads.classify, scores, weights, effects)
    total = sum(stages.values())
    for name, seconds in stages.items():
        print(f"{name}: {seconds:.1f} s")
    print(f"head_report total: {total:.1f} s ({'under' if total < 120 else 'OVER'} the 120 s target)")
    for name in heads.SCORE_NAMES:
        print(f"{name}: {int(table['types'].apply(lambda types, name=name: name in types).sum())} heads")
    print(
        f"induction candidates ablated together: {effects['induction'].all_candidates if effects else None}"
    )


if __name__ == "__main__":
    main()
