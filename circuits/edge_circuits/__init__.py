"""Edge circuits of a task: scores of every edge (interp.edges), the top circuit, its faithfulness
and curve (`find`), the task's prompt pairs (`tasks`) and the report (`report`)."""

from circuits.edge_circuits.find import (
    CIRCUIT_METHODS,
    ENSEMBLE_MEMBERS,
    SCHEMA,
    EdgeCircuitResult,
    EdgeCircuitSettings,
    find_edge_circuit,
)
from circuits.edge_circuits.report import FORMATS, circuit_svg, edge_sections, write_edge_report
from circuits.edge_circuits.tasks import (
    TASKS,
    EdgeTask,
    edge_task,
    file_task,
    induction_task,
    ioi_task,
)
from circuits.pairs_file import METRICS

__all__ = [
    "CIRCUIT_METHODS", "ENSEMBLE_MEMBERS",
    "FORMATS", "METRICS", "SCHEMA", "TASKS", "EdgeCircuitResult", "EdgeCircuitSettings",
    "EdgeTask", "circuit_svg", "edge_task",
    "file_task", "find_edge_circuit", "induction_task", "ioi_task", "edge_sections", "write_edge_report",
]  # fmt: skip
