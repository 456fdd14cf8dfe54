"""Our forward pass equals transformers' (eager attention, fp32) to 1e-4 on every architecture."""

from __future__ import annotations

import functools

import pytest
import torch
import transformers

import interp

ATOL = 1e-4


def _random_hf_model(config: transformers.PretrainedConfig, seed: int = 0):
    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # make norms and biases non-trivial, so a wrong mapping cannot hide
        for name, param in model.named_parameters():
            if "norm" in name or "ln" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
            if any(part in name for part in QUERY_KEY_WEIGHTS):
                param.mul_(QUERY_KEY_GAIN)  # peaked attention: positions, windows and caps matter
    return model.to(interp.default_device())  # beside the model under test ($INTERP_DEVICE)


# Query/key projection weights (fused ones include values) are scaled up so that attention
# patterns are far from uniform, as in trained models.
QUERY_KEY_WEIGHTS = ("q_proj", "k_proj", "c_attn", "query_key_value", "qkv_proj")
QUERY_KEY_GAIN = 4.0


# Small shapes shared by the Llama-style configs below.
_SMALL = dict(
    num_hidden_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    vocab_size=113,
    max_position_embeddings=64,
)

_GPT2 = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=101, n_positions=64)
_NEOX = dict(
    num_hidden_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    intermediate_size=128,
    vocab_size=97,
    rotary_pct=1.0,
)
_OPT = dict(
    num_hidden_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    ffn_dim=96,
    vocab_size=101,
    max_position_embeddings=64,
    word_embed_proj_dim=64,
    pad_token_id=1,
)
_FALCON = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=101, ffn_hidden_size=96)

NEW_FAMILY_CONFIGS = {
    "mistral-sliding-window": lambda: transformers.MistralConfig(**_SMALL, sliding_window=6),
    "qwen3-qk-norm": lambda: transformers.Qwen3Config(**_SMALL, head_dim=32),
    "qwen3-sliding-tied": lambda: transformers.Qwen3Config(
        **{**_SMALL, "num_hidden_layers": 3},
        use_sliding_window=True,
        sliding_window=5,
        max_window_layers=1,
        tie_word_embeddings=True,
    ),
    "olmo2-post-norms": lambda: transformers.Olmo2Config(**_SMALL),
    "olmo2-mha": lambda: transformers.Olmo2Config(**{**_SMALL, "num_key_value_heads": 4}, rope_theta=500.0),
    "granite-multipliers": lambda: transformers.GraniteConfig(
        **_SMALL,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=0.5,
        logits_scaling=8.0,
        tie_word_embeddings=True,
    ),
    "smollm3-nope-layers": lambda: transformers.SmolLM3Config(
        **{**_SMALL, "num_hidden_layers": 4}, no_rope_layer_interval=2, pad_token_id=0
    ),
    "stablelm-partial-rotary": lambda: transformers.StableLmConfig(**_SMALL, partial_rotary_factor=0.25),
    "stablelm-parallel-qk-norm-bias": lambda: transformers.StableLmConfig(
        **_SMALL, use_parallel_residual=True, qk_layernorm=True, use_qkv_bias=True
    ),
    "phi3-fused": lambda: transformers.Phi3Config(**_SMALL, pad_token_id=0),
    "phi3-partial-rotary": lambda: transformers.Phi3Config(
        **{**_SMALL, "num_key_value_heads": 4}, partial_rotary_factor=0.5, pad_token_id=0
    ),
    "phi-partial-rotary": lambda: transformers.PhiConfig(**_SMALL, partial_rotary_factor=0.5),
    "phi-qk-layernorm": lambda: transformers.PhiConfig(**_SMALL, qk_layernorm=True, hidden_act="gelu"),
    "gptj-interleaved-partial": lambda: transformers.GPTJConfig(
        n_layer=2, n_embd=64, n_head=4, rotary_dim=8, vocab_size=101, n_positions=64
    ),
    "gptj-full-rotary": lambda: transformers.GPTJConfig(
        n_layer=2, n_embd=48, n_head=3, rotary_dim=16, n_inner=80, vocab_size=101, n_positions=64
    ),
    "gpt-neo-local-global": lambda: transformers.GPTNeoConfig(
        num_layers=3,
        attention_types=[[["global", "local"], 1], [["local"], 1]],
        hidden_size=64,
        num_heads=4,
        window_size=5,
        vocab_size=101,
        max_position_embeddings=64,
    ),
    "opt-pre-ln": lambda: transformers.OPTConfig(**_OPT),
    "opt-project-in-out": lambda: transformers.OPTConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_dim=96,
        vocab_size=101,
        max_position_embeddings=64,
        word_embed_proj_dim=32,
        enable_bias=False,
        pad_token_id=1,
    ),
    "falcon-multi-query-parallel": lambda: transformers.FalconConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        vocab_size=101,
        multi_query=True,
        parallel_attn=True,
        bias=False,
        ffn_hidden_size=96,
    ),
    "falcon-new-decoder-gqa": lambda: transformers.FalconConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_kv_heads=2,
        vocab_size=101,
        new_decoder_architecture=True,
        bias=True,
        ffn_hidden_size=96,
    ),
    "falcon-new-decoder-one-norm-mqa": lambda: transformers.FalconConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_kv_heads=1,
        vocab_size=101,
        new_decoder_architecture=True,
        num_ln_in_parallel_attn=1,
        bias=False,
        ffn_hidden_size=96,
    ),
    "falcon-sequential-mha": lambda: transformers.FalconConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        vocab_size=101,
        multi_query=False,
        parallel_attn=False,
        bias=True,
        rope_theta=1000.0,
    ),
    "gemma-mqa": lambda: transformers.GemmaConfig(
        **{**_SMALL, "num_key_value_heads": 1}, head_dim=32, hidden_activation="gelu_pytorch_tanh"
    ),
    "gemma2-softcap-sliding": lambda: transformers.Gemma2Config(
        **{**_SMALL, "num_hidden_layers": 3},
        head_dim=32,
        sliding_window=5,
        query_pre_attn_scalar=24,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=0.5,
    ),
    "gemma2-no-softcap": lambda: transformers.Gemma2Config(
        **_SMALL, head_dim=16, sliding_window=4, attn_logit_softcapping=None, final_logit_softcapping=None
    ),
    "gemma3-local-global-rope": lambda: transformers.Gemma3TextConfig(
        **{**_SMALL, "num_hidden_layers": 3},
        head_dim=16,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        },
    ),
    "gemma3-softcap": lambda: transformers.Gemma3TextConfig(
        **_SMALL, head_dim=16, sliding_window=4, final_logit_softcapping=4.0, attn_logit_softcapping=6.0
    ),
    "mixtral-top2": lambda: transformers.MixtralConfig(**_SMALL, num_local_experts=4, num_experts_per_tok=2),
    "mixtral-top1-sliding": lambda: transformers.MixtralConfig(
        **_SMALL, num_local_experts=3, num_experts_per_tok=1, sliding_window=6
    ),
}

# Config keys read by some architectures' transformers code and ignored by others': interp reads
# each where transformers does.
CONFIG_KEY_CONFIGS = {
    "gpt2-unscaled-scores": lambda: transformers.GPT2Config(**_GPT2, scale_attn_weights=False),
    "gpt2-silu": lambda: transformers.GPT2Config(**_GPT2, activation_function="silu"),
    "gpt2-gelu-pytorch-tanh": lambda: transformers.GPT2Config(
        **_GPT2, activation_function="gelu_pytorch_tanh"
    ),
    "neox-gelu-fast": lambda: transformers.GPTNeoXConfig(**_NEOX, hidden_act="gelu_fast"),
    "gemma-reads-hidden-act": lambda: transformers.GemmaConfig(
        **_SMALL, head_dim=16, hidden_act="silu", hidden_activation="gelu_pytorch_tanh"
    ),
    "llama-ignores-partial-rotary": lambda: transformers.LlamaConfig(**_SMALL, partial_rotary_factor=0.5),
    **{
        f"{name}-ignores-bias-keys": lambda make=make: make(**_SMALL, mlp_bias=True)
        for name, make in {
            "mistral": functools.partial(transformers.MistralConfig, attention_bias=True),
            "mixtral": functools.partial(
                transformers.MixtralConfig, attention_bias=True, num_local_experts=3, num_experts_per_tok=2
            ),
            "phi3": functools.partial(transformers.Phi3Config, attention_bias=True, pad_token_id=0),
            "qwen2": functools.partial(transformers.Qwen2Config, attention_bias=True),
            "stablelm": functools.partial(transformers.StableLmConfig, attention_bias=True),
            "qwen3": transformers.Qwen3Config,  # these three read attention_bias, not mlp_bias
            "olmo2": transformers.Olmo2Config,
            "gemma": functools.partial(transformers.GemmaConfig, head_dim=16),
        }.items()
    },
    **{
        f"{name}-ignores-sliding-window": lambda make=make: make(**_SMALL, sliding_window=7)
        for name, make in {
            "llama": transformers.LlamaConfig,
            "granite": transformers.GraniteConfig,
            "olmo2": transformers.Olmo2Config,
            "stablelm": transformers.StableLmConfig,
            "phi": transformers.PhiConfig,
            "gemma": functools.partial(transformers.GemmaConfig, head_dim=16),
        }.items()
    },
    **{
        f"{name}-slides-every-layer": lambda make=make: make(
            **_SMALL, sliding_window=7, layer_types=["full_attention", "sliding_attention"]
        )
        for name, make in {
            "mistral": transformers.MistralConfig,
            "mixtral": functools.partial(
                transformers.MixtralConfig, num_local_experts=3, num_experts_per_tok=2
            ),
            "phi3": functools.partial(transformers.Phi3Config, pad_token_id=0),
        }.items()
    },
}

# RoPE types whose frequencies are fixed below max_position_embeddings: the model's own load exactly.
FIXED_ROPE_CONFIGS = {
    f"{name}-rope-{kind}": lambda make=make, scaling=scaling: make(rope_scaling=scaling)
    for name, make in {
        "neox": functools.partial(transformers.GPTNeoXConfig, **_NEOX),
        "falcon": functools.partial(transformers.FalconConfig, **_FALCON),
    }.items()
    for kind, scaling in {
        "linear": {"rope_type": "linear", "factor": 2.0},
        "dynamic": {"rope_type": "dynamic", "factor": 2.0},
        "yarn": {"rope_type": "yarn", "factor": 2.0, "attention_factor": 1.0},
    }.items()
}

HF_CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=101, n_positions=64),
    "gpt2-relu-wide": lambda: transformers.GPT2Config(
        n_layer=3, n_embd=48, n_head=3, n_inner=80, vocab_size=90, n_positions=40, activation_function="relu"
    ),
    "pythia-partial-rotary": lambda: transformers.GPTNeoXConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=97,
        max_position_embeddings=64,
        rotary_pct=0.25,
        use_parallel_residual=True,
    ),
    "neox-sequential-full-rotary": lambda: transformers.GPTNeoXConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=2,
        intermediate_size=96,
        vocab_size=97,
        max_position_embeddings=64,
        rotary_pct=1.0,
        use_parallel_residual=False,
        rotary_emb_base=500,
    ),
    "llama-gqa-tied": lambda: transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        vocab_size=113,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        rope_theta=100000.0,
    ),
    "llama-mha-untied-headdim": lambda: transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=48,
        num_attention_heads=3,
        head_dim=24,
        num_key_value_heads=3,
        intermediate_size=64,
        vocab_size=113,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        attention_bias=True,
        mlp_bias=True,
    ),
    "llama3-scaled-rope": lambda: transformers.LlamaConfig(
        num_hidden_layers=1,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=1,
        intermediate_size=96,
        vocab_size=113,
        max_position_embeddings=64,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "qwen2-biases-gqa": lambda: transformers.Qwen2Config(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        vocab_size=113,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    ),
    "mistral-gqa": lambda: transformers.MistralConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        vocab_size=113,
        max_position_embeddings=64,
        sliding_window=None,
    ),
    **NEW_FAMILY_CONFIGS,
    **CONFIG_KEY_CONFIGS,
    **FIXED_ROPE_CONFIGS,
}


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_logits_match_transformers(name: str) -> None:
    hf_model = _random_hf_model(HF_CONFIGS[name]())
    model = interp.load_model(hf_model)
    tokens = torch.randint(0, hf_model.config.vocab_size, (3, 20), generator=torch.Generator().manual_seed(1))
    tokens = tokens.to(hf_model.device)
    with torch.no_grad():
        expected = hf_model(tokens).logits
        ours = model(tokens)
        _, cache = model.run_with_cache(tokens)  # the hooked (explicit-pattern) path
        hooked = model.unembed(model.ln_final(cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]))
    torch.testing.assert_close(ours, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(hooked, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["qwen3-qk-norm", "mixtral-top2", "llama-gqa-tied"])
def test_a_pos_slice_of_the_cache_keeps_those_positions_of_every_activation(name: str) -> None:
    """run_with_cache(pos_slice=p) holds each activation of the full cache at positions p, whatever
    its layout: the position axis is found here as the one of the input's length (11, which no head,
    expert or width count equals; a pattern's first such axis is its queries). An expert's hooks hold
    its routed tokens, with no position axis: kept whole."""
    model = interp.load_model(_random_hf_model(HF_CONFIGS[name]()))
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 11), generator=torch.Generator().manual_seed(1))
    settings = dict(use_split_qkv_input=True, use_attn_result=True, use_hook_tokens=True)
    with model.settings(**settings), torch.no_grad():
        _, full = model.run_with_cache(tokens)
        for pos_slice in (4, -1, [1, 3, 8]):
            _, part = model.run_with_cache(tokens, pos_slice=pos_slice)
            assert part.keys() == full.keys()
            for hook, value in full.items():
                if ".experts." in hook:
                    torch.testing.assert_close(part[hook], value, atol=0, rtol=0)
                    continue
                dim = value.shape.index(11)
                index = torch.tensor([pos_slice] if isinstance(pos_slice, int) else pos_slice)
                torch.testing.assert_close(part[hook], value.index_select(dim, index % 11), atol=0, rtol=0)
        with pytest.raises(ValueError, match="pos_slice=20 selects positions outside the run's 11"):
            model.run_with_cache(tokens, pos_slice=20)


def test_a_soft_capped_model_keeps_its_probabilities_under_transformer_lens_processing() -> None:
    """cap * tanh(logits / cap) is not shift-invariant, so centring W_U would change a soft-capped
    model's probabilities: `from_pretrained` skips it with a warning (as TransformerLens) and its
    log-probs are transformers'; asked for by name, it is refused."""
    hf_model = _random_hf_model(HF_CONFIGS["gemma2-softcap-sliding"]())
    tokens = torch.randint(0, hf_model.config.vocab_size, (3, 20), generator=torch.Generator().manual_seed(1))
    with pytest.warns(UserWarning, match="soft-caps its logits"):
        model = interp.HookedTransformer.from_pretrained("gemma2", hf_model=hf_model, device="cpu")
    with torch.no_grad():
        expected = hf_model(tokens).logits.log_softmax(-1)
        torch.testing.assert_close(model(tokens).log_softmax(-1), expected, atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="center_unembed would change"):
        interp.load_model(hf_model, center_unembed=True)


# Long RoPE switches to long_factor past original_max_position_embeddings (16): frequencies that
# depend on the input's length. (8 factors: half of d_head 16.)
_LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0] * 8,
    "long_factor": [4.0] * 8,
    "original_max_position_embeddings": 16,
    "attention_factor": 1.0,
}

# Configs interp cannot compute as transformers does: refused by a message naming the key.
REFUSED_CONFIGS = {
    "gpt2-scores-by-inverse-layer": (
        lambda: transformers.GPT2Config(**_GPT2, scale_attn_by_inverse_layer_idx=True),
        "scale_attn_by_inverse_layer_idx",
    ),
    "gpt2-quick-gelu": (
        lambda: transformers.GPT2Config(**_GPT2, activation_function="quick_gelu"),
        "quick_gelu",
    ),
    "opt-weightless-norms": (
        lambda: transformers.OPTConfig(**_OPT, layer_norm_elementwise_affine=False),
        "layer_norm_elementwise_affine",
    ),
    "neox-longrope": (lambda: transformers.GPTNeoXConfig(**_NEOX, rope_scaling=_LONGROPE), "longrope"),
    "falcon-longrope": (lambda: transformers.FalconConfig(**_FALCON, rope_scaling=_LONGROPE), "longrope"),
}


@pytest.mark.parametrize("name", sorted(REFUSED_CONFIGS))
def test_unsupported_configs_are_refused(name: str) -> None:
    make_config, message = REFUSED_CONFIGS[name]
    with pytest.raises(NotImplementedError, match=message):
        interp.load_model(_random_hf_model(make_config()))


def _one_config_per_family() -> list[str]:
    """The first config of each model type (the bf16 and generation tests run one per family)."""
    seen: dict[str, str] = {}
    for name, make in HF_CONFIGS.items():
        seen.setdefault(make().model_type, name)
    return sorted(seen.values())


# bf16 keeps 8 significant bits (relative spacing 2^-8 = 0.4%); rounding at different places in
# two implementations drifts apart over layers. Measured on these configs: our bf16 logits are
# within 2.6% of the largest logit of transformers' bf16 logits, and about as close to the fp32
# logits as transformers' bf16 ones are (ratio <= 1.6). The bounds leave about 2x headroom.
# (Mixture-of-experts routing can flip between bf16 runs where two experts nearly tie.)
BF16_RTOL_OF_SCALE = 0.05


@pytest.mark.parametrize("name", _one_config_per_family())
def test_bf16_logits_match_transformers_bf16(name: str) -> None:
    hf_model = _random_hf_model(HF_CONFIGS[name]())
    tokens = torch.randint(0, hf_model.config.vocab_size, (3, 20), generator=torch.Generator().manual_seed(1))
    tokens = tokens.to(hf_model.device)
    model = interp.load_model(hf_model, dtype=torch.bfloat16)
    with torch.no_grad():
        fp32 = hf_model(tokens).logits
        theirs = hf_model.to(torch.bfloat16)(tokens).logits.float()
        ours = model(tokens)
    assert ours.dtype == torch.bfloat16
    ours = ours.float()
    scale = fp32.abs().max()
    assert (ours - theirs).abs().max() <= BF16_RTOL_OF_SCALE * scale
    assert (ours - fp32).abs().max() <= 2 * (theirs - fp32).abs().max() + 0.005 * scale


def _first_divergence_is_a_tie(hf_model, ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    """Greedy continuations may part only where transformers' top two logits tie (to 1e-4)."""
    for row in range(ours.shape[0]):
        differ = (ours[row] != theirs[row]).nonzero()
        if len(differ):
            step = differ[0, 0].item()
            with torch.no_grad():
                logits = hf_model(theirs[row : row + 1, :step]).logits[0, -1]
            top2 = logits.topk(2).values
            if top2[0] - top2[1] > ATOL:
                return False
    return True


@pytest.mark.parametrize("name", _one_config_per_family())
def test_kv_cache_greedy_generation_matches_transformers(name: str) -> None:
    """Greedy decoding with our KV cache continues the prompts as transformers' generate does,
    past the sliding windows of the configs that have them."""
    hf_model = _random_hf_model(HF_CONFIGS[name]())
    hf_model.generation_config.eos_token_id = None  # never stop early
    hf_model.generation_config.pad_token_id = 0
    model = interp.load_model(hf_model)
    prompts = torch.randint(0, hf_model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(2))
    prompts = prompts.to(hf_model.device)
    with torch.no_grad():
        theirs = hf_model.generate(
            prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=10, do_sample=False
        )
    ours = model.generate(prompts, max_new_tokens=10)
    assert ours.shape == theirs.shape == (2, 17)
    assert torch.equal(ours, theirs) or _first_divergence_is_a_tie(hf_model, ours, theirs)


def test_smollm2_matches_transformers_gguf(smollm2, smollm2_hf) -> None:
    """fp32 on a prompt; float64 on a padded batch. SmolLM2's residual stream reaches ~2e4, where
    fp32's spacing is 2e-3, so fp32 pad positions differ by rounding alone; in float64 they agree
    (transformers still rounds its RMSNorm through float32, hence not to 1e-12)."""
    tokens = smollm2.to_tokens("When Mary and John went to the store, John gave a drink to")
    with torch.no_grad():
        torch.testing.assert_close(smollm2(tokens), smollm2_hf(tokens).logits, atol=ATOL, rtol=0)
        batch = smollm2.to_tokens(
            ["When Mary and John went to the store, John gave a drink to", "The cat sat"]
        )
        ours64 = interp.from_hf(smollm2_hf).to(torch.float64)(batch)
        torch.testing.assert_close(ours64, smollm2_hf.to(torch.float64)(batch).logits, atol=ATOL, rtol=0)
        smollm2_hf.to(torch.float32)


def test_smollm2_does_ioi(smollm2) -> None:
    logits = smollm2(smollm2.to_tokens("When Mary and John went to the store, John gave a drink to"))[0, -1]
    logit_diff = logits[smollm2.to_single_token(" Mary")] - logits[smollm2.to_single_token(" John")]
    assert logit_diff > 3


def test_smollm2_config(smollm2) -> None:
    cfg = smollm2.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_model, cfg.d_vocab) == (30, 9, 3, 576, 49152)
    assert cfg.normalization == "rmsnorm" and cfg.gated_mlp and cfg.positional == "rotary"
    assert not cfg.default_prepend_bos  # SmolLM2's tokenizer adds no BOS


def test_local_transformers_directory_loads_with_its_tokenizer(smollm2, tmp_path) -> None:
    hf_model = _random_hf_model(HF_CONFIGS["qwen2-biases-gqa"]())
    hf_model.config.vocab_size = smollm2.cfg.d_vocab
    hf_model.resize_token_embeddings(smollm2.cfg.d_vocab)
    hf_model.save_pretrained(tmp_path / "qwen")
    smollm2.tokenizer.save_pretrained(tmp_path / "qwen")
    model = interp.load_model(str(tmp_path / "qwen"))
    tokens = model.to_tokens("When Mary and John went to the store")
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf_model(tokens).logits, atol=ATOL, rtol=0)
    assert model.to_single_token(" Mary") == smollm2.to_single_token(" Mary")


def test_a_half_precision_gemma_loads_as_its_float32_run():
    """Gemma's norms x * (1 + w) fold into w in float32, as transformers adds them: a bfloat16 model
    loaded in float32 gives the float32 run of the same weights (a bfloat16 1 + w is off by 4e-3)."""
    hf_model = _random_hf_model(HF_CONFIGS["gemma-mqa"]())
    half = hf_model.to(torch.bfloat16)
    tokens = torch.randint(0, half.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = interp.load_model(half)(tokens.to(half.device))
        expected = half.float()(tokens.to(half.device)).logits
    torch.testing.assert_close(ours, expected, atol=ATOL, rtol=0)


def test_a_float64_transformers_model_keeps_its_weights_in_float64():
    """load_model(dtype=float64) of a float64 model object holds its weights as they are (they were
    rounded to float32 on the way: 4e-9 off)."""
    hf_model = _random_hf_model(HF_CONFIGS["llama-gqa-tied"]()).double()
    with torch.no_grad():  # values no float32 holds
        for param in hf_model.parameters():
            param.add_(torch.randn_like(param) * 1e-9)
    model = interp.load_model(hf_model, dtype=torch.float64)
    assert model.W_E.dtype == torch.float64
    assert torch.equal(model.W_E, hf_model.get_input_embeddings().weight.to(model.W_E.device))


@pytest.mark.parametrize("name", ["neox-rope-dynamic", "falcon-rope-dynamic"])
def test_a_dynamic_rope_model_that_ran_past_its_context_loads_with_its_own_frequencies(name: str) -> None:
    """transformers' dynamic RoPE stretches a module's `inv_freq` after a run longer than
    max_position_embeddings (and keeps it until a shorter run): a model loaded then takes the model's
    own frequencies, not the stretched ones (1.6e-2 off on 30 tokens)."""
    hf_model = _random_hf_model(HF_CONFIGS[name]())
    long = hf_model.config.max_position_embeddings + 10
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        hf_model(torch.randint(0, hf_model.config.vocab_size, (1, long), generator=generator))
    model = interp.load_model(hf_model)
    tokens = torch.randint(0, hf_model.config.vocab_size, (2, 30), generator=generator)
    with torch.no_grad():
        expected = hf_model(tokens).logits  # a shorter run puts transformers' frequencies back
        torch.testing.assert_close(model(tokens), expected, atol=ATOL, rtol=0)
