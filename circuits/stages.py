"""Each stage's result kept as it completes, so that a run stopped mid-way resumes from the stages done.

    stages = StageResults(on_done=keep)          # keep(stage, value): e.g. write the --save file
    heads = stages.run("Induction heads", lambda: confirmed_induction_heads(model), progress)

A pipeline that takes `stages` (`head_report`, `find_ioi_circuit`, `icl_report`,
`function_vector_report`) runs each of its stages through `run`: a stage already in `done`
(read back from a partial result file, `circuits.results_file.resume_stages`) is not run again, and
each stage that finishes is recorded in `done` and handed to `on_done`. Stage values are what
`interp.io.serialize` stores: dataclasses registered there, tensors, lists, dicts, numbers. Kept
results are keyed by their settings and the weights' fingerprint (`interp.model.weights_fingerprint`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from interp.types import Progress

T = TypeVar("T")


@dataclass
class StageResults:
    """done: stage name -> its result, in the order the stages finished; on_done(stage, value): called
    as each stage finishes (an exception from it, KeyboardInterrupt too, stops the run there)."""

    done: dict[str, Any] = field(default_factory=dict)
    on_done: Callable[[str, Any], None] | None = None
    resumed_from: str = "an earlier run"  # where `done` came from, for the progress line

    def run(self, stage: str, compute: Callable[[], T], progress: Progress | None = None) -> T:
        """compute()'s value, or the stage's kept value without running it, reported as
        progress(f"{stage}: kept from ...", 0, 0)."""
        if stage in self.done:
            if progress is not None:
                progress(f"{stage}: kept from {self.resumed_from}", 0, 0)
            return self.done[stage]
        value = compute()
        self.done[stage] = value
        if self.on_done is not None:
            self.on_done(stage, value)
        return value
