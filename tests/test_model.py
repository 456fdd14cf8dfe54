"""Hooks, the cache and its decompositions, weight processing, saving, generation and bad input."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest
import torch
import transformers
from conftest import IOI_PROMPT, tiny_config

import interp
from interp.config import place
from interp.model.cache import select_pos
from interp.model.hooks import observer


def _models():
    """Small random models of every kind the code distinguishes."""
    return {
        "gpt2-like": tiny_config(),
        "attn-only": tiny_config(attn_only=True, positional="none"),
        "neox-parallel-partial-rotary": tiny_config(
            positional="rotary", rotary_dim=4, parallel_residual=True, activation="gelu"
        ),
        "llama-gqa": tiny_config(
            normalization="rmsnorm",
            positional="rotary",
            gated_mlp=True,
            activation="silu",
            n_kv_heads=2,
            qkv_bias=False,
            attn_out_bias=False,
            mlp_bias=False,
            unembed_bias=False,
        ),
    }


@pytest.fixture(params=sorted(_models()))
def model(request) -> interp.HookedTransformer:
    torch.manual_seed(0)
    model = interp.HookedTransformer(_models()[request.param])
    with torch.no_grad():  # non-trivial norms and biases
        for name, param in model.named_parameters():
            if name.endswith((".w", ".b")) or ".b_" in name or name == "b_U":
                param.add_(torch.randn_like(param) * 0.1)
    return model


def _tokens(model, batch=3, pos=12):
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(0))


def test_hook_shapes_follow_the_contract(model) -> None:
    cfg = model.cfg
    with model.settings(use_attn_result=True, use_split_qkv_input=True):
        _, cache = model.run_with_cache(_tokens(model))
    b, p, h, kv, d, e = 3, 12, cfg.n_heads, cfg.n_kv_heads, cfg.d_model, cfg.d_head
    expected = {
        "hook_embed": (b, p, d),
        "blocks.0.hook_resid_pre": (b, p, d),
        "blocks.1.hook_resid_post": (b, p, d),
        "blocks.0.ln1.hook_scale": (b, p, kv, 1),  # split inputs: ln1 runs on q, k, v inputs; v's is last
        "blocks.0.attn.hook_q": (b, p, h, e),
        "blocks.0.attn.hook_k": (b, p, kv, e),
        "blocks.0.attn.hook_v": (b, p, kv, e),
        "blocks.0.attn.hook_attn_scores": (b, h, p, p),
        "blocks.0.attn.hook_pattern": (b, h, p, p),
        "blocks.0.attn.hook_z": (b, p, h, e),
        "blocks.0.attn.hook_result": (b, p, h, d),
        "blocks.0.hook_q_input": (b, p, h, d),
        "blocks.0.hook_k_input": (b, p, kv, d),
        "blocks.0.hook_attn_out": (b, p, d),
        "ln_final.hook_scale": (b, p, 1),
        "ln_final.hook_normalized": (b, p, d),
    }
    if cfg.positional == "learned":
        expected["hook_pos_embed"] = (b, p, d)
    if cfg.positional == "rotary":
        expected["blocks.0.attn.hook_rot_q"] = (b, p, h, e)
        expected["blocks.0.attn.hook_rot_k"] = (b, p, kv, e)
    if not cfg.attn_only:
        expected["blocks.0.hook_mlp_out"] = (b, p, d)
        expected["blocks.0.mlp.hook_pre"] = (b, p, cfg.d_mlp)
        expected["blocks.0.mlp.hook_post"] = (b, p, cfg.d_mlp)
        if cfg.gated_mlp:
            expected["blocks.0.mlp.hook_pre_linear"] = (b, p, cfg.d_mlp)
    if not cfg.attn_only and not cfg.parallel_residual:
        expected["blocks.0.hook_resid_mid"] = (b, p, d)
    for name, shape in expected.items():
        assert tuple(cache[name].shape) == shape, name
    assert ("blocks.0.hook_resid_mid" in cache) == (not cfg.attn_only and not cfg.parallel_residual)


def test_opt_in_hooks_do_not_change_the_output(model) -> None:
    tokens = _tokens(model)
    with torch.no_grad():
        plain = model(tokens)
        with model.settings(use_attn_result=True, use_split_qkv_input=True):
            opted = model(tokens)
    torch.testing.assert_close(opted, plain, atol=1e-5, rtol=0)


def test_pattern_rows_are_causal_distributions(model) -> None:
    _, cache = model.run_with_cache(_tokens(model), names_filter=lambda n: n.endswith("hook_pattern"))
    pattern = cache["pattern", 0]
    torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:-1]))
    assert (pattern.triu(1) == 0).all()


def test_cache_equals_what_hooks_see(model) -> None:
    """What an observer hook sees (one that only reads, as run_with_cache's) is what the cache holds."""
    tokens = _tokens(model)
    seen = {}

    @observer
    def record(tensor, hook):
        seen[hook.name] = tensor.clone()

    model.run_with_hooks(tokens, fwd_hooks=[(lambda name: True, record)])
    _, cache = model.run_with_cache(tokens)
    assert set(seen) == set(cache.keys())
    for name, tensor in seen.items():
        torch.testing.assert_close(cache[name], tensor, atol=0, rtol=0)


def test_names_filter_caches_only_what_is_asked(model) -> None:
    _, cache = model.run_with_cache(_tokens(model), names_filter=["blocks.1.attn.hook_z"])
    assert list(cache.keys()) == ["blocks.1.attn.hook_z"]
    assert cache["z", 1] is cache["blocks.1.attn.hook_z"]
    with pytest.raises(KeyError, match="not cached"):
        cache["pattern", 0]


def test_decompose_resid_sums_to_the_final_residual(model) -> None:
    _, cache = model.run_with_cache(_tokens(model))
    stack, labels = cache.decompose_resid(return_labels=True)
    final = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    torch.testing.assert_close(stack.sum(0), final, atol=1e-5, rtol=0)
    assert len(labels) == stack.shape[0] and labels[0] == "embed"
    accumulated, acc_labels = cache.accumulated_resid(return_labels=True)
    torch.testing.assert_close(accumulated[-1], final)
    assert acc_labels[-1] == "final_post"


def test_head_results_plus_bias_sum_to_attn_out(model) -> None:
    with model.settings(use_attn_result=True):
        _, cache = model.run_with_cache(_tokens(model))
    for layer in range(model.cfg.n_layers):
        b_O = model.blocks[layer].attn.b_O
        total = cache["result", layer].sum(2) + (0 if b_O is None else b_O)
        torch.testing.assert_close(total, cache["attn_out", layer], atol=1e-5, rtol=0)
    # stack_head_results computes the same from hook_z when hook_result was not cached
    _, z_cache = model.run_with_cache(_tokens(model), names_filter=lambda n: n.endswith("hook_z"))
    from_z, labels = z_cache.stack_head_results(return_labels=True)
    from_result = cache.stack_head_results()
    torch.testing.assert_close(from_z, from_result, atol=1e-5, rtol=0)
    assert labels[: model.cfg.n_heads + 1][-1] == "L1H0"


def test_direct_logit_attribution_sums_to_logits(model) -> None:
    tokens = _tokens(model)
    logits, cache = model.run_with_cache(tokens)
    pos = torch.tensor([11, 5, 8])
    stack = cache.decompose_resid(pos=pos)  # [component, batch, d_model]
    answers, wrong = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    attrs = cache.logit_attrs(stack, answers, wrong, pos=pos)  # [component, batch]: applies ln_final
    rows = torch.arange(3)
    expected = logits[rows, pos, answers] - logits[rows, pos, wrong]
    ln_bias = model.ln_final.b
    constant = 0.0 if ln_bias is None else ln_bias @ (model.W_U[:, answers] - model.W_U[:, wrong])
    bias_u = 0.0 if model.b_U is None else model.b_U[answers] - model.b_U[wrong]
    torch.testing.assert_close(attrs.sum(0) + constant + bias_u, expected, atol=1e-4, rtol=0)


def test_select_pos_per_prompt() -> None:
    x = torch.arange(2 * 4 * 3).reshape(2, 4, 3)
    assert torch.equal(select_pos(x, torch.tensor([1, 3])), torch.stack([x[0, 1], x[1, 3]]))
    assert torch.equal(select_pos(x, 2), x[:, 2])


@pytest.mark.parametrize("fold_ln,center_writing,center_unembed", [(True, False, False), (True, True, True)])
def test_weight_processing_keeps_log_probs(model, fold_ln, center_writing, center_unembed) -> None:
    tokens = _tokens(model)
    with torch.no_grad():
        before = model(tokens).log_softmax(-1)
        if center_writing and model.cfg.normalization != "layernorm":
            with pytest.raises(ValueError, match="LayerNorm"):
                interp.model.weights.process_weights(model, center_writing_weights=True)
            center_writing = False
        interp.model.weights.process_weights(model, fold_ln, center_writing, center_unembed)
        after = model(tokens).log_softmax(-1)
    torch.testing.assert_close(after, before, atol=1e-4, rtol=0)
    assert model.ln_final.w is None and model.cfg.norm_folded


def test_save_and_load_round_trip(model, tmp_path) -> None:
    interp.model.weights.process_weights(model, fold_ln=True)
    model.save(tmp_path / "ckpt")
    loaded = interp.load_model(tmp_path / "ckpt", device=model.device)
    assert loaded.cfg == model.cfg
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    tokens = _tokens(model)
    assert torch.equal(model(tokens), loaded(tokens))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary leftovers


def test_start_and_stop_at_layer_compose(model) -> None:
    tokens = _tokens(model)
    with torch.no_grad():
        middle = model(tokens, stop_at_layer=1)
        torch.testing.assert_close(model(middle, start_at_layer=1), model(tokens), atol=1e-6, rtol=0)


def test_loss_is_next_token_cross_entropy(model) -> None:
    tokens = _tokens(model)
    logits, loss = model(tokens, return_type="both")
    expected = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
    )
    torch.testing.assert_close(loss, expected)
    assert model(tokens, return_type="loss", loss_per_token=True).shape == (3, 11)


def test_kv_cache_generation_equals_full_recompute(model) -> None:
    prompt = _tokens(model, batch=2, pos=5)
    with_cache = model.generate(prompt, max_new_tokens=6, use_past_kv_cache=True)
    without = model.generate(prompt, max_new_tokens=6, use_past_kv_cache=False)
    assert torch.equal(with_cache, without) and with_cache.shape == (2, 11)
    sampled = [model.generate(prompt, max_new_tokens=6, temperature=1.0, seed=3) for _ in range(2)]
    assert torch.equal(sampled[0], sampled[1])


def test_hooks_are_removed_even_when_the_forward_raises(model) -> None:
    def boom(tensor, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(_tokens(model), fwd_hooks=[("blocks.0.hook_resid_pre", boom)])
    assert not any(hp._forward_hooks for hp in model.hook_dict.values())
    with pytest.raises(RuntimeError), model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", boom)]):
        model(_tokens(model))
    assert not any(hp._forward_hooks for hp in model.hook_dict.values())


def test_a_hook_can_change_the_output(model) -> None:
    tokens = _tokens(model)
    clean = model(tokens)
    zeroed = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: z * 0)])
    assert not torch.allclose(clean, zeroed)
    assert torch.equal(model(tokens), clean)  # and is gone afterwards


# --- bad input ----------------------------------------------------------------------------------


def test_hook_name_typo_suggests_the_nearest(tiny_model) -> None:
    with pytest.raises(KeyError, match="blocks.0.attn.hook_pattern"):
        tiny_model.run_with_hooks(
            torch.zeros(1, 3, dtype=torch.long), fwd_hooks=[("blocks.0.attn.hook_patern", print)]
        )
    with pytest.raises(KeyError, match="use_attn_result"):
        tiny_model.run_with_cache(
            torch.zeros(1, 3, dtype=torch.long), names_filter=["blocks.0.attn.hook_result"]
        )
    with pytest.raises(KeyError, match="Unknown activation"):
        interp.act_name("patern", 0)


def test_layer_hook_names_name_one_hook_per_block_that_a_cache_holds(tiny_model) -> None:
    names = tiny_model.layer_hook_names("z")
    assert names == [f"blocks.{layer}.attn.hook_z" for layer in range(tiny_model.cfg.n_layers)]
    _, cache = tiny_model.run_with_cache(torch.zeros(1, 3, dtype=torch.long), names_filter=names)
    assert sorted(cache.keys()) == sorted(names)
    with pytest.raises(KeyError, match="Unknown activation"):
        tiny_model.layer_hook_names("patern")


def test_bad_tokens_are_explained(tiny_model) -> None:
    with pytest.raises(ValueError, match="integer"):
        tiny_model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"\[batch, pos\]"):
        tiny_model(torch.zeros(1, 1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="context"):
        tiny_model(torch.zeros(1, tiny_model.cfg.n_ctx + 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"lie in \[0, 61\)"):
        tiny_model(torch.tensor([[1, 61]]))
    with pytest.raises(ValueError, match="no tokenizer"):
        tiny_model("hello")


def test_tokenizer_errors_and_round_trip(smollm2) -> None:
    assert smollm2.to_single_token(" Mary") == smollm2.to_tokens(" Mary")[0, 0]
    with pytest.raises(ValueError, match="not one"):
        smollm2.to_single_token(" Bartholomew Jones")
    with pytest.raises(ValueError, match="context"):
        smollm2(torch.zeros(1, smollm2.cfg.n_ctx + 1, dtype=torch.long))
    tokens = smollm2.to_tokens(IOI_PROMPT)
    assert smollm2.to_string(tokens[0]) == IOI_PROMPT
    assert "".join(smollm2.to_str_tokens(IOI_PROMPT)) == IOI_PROMPT
    assert smollm2.generate(IOI_PROMPT, max_new_tokens=1).endswith(" Mary")


def test_smollm2_splits_off_digits_one_by_one_as_its_gguf_states(smollm2) -> None:
    """The GGUF's tokenizer.ggml.pre is "smollm": digits one by one, before GPT-2's rule (transformers'
    GGUF reader left the digit rule out, so a run of spaces gave its last space to the digit)."""
    assert smollm2.to_str_tokens("x  1") == ["x", "  ", "1"]
    assert smollm2.to_str_tokens("a\n  3") == ["a", "\n  ", "3"]
    assert smollm2.to_str_tokens(" 2024") == [" ", "2", "0", "2", "4"]


def test_unknown_model_name_lists_known_ones() -> None:
    with pytest.raises(ValueError, match="smollm2-135m"):
        interp.load_model("definitely-not-a-model-xyz")


def test_unsupported_architecture_is_named_with_the_closest() -> None:
    config = transformers.BloomConfig(n_layer=1, hidden_size=32, n_head=2, vocab_size=50)
    with pytest.raises(ValueError, match="'bloom' is not supported .*Supported: falcon, gemma, .*gpt2"):
        interp.load_model(transformers.AutoModelForCausalLM.from_config(config))
    config = transformers.Qwen2MoeConfig(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=2, vocab_size=50, num_experts=2
    )
    with pytest.raises(ValueError, match="'qwen2_moe' is not supported \\(closest: 'qwen2'\\)"):
        interp.load_model(transformers.AutoModelForCausalLM.from_config(config))


def test_corrupted_weights_file_is_explained(tiny_model, tmp_path) -> None:
    path = tiny_model.save(tmp_path / "ckpt")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated or corrupted"):
        interp.load_model(path)


def test_gguf_of_unsupported_architecture_is_explained(tmp_path) -> None:
    import gguf

    path = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_tensor("x", torch.zeros(4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture 'mamba'"):
        interp.load_model(path)
    garbage = tmp_path / "broken.gguf"
    garbage.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="not a readable GGUF"):
        interp.load_model(garbage)


def test_gguf_cache_is_keyed_by_content(tmp_path, monkeypatch) -> None:
    from interp.io.sources import content_hash

    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))
    first, copy, other = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf", tmp_path / "c" / "m.gguf"
    for path, data in ((first, b"same bytes"), (copy, b"same bytes"), (other, b"other bytes")):
        path.parent.mkdir()
        path.write_bytes(data)
    assert content_hash(first) == content_hash(copy) != content_hash(other)
    assert content_hash(first) == hashlib.sha256(b"same bytes").hexdigest()
    first.write_bytes(b"edited bytes")  # a new size and mtime: hashed again, not read from the index
    assert content_hash(first) == hashlib.sha256(b"edited bytes").hexdigest()
    for data in (b"edited BYTES", b"EDITED BYTES"):  # the same size, the old mtime restored (`cp -p`)
        stat = first.stat()
        if data.startswith(b"EDITED"):  # in place: the same inode, a change time a clock tick later
            time.sleep(0.05)
            first.write_bytes(data)
        else:  # renamed into place: another inode
            other.write_bytes(data)
            os.replace(other, first)
        os.utime(first, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert content_hash(first) == hashlib.sha256(data).hexdigest()


_SMALL_DECODER = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=48, vocab_size=97, max_position_embeddings=32)  # fmt: skip


@pytest.mark.parametrize(
    "config",
    [
        transformers.LlamaConfig(**_SMALL_DECODER, tie_word_embeddings=True),
        transformers.LlamaConfig(**_SMALL_DECODER, tie_word_embeddings=False),
        transformers.GemmaConfig(**_SMALL_DECODER, head_dim=8, tie_word_embeddings=True),
        transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=97, n_positions=32),
    ],
    ids=["llama-tied", "llama-untied", "gemma-tied", "gpt2-tied"],
)
def test_parameter_count_is_transformers_count(config, tmp_path) -> None:
    """A tied embedding counts once, as transformers counts it, also where interp's W_E is scaled
    (Gemma's sqrt(d_model)), W_U is centred (TransformerLens's processing) or the model comes back from
    a checkpoint: the count reads the tie the source states, not the weights."""
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    expected = sum(p.numel() for p in hf.parameters())
    model = interp.load_model(hf)
    assert model.cfg.tied_embeddings == config.tie_word_embeddings
    assert interp.parameter_count(model) == expected
    assert interp.parameter_count(interp.load_model(hf, center_unembed=True)) == expected
    assert interp.parameter_count(interp.load_model(model.save(tmp_path / "ckpt"))) == expected


def test_checkpoint_config_is_json(tiny_model, tmp_path) -> None:
    meta = json.loads((tiny_model.save(tmp_path / "c") / "config.json").read_text())
    assert meta["config"]["n_layers"] == 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_and_agrees(smollm2, dtype) -> None:
    """bf16/fp16 (norms, softmax and rotary in float32) keeps the IOI answer and a close logit diff."""
    tokens = smollm2.to_tokens(IOI_PROMPT)
    io, s = smollm2.to_single_token(" Mary"), smollm2.to_single_token(" John")
    with torch.no_grad():
        full = smollm2(tokens)[0, -1]
        half_model = interp.load_model("smollm2-135m", dtype=dtype)
        half = half_model(tokens)[0, -1]
        _, cache = half_model.run_with_cache(tokens, names_filter=["blocks.5.attn.hook_pattern"])
    assert half.dtype == dtype and torch.isfinite(half).all()
    assert cache["pattern", 5].dtype == dtype
    assert half.argmax() == full.argmax()
    assert abs((half[io] - half[s]).float() - (full[io] - full[s])) < 0.5


def test_memory_policy_switches_both_ways() -> None:
    from interp.runtime.memory import keep_freed_memory

    assert keep_freed_memory(False) and keep_freed_memory(True)  # glibc, as on every supported Linux


def test_given_z_equals_overwriting_z_and_still_runs_observed_attention():
    torch.manual_seed(0)
    cfg = tiny_config(n_layers=3, n_kv_heads=2, positional="rotary", normalization="rmsnorm")
    model = interp.HookedTransformer(cfg).eval()
    tokens = torch.randint(cfg.d_vocab, (3, 8))
    z = torch.randn(3, 8, cfg.n_heads, cfg.d_head)
    overwritten = model.run_with_hooks(tokens, fwd_hooks=[(interp.act_name("z", 1), lambda act, hook: z)])
    patterns = []
    with model.given_z({1: z}):
        skipped = model(tokens)
        observed = model.run_with_hooks(
            tokens, fwd_hooks=[(interp.act_name("pattern", 1), lambda p, hook: patterns.append(p))]
        )
        double = [(interp.act_name("z", 1), lambda act, hook: 2 * act)]
        scaled = model.run_with_hooks(tokens, fwd_hooks=double)
        with pytest.raises(ValueError, match=r"block 1's given z is \(3, 8, 4, 8\)"):
            model(tokens[:, :5])
    twice = model.run_with_hooks(tokens, fwd_hooks=[(interp.act_name("z", 1), lambda act, hook: 2 * z)])
    torch.testing.assert_close(skipped, overwritten, atol=0, rtol=0)
    torch.testing.assert_close(observed, overwritten, atol=0, rtol=0)
    torch.testing.assert_close(scaled, twice, atol=0, rtol=0)  # hook_z sees the given z
    assert len(patterns) == 1 and patterns[0].shape == (3, cfg.n_heads, 8, 8)
    assert model.blocks[1].attn.given_z is None
    assert not torch.equal(model(tokens), overwritten)
    with pytest.raises(ValueError, match="layer 3 out of range"), model.given_z({3: z}):
        pass


def test_the_weights_fingerprint_sees_every_weight() -> None:
    """A change to one entry of any weight, however large (an embedding row, one neuron; through
    `.data`, which keeps no version count), or to the dtype, changes `weights_fingerprint`; the same
    weights give the same one, on any device."""
    torch.manual_seed(0)
    model = interp.HookedTransformer(tiny_config(d_vocab=4000, d_mlp=4096))
    seen = {interp.weights_fingerprint(model)}
    assert interp.weights_fingerprint(model) in seen and next(iter(seen)).startswith("w2-")
    for weight, index in [(model.W_E, (1, 1)), (model.blocks[1].mlp.W_in, (5, 7)), (model.W_U, (31, 3999))]:
        weight.data[index] += 1e-3
        assert interp.weights_fingerprint(model) not in seen
        seen.add(interp.weights_fingerprint(model))
    place(model.cfg, "cuda:0", model.cfg.dtype)  # what moving the model records; the bytes are the same
    assert interp.weights_fingerprint(model) in seen
    assert interp.weights_fingerprint(model.to(torch.float64)) not in seen


def test_a_checkpoint_edited_to_rotate_other_dims_than_its_frequencies_is_refused(tmp_path) -> None:
    """A checkpoint of explicit (scaled) RoPE frequencies whose config.json was edited to another
    rotary_dim ran with the old one while cfg said the new: refused, naming both."""
    cfg = interp.Config(
        n_layers=1, d_model=16, n_heads=2, d_head=8, d_vocab=20, n_ctx=16, positional="rotary",
        rotary_inv_freq=[1.0, 0.5, 0.25, 0.125],
    )  # fmt: skip
    path = interp.HookedTransformer(cfg).save(tmp_path / "c") / "config.json"
    meta = json.loads(path.read_text())
    meta["config"]["rotary_dim"] = 4
    path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="rotary_inv_freq lists 4 frequencies, but rotary_dim=4 rotates 2"):
        interp.load_model(tmp_path / "c")
