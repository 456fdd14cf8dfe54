"""Edge-level circuits: the graph (`graph`), edge-level runs through the model's own forward pass
(`intervene`), edge scores (`attribution`: EAP, EAP-IG, exact), learned masks (`pruning`), selection
frequencies and ensembles (`stability`), faithfulness and each edge's effect of removal from a circuit
(`evaluate`)."""

from interp.edges.attribution import (
    IG_POINTS,
    METHODS,
    IGPoints,
    Method,
    edge_attribution,
    edge_attribution_by_position,
)
from interp.edges.evaluate import (
    REMOVAL_STAGE,
    Faithfulness,
    FaithfulnessCurve,
    RemovalEffects,
    area_under,
    faithfulness,
    faithfulness_curve,
    removal_effects,
)
from interp.edges.graph import (
    MIB_FRACTIONS,
    EdgeGraph,
    EdgeScores,
    edge_graph,
    fraction_to_edges,
    mib_json,
    node_circuit,
    prune,
    random_scores,
    top_circuit,
)
from interp.edges.intervene import (
    EdgeRun,
    ablated_outputs,
    edge_forward,
    pad_pair,
    run_circuits,
    writer_outputs,
)
from interp.edges.pruning import OBJECTIVES, PruneSettings, masked_logits, prune_edges
from interp.edges.stability import (
    ensemble,
    mean_scores,
    normalised_ranks,
    prompt_scores,
    selection_frequency,
    subset_metric,
)
from interp.interventions.ablation import Ablation
from interp.interventions.metrics import AnswerMetric, logit_diff_metric, prob_metric
from interp.interventions.stats import auroc
from interp.types import ABLATIONS, AblationKind

__all__ = [
    "ABLATIONS", "IG_POINTS", "IGPoints", "METHODS", "MIB_FRACTIONS", "OBJECTIVES", "Ablation",
    "AblationKind", "AnswerMetric",
    "EdgeGraph", "EdgeScores",
    "Faithfulness", "FaithfulnessCurve", "EdgeRun", "Method", "ablated_outputs", "area_under", "auroc",
    "edge_attribution", "edge_attribution_by_position", "edge_forward", "edge_graph", "faithfulness",
    "faithfulness_curve", "fraction_to_edges", "logit_diff_metric", "mib_json", "node_circuit", "pad_pair",
    "prob_metric", "prune", "random_scores", "run_circuits", "top_circuit", "writer_outputs",
    "ensemble", "masked_logits", "mean_scores", "normalised_ranks", "prompt_scores", "PruneSettings",
    "prune_edges",
    "selection_frequency", "subset_metric", "REMOVAL_STAGE", "RemovalEffects", "removal_effects",
]  # fmt: skip
