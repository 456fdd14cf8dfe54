"""Prompt-pair files (CSV with a header, or JSONL), read and checked without a model (no torch), so a
command can refuse a file before a model loads (`interp circuit --task`, `interp patch --pairs`).

    rows = read_pairs("agreement.csv")        # [{"clean": ..., "corrupted": ..., ...}, ...]
    check_pairs(rows, "agreement.csv")        # every pair has what its metric reads

Every message names a pair by its place among the file's pairs, from 1 ("pair 1": the first row under
a CSV's header, the first object of a JSONL file).
"""

from __future__ import annotations

import csv
import json
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

METRICS = ("logit_diff", "prob")  # the metrics of a file's pairs: correct - incorrect, or p(correct)
TEXTS = ("clean", "corrupted", "correct", "incorrect")  # read as text: a value must be a string
LABELS = ("family", "stratum")  # labels: a string, or a number read as its text (a JSON family 0 is "0")
POSITION_PREFIX = "pos:"  # `pos:NAME` columns: text of the clean prompt whose last token is the position


def read_pairs(path: str | Path) -> list[dict[str, str]]:
    """Rows of a CSV (with a header) or JSONL prompt-pair file, each column read as text (`pair_rows`).
    Refused (ValueError): a CSV header naming a column twice, a CSV row of more cells than the header
    names, a JSON object naming a key twice, and values of the columns read that are not text."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No prompt-pair file at {path}.")
    if path.suffix == ".jsonl":
        rows = []
        # split at newlines only, not splitlines: JSON strings may hold U+2028
        lines = path.read_text(encoding="utf-8-sig").split("\n")
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line, object_pairs_hook=_json_object(path, number)))
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
                reader = csv.DictReader(file)
                _check_header(reader.fieldnames or [], path)
                rows = list(reader)
            except csv.Error as error:
                raise ValueError(f"{path} is not a readable CSV ({error}).") from error
        for number, row in enumerate(rows, 1):
            if None in row:  # csv's key of the cells beyond the header's columns
                columns = [key for key in row if key is not None]
                raise ValueError(
                    f"{path}: pair {number} has {len(columns) + len(row[None])} cells, more than the "
                    f"{len(columns)} columns of the header ({', '.join(columns)}); quote a cell that holds "
                    "a comma, or name the extra column in the header"
                )
    else:
        raise ValueError(f"{path} must be a .csv (with a header) or .jsonl file of prompt pairs.")
    if not rows:
        raise ValueError(f"{path} has no prompt pairs.")
    _check_near_names([key for row in rows for key in row], path)
    return pair_rows(rows, path)


def _check_near_names(keys: Sequence[Any], path: Path) -> None:
    """Refuse a column that is a read column's name but for case or surrounding spaces (" family",
    "Family", "Corrupted", "POS:subject"): it would be ignored, a family column silently so."""
    for key in dict.fromkeys(keys):
        if not isinstance(key, str) or is_read(key):
            continue
        bare = key.strip().casefold()
        if is_read(bare):
            named = key.strip()[len(POSITION_PREFIX) :]
            meant = POSITION_PREFIX + named if bare.startswith(POSITION_PREFIX) else bare
            raise ValueError(
                f"{path}: the column {key!r} is not read (column names are exact, lower case, no spaces "
                f"around them); rename it {meant!r}"
            )


def _check_header(names: Sequence[str], path: Path) -> None:
    """Refuse a CSV header that names a column twice (csv keeps the last cell of the two)."""
    for index, column in enumerate(names):
        if column in names[:index]:
            raise ValueError(
                f"{path}: the header names the column {column!r} twice (columns {names.index(column) + 1} "
                f"and {index + 1}), and only the last would be read; remove or rename one"
            )


def _json_object(path: Path, number: int) -> Any:
    """json's object hook for line `number`: refuse an object naming a key twice (json keeps the last)."""

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        twice = next((key for index, key in enumerate(keys) if key in keys[:index]), None)
        if twice is not None:
            raise ValueError(
                f"{path}:{number} names the key {twice!r} twice, and only the last would be read; remove "
                "or rename one"
            )
        return dict(pairs)

    return hook


def is_read(key: Any) -> bool:
    """Whether a column is read: the answers and prompts, the labels, and named positions."""
    return isinstance(key, str) and (key in TEXTS or key in LABELS or key.startswith(POSITION_PREFIX))


def pair_rows(rows: Sequence[Mapping[str, Any]], name: str | Path) -> list[dict[str, str]]:
    """Copies of `rows` whose read columns (`is_read`) are text: a missing value (None, JSON null, a
    CSV row's missing cell) is "", a label (`LABELS`) its text without surrounding spaces (a number its
    text, a whole number's without a decimal point: 1 and 1.0 are one family); any other value that
    is not a string is refused (ValueError), naming the pair and the column. Other columns are kept as
    they are."""
    return [
        {key: _text(value, key, number, name) if is_read(key) else value for key, value in row.items()}
        for number, row in enumerate(rows, 1)
    ]


def _text(value: Any, key: str, number: int, name: str | Path) -> str:
    if value is None or isinstance(value, str):  # a label's surrounding spaces name no other family
        return (value or "").strip() if key in LABELS else value or ""
    if key in LABELS and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return str(int(value)) if float(value).is_integer() else str(value)  # 1 and 1.0: one family
    kind = {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "an object"}
    what = kind.get(type(value), f"a {type(value).__name__}")
    fix = "one string" + (" (one token: mind the leading space)" if key in ("correct", "incorrect") else "")
    if key in LABELS:
        fix = "a string or a number"
    raise ValueError(f"{name}: pair {number}'s {key} is {what} ({value!r}), not text; write it as {fix}")


def position_spec(spec: str, where: str) -> tuple[str, int]:
    """(text, k) of a `pos:NAME` value: `text` (its first occurrence) or `text#k` (its k-th). where: the
    pair and column, "agreement.csv: pair 2's pos:subject" (never "pos:NAME:", which a terminal may show
    as an emoji)."""
    needle, _, k = spec.rpartition("#") if "#" in spec else (spec, "", "1")
    if not needle.strip() or not (k.isascii() and k.isdigit()) or int(k) < 1:
        raise ValueError(
            f"{where} is {spec!r}, not a position; write the text, or text#k for its k-th occurrence"
        )
    return needle, int(k)


def occurrences(text: str, needle: str) -> list[int]:
    """Where `needle` starts in `text`, every occurrence (overlapping ones too)."""
    starts, start = [], text.find(needle)
    while start >= 0:
        starts.append(start)
        start = text.find(needle, start + 1)
    return starts


def check_pairs(
    rows: Sequence[Mapping[str, Any]], name: str | Path, metric: str = "logit_diff", offers_prob: bool = True
) -> None:
    """Refuse (ValueError) pairs that lack what `metric` reads (clean, corrupted, correct and, for
    logit_diff, incorrect), pairs whose corrupted prompt is their clean one (patching or ablating from
    it changes nothing), pairs whose correct answer is their incorrect one (the logit difference is 0),
    a pair that repeats another, a family column that some pairs leave empty, and `pos:NAME` columns
    that some pairs leave empty, that are no position, or whose text is not in the clean prompt as often
    as they say (whether it covers whole tokens needs the tokenizer: `circuits.path.task.pair_task`).
    offers_prob: whether the command offers --metric prob, which the errors then suggest."""
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r} is not one of {METRICS}.")
    rows = pair_rows(rows, name)
    needed = ["clean", "corrupted", "correct"] + (["incorrect"] if metric == "logit_diff" else [])
    for number, row in enumerate(rows, 1):
        missing = [key for key in needed if not row.get(key)]
        if missing:
            raise ValueError(
                f"{name}: pair {number} lacks {', '.join(missing)}; every pair needs {', '.join(needed)}"
                + (" (for a probability metric without an incorrect answer use --metric prob)." if offers_prob
                   else ".")
            )  # fmt: skip
    same = [number for number, row in enumerate(rows, 1) if row["clean"] == row["corrupted"]]
    if same:
        raise ValueError(
            f"{name}: {len(same)} pairs have the same clean and corrupted prompt (the first: pair "
            f"{same[0]}); patching or ablating from a corrupted prompt that is the clean one changes "
            "nothing, so every effect on them would be 0: give each pair a corrupted prompt that differs, "
            "or drop them"
        )
    if metric == "logit_diff":
        same = [number for number, row in enumerate(rows, 1) if row["correct"] == row["incorrect"]]
        if same:
            answer = rows[same[0] - 1]["correct"]
            raise ValueError(
                f"{name}: {len(same)} pairs have the same correct and incorrect answer (the first: pair "
                f"{same[0]}, {answer!r}); the logit difference of an answer with itself is 0 on every "
                "prompt, so no effect on them could be measured: give each pair an incorrect answer that "
                "differs" + (", or use --metric prob" if offers_prob else "")
            )
    _check_positions(rows, name)
    _check_repeats(rows, name, needed)
    for column, role in (("family", "the unit held out"), ("stratum", "the groups a verdict is read by")):
        if any(column in row for row in rows):  # an optional column: all or nothing
            values = [row.get(column) or "" for row in rows]
            if not all(values):
                raise ValueError(
                    f"{name}: {values.count('')} pairs lack a {column} ({role}; the first: pair "
                    f"{values.index('') + 1}); give every pair one, or none"
                )


def position_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The `pos:NAME` columns of any row, sorted."""
    return sorted({key for row in rows for key in row if is_read(key) and key.startswith(POSITION_PREFIX)})


def _check_positions(rows: list[dict[str, str]], name: str | Path) -> None:
    """Every pair has each `pos:NAME` column, a position (`text` or `text#k`) whose text occurs at least
    k times in its clean prompt."""
    columns = position_columns(rows)
    unnamed = [column for column in columns if not column[len(POSITION_PREFIX) :].strip()]
    if unnamed:
        raise ValueError(
            f"{name}: the column {unnamed[0]!r} names no position; write pos:NAME, e.g. pos:subject"
        )
    reserved = [column for column in columns if column[len(POSITION_PREFIX) :].strip() == "all"]
    if reserved:  # activation patching labels the patch of every position at once "all"
        raise ValueError(
            f"{name}: the column {reserved[0]!r} names a position 'all', which means every position at once "
            "in a patching table; rename it, e.g. pos:target"
        )
    for number, row in enumerate(rows, 1):
        missing = [column for column in columns if not row.get(column)]
        if missing:
            raise ValueError(
                f"{name}: pair {number} lacks {', '.join(missing)}; every pair needs each column"
            )
        for column in columns:
            where = f"{name}: pair {number}'s {column}"
            needle, k = position_spec(row[column], where)
            found = len(occurrences(row["clean"], needle))
            if found < k:
                raise ValueError(
                    f"{where} is {row[column]!r}, but {needle!r} does not occur {k} time(s) in the clean "
                    f"prompt {row['clean']!r} (it occurs {found}); write text of the clean prompt"
                )


def _check_repeats(rows: list[dict[str, str]], name: str | Path, needed: list[str]) -> None:
    """Refuse a pair that repeats an earlier one, the same prompts and answers (those the metric reads;
    its positions only name where to look), and a clean prompt with its answers in two families (without
    a family column, each pair is its own). A repeat counts one measurement twice (in every mean, CI and
    count of prompts); split by families, a clean prompt could be held out while its copy chooses."""
    first: dict[tuple[str, ...], int] = {}
    repeats = []
    for number, row in enumerate(rows, 1):
        key = tuple(row[column] for column in needed)
        if key in first:
            repeats.append((first[key], number))
        else:
            first[key] = number
    if repeats:
        earlier, later = repeats[0]
        raise ValueError(
            f"{name}: {len(repeats)} pairs repeat an earlier pair (the first: pair {later} repeats pair "
            f"{earlier}, the same {', '.join(needed)}); a repeat counts one pair twice, and split by "
            "families it can be held out while its copy chooses: remove the repeats"
        )
    answers = [column for column in needed if column != "corrupted"]
    family_of: dict[tuple[str, ...], tuple[int, str]] = {}
    for number, row in enumerate(rows, 1):
        family = row.get("family") or f"pair {number}"
        earlier, earlier_family = family_of.setdefault(tuple(row[c] for c in answers), (number, family))
        if earlier_family != family:
            where = f"families {earlier_family!r} and {family!r}" if "family" in row else "no family column"
            raise ValueError(
                f"{name}: pairs {earlier} and {number} have the same {', '.join(answers)} ({where}), so "
                "one could be held out while the other chooses: give pairs of one clean prompt one "
                "family (a family column), or keep one of them"
            )


def check_families(families: Sequence[str], name: str | Path) -> None:
    """Refuse the families of a family column (one per pair) that are fewer than two: holding out whole
    families needs two or more (`interp circuit` splits them; `interp patch` reads no family)."""
    distinct = list(dict.fromkeys(families))
    if len(families) and len(distinct) < 2:
        raise ValueError(
            f"{name}: its family column gives all {len(families)} pairs one family ({distinct[0]!r}), and "
            "holding out whole families needs two or more: give the pairs two or more families (a "
            "template, relation or document each), or drop the family column to hold out prompts"
        )
