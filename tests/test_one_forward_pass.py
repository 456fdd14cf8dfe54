"""One forward pass: a user's hook on the model is seen by every entry point of the library.

The user zeroes MLP 0 through `hook_mlp_out` with interp's own `ablation_hooks`, and keeps the hook
on the model while calling each entry point. Every one must report the hooked model's numbers (the
edge-level run once went around the model's hooks: 2.56 where the hooked model gave -0.61).
"""

from __future__ import annotations

import pytest
import torch

import interp
from interp import edges
from interp.interventions import ablation, metrics, patching
from interp.interventions.engine import cached_run, run_site_sets, start_names
from interp.interventions.path_patching import path_patching

ATOL = 1e-4


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    cfg = interp.Config(n_layers=2, d_model=32, n_heads=4, d_vocab=50, n_ctx=16, d_mlp=64, init_std=0.2)
    model = interp.HookedTransformer(cfg).eval()
    generator = torch.Generator().manual_seed(1)
    clean = torch.randint(50, (6, 9), generator=generator)
    corrupted = torch.randint(50, (6, 9), generator=generator)
    correct, incorrect = (
        torch.randint(50, (6,), generator=generator),
        torch.randint(50, (6,), generator=generator),
    )
    metric = metrics.logit_diff_metric(correct, incorrect)
    user_hook = ablation.ablation_hooks(model, mlps=[0])  # zero MLP 0's output
    with torch.no_grad():
        plain = metric(model(clean))
        with model.hooks(fwd_hooks=user_hook):
            hooked = metric(model(clean))
            hooked_corrupted = metric(model(corrupted))
    assert (plain - hooked).abs().max() > 0.1, (
        "the user's hook must change the metric for this test to mean anything"
    )
    return model, clean, corrupted, metric, user_hook, plain, hooked, hooked_corrupted


def test_forward_and_cache_see_the_hook(setup) -> None:
    model, clean, _, metric, user_hook, _, hooked, _ = setup
    with model.hooks(fwd_hooks=user_hook):
        logits, cache = model.run_with_cache(clean)
    torch.testing.assert_close(metric(logits), hooked, atol=ATOL, rtol=0)
    assert cache["mlp_out", 0].abs().max() == 0
    assert model.hook_dict["blocks.0.hook_mlp_out"].fwd_hooks == [], "the context removed the user's hook"


def test_engine_patching_and_ablation_see_the_hook(setup) -> None:
    model, clean, corrupted, metric, user_hook, _, hooked, hooked_corrupted = setup
    with model.hooks(fwd_hooks=user_hook):
        _, cache = cached_run(model, clean, start_names(model))
        values = run_site_sets(model, clean, [[]], cache, metric, target=cache)
        result = patching.activation_patching(model, clean, corrupted, metric, "resid_pre", layers=[1])
        path = path_patching(model, clean, corrupted, metric, senders=[(1, 0)])
        replacement = ablation.Replacement(model, [], "zero")
        ablated = ablation.ablated_metrics(model, clean, metric, [[]], replacement)
    torch.testing.assert_close(values[0], hooked, atol=ATOL, rtol=0)
    torch.testing.assert_close(
        result.target, hooked_corrupted, atol=ATOL, rtol=0
    )  # denoising: corrupted target
    torch.testing.assert_close(result.source, hooked, atol=ATOL, rtol=0)
    torch.testing.assert_close(path.target, hooked, atol=ATOL, rtol=0)
    torch.testing.assert_close(ablated[0], hooked, atol=ATOL, rtol=0)
    # Patching every position of resid_pre 1 from the clean run restores the hooked clean metric.
    torch.testing.assert_close(result.values[0], hooked, atol=ATOL, rtol=0)


def test_edge_circuits_see_the_hook(setup) -> None:
    model, clean, corrupted, metric, user_hook, _, hooked, hooked_corrupted = setup
    graph = edges.edge_graph(model)
    with model.hooks(fwd_hooks=user_hook):
        ablated = edges.ablated_outputs(model, clean, corrupted)
        full = torch.ones(1, graph.n_writers, graph.n_readers)
        none = torch.zeros(1, graph.n_writers, graph.n_readers)
        kept_all = edges.run_circuits(model, clean, full, ablated, metric)[0]
        kept_none = edges.run_circuits(model, clean, none, ablated, metric)[0]
        scores = edges.edge_attribution(model, clean, corrupted, metric, method="eap-ig", steps=3)
        activations = edges.edge_attribution(
            model, clean, corrupted, metric, method="eap-ig-activations", steps=2
        )
    torch.testing.assert_close(kept_all, hooked, atol=ATOL, rtol=0)
    torch.testing.assert_close(kept_none, hooked_corrupted, atol=ATOL, rtol=0)
    mlp0 = graph.writers.index("m0")
    assert torch.equal(ablated[mlp0], torch.zeros_like(ablated[mlp0]))  # the writer is the hooked output
    for result in (scores, activations):
        assert result.scores[mlp0].abs().max() == 0, "edges out of the zeroed MLP carry nothing"
        assert result.scores.abs().max() > 0
    # Without the hook the same edges carry something: the scores above came from the hooked model.
    unhooked = edges.edge_attribution(model, clean, corrupted, metric, method="eap-ig", steps=3)
    assert unhooked.scores[mlp0].abs().max() > 1e-4


def test_a_hook_on_a_reader_input_is_seen_by_the_edge_level_run(setup) -> None:
    """A hook on an opt-in reader hook point (here: every query input of layer 1 zeroed) is part of
    the model; the edge-level run builds readers' inputs from what the hook returns."""
    model, clean, corrupted, metric, _, _, _, _ = setup

    def zero(x, hook):
        return torch.zeros_like(x)

    graph = edges.edge_graph(model)
    with model.settings(use_split_qkv_input=True), model.hooks(fwd_hooks=[("blocks.1.hook_q_input", zero)]):
        expected = metric(model(clean))
        ablated = edges.ablated_outputs(model, clean, corrupted)
        kept = edges.run_circuits(
            model, clean, torch.ones(1, graph.n_writers, graph.n_readers), ablated, metric
        )
    torch.testing.assert_close(kept[0], expected, atol=ATOL, rtol=0)
