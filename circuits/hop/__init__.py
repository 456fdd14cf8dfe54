"""Function composition as iterated induction: the k-hop task's lookups, located head by head.

    finding = hop_report(model)           # each hop's heads, tested on held-out sequences (locate.py)
    finding.extras.paths                  # what carries hop j's result to hop j + 1's heads (hop_paths)
    lookup_chain_figure(finding, "hop.png")                                        # results.py

The model is a checkpoint of `interp train --task hop --hops K`; the result is a
`circuits.finding.Finding` whose extras are `HopFigures`, rendered by `circuits.finding`.
"""

from circuits.hop.locate import hop_paths, hop_report, hop_task_of, lookup_positions
from circuits.hop.results import HopFigures, carries, lookup_chain_figure

__all__ = [
    "HopFigures",
    "carries",
    "hop_paths",
    "hop_report",
    "hop_task_of",
    "lookup_chain_figure",
    "lookup_positions",
]
