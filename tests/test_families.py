"""Every capability works on the families beyond GPT-2/NeoX/Llama: decompositions, weight
processing, checkpoints, the new hook points, patching, ablation and the head report, on small
random-weight models from transformers configs (tests/test_equivalence.py checks their logits)."""

from __future__ import annotations

import json
import math

import pytest
import torch

import interp
from circuits.heads import SCORE_NAMES, head_report
from circuits.sections import result_json
from interp import metrics, patching
from interp.interventions.ablation import ablate
from tests.test_equivalence import HF_CONFIGS, _one_config_per_family, _random_hf_model

ATOL = 1e-4
BATCH, POS = 3, 12


def _load(name: str) -> interp.HookedTransformer:
    return interp.load_model(_random_hf_model(HF_CONFIGS[name]()))


def _tokens(model: interp.HookedTransformer, seed: int = 1) -> torch.Tensor:
    return torch.randint(model.cfg.d_vocab, (BATCH, POS), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def gemma2() -> interp.HookedTransformer:
    """Gemma 2: soft-capped scores and logits, local and global layers, pre- and post-norms."""
    return _load("gemma2-softcap-sliding")


@pytest.fixture(scope="module")
def mixtral() -> interp.HookedTransformer:
    """Mixtral: 4 routed experts, 2 per token."""
    return _load("mixtral-top2")


@pytest.mark.parametrize("name", _one_config_per_family())
def test_direct_logit_attribution_adds_up_to_the_logit_difference(name: str) -> None:
    model = _load(name)
    tokens = _tokens(model)
    logits, cache = model.run_with_cache(tokens)
    stack, labels = cache.decompose_resid(pos_slice=-1, return_labels=True)  # [component, batch, d_model]
    answers, wrong = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    if model.cfg.output_logits_soft_cap is not None:
        with pytest.raises(ValueError, match="soft-caps its logits"):
            cache.logit_attrs(stack, answers, wrong, pos_slice=-1)
        return
    attrs = cache.logit_attrs(stack, answers, wrong, pos_slice=-1)  # [component, batch]: applies ln_final
    rows = torch.arange(BATCH)
    expected = logits[rows, -1, answers] - logits[rows, -1, wrong]
    ln_bias = model.ln_final.b
    constant = 0.0 if ln_bias is None else ln_bias @ (model.W_U[:, answers] - model.W_U[:, wrong])
    bias_u = 0.0 if model.b_U is None else model.b_U[answers] - model.b_U[wrong]
    torch.testing.assert_close(attrs.sum(0) + constant + bias_u, expected, atol=ATOL, rtol=0)
    assert len(labels) == stack.shape[0] and (attrs.abs() > 1e-3).any()


def test_per_head_outputs_of_post_norm_models_are_refused(gemma2) -> None:
    _, cache = gemma2.run_with_cache(_tokens(gemma2))
    with pytest.raises(ValueError, match="ln1_post"):
        cache.stack_head_results()
    stack = cache.decompose_resid()  # layer outputs do add up
    torch.testing.assert_close(stack.sum(0), cache["resid_post", gemma2.cfg.n_layers - 1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", _one_config_per_family())
def test_folding_norms_keeps_log_probs(name: str) -> None:
    model = _load(name)
    tokens = _tokens(model)
    with torch.no_grad():
        expected = model(tokens).log_softmax(-1)
        interp.model.weights.process_weights(model, fold_ln=True)
        torch.testing.assert_close(model(tokens).log_softmax(-1), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["gemma3-local-global-rope", "mixtral-top1-sliding", "olmo2-post-norms"])
def test_checkpoint_round_trip(name: str, tmp_path) -> None:
    model = _load(name)
    tokens = _tokens(model)
    loaded = interp.load_model(model.save(tmp_path / name))
    assert loaded.cfg == model.cfg
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), model(tokens), atol=0, rtol=0)


def test_new_hook_points_fire(gemma2, mixtral) -> None:
    _, cache = gemma2.run_with_cache(_tokens(gemma2))
    for name in ["blocks.0.ln1_post.hook_normalized", "blocks.1.ln2_post.hook_scale"]:
        assert cache[name].shape[:2] == (BATCH, POS)
    qwen3 = _load("qwen3-qk-norm")
    _, cache = qwen3.run_with_cache(_tokens(qwen3))
    assert cache["blocks.0.attn.q_ln.hook_scale"].shape == (BATCH, POS, qwen3.cfg.n_heads, 1)
    assert cache["blocks.0.attn.k_ln.hook_normalized"].shape == (BATCH, POS, qwen3.cfg.n_kv_heads, 32)
    _, cache = mixtral.run_with_cache(_tokens(mixtral))
    mlp = "blocks.1.mlp."
    assert cache[mlp + "hook_router_logits"].shape == (BATCH, POS, 4)
    indices, weights = cache[mlp + "hook_expert_indices"], cache[mlp + "hook_expert_weights"]
    assert indices.shape == (BATCH, POS, 2)
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights[..., 0]))
    assert ((weights > 0).sum(-1) == 2).all() and (weights.gather(-1, indices) > 0).all()
    expert_out = cache[mlp + "hook_expert_out"]  # [batch, pos, expert, d_model]
    torch.testing.assert_close(expert_out.sum(2), cache["mlp_out", 1], atol=1e-6, rtol=0)
    assert torch.equal(expert_out.abs().sum(-1) > 0, weights > 0)


@pytest.mark.parametrize("family", ["gemma2", "mixtral"])
def test_patching_matches_a_hand_written_hook(family, request) -> None:
    model = request.getfixturevalue(family)
    clean, corrupted = _tokens(model, 1), _tokens(model, 2)
    end = torch.tensor([POS - 1, 5, 8])
    metric = lambda logits: metrics.logit_diff(logits, clean[:, 0], clean[:, 1], pos=end)  # noqa: E731
    _, clean_cache = model.run_with_cache(clean)
    rows = torch.arange(BATCH)

    def patch_head(z, hook):
        z = z.clone()
        z[rows, end, 2] = clean_cache["z", 1][rows, end, 2]
        return z

    expected = metric(model.run_with_hooks(corrupted, fwd_hooks=[(interp.act_name("z", 1), patch_head)]))
    result = patching.activation_patching(model, clean, corrupted, metric, "z", positions={"END": end})
    torch.testing.assert_close(result.per_example()[1, 2, 0], expected.detach().cpu(), atol=ATOL, rtol=0)
    whole = patching.activation_patching(model, clean, corrupted, metric, "resid_pre")
    torch.testing.assert_close(whole.values, whole.source.expand_as(whole.values), atol=ATOL, rtol=0)
    assert not torch.allclose(whole.source, whole.target, atol=1e-3)  # the patch did something


@pytest.mark.parametrize("family", ["gemma2", "mixtral"])
def test_ablation_matches_a_hand_written_hook(family, request) -> None:
    model = request.getfixturevalue(family)
    tokens = _tokens(model)

    def zero_head_and_mlp(act, hook):
        act = act.clone()
        if hook.name.endswith("hook_z"):
            act[:, :, 1] = 0
        else:
            act[:] = 0
        return act

    hooks = [(interp.act_name("z", 0), zero_head_and_mlp), (interp.act_name("mlp_out", 1), zero_head_and_mlp)]
    expected = model.run_with_hooks(tokens, fwd_hooks=hooks)
    with ablate(model, heads=[(0, 1)], mlps=[1]):
        ablated = model(tokens)
    torch.testing.assert_close(ablated, expected, atol=ATOL, rtol=0)
    assert not torch.allclose(ablated, model(tokens), atol=1e-3)


@pytest.mark.parametrize("family", ["gemma2", "mixtral"])
def test_head_report_runs_with_causal_checks(family, request) -> None:
    """`interp heads` (circuits.heads.head_report) with causal=True. Heads of a random model rarely
    cross the score thresholds; the ablation checks run on exactly the heads that do."""
    model = request.getfixturevalue(family)
    max_candidates = 2
    report = head_report(model, n_samples=4, seq_len=10, causal=True, max_candidates=max_candidates)
    data = json.loads(result_json(report))
    assert len(data["heads"]) == model.cfg.n_layers * model.cfg.n_heads
    crossing = 0
    for head in data["heads"]:
        assert set(SCORE_NAMES) <= set(head["scores"])
        assert all(0 <= head["scores"][name] <= 1 for name in ("previous_token", "induction", "broad"))
        crossing += head["scores"]["induction"] >= data["thresholds"]["induction"]
        check = head["causal"]["induction"]
        assert check["effect"] is None or (math.isfinite(check["effect"]) and check["se"] >= 0)
    checked = sum(head["causal"]["induction"]["effect"] is not None for head in data["heads"])
    assert checked == min(crossing, max_candidates)
