"""The `interp` command's progress printer: the one view of `interp.types.Progress` on a screen.

A command announces its stages up front ("3 stages: 1. Edge scores, 2. Edge pruning, 3. Faithfulness")
and names each as it begins ("stage 2 of 3: Edge pruning"). A reported stage "STAGE: detail" is part
of the planned STAGE. Work outside the numbered stages (a quick preparation that a resumed run does
again) is named by where it falls ("before stage 1: ...", "after stage 2: ..."). With --save, the
numbered stages are the units written to the file: the plan says so, and each stage's "stage 2 of 3
done: ..., saved to FILE" line comes once the file holds it. Without a terminal (a log, a pipe) it
writes lines, and a background timer repeats the current stage with its elapsed time whenever
HEARTBEAT_S passes without a line, so a long single step (one torch call) is not silent. On a
terminal, one bar per stage, refreshed by the same timer. Time left comes from the stage's measured
rate and is shown only once it is stable (`StageClock.seconds_left`); it is recomputed at every line
from the time now, never frozen.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # circuits.stages imports torch; the printer needs only its on_done
    from circuits.stages import StageResults

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
    most: int = 0  # the largest total reported: the work counted at first, where the stage finds less to do

    def advance(self, done: int, total: int, now: float) -> None:
        """Record progress(stage, done, total) reported at `now`."""
        if done != self.done and done > 0 and now > self.began:
            self.projections.append((now - self.began) / done * total)
        self.done, self.total, self.most = done, total, max(self.most, total)

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

    stages: the command's planned stages, announced at once, numbered; between: the work reported
    outside them (not numbered, not saved); a reported stage in neither is named "extra stage" and
    kept in `unplanned`. saved_to: the file each stage is written to as it finishes (`saved`).
    clock: seconds, monotonic."""

    def __init__(
        self,
        command: str,
        stages: Sequence[str],
        write: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        expected: str | None = None,
        between: Sequence[str] = (),
        saved_to: str | None = None,
    ) -> None:
        self.command, self.stages, self.write, self.clock = command, list(stages), write, clock
        self.between, self.saved_to = list(between), saved_to
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
        if saved_to is not None:
            count += f", each saved to {saved_to} as it finishes"
        self.line(f"{count}: {plan}" + (f" ({expected})" if expected else ""))

    def planned_stage(self, stage: str) -> str | None:
        """The planned stage `stage` is, or is part of ("STAGE: detail"); None if unplanned."""
        return _part_of(stage, self.stages)

    def number(self, planned: str) -> str:
        """ "stage 2 of 3" """
        return f"stage {self.stages.index(planned) + 1} of {len(self.stages)}"

    def title(self, stage: str) -> str:
        """ "stage 2 of 3: Edge pruning", "after stage 2: ..." (work between stages) or "extra stage: ..."."""
        planned = self.planned_stage(stage)
        if planned is not None:
            return f"{self.number(planned)}: {stage}"
        if _part_of(stage, self.between) is None:
            return f"extra stage: {stage}"
        if not self.seen:
            return f"before stage 1: {stage}"
        return f"after stage {self.stages.index(self.seen[-1]) + 1}: {stage}"

    def saved(self, stage: str) -> None:
        """Say that the planned `stage` is done and written to `saved_to`."""
        with self.lock:
            self.line(f"{self.number(stage)} done: {stage}, saved to {self.saved_to}")
            self.current = None  # what follows until the next stage is reported is no stage's

    def line(self, text: str) -> None:
        with self.lock:
            now = self.clock()
            self.last_line = now
            self.write(f"[{self.command} {now - self.began:6.1f}s] {text}")

    def status(self, stage: str, now: float) -> str:
        """The stage's count, time in it and (once stable) time left, as of `now`."""
        clock = self.clocks[stage]
        parts = [f"{clock.done}/{clock.total}"] if clock.total > 1 else []
        if parts and clock.most > clock.total:  # e.g. sequential stopping: runs found not needed
            parts[0] += f" (down from {clock.most})"
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
            if planned is None and _part_of(stage, self.between) is None:
                self.unplanned.append(stage)
            elif planned is not None and planned not in self.seen:
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
            if self.current is None and not self.seen:
                self.line("starting ...")
            elif self.current is None:
                self.line(f"after {self.number(self.seen[-1])}: still working")
            else:
                self.line(f"{self.status(self.current, now)} (still working)")


def _part_of(stage: str, names: Sequence[str]) -> str | None:
    """The name of `names` that `stage` is, or is part of ("NAME: detail"); None if none."""
    for name in names:
        if stage == name or stage.startswith(f"{name}: "):
            return name
    return None


@contextmanager
def said_when_saved(printer: ProgressPrinter, kept: StageResults | None) -> Iterator[None]:
    """While the block runs, each stage `kept` writes to its file (its `on_done`) is then said done
    (`printer.saved`)."""
    if kept is None:
        yield
        return
    keep = kept.on_done

    def keep_and_say(stage: str, value: object) -> None:
        if keep is not None:
            keep(stage, value)
        printer.saved(stage)

    kept.on_done = keep_and_say
    try:
        yield
    finally:
        kept.on_done = keep


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
def progress_printer(
    command: str,
    stages: Sequence[str],
    terminal: bool,
    expected: str | None = None,
    between: Sequence[str] = (),
    kept: StageResults | None = None,
    saved_to: str | None = None,
) -> Iterator[Callable[[str, int, int], None]]:
    """The Progress callback of `command` on stderr: on a `terminal` the plan, then one bar per stage
    (gone when the block ends), else a ProgressPrinter's lines with its heartbeat; each stage `kept`
    writes to `saved_to` said done as it is written, and a closing "done in" line."""
    from rich.console import Console

    stderr = Console(stderr=True)

    def write(text: str) -> None:
        if terminal:
            stderr.print(text, markup=False)
        else:
            print(text, file=sys.stderr, flush=True)

    printer = ProgressPrinter(command, stages, write, expected=expected, between=between, saved_to=saved_to)
    with said_when_saved(printer, kept):
        if terminal:
            with _bars(printer, stderr) as progress:
                yield progress
        else:
            with heartbeat_thread(printer.heartbeat):
                yield printer
    printer.line(f"done in {printer.clock() - printer.began:.1f} s")


@contextmanager
def _bars(printer: ProgressPrinter, stderr) -> Iterator[Callable[[str, int, int], None]]:
    """One bar per stage of `printer` on `stderr` ("stage 2 of 3: ..."): its count, elapsed time and
    (once stable) time left, refreshed every second."""
    from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bars

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
