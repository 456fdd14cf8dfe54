"""Function composition as iterated induction: the k-hop task's lookups, located head by head.

    result = hop_report(model)            # each hop's heads, tested on held-out sequences (locate.py)
    result.paths                          # what carries hop j's result to hop j + 1's heads (hop_paths)
    lookup_chain_figure(result, "hop.png")                                          # report.py

The model is a checkpoint of `interp train --task hop --hops K`; `circuits.hop.report` renders a
HopResult (terminal, JSON, Markdown).
"""

from circuits.hop.locate import hop_paths, hop_report, hop_task_of, lookup_positions
from circuits.hop.report import lookup_chain_figure, write_hop_report
from circuits.hop.results import HopPath, HopResult

__all__ = [
    "HopPath",
    "HopResult",
    "hop_paths",
    "hop_report",
    "hop_task_of",
    "lookup_chain_figure",
    "lookup_positions",
    "write_hop_report",
]
