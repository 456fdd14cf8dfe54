"""Prompt-pair files (CSV with a header, or JSONL), read and checked without a model (no torch): what
`interp circuit --task` and `interp patch --pairs` check before a model loads, and what
`circuits.path.task.pair_task` reads (the one task of a file).

    rows = read_pairs("agreement.csv")        # [{"clean": ..., "corrupted": ..., ...}, ...]
    check_pairs(rows, "agreement.csv")        # every pair has what its metric reads
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

METRICS = ("logit_diff", "prob")  # the metrics of a file's pairs: correct - incorrect, or p(correct)


def read_pairs(path: str | Path) -> list[dict[str, str]]:
    """Rows of a CSV (with a header) or JSONL prompt-pair file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No prompt-pair file at {path}.")
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number} is not JSON ({error.msg}).") from error
                if not isinstance(rows[-1], dict):
                    raise ValueError(
                        f"{path}:{number} is a JSON {type(rows[-1]).__name__}, not an object; write each "
                        'pair as {"clean": ..., "corrupted": ..., "correct": ..., "incorrect": ...}'
                    )
    elif path.suffix == ".csv":  # utf-8-sig: a byte-order mark (Excel's "CSV UTF-8") is not a name
        with path.open(newline="", encoding="utf-8-sig") as file:
            try:
                rows = list(csv.DictReader(file))
            except csv.Error as error:
                raise ValueError(f"{path} is not a readable CSV ({error}).") from error
    else:
        raise ValueError(f"{path} must be a .csv (with a header) or .jsonl file of prompt pairs.")
    if not rows:
        raise ValueError(f"{path} has no prompt pairs.")
    return rows


def check_pairs(rows: list[dict[str, str]], name: str | Path, metric: str = "logit_diff") -> None:
    """Refuse (ValueError) pairs that lack what `metric` reads (clean, corrupted, correct and, for
    logit_diff, incorrect), pairs whose corrupted prompt is their clean one (patching or ablating from
    it changes nothing), and a family column that some pairs leave empty."""
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r} is not one of {METRICS}.")
    needed = ["clean", "corrupted", "correct"] + (["incorrect"] if metric == "logit_diff" else [])
    for number, row in enumerate(rows, 1):
        missing = [key for key in needed if not row.get(key)]
        if missing:
            raise ValueError(
                f"{name}: pair {number} lacks {', '.join(missing)}; every pair needs {', '.join(needed)} "
                f"(for a probability metric without an incorrect answer use --metric prob)."
            )
    same = [number for number, row in enumerate(rows, 1) if row["clean"] == row["corrupted"]]
    if same:
        raise ValueError(
            f"{name}: {len(same)} pairs have the same clean and corrupted prompt (the first: pair "
            f"{same[0]}); patching or ablating from a corrupted prompt that is the clean one changes "
            "nothing, so every effect on them would be 0: give each pair a corrupted prompt that differs, "
            "or drop them"
        )
    if any("family" in row for row in rows):  # the optional family column: the unit held out
        families = [str(row.get("family") or "") for row in rows]
        if not all(families):
            raise ValueError(
                f"{name}: {families.count('')} pairs lack a family (the first: pair "
                f"{families.index('') + 1}); give every pair one, or none"
            )
