"""TransformerLens semantics, exactly: negative layer indices, attention masks and padding,
generate's return types, HookedTransformerConfig as a class, from_pretrained's arguments.

Real small models built from `interp.Config` (GPT-2-like, Llama-like with grouped-query attention,
a parallel-residual rotary model) and a word-level tokenizer built here (no download)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import tokenizers
import torch
import transformers
from conftest import tiny_config

import interp

ATOL = 1e-4
WORDS = ["<pad>", "<bos>", "<eos>"] + [f"w{i}" for i in range(58)]


def _tokenizer(pad: bool = True) -> transformers.PreTrainedTokenizerFast:
    vocab = {word: i for i, word in enumerate(WORDS)}
    inner = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<eos>"))
    inner.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    special = {"bos_token": "<bos>", "eos_token": "<eos>"} | ({"pad_token": "<pad>"} if pad else {})
    return transformers.PreTrainedTokenizerFast(tokenizer_object=inner, **special)


CONFIGS = {
    "gpt2-like": dict(),
    "llama-gqa": dict(
        normalization="rmsnorm", positional="rotary", gated_mlp=True, activation="silu", n_kv_heads=2,
        qkv_bias=False, attn_out_bias=False, mlp_bias=False, unembed_bias=False,
    ),
    "neox-parallel": dict(positional="rotary", rotary_dim=4, parallel_residual=True, activation="gelu"),
}  # fmt: skip


def _model(kind: str, **overrides) -> interp.HookedTransformer:
    torch.manual_seed(0)
    cfg = tiny_config(**{**CONFIGS[kind], "bos_token_id": 1, "default_prepend_bos": True, **overrides})
    model = interp.HookedTransformer(cfg, _tokenizer())
    with torch.no_grad():  # non-trivial norms and biases
        for name, param in model.named_parameters():
            if name.endswith((".w", ".b")) or ".b_" in name or name == "b_U":
                param.add_(torch.randn_like(param) * 0.1)
    return model.eval()


@pytest.fixture(params=sorted(CONFIGS))
def model(request) -> interp.HookedTransformer:
    return _model(request.param)


PROMPTS = ["w3 w4 w5 w6 w7 w8 w9", "w10 w11", "w12 w13 w14 w15"]


# --- 1. negative layer indices ---------------------------------------------------------------------


def test_negative_stop_and_start_at_layer_slice_the_blocks_as_transformer_lens():
    model = _model("gpt2-like", n_layers=3)
    tokens = torch.randint(3, 61, (2, 6), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens)
    before_last = model(tokens, stop_at_layer=-1)
    torch.testing.assert_close(before_last, cache["blocks.2.hook_resid_pre"], atol=ATOL, rtol=0)
    torch.testing.assert_close(model(tokens, stop_at_layer=-3), cache["hook_embed"] + cache["hook_pos_embed"])
    last_only = model(cache["blocks.2.hook_resid_pre"], start_at_layer=-1, stop_at_layer=3)
    torch.testing.assert_close(last_only, cache["blocks.2.hook_resid_post"], atol=ATOL, rtol=0)
    logits = model(cache["blocks.2.hook_resid_pre"], start_at_layer=-1)
    torch.testing.assert_close(logits, model(tokens), atol=ATOL, rtol=0)
    out, cache_1 = model.run_with_cache(tokens, stop_at_layer=-1)
    torch.testing.assert_close(out, before_last)
    assert "blocks.1.hook_resid_post" in cache_1 and "blocks.2.hook_resid_pre" not in cache_1
    loss = model(cache["blocks.1.hook_resid_pre"], start_at_layer=-2, tokens=tokens, return_type="loss")
    torch.testing.assert_close(loss, model(tokens, return_type="loss"), atol=ATOL, rtol=0)


@pytest.mark.parametrize("kwargs", [{"stop_at_layer": 4}, {"stop_at_layer": -4}, {"start_at_layer": 5}])
def test_out_of_range_layer_indices_raise(kwargs):
    model = _model("gpt2-like", n_layers=3)
    tokens = torch.randint(3, 61, (1, 4))
    x = model(tokens, stop_at_layer=0) if "start_at_layer" in kwargs else tokens
    with pytest.raises(ValueError, match="3 blocks"):
        model(x, **kwargs)
    with pytest.raises(ValueError, match="3 blocks"):
        model.run_with_cache(x, **kwargs)


# --- 2. attention masks and padding --------------------------------------------------------------


def _alone(model, prompt):
    return model(prompt)[0]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("explicit_pattern", [False, True])
def test_padded_prompts_give_the_logits_they_give_alone(model, side, explicit_pattern):
    """A list of texts of mixed lengths masks its own padding: each prompt's logits equal its
    unpadded run, for the fused SDPA path and the explicit pattern path (a hook on the pattern)."""
    hooks = [("blocks.0.attn.hook_pattern", lambda x, hook: x)] if explicit_pattern else []
    with model.hooks(fwd_hooks=hooks):
        padded = model(PROMPTS, padding_side=side)
        tokens, mask = model.to_tokens_and_mask(PROMPTS, padding_side=side)
        with_mask = model(tokens, attention_mask=mask)
        for i, prompt in enumerate(PROMPTS):
            alone = _alone(model, prompt)
            real = mask[i].bool()
            torch.testing.assert_close(padded[i, real], alone, atol=ATOL, rtol=0)
            torch.testing.assert_close(with_mask[i, real], alone, atol=ATOL, rtol=0)
    assert not padded.isnan().any()


def test_left_padding_run_with_cache_pattern_never_attends_to_pads(model):
    _, cache = model.run_with_cache(PROMPTS, padding_side="left")
    tokens, mask = model.to_tokens_and_mask(PROMPTS, padding_side="left")
    pattern = cache["blocks.1.attn.hook_pattern"]  # [batch, head, q, k]
    assert (pattern[mask[:, None, None, :].expand_as(pattern) == 0] == 0).all()
    real_rows = pattern.sum(-1)[mask[:, None, :].expand(-1, pattern.shape[1], -1) == 1]
    torch.testing.assert_close(real_rows, torch.ones_like(real_rows))
    _, alone = model.run_with_cache(PROMPTS[1])
    n = alone["blocks.1.hook_resid_post"].shape[1]
    torch.testing.assert_close(
        cache["blocks.1.hook_resid_post"][1, -n:], alone["blocks.1.hook_resid_post"][0], atol=ATOL, rtol=0
    )


def test_left_padded_token_ids_are_masked_when_the_model_pads_on_the_left():
    """TransformerLens derives the mask from leading pad ids when the tokenizer pads on the left;
    interp's `to_tokens` ids carry their mask whatever the model's side, and a copy of them (no
    mask) on a model that pads on the right is refused, where TransformerLens reads its padding."""
    model = _model("llama-gqa")
    tokens = model.to_tokens(PROMPTS, padding_side="left")
    carried = model(tokens)
    with pytest.raises(ValueError, match="look padded on the left"):
        model(tokens.clone())
    model.default_padding_side = "left"
    masked = model(tokens.clone())
    for i, prompt in enumerate(PROMPTS):
        alone = _alone(model, prompt)
        torch.testing.assert_close(masked[i, -alone.shape[0] :], alone, atol=ATOL, rtol=0)
        torch.testing.assert_close(carried[i, -alone.shape[0] :], alone, atol=ATOL, rtol=0)


def test_bos_that_is_the_pad_id_is_kept_as_transformer_lens():
    from interp.model.tokens import padding_mask

    tokens = torch.tensor([[0, 0, 0, 5, 6], [0, 4, 5, 6, 7]])
    assert padding_mask(tokens, 0, "left", True, 0).tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert padding_mask(tokens, 0, "left", False, 0).tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 1]]
    assert padding_mask(torch.tensor([[4, 0, 0]]), 0, "right", True, 0).tolist() == [[1, 0, 0]]


def test_loss_with_padding_counts_real_tokens_only():
    model = _model("gpt2-like")
    tokens, mask = model.to_tokens_and_mask(PROMPTS, padding_side="left")
    loss = model(tokens, attention_mask=mask, return_type="loss", loss_per_token=True)
    for i, prompt in enumerate(PROMPTS):
        alone = model(prompt, return_type="loss", loss_per_token=True)[0]
        torch.testing.assert_close(loss[i, -alone.shape[0] :], alone, atol=ATOL, rtol=0)
    mean = model(PROMPTS, padding_side="left", return_type="loss")
    torch.testing.assert_close(mean, loss.sum() / (mask[:, :-1] * mask[:, 1:]).sum())
    torch.testing.assert_close(model.loss_fn(model(tokens, attention_mask=mask), tokens, mask), mean)


@pytest.mark.parametrize("per_token", [False, True])
def test_the_loss_of_texts_padded_on_the_right_is_refused_without_their_mask(per_token):
    """TransformerLens masks nothing for a right-padded list of texts, so its loss counts the padding's
    predictions: the same call is refused here; with the texts' mask given (TransformerLens then masks
    too) it counts the real tokens, as left padding does."""
    model = _model("gpt2-like")
    assert model.tokenizer.padding_side == "right"
    with pytest.raises(
        ValueError, match="texts are padded on the right .*attention_mask=model.to_tokens_and_mask"
    ):
        model(PROMPTS, return_type="loss", loss_per_token=per_token)
    mask = model.to_tokens_and_mask(PROMPTS)[1]
    right = model(PROMPTS, return_type="loss", attention_mask=mask, loss_per_token=per_token)
    left = model(PROMPTS, return_type="loss", padding_side="left", loss_per_token=per_token)
    if not per_token:
        torch.testing.assert_close(right, left, atol=ATOL, rtol=0)
    model(PROMPTS[:1], return_type="loss")  # one text: no padding


def test_negative_layers_other_than_minus_one_are_refused_by_the_cache(model):
    """TransformerLens's cache reads None and -1 as the final stream and any other negative layer as an
    empty range: those are refused, naming the layer counted from the end."""
    _, cache = model.run_with_cache(torch.randint(3, 61, (1, 5)))
    n_layers = model.cfg.n_layers
    torch.testing.assert_close(cache.accumulated_resid(layer=-1), cache.accumulated_resid(layer=n_layers))
    for call in (cache.accumulated_resid, cache.decompose_resid, cache.stack_head_results):
        with pytest.raises(ValueError, match=f"from the end, pass layer={n_layers - 1}"):
            call(layer=-2)


def test_kv_cache_continues_a_left_padded_batch(model):
    tokens, mask = model.to_tokens_and_mask(PROMPTS, padding_side="left")
    cache = interp.HookedTransformerKeyValueCache.init_cache(model.cfg, model.device, len(PROMPTS))
    model(tokens[:, :-2], attention_mask=mask[:, :-2], past_kv_cache=cache)
    step = model(tokens[:, -2:], past_kv_cache=cache)
    full = model(tokens, attention_mask=mask)
    torch.testing.assert_close(step, full[:, -2:], atol=ATOL, rtol=0)


def test_attention_mask_of_the_wrong_shape_raises():
    model = _model("gpt2-like")
    with pytest.raises(ValueError, match="attention_mask has shape"):
        model(torch.tensor([[3, 4, 5]]), attention_mask=torch.tensor([[1, 1]]))


def test_a_mask_not_of_the_residual_streams_prompts_is_refused_from_a_layer_as_from_tokens():
    """forward(residual, start_at_layer=L, attention_mask=M) checks M as the token path does: a
    transposed mask is not read as another one (nor a KV cache of another batch size)."""
    model = _model("gpt2-like")
    tokens, mask = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 2]]), torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    residual = model(tokens, attention_mask=mask, stop_at_layer=1)
    from_layer = model(residual, start_at_layer=1, attention_mask=mask)
    torch.testing.assert_close(from_layer, model(tokens, attention_mask=mask), atol=ATOL, rtol=0)
    for wrong in (mask.T, mask.flatten(), mask[:, :3], mask[:1]):
        with pytest.raises(ValueError, match=r"attention_mask has shape .* must match the input's 2 prompts"):
            model(residual, start_at_layer=1, attention_mask=wrong)
    cache = interp.HookedTransformerKeyValueCache.init_cache(model.cfg, model.device, 3)
    with pytest.raises(ValueError, match=r"made for a batch of 3 prompts, got 2: init_cache"):
        model(tokens, attention_mask=mask, past_kv_cache=cache)
    for other in (residual[..., :-1], residual[0], tokens):  # not a residual stream [batch, pos, d_model]
        with pytest.raises(ValueError, match=r"start_at_layer=1 runs from a residual stream \[batch, pos"):
            model(other, start_at_layer=1)


# --- 3. generate --------------------------------------------------------------------------------


def test_generate_return_types():
    model = _model("gpt2-like")
    text = model.generate("w3 w4 w5", max_new_tokens=4, stop_at_eos=False)
    assert isinstance(text, str) and text.startswith("w3 w4 w5")
    assert isinstance(model.generate(["w3 w4 w5"], max_new_tokens=2, stop_at_eos=False), list)
    tokens = model.generate("w3 w4 w5", max_new_tokens=4, stop_at_eos=False, return_type="tokens")
    assert tokens.shape == (1, 8) and not tokens.is_floating_point()
    embeds = model.generate("w3 w4 w5", max_new_tokens=4, stop_at_eos=False, return_type="embeds")
    assert embeds.shape == (1, 8, model.cfg.d_model) and embeds.is_floating_point()
    torch.testing.assert_close(embeds, model.W_E[tokens])
    ids = model.generate(tokens[:, :4], max_new_tokens=4, stop_at_eos=False)
    assert torch.equal(ids, tokens)
    with pytest.raises(ValueError, match="d_model"):
        model.generate(embeds[0], max_new_tokens=2)
    with pytest.raises(ValueError, match="return_type"):
        model.generate("w3", return_type="logits")


@pytest.mark.parametrize("use_past_kv_cache", [True, False])
def test_generate_from_embeddings_continues_as_from_their_tokens(model, use_past_kv_cache):
    kwargs = dict(max_new_tokens=4, stop_at_eos=False, use_past_kv_cache=use_past_kv_cache)
    tokens = model.to_tokens(["w3 w4 w5 w6", "w7 w3 w9 w4"])
    from_tokens = model.generate(tokens, **kwargs)
    embeds = model.embed(tokens)
    new_tokens = model.generate(embeds, return_type="tokens", **kwargs)
    assert torch.equal(new_tokens, from_tokens[:, tokens.shape[1] :])  # TL: the new tokens only
    out = model.generate(embeds, **kwargs)  # embeddings in, embeddings out
    torch.testing.assert_close(out, model.W_E[from_tokens])
    texts = model.generate(embeds, return_type="str", **kwargs)
    assert texts == [model.to_string(row) for row in new_tokens]


@pytest.mark.parametrize("use_past_kv_cache", [True, False])
def test_generate_a_batch_of_mixed_lengths_continues_each_prompt_as_alone(model, use_past_kv_cache):
    kwargs = dict(max_new_tokens=5, stop_at_eos=False, use_past_kv_cache=use_past_kv_cache)
    batch = model.generate(PROMPTS, **kwargs)
    assert batch == [model.generate(prompt, **kwargs) for prompt in PROMPTS]
    with pytest.raises(ValueError, match="on the left"):
        model.generate(PROMPTS, padding_side="right", **kwargs)
    ids = model.generate(model.to_tokens(PROMPTS, padding_side="left"), **kwargs)  # carrying their mask
    alone = [model.generate(prompt, return_type="tokens", **kwargs)[0, -5:] for prompt in PROMPTS]
    assert torch.equal(ids[:, -5:], torch.stack(alone))
    with pytest.raises(ValueError, match="pad a batch of ids on the left"):
        model.generate(model.to_tokens(PROMPTS, padding_side="right"), **kwargs)


def test_generate_reads_plain_ids_as_the_forward_pass_does_with_or_without_the_kv_cache(model):
    """Ids that carry no mask are run as the forward pass runs them (pad or EOS ids are tokens, but
    leading pad ids where the model pads on the left), the same with and without the KV cache: a
    prompt ending in the EOS id (GPT-2's BOS, a model with no pad token) is not read as padding."""
    kwargs = dict(max_new_tokens=4, stop_at_eos=False)
    model.set_tokenizer(_tokenizer(pad=False))  # the pad id is the EOS id, 2
    for ids in (torch.tensor([[1, 2]]), torch.tensor([[1, 5, 6, 2]])):
        expected = ids
        for _ in range(4):  # greedy, each step a full forward pass on all the ids
            expected = torch.cat([expected, model(expected)[:, -1].argmax(-1, keepdim=True)], dim=1)
        for use_past_kv_cache in (True, False):
            assert torch.equal(model.generate(ids, use_past_kv_cache=use_past_kv_cache, **kwargs), expected)
    model.set_tokenizer(_tokenizer())
    model.default_padding_side = "left"
    padded = torch.tensor([[0, 0, 1, 5, 6], [1, 7, 8, 9, 10]])  # pad id 0, leading
    for use_past_kv_cache in (True, False):
        out = model.generate(padded, use_past_kv_cache=use_past_kv_cache, **kwargs)
        assert torch.equal(out[0, -4:], model.generate(padded[:1, 2:], **kwargs)[0, -4:])


def test_generate_and_the_kv_cache_refuse_what_they_cannot_run(model):
    with pytest.raises(ValueError, match="max_new_tokens must be 0 or more"):
        model.generate("w3", max_new_tokens=-1)
    with pytest.raises(ValueError, match="top_k must be from 1"):
        model.generate("w3", max_new_tokens=2, do_sample=True, top_k=model.cfg.d_vocab + 1)
    cache = interp.HookedTransformerKeyValueCache.init_cache(model.cfg, model.device, 1)
    cache.entries = cache.entries[:1]  # a cache of a one-layer model
    with pytest.raises(ValueError, match="KV cache was made for another model"):
        model(model.to_tokens("w3 w4"), past_kv_cache=cache)


def test_a_kv_cache_run_that_stops_at_a_layer_is_refused_and_leaves_the_cache_whole(model):
    """A run that stops (or starts) at a layer would fill only those layers' caches, and the next run on
    the cache read other layers' keys from nothing (logits 0.3-0.45 off, silently): refused before the
    cache changes; a frozen cache, which nothing is added to, may be read part way."""
    tokens = model.to_tokens("w3 w4 w5 w6 w7 w8")
    assert tokens.shape[1] == 7  # BOS first
    cache = interp.HookedTransformerKeyValueCache.init_cache(model.cfg, model.device, 1)
    with pytest.raises(ValueError, match="leaving the cache's layers out of step"):
        model(tokens[:, :4], past_kv_cache=cache, stop_at_layer=1)
    assert cache.n_cached == 0
    model(tokens[:, :4], past_kv_cache=cache)
    torch.testing.assert_close(model(tokens[:, 4:], past_kv_cache=cache), model(tokens)[:, 4:])
    cache.freeze()
    model(tokens[:, 4:], past_kv_cache=cache, stop_at_layer=1)
    cache.entries[0].past_keys = cache.entries[0].past_keys[:, :2]  # a layer out of step
    with pytest.raises(ValueError, match=r"layers hold \[2, 7\] tokens where its mask records 7"):
        model(tokens[:, 4:], past_kv_cache=cache)


# --- 4. HookedTransformerConfig as a class -------------------------------------------------------

SMALL = dict(n_layers=2, d_model=32, n_ctx=16, d_head=8, d_vocab=61, act_fn="gelu", device="cpu")


def test_hooked_transformer_config_is_a_class_with_transformer_lens_fields():
    cfg = interp.HookedTransformerConfig(**SMALL, tokenizer_name=None, attention_dir="causal")
    assert isinstance(cfg, interp.HookedTransformerConfig)
    assert (cfg.n_heads, cfg.d_mlp, cfg.d_vocab_out, cfg.normalization_type) == (4, 128, 61, "LN")
    assert cfg.initializer_range == pytest.approx(0.8 / 32**0.5) and cfg.n_params > 0
    assert not cfg.is_layer_norm_activation() and not cfg.ungroup_grouped_query_attention
    assert interp.HookedTransformerConfig.unwrap(cfg) is cfg
    assert interp.HookedTransformerConfig.unwrap(cfg.to_dict()) == cfg
    model = interp.HookedTransformer(cfg)
    assert isinstance(model.cfg, interp.Config) and model.cfg.n_heads == 4
    assert model.cfg.activation == "gelu" and not model.hook_settings.use_attn_result


@pytest.mark.parametrize(
    "setting", ["use_attn_result", "use_split_qkv_input", "use_hook_mlp_in", "use_attn_in"]
)
def test_hook_settings_of_the_config_are_turned_on_in_the_model(setting):
    model = interp.HookedTransformer(interp.HookedTransformerConfig(**SMALL, **{setting: True}))
    assert getattr(model.hook_settings, setting)
    suffix = {"use_attn_result": "attn.hook_result", "use_split_qkv_input": "hook_q_input",
              "use_hook_mlp_in": "hook_mlp_in", "use_attn_in": "hook_attn_in"}[setting]  # fmt: skip
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3]]))
    assert f"blocks.1.{suffix}" in cache


def test_config_d_vocab_from_the_tokenizer_and_lnpre():
    cfg = interp.HookedTransformerConfig(**{**SMALL, "d_vocab": -1}, normalization_type="LNPre")
    model = interp.HookedTransformer(cfg, _tokenizer())
    assert model.cfg.d_vocab == len(WORDS) and model.blocks[0].ln1.w is None
    assert model("w3 w4").shape == (1, 3, len(WORDS))
    with pytest.raises(ValueError, match="needs a tokenizer"):
        interp.HookedTransformer(cfg)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(attention_dir="sideways"), "attention_dir"),
        (dict(act_fn=None), "act_fn must be specified"),
        (dict(positional_embedding_type="alibi"), "positional_embedding_type"),
        (dict(checkpoint_index=3), "one checkpoint"),
    ],
)
def test_config_options_interp_cannot_honour_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        interp.HookedTransformerConfig(**{**SMALL, **kwargs})


def test_model_from_a_llama_like_transformer_lens_config_runs():
    cfg = interp.HookedTransformerConfig(
        **{**SMALL, "act_fn": "silu"}, normalization_type="RMS", positional_embedding_type="rotary",
        rotary_dim=8, gated_mlp=True, n_key_value_heads=2, use_attn_result=True,
    )  # fmt: skip
    model = interp.HookedTransformer(cfg)
    assert model.cfg.n_kv_heads == 2 and model.cfg.group_size == 2
    logits, cache = model.run_with_cache(torch.tensor([[1, 2, 3, 4]]))
    result = cache["blocks.0.attn.hook_result"].sum(2) + model.blocks[0].attn.b_O
    torch.testing.assert_close(result, cache["blocks.0.hook_attn_out"], atol=ATOL, rtol=0)
    assert logits.shape == (1, 4, 61)
    with pytest.raises(TypeError, match="interp.Config or an interp.HookedTransformerConfig"):
        interp.HookedTransformer({"n_layers": 2})
    # TL's gated MLP has b_in, no b_gate, and adds b_in after the product: a state dict without b_gate
    # loads where b_in is zero (the same numbers); another b_in is refused.
    tl_state = {name: value for name, value in model.state_dict().items() if not name.endswith("b_gate")}
    again = interp.HookedTransformer(cfg)
    again.load_state_dict(tl_state)
    torch.testing.assert_close(again(torch.tensor([[1, 2, 3, 4]])), logits, atol=0, rtol=0)
    tl_state["blocks.1.mlp.b_in"] = torch.full_like(tl_state["blocks.1.mlp.b_in"], 0.1)
    with pytest.raises(ValueError, match="blocks.1.mlp.b_in is TransformerLens's gated-MLP bias"):
        again.load_state_dict(tl_state)


# --- 5. from_pretrained's arguments and TL's remaining methods -------------------------------------


def _hf_gpt2(kind: str = "gpt2"):
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=61, n_positions=32)
    else:
        config = transformers.LlamaConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=48, vocab_size=61, max_position_embeddings=32,
        )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "ln" in name or "norm" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    return model


def test_from_pretrained_padding_side_prepend_bos_and_checkpoints():
    hf = _hf_gpt2()
    model = interp.HookedTransformer.from_pretrained(
        "gpt2", hf_model=hf, tokenizer=_tokenizer(), device="cpu", default_padding_side="left",
        default_prepend_bos=False,
    )  # fmt: skip
    assert model.default_padding_side == "left" and not model.cfg.default_prepend_bos
    tokens = model.to_tokens(["w3 w4 w5", "w6"])
    assert tokens.tolist() == [[3 + 3, 3 + 4, 3 + 5], [0, 0, 3 + 6]]
    logits = model(tokens)  # leading pads masked, as TL with a left-padding tokenizer
    torch.testing.assert_close(logits[1, -1], model("w6")[0, -1], atol=ATOL, rtol=0)
    with tempfile.TemporaryDirectory() as directory:  # saved and loaded, it still pads on the left
        model.save(Path(directory) / "saved")
        loaded = interp.load_model(Path(directory) / "saved")
    assert (
        loaded.default_padding_side == "left"
        and loaded.to_tokens(["w3 w4 w5", "w6"]).tolist() == tokens.tolist()
    )
    torch.testing.assert_close(loaded(tokens)[1, -1], logits[1, -1], atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="one checkpoint"):
        interp.HookedTransformer.from_pretrained("gpt2", hf_model=hf, checkpoint_index=3)
    with pytest.raises(ValueError, match="default_padding_side"):
        interp.HookedTransformer.from_pretrained("gpt2", hf_model=hf, default_padding_side="middle")


def test_refactor_factored_attn_matrices_keeps_outputs_and_factors_as_transformer_lens():
    hf = _hf_gpt2()
    kwargs = dict(hf_model=hf, tokenizer=_tokenizer(), device="cpu")
    plain = interp.HookedTransformer.from_pretrained("gpt2", **kwargs)
    refactored = interp.HookedTransformer.from_pretrained(
        "gpt2", refactor_factored_attn_matrices=True, **kwargs
    )
    tokens = torch.randint(3, 61, (2, 7), generator=torch.Generator().manual_seed(0))
    _, cache = plain.run_with_cache(tokens)
    logits, cache_r = refactored.run_with_cache(tokens)
    torch.testing.assert_close(logits, plain(tokens), atol=ATOL, rtol=0)
    for name in ("blocks.1.attn.hook_attn_scores", "blocks.1.hook_attn_out", "blocks.1.hook_resid_post"):
        torch.testing.assert_close(cache_r[name], cache[name], atol=ATOL, rtol=0)
    attn = refactored.blocks[0].attn
    q_eff, k_eff = (
        torch.cat([w, b[:, None]], dim=1) for w, b in ((attn.W_Q, attn.b_Q), (attn.W_K, attn.b_K))
    )
    torch.testing.assert_close(q_eff.norm(dim=1), k_eff.norm(dim=1), atol=1e-4, rtol=1e-4)  # balanced
    assert attn.b_V.abs().max() == 0
    eye = torch.eye(attn.W_O.shape[1]).expand(attn.W_O.shape[0], -1, -1)
    torch.testing.assert_close(attn.W_O @ attn.W_O.transpose(-1, -2), eye, atol=1e-5, rtol=0)  # a rotation
    from transformer_lens.weight_processing import ProcessWeights

    theirs = ProcessWeights.refactor_factored_attn_matrices(plain.tl_parameters(), plain.cfg)
    ours = refactored.tl_parameters()
    for name in ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O"):
        for layer in range(plain.cfg.n_layers):
            key = f"blocks.{layer}.attn.{name}"
            torch.testing.assert_close(ours[key], theirs[key], atol=ATOL, rtol=0, msg=key)
    llama = interp.HookedTransformer.from_pretrained("llama", hf_model=_hf_gpt2("llama"), device="cpu")
    with pytest.raises(ValueError, match="rotary positions"):
        llama.refactor_factored_attn_matrices()


def test_input_to_embed_set_tokenizer_and_toggle_autodiff(model):
    residual, tokens, shortformer, mask = model.input_to_embed(PROMPTS, padding_side="left")
    assert shortformer is None and mask.shape == tokens.shape and residual.shape[:2] == tokens.shape
    torch.testing.assert_close(
        model(residual, start_at_layer=0, attention_mask=mask), model(PROMPTS, padding_side="left")
    )
    _, cache = model.run_with_cache(PROMPTS, padding_side="left")
    torch.testing.assert_close(residual, cache["blocks.0.hook_resid_pre"])
    bare = interp.HookedTransformer(model.cfg)
    bare.set_tokenizer(_tokenizer(), default_padding_side="left")
    assert bare.to_tokens(["w3 w4", "w5"])[1, 0] == 0 and bare.default_padding_side == "left"
    try:
        model.toggle_autodiff(False)
        assert not torch.is_grad_enabled()
        model.toggle_autodiff(True)
        assert torch.is_grad_enabled()
    finally:
        torch.set_grad_enabled(True)


def test_ln_final_hooks_fire_with_return_type_none(model):
    names = ["ln_final.hook_scale", "ln_final.hook_normalized", "blocks.0.hook_resid_post"]
    out, cache = model.run_with_cache("w3 w4 w5", names_filter=names, return_type=None)
    assert out is None and set(names) <= set(cache.keys())
    _, full = model.run_with_cache("w3 w4 w5")
    torch.testing.assert_close(cache["ln_final.hook_normalized"], full["ln_final.hook_normalized"])


def test_logit_attrs_without_a_batch_dim(model):
    _, cache = model.run_with_cache("w3 w4 w5 w6")
    stack = cache.decompose_resid(layer=-1, pos_slice=-1)  # [component, batch, d_model]
    with_batch = cache.logit_attrs(stack, "w7", "w8", pos_slice=-1)  # [component, batch]
    single = cache.remove_batch_dim()
    stack_1 = single.decompose_resid(layer=-1, pos_slice=-1)  # [component, d_model]
    without = single.logit_attrs(stack_1, "w7", "w8", pos_slice=-1, has_batch_dim=False)
    torch.testing.assert_close(without, with_batch[:, 0], atol=ATOL, rtol=0)


def test_pos_embed_with_an_attention_mask_is_what_hook_pos_embed_sees():
    model = _model("gpt2-like")
    _, cache = model.run_with_cache(PROMPTS, padding_side="left")
    tokens, mask = model.to_tokens_and_mask(PROMPTS, padding_side="left")
    torch.testing.assert_close(model.pos_embed(tokens, 0, mask), cache["hook_pos_embed"])
    torch.testing.assert_close(
        model.pos_embed(tokens[:, -2:], tokens.shape[1] - 2, mask), cache["hook_pos_embed"][:, -2:]
    )
    torch.testing.assert_close(model.pos_embed(tokens[:1]), model.W_pos[: tokens.shape[1]][None])


def test_a_hook_editing_the_position_embeddings_in_place_leaves_w_pos_alone():
    model = _model("gpt2-like")
    w_pos = model.W_pos.detach().clone()

    def zero_first_prompt(pos_embed, hook):
        pos_embed[0] = 0.0
        return pos_embed

    tokens = model.to_tokens(["w3 w4 w5", "w6 w7 w8"])
    seen = {}
    model.run_with_hooks(
        tokens,
        fwd_hooks=[
            ("hook_pos_embed", zero_first_prompt),
            ("hook_pos_embed", lambda x, hook: seen.update(x=x)),
        ],
    )
    assert torch.equal(model.W_pos, w_pos)
    assert (seen["x"][0] == 0).all() and torch.equal(seen["x"][1], w_pos[: tokens.shape[1]])
    torch.testing.assert_close(model.pos_embed(tokens), w_pos[: tokens.shape[1]].expand(2, -1, -1))


def test_from_pretrained_prepends_bos_as_transformer_lens_and_load_model_keeps_the_models_policy():
    hf = _hf_gpt2("llama")  # a Llama whose tokenizer adds no BOS: the model's own policy is none
    kwargs = dict(hf_model=hf, tokenizer=_tokenizer(), device="cpu")
    tl_style = interp.HookedTransformer.from_pretrained("llama", **kwargs)
    assert tl_style.cfg.default_prepend_bos and tl_style.to_tokens("w3 w4").tolist() == [[1, 6, 7]]
    own = interp.load_model(hf, tokenizer=_tokenizer())
    assert not own.cfg.default_prepend_bos and own.to_tokens("w3 w4").tolist() == [[6, 7]]
    no_bos = interp.HookedTransformer.from_pretrained("llama", default_prepend_bos=False, **kwargs)
    assert no_bos.to_tokens("w3 w4").tolist() == [[6, 7]]


# --- TransformerLens's remaining options: implemented, each equal to what it stands for ----------


def test_cached_and_uncached_runs_give_the_same_logits_bit_for_bit(model):
    """run_with_cache only observes (fused attention stays fused), so its logits are forward's; a hook
    that may change the pattern makes the attention explicit, within rounding of the fused one."""
    tokens = torch.tensor([[1, 5, 9, 13, 17, 21]])
    logits, cache = model.run_with_cache(tokens)
    assert "blocks.0.attn.hook_pattern" in cache
    assert torch.equal(logits, model(tokens))
    changing = model.run_with_hooks(
        tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda x, hook: x * 1.0)]
    )
    torch.testing.assert_close(changing, logits, atol=1e-5, rtol=0)


def test_setting_a_hook_switch_on_model_cfg_switches_the_models_hook():
    model = _model("gpt2-like")
    model.cfg.use_attn_result = True  # TransformerLens 2 code
    assert model.hook_settings.use_attn_result and model.cfg.use_attn_result
    _, cache = model.run_with_cache("w3 w4", names_filter="blocks.1.attn.hook_result")
    assert cache["blocks.1.attn.hook_result"].shape == (1, 3, 4, 32)
    interp.model.weights.process_weights(
        model, fold_ln=True, center_writing_weights=True, center_unembed=True, fold_value_biases=True
    )  # a new Config: still the model's switch
    model.cfg.use_attn_result = False
    assert not model.hook_settings.use_attn_result
    with pytest.raises(AttributeError, match="no model owns this Config"):
        tiny_config().use_attn_result = True
    with pytest.raises(AssertionError, match="hook_attn_in needs one key/value head"):
        _model("llama-gqa").cfg.use_attn_in = True


@pytest.mark.parametrize("qk_norm", ["none", "head"])
def test_ungroup_grouped_query_attention_gives_k_and_v_per_query_head(qk_norm):
    model = _model("llama-gqa", qk_norm=qk_norm)
    tokens = torch.tensor([[1, 5, 9, 13]])
    names = ["blocks.0.attn.hook_k", "blocks.0.attn.hook_v"]
    grouped, grouped_cache = model.run_with_cache(tokens, names_filter=names)
    model.cfg.ungroup_grouped_query_attention = True
    ungrouped, cache = model.run_with_cache(tokens, names_filter=names)
    assert (
        cache["blocks.0.attn.hook_k"].shape[2]
        == model.cfg.n_heads
        == 2 * grouped_cache["blocks.0.attn.hook_k"].shape[2]
    )
    torch.testing.assert_close(
        cache["blocks.0.attn.hook_v"], grouped_cache["blocks.0.attn.hook_v"].repeat_interleave(2, 2)
    )
    torch.testing.assert_close(ungrouped, grouped, atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="KV cache holds keys and values per key/value head"):
        model.generate(tokens, max_new_tokens=1, use_past_kv_cache=True, verbose=False)


def test_a_config_without_norms_runs_the_stream_as_is():
    """normalization_type=None (ARENA's toy models): no norm modules or hooks; logits are the plain
    sum of the residual stream unembedded, and direct logit attribution adds up to them."""
    model = interp.HookedTransformer(interp.HookedTransformerConfig(**{**SMALL, "normalization_type": None}))
    assert model.cfg.normalization_type is None and not [
        n for n in model.hook_dict if ".ln" in n or "ln_" in n
    ]
    tokens = torch.tensor([[1, 5, 9, 13]])
    logits, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(logits, cache["resid_post", -1] @ model.W_U + model.b_U)
    attrs = cache.logit_attrs(cache.decompose_resid(pos_slice=-1), 7, 8, pos_slice=-1)
    torch.testing.assert_close(attrs.sum(0), logits[:, -1, 7] - logits[:, -1, 8], atol=ATOL, rtol=0)


def test_solu_is_softmax_weighted_then_layer_normed_and_folds_exactly():
    model = interp.HookedTransformer(interp.HookedTransformerConfig(**{**SMALL, "act_fn": "solu_ln"}))
    with torch.no_grad():  # non-trivial norm weights, so that folding them is tested
        model.blocks[0].mlp.ln.w.uniform_(0.5, 1.5)
        model.blocks[0].mlp.ln.b.normal_()
    tokens = torch.tensor([[1, 5, 9, 13]])
    logits, cache = model.run_with_cache(tokens)
    pre = cache["blocks.0.mlp.hook_pre"]
    torch.testing.assert_close(cache["blocks.0.mlp.hook_mid"], pre * pre.softmax(-1))
    from transformer_lens.utilities import get_act_name

    assert cache["mid", 0] is cache[get_act_name("mid", 0)]  # TL's short name reads the same hook
    ln = model.blocks[0].mlp.ln
    expected = torch.nn.functional.layer_norm(pre * pre.softmax(-1), (pre.shape[-1],), ln.w, ln.b, 1e-5)
    torch.testing.assert_close(cache["blocks.0.mlp.hook_post"], expected, atol=ATOL, rtol=0)
    interp.model.weights.process_weights(
        model, fold_ln=True, center_writing_weights=True, center_unembed=True, fold_value_biases=True
    )
    assert model.blocks[0].mlp.ln.w is None and model.cfg.normalization_type == "LNPre"
    torch.testing.assert_close(model(tokens).log_softmax(-1), logits.log_softmax(-1), atol=ATOL, rtol=0)


def test_d_vocab_out_is_the_logits_vocabulary(tmp_path):
    model = interp.HookedTransformer(interp.HookedTransformerConfig(**{**SMALL, "d_vocab_out": 10}))
    tokens = torch.tensor([[1, 50, 60]])  # input ids beyond the output vocabulary
    logits, cache = model.run_with_cache(tokens)
    assert logits.shape == (1, 3, 10) and model.cfg.d_vocab_out == 10 and model.cfg.d_vocab == 61
    with pytest.raises(ValueError, match="output vocabulary"):
        cache.logit_attrs(cache.decompose_resid(pos_slice=-1), 12, pos_slice=-1)
    loaded = interp.load_model(model.save(tmp_path / "out"), device=model.device)
    assert torch.equal(loaded(tokens), logits)


def test_transformer_lens_state_dict_names_load_and_tl_parameters_give_them():
    model = _model("gpt2-like")
    tl_state = {name: p.detach().clone() for name, p in model.tl_parameters().items()}
    assert {"embed.W_E", "pos_embed.W_pos", "unembed.W_U", "blocks.1.attn.W_K", "blocks.1.attn.W_V"} <= set(
        tl_state
    )
    tl_state["unembed.b_U"] = torch.zeros(model.cfg.d_vocab)  # TL's models always hold b_U
    tl_state["blocks.0.attn.IGNORE"] = torch.tensor(-1e5)
    other = _model("gpt2-like")
    other.init_weights(seed=1)
    other.load_state_dict(tl_state)
    tokens = torch.tensor([[1, 5, 9]])
    assert torch.equal(other(tokens), model(tokens))
    gqa = _model("llama-gqa")
    gqa_state = {name: p.detach().clone() for name, p in gqa.tl_parameters().items()}
    assert gqa_state["blocks.0.attn.W_K"].shape[0] == 4  # per query head, as TL's HookedTransformer gives W_K
    other = _model("llama-gqa")
    other.init_weights(seed=1)
    other.load_state_dict(gqa_state)  # the group's copies are one key/value head again
    assert torch.equal(other(tokens), gqa(tokens))
    gqa_state["blocks.0.attn.W_K"][1] += 1.0  # query head 1's copy no longer its group's
    with pytest.raises(ValueError, match="differs within a group of 2 query heads"):
        other.load_state_dict(gqa_state)


def test_transformer_lens_built_models_hold_b_u():
    model = interp.HookedTransformer(interp.HookedTransformerConfig(**SMALL))
    assert model.b_U is not None and model.b_U.shape == (61,) and not model.b_U.any()


def test_logit_attrs_of_a_raw_residual_stream_is_refused_in_one_line_and_works_as_one_component():
    model = _model("gpt2-like")
    tokens = torch.tensor([[1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]])
    logits, cache = model.run_with_cache(tokens)
    right, wrong = torch.tensor([3, 4, 5]), torch.tensor([6, 7, 8])
    with pytest.raises(ValueError, match=r"is one component: pass resid\[None\]"):
        cache.logit_attrs(cache["resid_post", -1], right, wrong)  # [batch, pos, d]: a shape error before
    attrs = cache.logit_attrs(cache["resid_post", -1][None], right, wrong)  # [1, batch, pos]
    rows = torch.arange(3)
    bias = model.ln_final.b @ (model.W_U[:, right] - model.W_U[:, wrong])  # a constant, not attributed
    expected = logits[rows, -1, right] - logits[rows, -1, wrong] - bias  # (the model has no b_U)
    torch.testing.assert_close(attrs[0, :, -1], expected, atol=ATOL, rtol=0)


def test_logit_attrs_of_one_prompt_are_the_batched_ones_bit_for_bit(smollm2):
    """Issue 41: TransformerLens's forms of one prompt's attributions (batch_slice=, a stack without its
    batch dim) are the batched attributions' column exactly: every path is one product and one sum over
    d_model. A stack without its batch dim of a cache of several prompts needs batch_slice=."""
    from transformer_lens.utilities import Slice

    model = smollm2
    prompts = [
        "When Mary and John went to the store, John gave a drink to",
        "When Tom and Anna went to the park, Anna gave a ball to",
    ]
    tokens = model.to_tokens(prompts)
    names = [(" Mary", " John"), (" Tom", " Anna")]
    answers = torch.tensor([[model.to_single_token(a), model.to_single_token(b)] for a, b in names])
    _, cache = model.run_with_cache(tokens)
    stack = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1)  # [component, batch, d_model]
    batched = cache.logit_attrs(stack, answers[:, 0], answers[:, 1], pos_slice=-1)
    last = len(prompts) - 1
    for one in (
        cache.logit_attrs(stack, answers[-1, 0], answers[-1, 1], pos_slice=Slice(-1), batch_slice=-1),
        cache.logit_attrs(
            stack[:, -1], answers[-1, 0], answers[-1, 1], pos_slice=-1, batch_slice=-1, has_batch_dim=False
        ),  # fmt: skip
        cache.logit_attrs(
            stack[:, [0, last]],
            answers[[0, last], 0],
            answers[[0, last], 1],
            pos_slice=-1,
            batch_slice=[0, last],
            has_batch_dim=False,
        )[:, -1],  # fmt: skip
    ):
        assert torch.equal(one, batched[:, -1])
    with pytest.raises(ValueError, match="has no batch dim .* holds 2 prompts.*pass batch_slice="):
        cache.logit_attrs(stack[:, -1], answers[-1, 0], answers[-1, 1], pos_slice=-1, has_batch_dim=False)


def test_run_with_cache_without_logits_runs_the_blocks_of_hooks_already_on_the_model(model):
    """return_type=None stops after the last block a cache needs, but not before the hooks added to the
    model fire (the Main Demo's induction-score hook on every layer's pattern: layer 1's never ran)."""
    fired = []
    model.add_hook(
        lambda name: name.endswith("hook_pattern"), lambda pattern, hook: fired.append(hook.layer())
    )
    try:
        model.run_with_cache(
            model.to_tokens("w3 w4 w5"), names_filter="blocks.0.hook_resid_post", return_type=None
        )
    finally:
        model.reset_hooks()
    assert fired == list(range(model.cfg.n_layers))


def test_split_qkv_input_caches_ln1_per_head_sliced_by_position_and_applied_as_one(model):
    """With use_split_qkv_input, ln1's hooks are per head ([batch, pos, head, ...]): pos_slice takes
    positions (it took the last head), and decompose_resid(apply_ln=True) applies the one scale (it
    raised a shape error from inside torch)."""
    tokens = model.to_tokens(["w3 w4 w5 w6", "w7 w3 w9 w4"])
    _, plain = model.run_with_cache(tokens)
    model.set_use_split_qkv_input(True)
    try:
        _, split = model.run_with_cache(tokens)
        name = "blocks.1.ln1.hook_scale"
        last = model.run_with_cache(tokens, pos_slice=-1, names_filter=name)[1][name]
        torch.testing.assert_close(last, split[name][:, -1:])
        torch.testing.assert_close(
            split.decompose_resid(layer=1, apply_ln=True), plain.decompose_resid(layer=1, apply_ln=True)
        )
    finally:
        model.set_use_split_qkv_input(False)


def test_run_with_cache_takes_transformer_lens_keywords(model):
    """clear_contexts and return_cache_object do what TransformerLens's do (they were passed on to
    forward, which raised); reset_hooks_end=False, which would leave the caching hooks on, is refused."""
    tokens = model.to_tokens("w3 w4 w5")
    model.hook_dict["blocks.0.hook_resid_pre"].ctx["seen"] = True
    _, cache = model.run_with_cache(tokens, clear_contexts=True, return_cache_object=False)
    _, full = model.run_with_cache(tokens)
    assert isinstance(cache, dict) and torch.equal(
        cache["blocks.1.attn.hook_z"], full["blocks.1.attn.hook_z"]
    )
    assert not model.hook_dict["blocks.0.hook_resid_pre"].ctx
    with pytest.raises(ValueError, match="reset_hooks_end=False"):
        model.run_with_cache(tokens, reset_hooks_end=False)


def test_transformer_lens_idioms_fail_loudly_where_a_number_would_be_wrong():
    """TL code's idioms: `except AssertionError` around to_single_token (a multi-token string) keeps
    working; apply_ln_to_stack of a stack over every position with an int pos_slice (which names the
    positions already taken) is refused where it applied the last position's scale to every position
    (or failed inside torch); add_hook of a misspelt name suggests the right one; a property a model
    lacks says why (W_gate of a model without a gated MLP), not only that the attribute is missing."""
    model = _model("gpt2-like")
    kept = []
    for word in ("w3", "w4 w5", "w6"):
        try:
            kept.append(model.to_single_token(word))
        except AssertionError:
            continue
    assert kept == [model.to_single_token("w3"), model.to_single_token("w6")]
    _, cache = model.run_with_cache(model.to_tokens(["w3 w4 w5", "w6 w7 w8"]))
    stack = cache.decompose_resid()  # [component, batch, pos, d_model]
    with pytest.raises(ValueError, match="pos_slice names the positions already taken"):
        cache.apply_ln_to_stack(stack, pos_slice=-1)
    torch.testing.assert_close(
        cache.apply_ln_to_stack(stack[:, :, -1], pos_slice=-1), cache.apply_ln_to_stack(stack)[:, :, -1]
    )
    with pytest.raises(Exception, match="blocks.0.hook_resid_post"):
        model.add_hook("blocks.0.hook_resid_psot", lambda x, hook: x)
    with pytest.raises(AttributeError, match="no gated MLP"):
        _ = model.W_gate


def test_a_prompt_that_stops_at_eos_reads_the_same_in_a_batch_as_alone():
    """A row that reached EOS is filled with EOS while the batch runs on (TransformerLens's convention);
    its text kept the fill, so it depended on the other prompts: it ends at its first EOS, as alone."""
    model = _model("llama-gqa")
    kwargs = dict(max_new_tokens=6, do_sample=False, verbose=False)
    free = model.generate(PROMPTS[1], return_type="tokens", stop_at_eos=False, **kwargs)[0]
    eos = int(free[model.to_tokens(PROMPTS[1]).shape[1] + 1])  # the second token it makes: it stops there
    alone = model.generate(PROMPTS[1], eos_token_id=eos, **kwargs)
    batch = model.generate([PROMPTS[0], PROMPTS[1]], eos_token_id=eos, **kwargs)
    others = model.generate(PROMPTS[0], return_type="tokens", eos_token_id=eos, **kwargs)[0]
    assert eos not in others.tolist()[:-1]  # the other prompt runs on past the stop
    assert batch[1] == alone and batch[0] == model.generate(PROMPTS[0], eos_token_id=eos, **kwargs)
