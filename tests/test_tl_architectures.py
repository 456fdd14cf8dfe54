"""TransformerLens's edge architectures: shortformer positions and bidirectional attention.

The reference is TransformerLens's definition written out in plain torch (`_reference`): shortformer
positions W_pos[p] are added to each block's query and key inputs after ln1, not to its value input
and not to the residual stream (TL's `TransformerBlock.forward`, `shortformer_pos_embed`);
bidirectional attention masks nothing (TL's `attention_dir="bidirectional"`). Weights are read
through TransformerLens's parameter names (`tl_parameters`).
"""

from __future__ import annotations

import math

import pytest
import tokenizers
import torch
import transformers

import interp
from interp.interventions.engine import Intervention, Site, cached_run, run_site_sets, start_names

ATOL = 1e-4


def _model(seed: int = 0, **overrides) -> interp.HookedTransformer:
    """A small random model with non-trivial norms and biases, so a wrong wiring cannot hide."""
    values = dict(n_layers=2, d_model=32, n_heads=4, d_vocab=23, n_ctx=16, init_std=0.15)
    model = interp.HookedTransformer(interp.Config(**{**values, **overrides}))
    model.init_weights(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            last = name.split(".")[-1]
            if last in ("w", "b") or last.startswith("b_"):
                param.add_(torch.randn(param.shape, generator=generator) * 0.1)
    return model.eval()


def _layer_norm(x: torch.Tensor, params: dict, name: str, eps: float) -> torch.Tensor:
    if f"{name}.w" not in params:  # normalization None
        return x
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * params[f"{name}.w"] + params[f"{name}.b"]


@torch.no_grad()
def _reference(model: interp.HookedTransformer, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """TransformerLens's forward pass in plain torch: (logits, {hook name: activation})."""
    cfg, params = model.cfg, model.tl_parameters()
    shortformer = cfg.positional_embedding_type == "shortformer"
    n_pos = tokens.shape[1]
    acts = {"hook_embed": params["embed.W_E"][tokens]}
    x = acts["hook_embed"]
    if cfg.positional_embedding_type in ("standard", "shortformer"):
        acts["hook_pos_embed"] = params["pos_embed.W_pos"][:n_pos].expand_as(x)
        if not shortformer:
            x = x + acts["hook_pos_embed"]
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}"
        acts[f"{p}.hook_resid_pre"] = x
        normed = _layer_norm(x, params, f"{p}.ln1", cfg.eps)
        positioned = normed + acts["hook_pos_embed"] if shortformer else normed
        q = torch.einsum("bpd,hde->bphe", positioned, params[f"{p}.attn.W_Q"]) + params[f"{p}.attn.b_Q"]
        k = torch.einsum("bpd,hde->bphe", positioned, params[f"{p}.attn.W_K"]) + params[f"{p}.attn.b_K"]
        v = torch.einsum("bpd,hde->bphe", normed, params[f"{p}.attn.W_V"]) + params[f"{p}.attn.b_V"]
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(cfg.d_head)
        if cfg.attention_dir == "causal":
            scores = scores.masked_fill(~torch.ones(n_pos, n_pos).bool().tril(), float("-inf"))
        pattern = scores.softmax(-1)
        z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
        attn_out = torch.einsum("bqhe,hed->bqd", z, params[f"{p}.attn.W_O"]) + params[f"{p}.attn.b_O"]
        acts.update({f"{p}.attn.hook_{n}": a for n, a in zip("qkvz", (q, k, v, z), strict=True)})
        acts[f"{p}.attn.hook_pattern"] = pattern
        x = x + attn_out
        if not cfg.attn_only:
            pre = (
                _layer_norm(x, params, f"{p}.ln2", cfg.eps) @ params[f"{p}.mlp.W_in"]
                + params[f"{p}.mlp.b_in"]
            )
            x = x + torch.nn.functional.gelu(pre, approximate="tanh") @ params[f"{p}.mlp.W_out"]
            x = x + params[f"{p}.mlp.b_out"]
        acts[f"{p}.hook_resid_post"] = x
    logits = _layer_norm(x, params, "ln_final", cfg.eps) @ params["unembed.W_U"]
    return (logits + params["unembed.b_U"] if "unembed.b_U" in params else logits), acts


def _assert_equal_to_reference(model: interp.HookedTransformer, tokens: torch.Tensor) -> None:
    expected, expected_acts = _reference(model, tokens)
    logits, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(model(tokens), expected, atol=ATOL, rtol=0)  # fused attention
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)
    for name, value in expected_acts.items():
        torch.testing.assert_close(cache[name], value, atol=ATOL, rtol=0, msg=name)


SHORTFORMER = {
    "layernorm-mlp": dict(positional="shortformer"),
    "attn-only-no-norm": dict(positional="shortformer", attn_only=True, normalization="none"),
}


@pytest.mark.parametrize("arch", SHORTFORMER)
@pytest.mark.parametrize("per_head_inputs", [False, True])
def test_shortformer_forward_and_cache_equal_the_definition(arch: str, per_head_inputs: bool) -> None:
    """Logits, hook_pos_embed, resid_pre (which holds no positions), q, k (positions in) and v (none),
    the pattern and z equal TransformerLens's definition; so does the run with per-head inputs."""
    model = _model(**SHORTFORMER[arch])
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 9), generator=torch.Generator().manual_seed(1))
    with model.settings(use_split_qkv_input=per_head_inputs, use_attn_result=per_head_inputs):
        _assert_equal_to_reference(model, tokens)
    assert model.cfg.positional_embedding_type == "shortformer"
    with pytest.raises(ValueError, match="pos_embed"):  # TransformerLens code that omits them fails loudly
        model(torch.zeros(3, 9, model.cfg.d_model), start_at_layer=0)


def test_shortformer_runs_from_the_embedding_left_padding_and_kv_cache_equal_the_full_run() -> None:
    model = _model(positional="shortformer")
    tokens = torch.randint(1, model.cfg.d_vocab, (2, 8), generator=torch.Generator().manual_seed(2))
    full = model(tokens)
    residual, _, pos_embed, mask = model.input_to_embed(tokens)
    assert mask is None and pos_embed.shape == residual.shape
    torch.testing.assert_close(model(residual, start_at_layer=0, shortformer_pos_embed=pos_embed), full)
    resid_1 = model.run_with_cache(tokens, names_filter="blocks.1.hook_resid_pre")[1][
        "blocks.1.hook_resid_pre"
    ]
    torch.testing.assert_close(model(resid_1, start_at_layer=1, shortformer_pos_embed=pos_embed), full)
    # A left-padded prompt gives the logits it gives alone (positions from its first real token).
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), tokens[:1, :5]], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    torch.testing.assert_close(
        model(padded, attention_mask=mask)[:, 3:], model(tokens[:1, :5]), atol=ATOL, rtol=0
    )
    # Keys cached with their positions: the KV cache continues the run.
    cache = interp.HookedTransformerKeyValueCache.init_cache(model.cfg, model.device, 2)
    model(tokens[:, :5], past_kv_cache=cache)
    torch.testing.assert_close(model(tokens[:, 5:], past_kv_cache=cache), full[:, 5:], atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="ln1"):
        interp.model.weights.process_weights(model, fold_ln=True)


def test_bidirectional_attention_equals_the_non_causal_definition_and_sees_later_tokens() -> None:
    model = _model(causal=False)
    assert model.cfg.attention_dir == "bidirectional"
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 9), generator=torch.Generator().manual_seed(3))
    _assert_equal_to_reference(model, tokens)
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % model.cfg.d_vocab
    with torch.no_grad():  # a later token changes position 0
        assert float((model(changed)[:, 0] - model(tokens)[:, 0]).abs().max()) > 1e-3
    cfg = interp.HookedTransformerConfig(
        n_layers=1, d_model=32, d_head=8, n_ctx=16, d_vocab=23, act_fn="gelu", attention_dir="bidirectional"
    )
    assert not interp.HookedTransformer(cfg).cfg.causal


def test_bidirectional_models_refuse_generation_kv_caches_and_padding_masks() -> None:
    model = _model(causal=False)
    tokens = torch.randint(1, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(4))
    with pytest.raises(ValueError, match="cannot generate"):
        model.generate(tokens, max_new_tokens=2)
    with pytest.raises(ValueError, match="past_kv_cache"):
        model(tokens, past_kv_cache=interp.HookedTransformerKeyValueCache.init_cache(model.cfg, "cpu", 2))
    with pytest.raises(ValueError, match="padded"):
        model(tokens, attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]))
    torch.testing.assert_close(
        model(tokens, attention_mask=torch.ones(2, 6, dtype=torch.long)), model(tokens)
    )
    with pytest.raises(ValueError, match="window"):
        interp.Config(n_layers=1, d_model=8, n_heads=2, d_vocab=5, n_ctx=8, causal=False,
                      attn_types=["local"], window_size=2)  # fmt: skip


@pytest.mark.parametrize("arch", ["shortformer", "bidirectional"])
def test_engine_patching_and_ablation_equal_hooked_runs(arch: str) -> None:
    """The engine runs blocks from a residual stream (starting at the first patched block, from the
    target's cache): its metrics equal ordinary forward passes with the same hooks."""
    model = _model(**({"positional": "shortformer"} if arch == "shortformer" else {"causal": False}))
    generator = torch.Generator().manual_seed(5)
    clean = torch.randint(0, model.cfg.d_vocab, (3, 7), generator=generator)
    corrupted = torch.randint(0, model.cfg.d_vocab, (3, 7), generator=generator)
    metric = lambda logits: logits[:, 2, 0] - logits[:, 2, 1]  # noqa: E731  (position 2 of 7: early)
    _, target = cached_run(model, clean, start_names(model))
    names = ["blocks.1.attn.hook_z", "blocks.0.attn.hook_z", "blocks.1.hook_resid_pre"]
    _, source = cached_run(model, corrupted, names)
    runs = [
        [Site("blocks.1.attn.hook_z", head=2)],  # patched from the corrupted run, block 1 only
        [Site("blocks.1.attn.hook_z")],  # every head of block 1: its attention is skipped
        [Site("blocks.1.hook_resid_pre", pos=4)],
        [Intervention(Site("blocks.0.attn.hook_z", head=[0, 3]), torch.zeros(()))],  # zero ablation
        [],
    ]
    values = run_site_sets(model, clean, runs, source, metric, target=target)
    for run, value in zip(runs, values, strict=True):
        hooks = []
        for entry in run:
            iv = entry if isinstance(entry, Intervention) else Intervention(entry, source)

            def write(act, hook, iv=iv):
                mask = interp.interventions.engine.site_mask(iv.site, act.shape)
                return torch.where(mask, iv.values(act), act)

            hooks.append((iv.site.name, write))
        with torch.no_grad():
            expected = metric(model.run_with_hooks(clean, fwd_hooks=hooks))
        torch.testing.assert_close(value, expected, atol=ATOL, rtol=0)
    if arch == "shortformer":
        with pytest.raises(ValueError, match="hook_pos_embed"):
            run_site_sets(
                model, clean, [[Intervention(Site("hook_pos_embed"), torch.zeros(()))]], None, metric
            )


def _word_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A local tokenizer (the hub's EleutherAI/gpt-neox-20b is not reachable offline)."""
    words = ["<pad>", "<bos>", "<eos>"] + [f"w{i}" for i in range(60)]
    inner = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<eos>")
    )
    inner.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=inner, bos_token="<bos>", eos_token="<eos>")


def test_arena_attn_only_2l_builds_loads_transformer_lens_weights_and_scores_induction() -> None:
    """ARENA 1.2's model: its exact HookedTransformerConfig, a state dict under TransformerLens's
    names (with TL's mask buffers), and induction scores from the cache and from a pattern hook as the
    chapter computes them, equal to the reference definition's patterns."""
    cfg = interp.HookedTransformerConfig(
        d_model=768, d_head=64, n_heads=12, n_layers=2, n_ctx=2048, d_vocab=50278, attention_dir="causal",
        attn_only=True, tokenizer_name="EleutherAI/gpt-neox-20b", seed=398, use_attn_result=True,
        normalization_type=None, positional_embedding_type="shortformer",
    )  # fmt: skip
    with pytest.raises(ValueError, match="pass tokenizer="):  # offline: no hub, a clear error
        interp.HookedTransformer(cfg)
    model = interp.HookedTransformer(cfg, tokenizer=_word_tokenizer())
    assert model.cfg.use_attn_result and model.cfg.normalization_type is None
    generator = torch.Generator().manual_seed(0)
    state = {
        name: torch.randn(p.shape, generator=generator) * 0.05 for name, p in model.tl_parameters().items()
    }
    for layer in range(2):  # TransformerLens's buffers, which a saved TL state dict holds
        state[f"blocks.{layer}.attn.mask"] = torch.ones(2048, 2048).bool().tril()
        state[f"blocks.{layer}.attn.IGNORE"] = torch.tensor(-torch.inf)
    assert {"embed.W_E", "pos_embed.W_pos", "blocks.1.attn.W_K", "unembed.b_U"} <= set(state)
    model.load_state_dict(state)
    torch.testing.assert_close(model.tl_parameters()["pos_embed.W_pos"].cpu(), state["pos_embed.W_pos"])
    seq_len = 10
    prefix = torch.tensor([[model.tokenizer.bos_token_id]])
    half = torch.randint(0, cfg.d_vocab, (1, seq_len), generator=generator)
    rep_tokens = torch.cat([prefix, half, half], dim=1)
    logits, rep_cache = model.run_with_cache(rep_tokens, remove_batch_dim=True)
    expected_logits, expected = _reference(model, rep_tokens)
    torch.testing.assert_close(logits, expected_logits, atol=ATOL, rtol=0)
    from_cache = torch.stack(
        [rep_cache["pattern", layer].diagonal(-seq_len + 1, dim1=-2, dim2=-1).mean(-1) for layer in range(2)]
    )
    induction_score_store = torch.zeros(2, 12)

    def induction_score_hook(pattern, hook):
        stripe = pattern.diagonal(dim1=-2, dim2=-1, offset=1 - seq_len)
        induction_score_store[hook.layer(), :] = stripe.mean(-1).mean(0)

    model.run_with_hooks(
        rep_tokens,
        return_type=None,
        fwd_hooks=[(lambda name: name.endswith("pattern"), induction_score_hook)],
    )
    reference = torch.stack(
        [expected[f"blocks.{layer}.attn.hook_pattern"][0].diagonal(-seq_len + 1, dim1=-2, dim2=-1).mean(-1)
         for layer in range(2)]
    )  # fmt: skip
    torch.testing.assert_close(from_cache, reference, atol=ATOL, rtol=0)
    torch.testing.assert_close(induction_score_store, reference, atol=ATOL, rtol=0)


def test_shortformer_residual_decompositions_sum_to_the_residual_and_leave_positions_out() -> None:
    model = _model(positional="shortformer")
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(6))
    _, cache = model.run_with_cache(tokens)
    with pytest.raises(ValueError, match="not in the residual stream"):
        cache.decompose_resid()  # TransformerLens would add hook_pos_embed as a component
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name != "hook_pos_embed")
    stack, labels = cache.decompose_resid(return_labels=True)
    assert "pos_embed" not in labels
    torch.testing.assert_close(stack.sum(0), cache["blocks.1.hook_resid_post"], atol=ATOL, rtol=0)
    full = cache.get_full_resid_decomposition(layer=1, expand_neurons=False)
    torch.testing.assert_close(full.sum(0), cache["blocks.1.hook_resid_pre"], atol=ATOL, rtol=0)
