"""Ground truth: the hand-set induction model really uses exactly its planted edges, and edge
attribution recovers them."""

from __future__ import annotations

import math

import pytest
import torch

from circuits.edge_circuits.ground_truth import (
    edge_circuit_finder,
    planted_induction,
    precision_recall,
    repeated_sequence_task,
    score_method,
)
from interp import edges


@pytest.fixture(scope="module")
def truth():
    return planted_induction()


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
