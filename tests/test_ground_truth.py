"""Ground truth: the hand-set induction models really use their planted edges, edge attribution
recovers them, and saturation hides them from first-order attribution (EAP); the trained model
with disabled heads does the task with the other heads only, and its measured truth holds on new
prompts."""

from __future__ import annotations

import math

import pytest
import torch

import interp
from circuits.edge_circuits.ground_truth import (
    DISABLED_HEADS,
    TRUTH_THRESHOLD,
    disabled_heads_induction,
    edge_circuit_finder,
    planted_induction,
    precision_recall,
    repeated_sequence_task,
    saturated_induction,
    score_method,
    thresholded_truth,
)
from circuits.edge_circuits.tasks import induction_task
from interp import edges


@pytest.fixture(scope="module")
def truth():
    return planted_induction()


@pytest.fixture(scope="module")
def saturated():
    return saturated_induction()


@pytest.fixture(scope="module")
def trained():
    return disabled_heads_induction()


def test_building_a_planted_model_leaves_the_callers_random_numbers_alone():
    """The planted model's weights are set by hand: the random ones its constructor drew (from torch's
    global generator, so that a caller's later torch.randn changed) are drawn from a forked stream."""
    torch.manual_seed(1234)
    expected = torch.randn(3)
    torch.manual_seed(1234)
    planted_induction()
    assert torch.equal(torch.randn(3), expected)


def test_precision_and_recall_count_edges():
    true = torch.zeros(3, 4, dtype=torch.bool)
    true[0, 1] = true[1, 2] = true[2, 3] = True  # 3 true edges
    found = torch.zeros(3, 4, dtype=torch.bool)
    found[0, 1] = found[2, 3] = found[0, 0] = found[1, 1] = True  # 2 of them, and 2 others
    assert precision_recall(found, true) == (2 / 4, 2 / 3)
    assert precision_recall(true, true) == (1.0, 1.0)
    precision, recall = precision_recall(torch.zeros(3, 4, dtype=torch.bool), true)
    assert math.isnan(precision) and recall == 0.0
    with pytest.raises(ValueError, match="no edges"):
        precision_recall(found, torch.zeros(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="differ in shape"):
        precision_recall(found[:2], true)


def test_the_planted_model_solves_the_task_on_new_prompts(truth):
    task = repeated_sequence_task(32, 8, n_prompts=64, seed=1)  # prompts the finders never see
    with torch.no_grad():
        logits = truth.model(task.clean)
    answer = task.clean[:, 7]  # A[-1]: what followed the last token's earlier copy
    assert (logits[:, -1].argmax(-1) == answer).float().mean() >= 0.95
    assert float(task.metric(logits, torch.arange(64)).min()) > 1.0


def test_exactly_the_planted_edges_matter(truth):
    """Each planted edge ablated alone lowers the metric; all other edges ablated at once change
    nothing (faithfulness 1), on prompts the finders never see."""
    model, graph = truth.model, edges.edge_graph(truth.model)
    task = repeated_sequence_task(32, 8, n_prompts=64, seed=1)
    one_out = []
    for w, r in graph.edges(truth.circuit):
        keep = graph.valid.clone()
        keep[w, r] = False
        one_out.append(keep)
    circuits = torch.stack([truth.circuit, *one_out])
    result = edges.faithfulness(model, task.clean, task.corrupted, task.metric, circuits)
    assert float(result.full.mean() - result.empty.mean()) > 2.0
    assert abs(float(result.faithfulness[0]) - 1) < 1e-4  # only the planted edges kept
    assert (result.faithfulness[1:] < 0.9).all(), result.faithfulness  # any one planted edge ablated


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_edge_attribution_recovers_the_planted_circuit(truth, method):
    precision, recall = score_method(edge_circuit_finder(method), truth)
    assert recall >= 0.9 and precision >= 0.9, (precision, recall)


def test_the_saturated_model_solves_the_task_on_new_prompts(saturated):
    task = repeated_sequence_task(32, 8, n_prompts=64, seed=1)
    with torch.no_grad():
        logits = saturated.model(task.clean)
    assert (logits[:, -1].argmax(-1) == task.clean[:, 7]).float().mean() >= 0.95
    assert float(task.metric(logits, torch.arange(64)).min()) > 1.0


def test_the_saturated_truth_is_the_edges_over_the_threshold(saturated):
    """On prompts no method saw: each planted edge ablated alone moves the metric by at least
    TRUTH_THRESHOLD of (model - every edge ablated), every other edge by less (a0.h2's by more than
    nothing: a real but small distractor), and the planted edges alone keep >= 0.9 of it."""
    model, graph = saturated.model, edges.edge_graph(saturated.model)
    task = repeated_sequence_task(32, 8, n_prompts=64, seed=1)
    one_out = []
    for w, r in graph.edges():
        keep = graph.valid.clone()
        keep[w, r] = False
        one_out.append(keep)
    result = edges.faithfulness(
        model, task.clean, task.corrupted, task.metric, torch.stack([saturated.circuit, *one_out])
    )
    assert float(result.faithfulness[0]) >= 0.9
    effect = 1 - result.faithfulness[1:]  # each edge's share of the full effect
    planted = torch.tensor([bool(saturated.circuit[w, r]) for w, r in graph.edges()])
    assert (effect[planted] >= TRUTH_THRESHOLD).all(), effect[planted]
    assert (effect[~planted].abs() < TRUTH_THRESHOLD).all(), effect[~planted]
    assert (effect[~planted].abs() > 0.01).sum() == 2  # a0.h2's value and output edges


def test_saturation_hides_the_key_edges_from_eap(saturated):
    """The gradient through the saturated keys is ~0 at the clean prompts, the exact effect is not:
    EAP misses the planted circuit, exact ablation and EAP-IG (the path integral) recover it."""
    model, task, graph = saturated.model, saturated.task, edges.edge_graph(saturated.model)
    eap, exact = (
        edges.edge_attribution(model, task.clean, task.corrupted, task.metric, m, 5) for m in ("eap", "exact")
    )
    key = graph.edge_index("a0.h0->a1.h0<k>")
    assert abs(float(eap.scores[key])) < 1e-3 < 1.0 < abs(float(exact.scores[key]))
    assert score_method(edge_circuit_finder("eap"), saturated)[1] <= 0.6
    for method in ("exact", "eap-ig"):
        precision, recall = score_method(edge_circuit_finder(method), saturated)
        assert recall >= 0.9 and precision >= 0.9, (method, precision, recall)


def test_induction_items_have_one_answer_and_the_corrupted_prompt_none(trained):
    """A's tokens are distinct (A[-2] occurs once, so induction predicts A[-1] alone) and B shares none
    with A; drawn with replacement, a fifth of the toy vocabulary's items were ambiguous."""
    task = induction_task(trained.model, 64, seq_len=10, seed=0)
    first, other = task.clean[:, 1:11], task.corrupted[:, 1:11]
    for a, b in zip(first.tolist(), other.tolist(), strict=True):
        assert len(set(a)) == 10 and not set(a) & set(b)
    small = interp.HookedTransformer(interp.Config(n_layers=1, d_model=16, n_heads=2, d_vocab=12, n_ctx=32))
    with pytest.raises(ValueError, match="needs 16 distinct tokens for A and B, but the vocabulary has 12"):
        induction_task(small, 4, seq_len=8)


def test_the_disabled_heads_model_solves_the_task_without_them(trained):
    model, graph = trained.model, edges.edge_graph(trained.model)
    task = induction_task(model, 64, seq_len=10, seed=2000)  # neither the methods' nor the truth's prompts
    with torch.no_grad():
        logits = model(task.clean)
    assert (logits[:, -1].argmax(-1) == task.clean[:, 10]).float().mean() >= 0.9  # A[-1], after BOS
    for layer, head in DISABLED_HEADS:
        assert not model.blocks[layer].attn.W_O[head].any()  # off: it writes nothing
    touch = torch.zeros_like(graph.valid)
    for layer, head in DISABLED_HEADS:
        touch[graph.writers.index(f"a{layer}.h{head}")] = True
        touch[:, [graph.readers.index(f"a{layer}.h{head}<{x}>") for x in "qkv"]] = True
    exact = edges.edge_attribution(model, task.clean, task.corrupted, task.metric, "exact")
    assert exact.scores[touch & graph.valid].abs().max() < 1e-4  # a disabled head's edges: no effect
    assert not (trained.circuit & touch).any()


def test_the_disabled_heads_truth_holds_on_new_prompts(trained):
    """The thresholded truth, measured on other prompts, is the same edges, and they alone keep
    >= 0.9 of the metric there."""
    model = trained.model
    task = induction_task(model, 64, seq_len=10, seed=2000)
    assert trained.n_edges >= 5
    assert torch.equal(thresholded_truth(model, task), trained.circuit)
    result = edges.faithfulness(model, task.clean, task.corrupted, task.metric, trained.circuit)
    assert float(result.faithfulness[0]) >= 0.9
    precision, recall = score_method(edge_circuit_finder("exact"), trained)
    assert recall >= 0.9 and precision >= 0.9, (precision, recall)
