"""IOI as a task on the one analysis path: its split, and agreement with IOI's own pipeline."""

import math

import pytest
import torch

import interp
from circuits.edge_circuits.tasks import edge_task, heldout_edge_task
from circuits.ioi import find_ioi_circuit
from circuits.ioi.task import ioi_pair_task
from circuits.path import head_path
from interp.model.tokens import recorded_padding


@pytest.fixture(scope="module")
def toy_ioi():
    return interp.load_model("toy-ioi")


def test_ioi_pair_task_holds_out_ioi_heldout_split(toy_ioi):
    task = ioi_pair_task(toy_ioi, n_prompts=16)
    discovery, heldout = task.split()
    assert set(heldout.families) == set(task.heldout_families)
    assert all(f.startswith("template") for f in discovery.families)
    assert all(f.startswith("held-out template") for f in heldout.families)
    assert {tuple(row.tolist()) for row in discovery.clean}.isdisjoint(
        tuple(row.tolist()) for row in heldout.clean
    )
    assert set(task.strata) == {"ABBA", "BABA"}
    rows = torch.arange(len(task))
    assert (task.clean[rows, task.positions["S2"]] == task.incorrect).all()
    assert (task.clean[rows, task.positions["IO"]] == task.correct).all()
    clean_logits = toy_ioi(task.clean)
    assert (task.metric(clean_logits) > 0).float().mean() > 0.9  # the model does the task


def test_the_edge_circuit_s_ioi_prompts_are_the_pair_task_s_split(smollm2):
    """`interp circuit --task ioi` reads IOI's one pair task: its discovery and held-out prompts are the
    pair task's two splits, token for token, each clean prompt carrying its exact padding (SmolLM2's
    templates differ in length), with the metric named by IOI's answers."""
    task = ioi_pair_task(smollm2, n_prompts=8, seed=3)
    edge = edge_task(smollm2, "ioi", n_prompts=8, seed=3), heldout_edge_task(smollm2, "ioi", 8, seed=3)
    for pairs, edge_side in zip(task.split(), edge, strict=True):
        assert torch.equal(edge_side.clean, pairs.clean) and torch.equal(edge_side.corrupted, pairs.corrupted)
        assert edge_side.families == list(pairs.families) and edge_side.strata == list(pairs.strata)
        padding = recorded_padding(edge_side.clean)
        assert padding is not None and torch.equal(padding.sum(1) - 1, pairs.end)
        assert torch.equal(edge_side.metric(smollm2(edge_side.clean)), pairs.metric(smollm2(pairs.clean)))
        assert edge_side.metric_name == pairs.metric_name == "logit_diff(IO - S)"
    assert (task.end != task.end.max()).any()  # some prompts are padded


def test_head_path_on_ioi_agrees_with_ioi_pipeline(toy_ioi):
    """The shared path, with no IOI-specific step, finds a class attending to S2 whose drop on held-out
    templates is positive (its CI over the prompts of those 2 templates) and which holds the heads IOI's own
    pipeline names as attending to S2. Its two classes take all 8 heads of the model, so no random heads
    are left to compare them with: the path leaves them unconfirmed, with no figure beyond random (the
    raw drop stands as the drop), saying why."""
    path = head_path(toy_ioi, ioi_pair_task(toy_ioi, n_prompts=64))
    to_s2 = next(check for check in path.classes if check.name == "to S2")
    assert to_s2.heldout.drop > 0 and to_s2.random_sets == [[]] * len(to_s2.random_sets)
    assert 0 < to_s2.heldout.drop_ci[0] <= to_s2.heldout.drop  # within each of its 2 held-out templates
    assert math.isnan(to_s2.heldout.beyond) and "no random heads" in to_s2.note
    assert to_s2.random_sets_short and to_s2.verdict == "unconfirmed"
    ioi = find_ioi_circuit(toy_ioi, n_prompts=64, seed=0).extras
    s2_classes = [name for name in ioi.circuit if name in ("s_inhibition", "s_suppression")]
    named = {f"L{layer}H{head}" for name in s2_classes for layer, head in ioi.circuit[name]}
    assert named and named <= set(to_s2.heads)
