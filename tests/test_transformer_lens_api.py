"""TransformerLens users' code runs on interp: calls written as TL's demos write them (Main_Demo,
Exploratory_Analysis_Demo, activation patching, head detector, ARENA 1.2), each run on interp's model
and, where TL can compute it, on TL's TransformerBridge over the same weights (compatibility mode:
TL's weight processing), numbers equal to 1e-4.

Models: random transformers GPT-2 (LayerNorm, learned positions, biases) and Llama (RMSNorm, rotary,
grouped-query attention, gated MLP) with SmolLM2's tokenizer and non-trivial norms and biases, loaded
with `interp.HookedTransformer.from_pretrained` (TL's processing defaults).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings

import pytest
import torch
import transformers

import interp
from interp import HookedTransformer

ATOL = 1e-4
PROMPTS = [
    "When Mary and John went to the store, John gave a drink to",
    "When Tom and Anna went to the park, Anna gave a ball to",
]


def _random_hf_model(kind: str, vocab: int, bos: int, eos: int):
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=4,
            vocab_size=vocab,
            n_positions=64,
            bos_token_id=bos,
            eos_token_id=eos,
        )
    else:
        config = transformers.LlamaConfig(
            num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, vocab_size=vocab, max_position_embeddings=64, bos_token_id=bos,
            eos_token_id=eos,
        )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # non-trivial norms and biases, so that folding and centring matter
        for name, param in model.named_parameters():
            if "norm" in name or "ln" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    return model


@pytest.fixture(scope="module", params=["gpt2", "llama-gqa"])
def pair(request, smollm2):
    """(interp model, TL TransformerBridge, tokens) over the same random weights."""
    from transformer_lens.model_bridge import TransformerBridge

    tok = smollm2.tokenizer
    hf = _random_hf_model(request.param, len(tok), tok.bos_token_id, tok.eos_token_id)
    ours = HookedTransformer.from_pretrained(request.param, hf_model=hf, tokenizer=tok, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        bridge = TransformerBridge.boot_transformers(
            "gpt2" if request.param == "gpt2" else "random-llama", hf_model=hf, tokenizer=tok
        )
        bridge.enable_compatibility_mode()
        logging.disable(logging.NOTSET)
    tokens = bridge.to_tokens(PROMPTS)  # TL prepends BOS for both; interp's Llama policy would not
    return ours, bridge, tokens


@pytest.fixture(scope="module")
def caches(pair):
    ours, bridge, tokens = pair
    return ours.run_with_cache(tokens)[1], bridge.run_with_cache(tokens)[1]


def _assert_same(ours, theirs) -> None:
    if isinstance(theirs, tuple):  # (tensor, labels)
        assert ours[1] == theirs[1]
        ours, theirs = ours[0], theirs[0]
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours.float(), theirs.float(), atol=ATOL, rtol=0)


# --- ActivationCache: same call on both caches ----------------------------------------------------

MARY, JOHN = torch.tensor([6162, 3700]), torch.tensor([3700, 6162])  # " Mary"/" John" ids differ per prompt

CACHE_CALLS = {
    'cache["pattern", 0]': lambda c: c["pattern", 0],
    'cache["resid_post", -1]': lambda c: c["resid_post", -1],
    'cache["blocks.0.attn.hook_z"]': lambda c: c["blocks.0.attn.hook_z"],
    'cache["scale", 1, "ln2"]': lambda c: c["scale", 1, "ln2"],
    "accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1, return_labels=True)": lambda c: (
        c.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1, return_labels=True)
    ),
    "accumulated_resid(apply_ln=True, return_labels=True)": lambda c: c.accumulated_resid(
        apply_ln=True, return_labels=True
    ),
    "accumulated_resid(layer=1, apply_ln=True, pos_slice=-1)": lambda c: c.accumulated_resid(
        layer=1, apply_ln=True, pos_slice=-1
    ),
    "decompose_resid(layer=-1, pos_slice=-1, return_labels=True)": lambda c: c.decompose_resid(
        layer=-1, pos_slice=-1, return_labels=True
    ),
    'decompose_resid(mode="attn", apply_ln=True, pos_slice=-1)': lambda c: c.decompose_resid(
        mode="attn", apply_ln=True, pos_slice=-1
    ),
    "decompose_resid(layer=1, mlp_input=True, return_labels=True)": lambda c: c.decompose_resid(
        layer=1, mlp_input=True, return_labels=True
    ),
    "stack_head_results(layer=-1, pos_slice=-1, return_labels=True)": lambda c: c.stack_head_results(
        layer=-1, pos_slice=-1, return_labels=True
    ),
    "stack_head_results(layer=1, incl_remainder=True, return_labels=True)": lambda c: c.stack_head_results(
        layer=1, incl_remainder=True, return_labels=True
    ),
    "stack_head_results(apply_ln=True, pos_slice=(2, 5))": lambda c: c.stack_head_results(
        apply_ln=True, pos_slice=(2, 5)
    ),
    "apply_ln_to_stack(decompose_resid(pos_slice=-1), layer=-1, pos_slice=-1)": lambda c: c.apply_ln_to_stack(
        c.decompose_resid(pos_slice=-1), layer=-1, pos_slice=-1
    ),
    "logit_attrs(decompose_resid(pos_slice=-1), MARY, JOHN, pos_slice=-1)": lambda c: c.logit_attrs(
        c.decompose_resid(pos_slice=-1), MARY, JOHN, pos_slice=-1
    ),
    'logit_attrs(stack_head_results(pos_slice=-1), " Mary", " John", pos_slice=-1)': lambda c: c.logit_attrs(
        c.stack_head_results(pos_slice=-1), " Mary", " John", pos_slice=-1
    ),
    "logit_attrs(accumulated_resid(), tokens [batch, pos])": lambda c: c.logit_attrs(
        c.accumulated_resid(),
        100 + torch.arange(c["hook_embed"][..., 0].numel()).view(c["hook_embed"].shape[:2]),
    ),
    "get_full_resid_decomposition(expand_neurons=False, return_labels=True)": lambda c: (
        c.get_full_resid_decomposition(expand_neurons=False, return_labels=True)
    ),
    "get_full_resid_decomposition(pos_slice=-1, return_labels=True)": lambda c: (
        c.get_full_resid_decomposition(pos_slice=-1, return_labels=True)
    ),
    "get_full_resid_decomposition(layer=1, mlp_input=True, apply_ln=True, pos_slice=-1)": lambda c: (
        c.get_full_resid_decomposition(
            layer=1, mlp_input=True, apply_ln=True, pos_slice=-1, expand_neurons=False
        )
    ),
    'stack_activation("pattern")': lambda c: c.stack_activation("pattern"),
    "stack_neuron_results(1, pos_slice=-1, return_labels=True)": lambda c: c.stack_neuron_results(
        1, pos_slice=-1, return_labels=True
    ),
    "apply_slice_to_batch_dim(1)": lambda c: c.apply_slice_to_batch_dim(1)["resid_pre", 1],
}


@pytest.mark.parametrize("call", CACHE_CALLS)
def test_cache_call_equals_transformer_lens(caches, call):
    ours, theirs = caches
    _assert_same(CACHE_CALLS[call](ours), CACHE_CALLS[call](theirs))


def test_compute_head_results_and_remove_batch_dim(pair, caches):
    ours_model, bridge, tokens = pair
    ours, theirs = caches
    ours.compute_head_results()
    theirs.compute_head_results()
    _assert_same(ours["result", 1], theirs["result", 1])
    _, one = ours_model.run_with_cache(tokens[:1], remove_batch_dim=True)
    _, tl_one = bridge.run_with_cache(tokens[:1], remove_batch_dim=True)
    _assert_same(one["pattern", 1], tl_one["pattern", 1])  # [head, query_pos, key_pos]
    _assert_same(one.decompose_resid(pos_slice=-1), tl_one.decompose_resid(pos_slice=-1))
    _, batched = ours_model.run_with_cache(tokens[:1])
    assert batched.remove_batch_dim() is batched and batched["resid_pre", 0].ndim == 2


def test_logit_attrs_sum_to_the_logit_difference(pair, caches):
    """The silent wrong answer of the issue: a raw stack through logit_attrs sums to the logit
    difference (up to the norm's and unembedding's biases), as in TransformerLens."""
    ours_model, _, tokens = pair
    ours, _ = caches
    logits = ours_model(tokens)
    attrs = ours.logit_attrs(
        ours.decompose_resid(pos_slice=-1), MARY, JOHN, pos_slice=-1
    )  # [component, batch]
    rows = torch.arange(2)
    expected = logits[rows, -1, MARY] - logits[rows, -1, JOHN]
    b_U = ours_model.b_U
    bias = 0.0 if b_U is None else b_U[MARY] - b_U[JOHN]
    torch.testing.assert_close(attrs.sum(0) + bias, expected, atol=ATOL, rtol=0)
    normalised = ours.decompose_resid(pos_slice=-1, apply_ln=True)
    with pytest.raises(ValueError, match="applies the final norm itself"):
        ours.logit_attrs(normalised, MARY, JOHN, pos_slice=-1)


# --- weights and model-level helpers --------------------------------------------------------------


def _per_query_head(bridge, x):
    """TL 4.3's Bridge keeps key/value weights per key/value head; HookedTransformer repeated them."""
    group = bridge.cfg.n_heads // (bridge.cfg.n_key_value_heads or bridge.cfg.n_heads)
    return x.repeat_interleave(group, dim=-3 if x.ndim >= 3 and x.shape[-1] == bridge.cfg.d_head else -2)


WEIGHT_CALLS = {
    "W_E": (lambda m: m.W_E, None),
    "W_U": (lambda m: m.W_U, None),
    "W_pos": (lambda m: m.W_pos, None),
    "b_U": (lambda m: m.b_U, None),
    "W_Q": (lambda m: m.W_Q, None),
    "W_K": (lambda m: m.W_K, lambda b: _per_query_head(b, b.W_K)),
    "W_V": (lambda m: m.W_V, lambda b: _per_query_head(b, b.W_V)),
    "W_O": (lambda m: m.W_O, None),
    "b_Q": (lambda m: m.b_Q, None),
    "b_K": (lambda m: m.b_K, lambda b: _per_query_head(b, b.b_K)),
    "b_O": (lambda m: m.b_O, None),
    "W_in": (lambda m: m.W_in, None),
    "W_out": (lambda m: m.W_out, None),
    "W_gate": (lambda m: m.W_gate, None),
    "b_in": (lambda m: m.b_in, None),
    "b_out": (lambda m: m.b_out, None),
    "blocks[1].attn.W_K": (
        lambda m: m.blocks[1].attn.W_K,
        lambda b: _per_query_head(b, b.blocks[1].attn.W_K),
    ),
    "blocks[0].mlp.W_in": (lambda m: m.blocks[0].mlp.W_in, None),
    "OV.AB": (lambda m: m.OV.AB, None),
    "QK.AB": (lambda m: m.QK.AB, None),
    "OV[1, 2].eigenvalues": (lambda m: m.OV[1, 2].eigenvalues.abs().sort().values, None),
    'tokens_to_residual_directions(" Mary")': (lambda m: m.tokens_to_residual_directions(" Mary"), None),
    "tokens_to_residual_directions(tokens)": (
        lambda m: m.tokens_to_residual_directions(torch.tensor([[5, 6], [7, 8]])),
        None,
    ),
    "accumulated_bias(2, include_mlp_biases=True)": (lambda m: m.accumulated_bias(2), None),
    "embed(tokens)": (lambda m: m.embed(torch.tensor([[1, 5, 9]])), None),
    "embed.W_E @ OV[1, 0] @ W_U": (lambda m: (m.embed.W_E[:50] @ m.OV[1, 0] @ m.W_U[:, :50]).AB, None),
}


@pytest.mark.parametrize("call", WEIGHT_CALLS)
def test_weights_equal_transformer_lens(pair, call):
    ours_model, bridge, _ = pair
    ours_fn, tl_fn = WEIGHT_CALLS[call]
    try:
        theirs = (tl_fn or ours_fn)(bridge)
    except AttributeError:  # e.g. the Bridge has no b_K on bias-free Llama; ours are zeros
        if call.startswith("b_"):
            assert not ours_fn(ours_model).any()
            return
        with pytest.raises(AttributeError):  # neither model has it
            ours_fn(ours_model)
        return
    if theirs is None:  # the Bridge says None (e.g. W_gate of a plain MLP); interp raises
        with pytest.raises(AttributeError):
            ours_fn(ours_model)
        return
    ours = ours_fn(ours_model)
    if call == "b_U" and ours is None:  # a deliberate difference: no b_U on models without one
        assert not theirs.any()
        return
    _assert_same(ours, theirs)


def test_pos_embed_is_what_hook_pos_embed_sees(pair, caches):
    ours, _, tokens = pair
    if ours.cfg.positional_embedding_type == "standard":
        _assert_same(ours.pos_embed(tokens), caches[1]["hook_pos_embed"])
        assert ours.pos_embed.W_pos is ours.W_pos
    else:
        with pytest.raises(AttributeError):
            ours.pos_embed(tokens)


# --- forward, hooks and opt-in hook points --------------------------------------------------------


def test_forward_and_loss_equal_transformer_lens(pair):
    ours, bridge, tokens = pair
    _assert_same(ours(tokens), bridge(tokens))
    _assert_same(ours(tokens, return_type="loss"), bridge(tokens, return_type="loss"))
    _assert_same(
        ours(tokens, return_type="loss", loss_per_token=True),
        bridge(tokens, return_type="loss", loss_per_token=True),
    )
    logits, loss = ours(tokens, return_type="both")
    _assert_same(ours.loss_fn(logits, tokens), loss)
    _assert_same(ours(PROMPTS[0], prepend_bos=True), bridge(PROMPTS[0], prepend_bos=True))


def test_run_with_hooks_equals_transformer_lens(pair):
    from transformer_lens.utilities import get_act_name

    ours, bridge, tokens = pair

    def ablate_head(z, hook):  # [batch, pos, head, d_head]
        z[:, :, 2] = 0.0
        return z

    hooks = [(get_act_name("z", 1), ablate_head)]
    _assert_same(ours.run_with_hooks(tokens, fwd_hooks=hooks), bridge.run_with_hooks(tokens, fwd_hooks=hooks))
    names = lambda name: name.endswith("pattern")  # noqa: E731
    _, ours_cache = ours.run_with_cache(tokens, names_filter=names)
    _, tl_cache = bridge.run_with_cache(tokens, names_filter=names)
    assert set(ours_cache.keys()) == set(tl_cache.keys())


def test_opt_in_hooks(pair):
    ours, bridge, tokens = pair
    ours.set_use_attn_result(True)
    bridge.set_use_attn_result(True)
    try:
        _assert_same(
            ours.run_with_cache(tokens)[1]["result", 1], bridge.run_with_cache(tokens)[1]["result", 1]
        )
    finally:
        ours.set_use_attn_result(False)
        bridge.set_use_attn_result(False)
    logits = ours(tokens)
    ours.set_use_hook_mlp_in(True)
    ours.set_use_split_qkv_input(True)
    try:
        out, cache = ours.run_with_cache(tokens)
        _assert_same(out, logits)
        torch.testing.assert_close(cache["mlp_in", 1], cache["resid_mid", 1])
        assert cache["q_input", 1].shape == (*tokens.shape, ours.cfg.n_heads, ours.cfg.d_model)
    finally:
        ours.set_use_hook_mlp_in(False)
        ours.set_use_split_qkv_input(False)
    if ours.cfg.n_key_value_heads is None:
        with ours.settings(use_attn_in=True):
            out, cache = ours.run_with_cache(tokens)
        _assert_same(out, logits)
        assert cache["attn_in", 0].shape == (*tokens.shape, ours.cfg.n_heads, ours.cfg.d_model)
    else:
        with pytest.raises(ValueError, match="use set_use_split_qkv_input"):
            ours.set_use_attn_in(True)


def test_in_place_edit_of_one_heads_input_changes_that_head_only(pair):
    """ARENA's path-patching hook writes some heads' slice of hook_q_input / hook_v_input / hook_attn_in
    in place and returns it: each head's input is its own copy (TransformerLens's), so the edit moves
    those heads alone, as the same hook on a private copy does, and never the residual stream."""
    ours, _, tokens = pair

    def edit_head_0(x, hook):  # [batch, pos, head, d_model]
        x[:, :, 0] = x[:, :, 0].roll(1, dims=1)  # each position given the previous one's input
        return x

    def edit_a_copy(x, hook):
        return edit_head_0(x.clone(), hook)

    names = lambda n: n in ("blocks.1.attn.hook_z", "blocks.1.hook_resid_pre")  # noqa: E731
    grouped = ours.cfg.n_key_value_heads is not None  # hook_attn_in needs a key/value head per query head
    group = ours.cfg.n_heads // ours.cfg.n_key_value_heads if grouped else 1  # query heads per v_input head
    settings = {"use_split_qkv_input": "blocks.1.hook_v_input"} | (
        {} if grouped else {"use_attn_in": "blocks.1.hook_attn_in"}
    )
    for setting, name in settings.items():
        with ours.settings(**{setting: True}):
            _, clean = ours.run_with_cache(tokens, names_filter=names)
            with ours.hooks(fwd_hooks=[(name, edit_head_0)]):
                in_place, edited = ours.run_with_cache(tokens, names_filter=names)
            with ours.hooks(fwd_hooks=[(name, edit_a_copy)]):
                copied = ours(tokens)
        torch.testing.assert_close(in_place, copied, rtol=0, atol=0)
        moved = (edited["z", 1] - clean["z", 1]).abs().amax(dim=(0, 1, 3))  # [head]
        heads = group if setting == "use_split_qkv_input" else 1
        assert moved[:heads].min() > 1e-3 and moved[heads:].max() == 0, setting
        torch.testing.assert_close(edited["resid_pre", 1], clean["resid_pre", 1], rtol=0, atol=0)


def test_run_with_cache_incl_bwd_equals_transformer_lens(pair):
    """TL's `run_with_cache(return_type="loss", incl_bwd=True)` runs the backward pass itself and caches
    each hook's gradient as "<name>_grad"; the hooks come off the model afterwards. A many-valued
    output (logits) is refused, saying what to pass."""
    ours, bridge, tokens = pair
    names = ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z"]
    loss, cache = ours.run_with_cache(tokens, return_type="loss", incl_bwd=True, names_filter=names)
    tl_loss, tl_cache = bridge.run_with_cache(tokens, return_type="loss", incl_bwd=True, names_filter=names)
    _assert_same(loss, tl_loss)
    for name in names:
        _assert_same(cache[f"{name}_grad"], tl_cache[f"{name}_grad"])
    assert not any(point.has_hooks() for point in ours.hook_dict.values())
    with pytest.raises(ValueError, match="return_type='loss'"):
        ours.run_with_cache(tokens, incl_bwd=True, names_filter=names)
    assert not any(point.has_hooks() for point in ours.hook_dict.values())


def test_filter_registration_attaches_to_the_hooks_that_fire(pair):
    """TL's Attribution Patching demo registers forward and backward caching hooks with a filter of
    names, `model.add_hook(filter_not_qkv_input, hook, "fwd")`: the filter also matches opt-in hook
    points that are switched off (hook_tokens, hook_mlp_in, hook_result), which stay silent; a name
    of one still raises."""
    from interp.model.cache import ActivationCache

    ours, _, tokens = pair
    filter_not_qkv_input = lambda name: "_input" not in name  # noqa: E731
    correct, incorrect = ours.to_single_token(" Mary"), ours.to_single_token(" Tom")

    def metric(logits):
        return (logits[:, -1, correct] - logits[:, -1, incorrect]).mean()

    ours.reset_hooks()
    cache, grad_cache = {}, {}

    def forward_cache_hook(act, hook):
        cache[hook.name] = act.detach()

    def backward_cache_hook(act, hook):
        grad_cache[hook.name] = act.detach()

    ours.add_hook(filter_not_qkv_input, forward_cache_hook, "fwd")
    ours.add_hook(filter_not_qkv_input, backward_cache_hook, "bwd")
    metric(ours(tokens)).backward()
    ours.reset_hooks()
    firing = ours.hook_names(filter_not_qkv_input)
    assert "hook_tokens" not in firing and "blocks.0.hook_mlp_in" not in firing
    assert set(cache) == set(firing) and set(grad_cache) <= set(firing) and grad_cache
    _, reference = ours.run_with_cache(tokens, names_filter=filter_not_qkv_input)
    for name in firing:
        torch.testing.assert_close(ActivationCache(cache, ours)[name], reference[name], atol=ATOL, rtol=ATOL)

    def with_hooks():
        ours.run_with_hooks(tokens, fwd_hooks=[(filter_not_qkv_input, forward_cache_hook)])

    def with_caching_hooks():
        ours.add_caching_hooks(filter_not_qkv_input, cache=cache)
        ours(tokens)

    def with_hooks_context():
        with ours.hooks(fwd_hooks=ours.get_caching_hooks(filter_not_qkv_input, cache=cache)[1]):
            ours(tokens)

    for run in (with_hooks, with_caching_hooks, with_hooks_context):
        cache.clear()
        run()
        ours.reset_hooks()
        assert set(cache) == set(firing), run.__name__
    with pytest.raises(interp.checks.HookNameError, match="opt-in"):
        ours.add_hook("hook_tokens", forward_cache_hook, "fwd")


# --- config, modes, tokenization, generation ------------------------------------------------------


def test_config_reads_as_transformer_lens(pair):
    ours, bridge, _ = pair
    assert ours.cfg.normalization_type == bridge.cfg.normalization_type + "Pre"  # after fold_ln, as TL's
    for name in [
        "n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "d_vocab_out", "n_ctx",
        "act_fn", "positional_embedding_type", "n_key_value_heads", "device",
        "dtype", "gated_mlp", "final_rms",
    ]:  # fmt: skip
        assert getattr(ours.cfg, name) == getattr(bridge.cfg, name), name
    assert torch.zeros(3, device=ours.cfg.device).device == ours.W_E.device
    with pytest.raises(AttributeError):
        ours.cfg.device = "cuda"


def test_models_load_in_eval_mode_and_train_still_works(pair):
    ours, bridge, _ = pair
    assert not ours.training and not bridge.training
    ours.train()
    try:
        assert ours.training and all(module.training for module in ours.modules())
    finally:
        ours.eval()


def test_tokenization_equals_transformer_lens(pair):
    ours, bridge, tokens = pair
    assert torch.equal(ours.to_tokens(PROMPTS, prepend_bos=True), tokens)
    left = ours.to_tokens(["a b c d", "a"], prepend_bos=True, padding_side="left")
    assert torch.equal(left, bridge.to_tokens(["a b c d", "a"], prepend_bos=True, padding_side="left"))
    assert ours.to_str_tokens(PROMPTS[0], prepend_bos=True) == bridge.to_str_tokens(
        PROMPTS[0], prepend_bos=True
    )
    assert ours.to_str_tokens(tokens[0]) == bridge.to_str_tokens(tokens[0])
    assert ours.to_str_tokens(PROMPTS) == [ours.to_str_tokens(p) for p in PROMPTS]
    mary = ours.to_single_token(" Mary")
    assert mary == bridge.to_single_token(" Mary")
    assert ours.to_string(mary) == ours.to_string(torch.tensor(mary)) == " Mary" == bridge.to_string(mary)
    assert ours.to_string([mary, mary]) == " Mary Mary"
    assert ours.to_string(tokens[:, 1:]) == bridge.to_string(tokens[:, 1:])
    assert ours.to_single_str_token(mary) == " Mary"
    for mode in ("first", "last"):
        position = ours.get_token_position(" Mary", PROMPTS[0], mode=mode, prepend_bos=True)
        assert position == bridge.get_token_position(" Mary", PROMPTS[0], mode=mode, prepend_bos=True)


def _assert_greedy_under(model, tokens, prompt_len: int) -> None:
    """Each new token of `tokens` [1, pos] is an argmax of `model`'s next-token logits, to ATOL: a
    random model's top logits can tie to 1e-6, so which of two tied tokens is picked depends on the CPU."""
    logits = model(tokens)[0, prompt_len - 1 : -1]  # [new, d_vocab]: the logits that chose each new token
    chosen = logits.gather(-1, tokens[0, prompt_len:, None])[:, 0]
    assert (chosen >= logits.max(-1).values - ATOL).all(), (chosen, logits.max(-1).values)


def test_generate_equals_transformer_lens(pair):
    """Greedy continuations agree with TL's generate without its KV cache. (TL 4.3's Bridge with its
    KV cache, under transformers 5.24, continues the random Llama with tokens that are not greedy under
    its own forward pass: margins of 0.05, not ties; so it is not the reference here.)"""
    ours, bridge, _ = pair
    kwargs = dict(max_new_tokens=4, do_sample=False, prepend_bos=True, verbose=False)
    prompt = ours.to_tokens(PROMPTS[0], prepend_bos=True)
    ours_tokens = ours.generate(prompt, **kwargs)  # with interp's KV cache
    tl_tokens = bridge.generate(prompt, use_past_kv_cache=False, **kwargs)
    assert ours_tokens.shape == tl_tokens.shape == (1, prompt.shape[1] + 4)
    for tokens in (ours_tokens, tl_tokens):  # each engine's continuation is greedy under both
        _assert_greedy_under(ours, tokens, prompt.shape[1])
        _assert_greedy_under(bridge, tokens, prompt.shape[1])
    assert ours.generate(PROMPTS[0], **kwargs) == ours.to_string(ours_tokens[0, 1:])  # text in, text out
    kwargs.pop("max_new_tokens")  # TL's default length (10 new tokens), with a stop at EOS off in both
    default = ours.generate(prompt, stop_at_eos=False, **kwargs)
    assert (
        default.shape == bridge.generate(prompt, stop_at_eos=False, use_past_kv_cache=False, **kwargs).shape
    )


# --- TransformerLens's own tools on an interp model -----------------------------------------------


def test_transformer_lens_patching_runs_on_interp(pair):
    from transformer_lens import patching

    ours, bridge, clean = pair
    corrupted = clean.clone()
    corrupted[:, 2] = clean.flip(0)[:, 2]

    def metric(logits):
        return (logits[:, -1, 6162] - logits[:, -1, 3700]).mean()

    _, ours_cache = ours.run_with_cache(clean)
    _, tl_cache = bridge.run_with_cache(clean)
    for name in ("get_act_patch_resid_pre", "get_act_patch_attn_head_out_all_pos"):
        got = getattr(patching, name)(ours, corrupted, ours_cache, metric)
        expected = getattr(patching, name)(bridge, corrupted, tl_cache, metric)
        _assert_same(got, expected)


def test_head_detector_and_test_prompt_run_on_interp(pair):
    from transformer_lens import head_detector
    from transformer_lens.utilities import test_prompt

    ours, bridge, _ = pair
    text = "The cat sat on the mat. The cat sat on the mat."
    default_bos, ours.cfg.default_prepend_bos = ours.cfg.default_prepend_bos, True  # as TL, for every model
    try:
        for head_type in ("previous_token_head", "induction_head"):
            expected = head_detector.detect_head(bridge, text, head_type)
            _assert_same(head_detector.detect_head(ours, text, head_type), expected)
    finally:
        ours.cfg.default_prepend_bos = default_bos
    printed = []
    for model in (ours, bridge):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            test_prompt(PROMPTS[0], "Mary", model, prepend_bos=True)
        printed.append(out.getvalue())
    assert "Mary" in printed[0] and printed[0].splitlines()[:3] == printed[1].splitlines()[:3]


def test_circuitsvis_as_the_demos_call_it(pair):
    import circuitsvis as cv

    ours, _, _ = pair
    _, cache = ours.run_with_cache(PROMPTS[0], remove_batch_dim=True)
    html = cv.attention.attention_patterns(
        tokens=ours.to_str_tokens(PROMPTS[0]), attention=cache["pattern", 0]
    )
    assert "Mary" in str(html)


# --- loading --------------------------------------------------------------------------------------


def test_from_pretrained_processing_keeps_log_probs_and_the_source_model(smollm2):
    """Tied embeddings (W_U is a view of W_E) and the transformers model stay untouched."""
    tok = smollm2.tokenizer
    hf = _random_hf_model("gpt2", len(tok), tok.bos_token_id, tok.eos_token_id)
    before = {name: p.clone() for name, p in hf.named_parameters()}
    tokens = torch.tensor([[1, 500, 600, 700]])
    expected = hf(tokens).logits.log_softmax(-1)
    processed = HookedTransformer.from_pretrained("gpt2", hf_model=hf, tokenizer=tok, device="cpu")
    raw = HookedTransformer.from_pretrained_no_processing("gpt2", hf_model=hf, tokenizer=tok, device="cpu")
    assert processed.cfg.normalization_type == "LNPre" and raw.cfg.normalization_type == "LN"
    torch.testing.assert_close(processed(tokens).log_softmax(-1), expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(raw(tokens), hf(tokens).logits, atol=ATOL, rtol=0)
    for name, param in hf.named_parameters():
        assert torch.equal(param, before[name]), name
    assert not interp.load_model(hf, tokenizer=tok).training
    from interp.io.sources import official_name

    assert [official_name(n) for n in ("gpt2-small", "pythia-70m", "smollm2-135m")] == [
        "gpt2", "EleutherAI/pythia-70m", "smollm2-135m",
    ]  # fmt: skip
    with pytest.raises(TypeError, match="unsupported arguments"):
        HookedTransformer.from_pretrained("gpt2", hf_model=hf, first_n_layers=1)


@pytest.mark.parametrize("kind", ["gpt2", "llama-gqa"])
def test_hook_normalized_is_where_transformer_lens_has_it(smollm2, kind):
    """Without folding, TL's HookedTransformer hooks a LayerNorm's output after its weight and bias and
    an RMSNorm's x / scale before its weight: a TL hook reading or writing hook_normalized gets TL's
    tensor (an RMSNorm's equals the Bridge's)."""
    from transformer_lens.model_bridge import TransformerBridge

    tok = smollm2.tokenizer
    hf = _random_hf_model(kind, len(tok), tok.bos_token_id, tok.eos_token_id)
    raw = HookedTransformer.from_pretrained_no_processing(kind, hf_model=hf, tokenizer=tok, device="cpu")
    tokens = raw.to_tokens(PROMPTS[:1], prepend_bos=True)
    _, cache = raw.run_with_cache(tokens)
    x, ln = cache["resid_pre", 1], raw.blocks[1].ln1
    if kind == "gpt2":
        expected = (x - x.mean(-1, keepdim=True)) / cache["scale", 1, "ln1"] * ln.w + ln.b
    else:
        expected = x / cache["scale", 1, "ln1"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bridge = TransformerBridge.boot_transformers("random-llama", hf_model=hf, tokenizer=tok)
        _assert_same(cache["normalized", 1, "ln1"], bridge.run_with_cache(tokens)[1]["normalized", 1, "ln1"])
    torch.testing.assert_close(cache["normalized", 1, "ln1"], expected, atol=1e-5, rtol=0)
    assert not torch.allclose(ln.w, torch.ones_like(ln.w))  # the weight is not folded: the test can tell


def test_mean_loss_of_right_padded_ids_is_refused_not_padded(pair):
    """TL's loss of right-padded ids or texts counts the padding's predictions: both are refused
    without a mask; with their mask, the texts' and the ids' count real tokens only."""
    ours, _, _ = pair
    texts = [PROMPTS[0], "Hi there"]
    tokens, mask = ours.to_tokens_and_mask(texts)
    assert mask is not None and not bool(mask.all())
    masked = ours(texts, return_type="loss", attention_mask=mask)
    _assert_same(ours(tokens, return_type="loss", attention_mask=mask), masked)
    for unmasked in (ours.to_tokens(texts), texts):
        with pytest.raises(ValueError, match="model.to_tokens_and_mask"):
            ours(unmasked, return_type="loss")
    per_token = ours(ours.to_tokens(texts), return_type="loss", loss_per_token=True)
    _assert_same(per_token[0], ours(texts[:1], return_type="loss", loss_per_token=True)[0])


def test_model_from_a_transformer_lens_config():
    """ARENA 1.2's way of building a model: HookedTransformer(HookedTransformerConfig(...))."""
    from interp import HookedTransformerConfig

    cfg = HookedTransformerConfig(
        d_model=64, d_head=16, n_layers=2, n_ctx=32, d_vocab=50, act_fn="relu", attn_only=True,
        normalization_type="LN", positional_embedding_type="standard", seed=0,
    )  # fmt: skip
    model = HookedTransformer(cfg)
    assert (cfg.n_heads, cfg.act_fn, cfg.normalization_type, cfg.positional_embedding_type) == (
        4,
        "relu",
        "LN",
        "standard",
    )
    logits, cache = model.run_with_cache(torch.tensor([[1, 2, 3, 4]]))
    assert logits.shape == (1, 4, 50) and cache["pattern", -1].shape == (1, 4, 4, 4)
    with pytest.raises(ValueError, match="positional_embedding_type"):
        HookedTransformerConfig(
            d_model=64, d_head=16, n_layers=1, n_ctx=8, d_vocab=5, positional_embedding_type="alibi"
        )
    with pytest.raises(TypeError, match="unexpected keyword"):
        HookedTransformerConfig(d_model=64, d_head=16, n_layers=1, n_ctx=8, d_vocab=5, not_a_field=True)


def test_smollm2_direct_logit_attribution_as_tl_demos_write_it(smollm2):
    """The issue's case: a raw decomposition through logit_attrs sums to the logit difference
    (it summed to 179.7 against 6.12 when logit_attrs expected a normalised stack)."""
    prompt = "When Mary and John went to the store, John gave a drink to"
    logits, cache = smollm2.run_with_cache(prompt)
    mary, john = smollm2.to_single_token(" Mary"), smollm2.to_single_token(" John")
    stack, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
    attrs = cache.logit_attrs(stack, mary, john, pos_slice=-1)  # [component, batch]
    logit_diff = logits[0, -1, mary] - logits[0, -1, john]
    assert logit_diff > 1.0
    torch.testing.assert_close(attrs.sum(), logit_diff, atol=ATOL, rtol=0)
    heads = cache.logit_attrs(
        cache.stack_head_results(layer=-1, pos_slice=-1), " Mary", " John", pos_slice=-1
    )
    attn = cache.logit_attrs(
        cache.decompose_resid(mode="attn", incl_embeds=False, pos_slice=-1), mary, john, pos_slice=-1
    )
    torch.testing.assert_close(heads.sum(), attn.sum(), atol=ATOL, rtol=0)  # Llama attention has no b_O


def test_exploratory_analysis_demo_cells_on_smollm2():
    """Exploratory_Analysis_Demo's cells, unchanged but for the import, on SmolLM2 loaded with
    TL's processing: the residual-stream views all give back the model's logit difference."""
    import einops

    model = HookedTransformer.from_pretrained("smollm2-135m", fold_ln=True, center_writing_weights=True)
    prompts = ["When John and Mary went to the shops, John gave the bag to"] * 2
    answers = [(" Mary", " John")] * 2
    answer_tokens = torch.tensor(
        [[model.to_single_token(a) for a in pair] for pair in answers], device=model.cfg.device
    )
    tokens = model.to_tokens(prompts, prepend_bos=True)
    logits, cache = model.run_with_cache(tokens)
    final_logits = logits[:, -1, :].gather(dim=-1, index=answer_tokens)
    logit_diff = (final_logits[:, 0] - final_logits[:, 1]).mean()
    directions = model.tokens_to_residual_directions(answer_tokens)  # [batch, 2, d_model]
    logit_diff_directions = directions[:, 0] - directions[:, 1]

    def residual_stack_to_logit_diff(residual_stack):
        scaled = cache.apply_ln_to_stack(residual_stack, layer=-1, pos_slice=-1)
        return einops.einsum(scaled, logit_diff_directions, "... batch d_model, batch d_model -> ...") / len(
            prompts
        )

    final = cache["resid_post", -1][:, -1, :]
    torch.testing.assert_close(residual_stack_to_logit_diff(final), logit_diff, atol=ATOL, rtol=0)
    accumulated, labels = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1, return_labels=True)
    assert labels[-1] == "final_post" and len(labels) == 2 * model.cfg.n_layers + 1
    torch.testing.assert_close(residual_stack_to_logit_diff(accumulated)[-1], logit_diff, atol=ATOL, rtol=0)
    per_layer = cache.decompose_resid(layer=-1, pos_slice=-1)
    torch.testing.assert_close(residual_stack_to_logit_diff(per_layer).sum(), logit_diff, atol=ATOL, rtol=0)
    per_head = residual_stack_to_logit_diff(cache.stack_head_results(layer=-1, pos_slice=-1))
    per_head = einops.rearrange(per_head, "(layer head) -> layer head", layer=model.cfg.n_layers)
    assert per_head.shape == (model.cfg.n_layers, model.cfg.n_heads)


def test_left_padded_batch_equals_transformer_lens(pair):
    """Mixed-length prompts padded on the left with their attention mask: interp's logits at real
    positions equal TL's (and each prompt's own), for learned positions and for rotary + GQA."""
    ours, bridge, _ = pair
    prompts = ["When Mary and John went to the store", "John gave", "a drink to Mary"]
    tokens, mask = ours.to_tokens_and_mask(prompts, prepend_bos=True, padding_side="left")
    expected = bridge(tokens, attention_mask=mask, padding_side="left")
    logits = ours(tokens, attention_mask=mask)
    real = mask.bool()
    _assert_same(logits[real], expected[real])
    alone = ours(prompts[1], prepend_bos=True)[0]
    _assert_same(logits[1, -alone.shape[0] :], alone)
