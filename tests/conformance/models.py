"""The offline stand-ins for the hub models TransformerLens's tests load.

`SMOLLM2` is the offline pretrained model. `tiny(kind)` is the directory of a small random checkpoint
with SmolLM2's tokenizer, written once per process, used where the assertions hold for any model of
the shape the test assumes:
- "gpt2": 2 layers of 8 heads, LayerNorm, learned positions, GELU MLPs (for SoLU and TinyStories);
- "solu-1l": 1 layer of 8 heads with a SoLU MLP (solu-1l, where a test reads its hooks);
- "gpt2-small": the same with GPT-2 small's 12 layers; "opt": 12 layers with ReLU MLPs (OPT);
- "attn-only": 2 layers without MLPs; "pythia": 6 layers, rotary, parallel residual (Pythia-14m);
- "qwen2": 2 layers of grouped-query attention (2 key/value heads), RMSNorm, rotary, gated SiLU MLPs.
`tokenizer_path()` is SmolLM2's tokenizer directory, for `AutoTokenizer.from_pretrained`; `hf_gpt2()` a
random `transformers` GPT-2 directory, for tests that compare with transformers' modules.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import torch

import interp

SMOLLM2 = "smollm2-135m"

_KINDS = {
    "gpt2": dict(n_layers=2, d_model=64, n_heads=8, activation="gelu_new"),
    "solu-1l": dict(n_layers=1, d_model=64, n_heads=8, activation="solu_ln"),
    "gpt2-small": dict(n_layers=12, d_model=64, n_heads=4, activation="gelu_new"),
    "opt": dict(n_layers=12, d_model=64, n_heads=4, activation="relu"),
    "attn-only": dict(n_layers=2, d_model=64, n_heads=4, attn_only=True),
    "qwen2": dict(
        n_layers=2,
        d_model=64,
        n_heads=4,
        n_kv_heads=2,
        normalization="rmsnorm",
        positional="rotary",
        gated_mlp=True,
        activation="silu",
    ),
    "pythia": dict(n_layers=6, d_model=64, n_heads=4, positional="rotary", parallel_residual=True),
}


@functools.cache
def _smollm2_tokenizer():
    return interp.load_model(SMOLLM2).tokenizer


@functools.cache
def tokenizer_path() -> str:
    directory = Path(tempfile.gettempdir()) / "interp-conformance" / "smollm2-tokenizer"
    if not all((directory / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        _smollm2_tokenizer().save_pretrained(directory)
    return str(directory)


@functools.cache
def tiny(kind: str = "gpt2") -> str:
    """The directory of a random checkpoint of `kind` (a name from_pretrained takes), the same path in
    every process so that test ids name it alike; written unless it already holds this config (so
    that runs side by side do not replace it under each other)."""
    tokenizer = _smollm2_tokenizer()
    cfg = interp.Config(
        d_vocab=len(tokenizer),
        n_ctx=512,
        bos_token_id=tokenizer.bos_token_id,
        model_name=f"tiny-{kind}",
        **_KINDS[kind],
    )
    directory = Path(tempfile.gettempdir()) / "interp-conformance" / f"tiny-{kind}"
    config_file = directory / "config.json"
    if config_file.is_file() and json.loads(config_file.read_text()).get("config") == cfg.to_dict():
        return str(directory)
    torch.manual_seed(0)
    return str(interp.HookedTransformer(cfg, tokenizer).save(directory))


@functools.cache
def hf_gpt2() -> str:
    """The directory of a random 2-layer `transformers` GPT-2 with SmolLM2's tokenizer (for tests that
    compare with transformers' own modules), written once like `tiny`."""
    import transformers

    directory = Path(tempfile.gettempdir()) / "interp-conformance" / "hf-gpt2"
    if not (directory / "model.safetensors").is_file():
        tokenizer = _smollm2_tokenizer()
        config = transformers.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, n_positions=512, vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        )  # fmt: skip
        torch.manual_seed(0)
        transformers.GPT2LMHeadModel(config).save_pretrained(directory)
        tokenizer.save_pretrained(directory)
    return str(directory)
