"""The induction heads `interp heads` confirms, kept per model in interp's cache directory (under the
weights' fingerprint and the settings) for the analyses that test induction heads (ICL, retrieval):
`confirmed_induction_heads(model)` finds or reads them, `remember_induction_heads` keeps a report's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import circuits
import interp
from circuits.finding import Finding
from circuits.heads.pipeline import confirmed_induction
from circuits.stages import StageResults
from interp.checks import check_heads
from interp.io.files import write_text_atomic
from interp.io.source_code import source_key
from interp.io.sources import cache_dir
from interp.model import weights_fingerprint
from interp.types import Head, Progress, substages

INDUCTION_HEADS_STAGE = "Induction heads (interp heads)"  # the stage confirmed_induction_heads reports


def induction_heads_cache(model: interp.HookedTransformer, n_samples: int = 16, seed: int = 0) -> Path:
    """Where the induction heads of `head_report(model, n_samples, seed)` are kept, named by the weights'
    fingerprint, the settings and the source of interp and circuits (another version's are not reused)."""
    code = source_key(interp, circuits)
    name = f"{weights_fingerprint(model)}-n{n_samples}-s{seed}-code-{code}.json"
    return cache_dir() / "induction-heads" / name


def remember_induction_heads(
    model: interp.HookedTransformer, report: Finding, n_samples: int = 16, seed: int = 0
) -> Path:
    """Keep the induction heads of `report` (`head_report(model, n_samples, seed)`, other settings at
    their defaults) where `confirmed_induction_heads` finds them; returns the path."""
    return _keep_induction_heads(model, report.extras.heads_of_type("induction"), n_samples, seed)


def _keep_induction_heads(
    model: interp.HookedTransformer, heads: list[Head], n_samples: int, seed: int
) -> Path:
    path = induction_heads_cache(model, n_samples, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"model": model.cfg.model_name, "heads": heads}))
    return path


def confirmed_induction_heads(
    model: interp.HookedTransformer,
    n_samples: int = 16,
    seed: int = 0,
    cache: bool = True,
    progress: Progress | None = None,
) -> list[Head]:
    """The induction heads `interp heads` confirms (strongest first), by `confirmed_induction`; with
    `cache`, kept at `induction_heads_cache` and read back from there. progress: its stages as parts of
    INDUCTION_HEADS_STAGE."""
    path = induction_heads_cache(model, n_samples, seed)
    if cache and path.is_file():
        if progress is not None:
            progress(f"{INDUCTION_HEADS_STAGE}: reusing the head report cached at {path}", 0, 0)
        return [tuple(head) for head in json.loads(path.read_text())["heads"]]
    heads = confirmed_induction(
        model, n_samples=n_samples, seed=seed, progress=substages(progress, INDUCTION_HEADS_STAGE)
    )
    if cache:
        _keep_induction_heads(model, heads, n_samples, seed)
    return heads


def induction_heads_or_confirmed(
    model: interp.HookedTransformer,
    induction_heads: Sequence[Head] | None,
    stages: StageResults,
    progress: Progress | None,
) -> tuple[list[Head], str]:
    """(the induction heads, how they were found): the given heads, else `confirmed_induction_heads`
    (kept in `stages` as `INDUCTION_HEADS_STAGE`)."""
    if induction_heads is not None:
        return check_heads(model.cfg, induction_heads), "given"
    found = stages.run(
        INDUCTION_HEADS_STAGE, lambda: confirmed_induction_heads(model, progress=progress), progress
    )
    return check_heads(model.cfg, [tuple(head) for head in found]), "confirmed by interp heads"
