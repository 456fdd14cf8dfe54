"""The one analysis path: a task of prompt pairs (families, strata, named positions) -> discover heads
-> classify them -> validate each class on held-out families -> faithfulness -> one
`circuits.finding.Finding` (analysis "path", extras `PathFigures`)."""

from circuits.path.results import PathFigures
from circuits.path.steps import PATH_STAGES, PathSettings, head_path
from circuits.path.task import PairTask, pair_task

__all__ = ["PATH_STAGES", "PairTask", "PathFigures", "PathSettings", "head_path", "pair_task"]
