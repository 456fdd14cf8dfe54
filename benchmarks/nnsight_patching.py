"""Activation patching of every head's output: interp vs nnsight on the same transformers model.

Run alone (two torch processes on two cores distort every figure):
    python benchmarks/nnsight_patching.py [--heads-per-trace 9] [--batch-size N] [--layers 30] [--threads 2]

SmolLM2-135M from its GGUF, loaded once by transformers (fp32); interp reads the same object
(`interp.load_model(hf_model)`) and nnsight wraps it (`nnsight.TransformersModel`). The prompts, metric and
sweep are benchmarks/patching.py's: 8 IOI prompts of 14 tokens, logit(IO) - logit(S) at the last
token, every head's z (the input of `o_proj`, one head's slice) patched from the clean run into the
corrupted run at all positions (270 patched runs). nnsight is used as its documentation teaches: one
trace saves the clean z of every layer, then each trace batches `--heads-per-trace` invokes of the
corrupted prompts, each writing one head's clean slice and saving the metric at the last token
(`logits_to_keep=1`, so the unembedding runs at that token only, as interp's `logit_pos` does).
interp batches patched runs and starts each at the patched layer from the cached corrupted run.
Both sweeps are checked equal per prompt (to 1e-4) before the times and the ratio are printed (no
peak memory: in one process the second sweep reuses the memory the first freed).
"""

from __future__ import annotations

import argparse
import os

import nnsight
import torch
import transformers
from nnsight import TransformersModel
from patching import ioi_prompts, timed  # benchmarks/patching.py

import interp
from interp import metrics
from interp.interventions.engine import RunOptions
from interp.interventions.patching import activation_patching
from interp.io.sources import OFFLINE_MODELS
from interp.runtime.memory import keep_freed_memory


def nnsight_sweep(
    lm: TransformersModel, clean: torch.Tensor, corrupted: torch.Tensor, io: torch.Tensor, s: torch.Tensor,
    heads_per_trace: int, n_layers: int,
) -> torch.Tensor:  # fmt: skip
    """[layer, head, batch] logit(IO) - logit(S) at the last token with one head's z patched."""
    config = lm.config
    n_heads = config.num_attention_heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    rows = torch.arange(clean.shape[0])
    layers = lm.model.layers
    with torch.no_grad(), lm.trace(clean):
        clean_z = nnsight.save([layers[layer].self_attn.o_proj.input for layer in range(n_layers)])
    heads = [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    values = []
    for start in range(0, len(heads), heads_per_trace):
        with torch.no_grad(), lm.trace(logits_to_keep=1) as tracer:
            chunk = list().save()
            for layer, head in heads[start : start + heads_per_trace]:
                with tracer.invoke(corrupted):
                    part = slice(head * d_head, (head + 1) * d_head)
                    layers[layer].self_attn.o_proj.input[:, :, part] = clean_z[layer][:, :, part]
                    logits = lm.lm_head.output[:, -1]
                    chunk.append(logits[rows, io] - logits[rows, s])
        values.extend(chunk)
    return torch.stack(values).view(n_layers, n_heads, -1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--heads-per-trace", type=int, default=9, help="nnsight invokes per trace")
    parser.add_argument("--batch-size", type=int, default=None, help="patched runs per forward (interp)")
    parser.add_argument("--layers", type=int, default=None, help="patch heads of the first N layers only")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    path = OFFLINE_MODELS["smollm2-135m"]()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = interp.load_model(hf, tokenizer=tokenizer).eval()
    lm = TransformersModel(hf, task="text-generation", tokenizer=tokenizer)
    clean, corrupted, io, s = ioi_prompts(model)
    n_layers = args.layers or model.cfg.n_layers
    n_heads = model.cfg.n_heads
    metric = lambda logits: metrics.logit_diff(logits, io, s)  # noqa: E731
    print(
        f"SmolLM2-135M fp32 (transformers {transformers.__version__}), {clean.shape[0]} IOI prompts x "
        f"{clean.shape[1]} tokens, {n_layers * n_heads} heads' z patched, {torch.get_num_threads()} threads"
    )

    sweep = lambda layers: activation_patching(  # noqa: E731
        model, clean, corrupted, metric, "z", layers=range(layers),
        options=RunOptions(batch_size=args.batch_size, logit_pos=-1),
    )  # fmt: skip
    sweep(1), nnsight_sweep(lm, clean, corrupted, io, s, args.heads_per_trace, 1)  # warm-up, both sides
    ours, ours_s, _ = timed(lambda: sweep(n_layers))
    theirs, theirs_s, _ = timed(
        lambda: nnsight_sweep(lm, clean, corrupted, io, s, args.heads_per_trace, n_layers)
    )
    diff = (ours.per_example()[:, :, 0] - theirs).abs().max().item()
    print(f"max |interp - nnsight| over heads and prompts = {diff:.2e}")
    if not diff < 1e-4:
        raise SystemExit("FAIL: the sweeps differ by more than 1e-4; no timing reported")
    name = f"nnsight, {args.heads_per_trace} invokes per trace"
    print(f"{'interp activation_patching (z, all pos)':42} {ours_s:8.2f} s\n{name:42} {theirs_s:8.2f} s")
    print(f"nnsight time / interp time: {theirs_s / ours_s:.2f}x (above 1: interp is faster)")


if __name__ == "__main__":
    os.environ.setdefault("TQDM_DISABLE", "1")
    keep_freed_memory()  # the allocator policy the interp command runs with
    main()
