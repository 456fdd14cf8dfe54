"""Activation patching on IOI prompts or the user's own prompt pairs, and its report (`circuits.sections`).

    report = ioi_patching(model, component="z")               # or pairs_patching(model, "pairs.csv")
    write_patch_report(report, "markdown", None, console)   # or "table", "csv", "json", "html"

The metric is normalised: 0 = the corrupted run's mean, 1 = the clean run's mean (per prompt pair,
logit(correct) - logit(incorrect) at the prompt's last token; IOI: logit(IO) - logit(S) at END).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from rich.console import Console

from circuits.edge_circuits.tasks import pair_edge_task
from circuits.output import safe_csv
from circuits.path.task import pair_task
from circuits.sections import Report, Section, Table, ci_text, write_sections
from interp import HookedTransformer, metrics
from interp.interventions.engine import RunOptions
from interp.interventions.patching import HEAD_COMPONENTS, activation_patching
from interp.interventions.results import PatchResult
from interp.tasks.ioi import ioi_dataset_for
from interp.types import Progress

FORMATS = ("table", "csv", "json", "markdown", "html")
METRIC = "normalised logit difference (0 = corrupted, 1 = clean)"


@dataclass(kw_only=True)
class PatchReport:
    """What `interp patch` found: `result` of patching `component` on `task`, `top` rows shown."""

    model: str
    task: str
    component: str
    direction: str
    result: PatchResult
    top: int = 10
    group: int = 1  # k or v of a grouped-query model: the query heads each key/value head serves

    @property
    def unpatched(self) -> int:
        """The normalised metric of the unpatched run the patches are read against (0 denoising the
        corrupted run, 1 noising the clean one)."""
        return 0 if self.direction == "denoise" else 1

    def ranked(self) -> pd.DataFrame:
        """Summary rows (mean and 95 % bootstrap CI per patch), the strongest effect first: what
        `--format json` and csv hold (a grouped-query model's k or v: a "kv_head" column)."""
        rows = self.result.summary().sort_values("mean", ascending=self.direction == "noise")
        return rows.rename(columns={"head": "kv_head"}) if self.group > 1 else rows

    def head_label(self, row: Any) -> str:
        """A `ranked` row's head: a query head "H3", or a key/value head "KV1 (query heads 3-5)"."""
        head = getattr(row, "kv_head", getattr(row, "head", None))
        if head is None or self.group == 1:
            return "" if head is None else f"H{head}"
        first = int(head) * self.group
        return f"KV{head} (query heads {first}-{first + self.group - 1})"

    json_data = ranked


def ioi_patching(
    model: HookedTransformer, component: str = "z", direction: str = "denoise", n_prompts: int = 8,
    seed: int = 0, top: int = 10, progress: Progress | None = None,
) -> PatchReport:  # fmt: skip
    """Patch `component` on IOI prompts against ABC prompts (three other names)."""
    clean, corrupted, _ = ioi_dataset_for(model, n_prompts, seed)
    end = clean.positions["END"]

    def logit_diff(logits):
        return metrics.logit_diff(logits, clean.io_token, clean.s_token, pos=end)

    pair = (clean.tokens, corrupted.tokens, logit_diff)
    return _patching(
        model, f"ioi ({n_prompts} prompts)", pair, end, clean.positions, component, direction, top, progress
    )


def pairs_patching(
    model: HookedTransformer, path: str | Path, component: str = "z", direction: str = "denoise",
    top: int = 10, progress: Progress | None = None,
) -> PatchReport:  # fmt: skip
    """Patch `component` on the prompt pairs of a CSV/JSONL file (the format `interp circuit --task`
    reads), whose clean and corrupted prompts have the same number of tokens: a head's output at every
    position at once, a residual or layer output at each named position (the file's `pos:` columns,
    else where the prompts differ, `PairTask.with_changed_positions`) and at the last token ("END")."""
    pairs = pair_task(model, path)
    task = pair_edge_task(pairs)
    end = task.metric.pos
    if not (task.corrupted_metric.pos == end).all():
        pair = int((task.corrupted_metric.pos != end).nonzero()[0, 0]) + 1
        raise ValueError(
            f"{path}: pair {pair}'s clean and corrupted prompts have different numbers of tokens; "
            "activation patching aligns positions, so give pairs of equal token length "
            "(interp circuit --task accepts unequal ones)."
        )
    task_name = f"{task.name} ({task.n_prompts} pairs)"
    named = (pairs if pairs.positions else pairs.with_changed_positions()).positions
    positions = dict(named) | ({} if "END" in named else {"END": end})
    return _patching(model, task_name, task.pair, end, positions, component, direction, top, progress)


def _patching(model, task, pair, end, positions, component, direction, top, progress) -> PatchReport:
    """Patch `component` of the pair's (clean, corrupted) prompts, its metric normalised by the two
    runs' means, at `positions` (name -> [batch] positions; a head's output is patched at every position
    at once); progress(stage, done, total): the patched runs done (`RunOptions`)."""
    clean, corrupted, metric = pair
    positions = None if component in HEAD_COMPONENTS else positions
    with torch.no_grad():  # the baselines are constants of the metric
        metric = metrics.normalized(metric, model(clean), model(corrupted))
    result = activation_patching(
        model, clean, corrupted, metric, component, positions, direction=direction,
        options=RunOptions(logit_pos=end, progress=progress),
    )  # fmt: skip
    cfg = model.cfg
    grouped = component in ("k", "v") and not cfg.ungroup_grouped_query_attention
    return PatchReport(model=cfg.model_name, task=task, component=component, direction=direction,
                       result=replace(result, metric_name=METRIC), top=top,
                       group=cfg.n_heads // cfg.n_kv_heads if grouped else 1)  # fmt: skip


def patch_headline(report: PatchReport) -> str:
    """The finding in one sentence: the strongest patch, and how many patches move the metric beyond
    its unpatched value (0 when denoising the corrupted run, 1 when noising the clean run), on the
    prompts that rank them (nothing is held out: the strongest is the largest of many, its CI not
    corrected for that choice)."""
    ranked = report.ranked()
    best = next(ranked.itertuples())
    site = f"L{best.layer}" + report.head_label(best)
    site += "" if str(best.position) == "all" else f" at {best.position}"
    unpatched = report.unpatched
    beyond = int(((ranked["ci_low"] > unpatched) | (ranked["ci_high"] < unpatched)).sum())
    moved = (
        f"{beyond} of {len(ranked)} patches move it beyond {unpatched} (95% CI)"
        if report.result.values.shape[-1] > 1
        else "one prompt pair gives no CI, so no patch is shown to move it (give two or more)"
    )
    ci = ci_text((best.ci_low, best.ci_high), 3, sign=False, apart_from=unpatched)
    return (
        f"{report.model}, patching {report.component} ({report.direction}): strongest {site}, "
        f"{best.mean:.3f} {ci} on the normalised logit difference; {moved}. The same prompts rank and "
        "measure every patch (an exploratory scan, nothing held out): confirm a site on other prompts."
    )


def patch_sections(report: PatchReport) -> Report:
    """The report: the finding, then the top `report.top` patches, the strongest first."""
    columns = ["layer", "head" if report.group == 1 else "key/value head", "position", "mean", "95% CI"]
    rows = [
        [str(row.layer), report.head_label(row), str(row.position), f"{row.mean:.3f}",
         ci_text((row.ci_low, row.ci_high), 3, sign=False, apart_from=report.unpatched)]
        for row in report.ranked().head(report.top).itertuples()
    ]  # fmt: skip
    order = "highest" if report.direction == "denoise" else "lowest"
    what = (
        f"{report.model}, {report.task}: patching {report.component} ({report.direction}); {METRIC}, "
        f"mean and 95% bootstrap CI over prompts, the {order} mean first"
    )
    table = Table(columns=columns, rows=rows, right=columns)
    strongest = Section(title=f"The {len(rows)} strongest patches", lines=[what], table=table)
    title = f"Activation patching of {report.model}"
    return Report(title=title, headline=[patch_headline(report)], sections=[strongest])


def write_patch_report(report: PatchReport, format: str, out: str | Path | None, console: Console) -> None:
    """Render `report` in `format` to the file `out`, or to the console when out is None: csv and json
    hold every patch, the other formats the top rows."""
    data = {"csv": lambda: safe_csv(report.ranked())}
    write_sections(patch_sections(report), format, out, console, report, data, width=200)
