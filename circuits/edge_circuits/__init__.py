"""Edge circuits of a task: scores of every edge (interp.edges), the top circuit, its faithfulness
and curve (`find`), the task's prompt pairs (`tasks`) and the report (`report`)."""

from circuits.edge_circuits.find import EdgeCircuitSettings, find_edge_circuit
from circuits.edge_circuits.tasks import edge_task, induction_task, ioi_task

__all__ = ["EdgeCircuitSettings", "edge_task", "find_edge_circuit", "induction_task", "ioi_task"]
