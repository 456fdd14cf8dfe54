"""The one analysis path: a task of prompt pairs (families, strata, named positions) -> discover heads
-> classify them -> validate each class on held-out families -> faithfulness -> one report."""

from circuits.path.steps import PATH_STAGES, PathResult, PathSettings, head_path
from circuits.path.task import PairTask, pair_task

__all__ = ["PATH_STAGES", "PairTask", "PathResult", "PathSettings", "head_path", "pair_task"]
