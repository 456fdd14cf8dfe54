"""The `interp` command's progress printer: the one view of `interp.types.Progress` on a screen.

A command announces its stages up front ("3 stages: 1. Edge scores, 2. Edge pruning, 3. Faithfulness")
and names each as it begins ("stage 2 of 3: Edge pruning"). A reported stage "STAGE: detail" is part
of the planned STAGE. Without a terminal (a log, a pipe) it writes lines, and a background timer
repeats the current stage with its elapsed time whenever HEARTBEAT_S passes without a line, so a long
single step (one torch call) is not silent. On a terminal, one bar per stage, refreshed by the same
timer. Time left comes from the stage's measured rate and is shown only once it is stable
(`StageClock.seconds_left`); it is recomputed at every line from the time now, never frozen.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

HEARTBEAT_S = 10.0  # without a terminal, the longest silence between two lines
LINE_EVERY_S = 5.0  # without a terminal, a stage's count is printed at most this often
ESTIMATE_AFTER_ITEMS = 3  # time left is shown only after this many of a stage's units
ESTIMATE_AFTER_S = 10.0  # ... and this many seconds in the stage
ESTIMATE_AGREEMENT = 0.25  # ... and while successive projections of its duration agree this closely


@dataclass
class StageClock:
    """A stage's measured rate. Times in seconds from `began` (any monotonic clock)."""

    began: float
    done: int = 0
    total: int = 0
    projections: list[float] = field(default_factory=list)  # the stage's duration projected at each unit

    def advance(self, done: int, total: int, now: float) -> None:
        """Record progress(stage, done, total) reported at `now`."""
        if done != self.done and done > 0 and now > self.began:
            self.projections.append((now - self.began) / done * total)
        self.done, self.total = done, total

    def seconds_left(self, now: float) -> float | None:
        """(total - done) units at the stage's mean time per unit so far, measured up to `now` (so it
        grows while a unit takes longer than the rest); None until at least ESTIMATE_AFTER_ITEMS units
        and ESTIMATE_AFTER_S seconds, and while the last two projections of the stage's duration
        differ by more than ESTIMATE_AGREEMENT."""
        elapsed = now - self.began
        if self.done < ESTIMATE_AFTER_ITEMS or elapsed < ESTIMATE_AFTER_S or not 0 < self.done < self.total:
            return None
        if len(self.projections) < 2:
            return None
        previous, last = self.projections[-2:]
        if abs(last - previous) > ESTIMATE_AGREEMENT * max(last, previous):
            return None
        return elapsed / self.done * (self.total - self.done)


class ProgressPrinter:
    """A `Progress` callback that writes lines through `write` (stderr without a terminal).

    stages: the command's planned stages, announced at once; a reported stage outside the plan is
    named "extra stage" and kept in `unplanned`. clock: seconds, monotonic."""

    def __init__(
        self,
        command: str,
        stages: Sequence[str],
        write: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        expected: str | None = None,
    ) -> None:
        self.command, self.stages, self.write, self.clock = command, list(stages), write, clock
        self.began = clock()
        self.clocks: dict[str, StageClock] = {}
        self.seen: list[str] = []  # the planned stages reported, in order
        self.unplanned: list[str] = []
        self.current: str | None = None
        self.last_line = self.began
        self.last_count: dict[str, float] = {}
        self.lock = threading.RLock()
        plan = ", ".join(f"{i}. {stage}" for i, stage in enumerate(self.stages, 1))
        count = f"{len(self.stages)} stage{'s' if len(self.stages) != 1 else ''}"
        self.line(f"{count}: {plan}" + (f" ({expected})" if expected else ""))

    def planned_stage(self, stage: str) -> str | None:
        """The planned stage `stage` is, or is part of ("STAGE: detail"); None if unplanned."""
        for planned in self.stages:
            if stage == planned or stage.startswith(f"{planned}: "):
                return planned
        return None

    def title(self, stage: str) -> str:
        """ "stage 2 of 3: Edge pruning" (or "extra stage: ...")."""
        planned = self.planned_stage(stage)
        if planned is None:
            return f"extra stage: {stage}"
        return f"stage {self.stages.index(planned) + 1} of {len(self.stages)}: {stage}"

    def line(self, text: str) -> None:
        with self.lock:
            now = self.clock()
            self.last_line = now
            self.write(f"[{self.command} {now - self.began:6.1f}s] {text}")

    def status(self, stage: str, now: float) -> str:
        """The stage's count, time in it and (once stable) time left, as of `now`."""
        clock = self.clocks[stage]
        parts = [f"{clock.done}/{clock.total}"] if clock.total > 1 else []
        parts.append(f"{now - clock.began:.0f} s in this stage")
        left = clock.seconds_left(now)
        if left is not None:
            parts.append(f"about {left:.0f} s left")
        return f"{self.title(stage)}: {', '.join(parts)}"

    def record(self, stage: str, done: int, total: int, now: float) -> bool:
        """Note progress(stage, done, total) at `now`; True when the stage is new."""
        new = stage not in self.clocks
        if new:
            self.clocks[stage] = StageClock(began=now)
            self.last_count[stage] = now
            planned = self.planned_stage(stage)
            if planned is None:
                self.unplanned.append(stage)
            elif planned not in self.seen:
                self.seen.append(planned)
        self.current = stage
        self.clocks[stage].advance(done, total, now)
        return new

    def __call__(self, stage: str, done: int, total: int) -> None:
        with self.lock:
            now = self.clock()
            if self.record(stage, done, total, now):
                self.line(f"{self.title(stage)} ..." if total else f"{self.title(stage)} (nothing to do)")
            elif 0 < done < total and now - self.last_count[stage] >= LINE_EVERY_S:
                self.last_count[stage] = now
                self.line(self.status(stage, now))

    def heartbeat(self) -> None:
        """A line repeating the current stage, if none was written for HEARTBEAT_S."""
        with self.lock:
            now = self.clock()
            if now - self.last_line < HEARTBEAT_S:
                return
            if self.current is None:
                self.line("starting ...")
            else:
                self.line(f"{self.status(self.current, now)} (still working)")


@contextmanager
def heartbeat_thread(beat: Callable[[], None], every_s: float = 1.0) -> Iterator[None]:
    """Call `beat` every `every_s` seconds from a daemon thread while the block runs."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every_s):
            beat()

    thread = threading.Thread(target=run, name="interp-progress-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def progress_lines(
    command: str, stages: Sequence[str], expected: str | None = None
) -> Iterator[ProgressPrinter]:
    """A ProgressPrinter on stderr with its heartbeat running, and a closing "done in" line."""

    def write(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    printer = ProgressPrinter(command, stages, write, expected=expected)
    with heartbeat_thread(printer.heartbeat):
        yield printer
    printer.line(f"done in {printer.clock() - printer.began:.1f} s")


@contextmanager
def progress_bars(command: str, stages: Sequence[str], expected: str | None = None) -> Iterator[Callable]:
    """On a terminal: the plan printed once, then one bar per stage ("stage 2 of 3: ..."), its count,
    elapsed time and (once stable) time left, refreshed every second; gone when the block ends."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bars

    stderr = Console(stderr=True)
    printer = ProgressPrinter(
        command, stages, lambda text: stderr.print(text, markup=False), expected=expected
    )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[left]}"))  # fmt: skip
    with Bars(*columns, console=stderr, transient=True) as bars:
        tasks: dict[str, TaskID] = {}

        def refresh() -> None:
            with printer.lock:
                now = printer.clock()
                for stage, task in tasks.items():
                    left = printer.clocks[stage].seconds_left(now)
                    bars.update(task, left="" if left is None else f"about {left:.0f} s left")

        def progress(stage: str, done: int, total: int) -> None:
            with printer.lock:
                if printer.record(stage, done, total, printer.clock()):
                    tasks[stage] = bars.add_task(printer.title(stage), total=total or 1, left="")
                bars.update(tasks[stage], completed=done if total else 1, total=total or 1)

        with heartbeat_thread(refresh):
            yield progress
    printer.line(f"done in {printer.clock() - printer.began:.1f} s")
