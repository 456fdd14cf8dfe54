"""Checks of a report's format and output paths, run before any model loads (`check_format`,
`check_writable`); CSV safe for spreadsheets (`safe_csv`); a report's figure written to an image file
(`save_figure`; `pyplot`: matplotlib without a display)."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from interp.io.files import atomic_path

if TYPE_CHECKING:
    import pandas as pd

FORMULA_STARTS = ("=", "+", "-", "@")


def check_writable(path: str | Path, option: str = "--out", directory: bool = False) -> None:
    """Refuse, before any work, an output that cannot be written: a file path that is a directory
    (a directory's path that is a file), or one whose nearest existing directory (missing ones are
    created) takes no new file."""
    path = Path(path).expanduser().absolute()
    if directory and path.is_file():
        raise ValueError(f"{option} {path} is a file; pass a directory")
    if not directory and path.is_dir():
        raise ValueError(f"{option} {path} is a directory; pass a file path such as {path / 'report.html'}")
    parent = path if directory and path.is_dir() else next(p for p in path.parents if p.exists())
    if not parent.is_dir():
        raise ValueError(f"{option} {path}: {parent} is a file, not a directory; pass a path in a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=parent):
            pass
    except OSError as error:
        raise ValueError(
            f"{option} {path} cannot be written: {parent} takes no new file ({error.strerror}); pass a path "
            "in a writable directory"
        ) from error


def check_format(format: str, formats: Sequence[str], out: str | Path | None) -> None:
    """Refuse a format not in `formats`, or HTML without a file to write it to (`out`)."""
    if format not in formats:
        raise ValueError(f"unknown format {format!r}; choose one of {', '.join(formats)}.")
    if format == "html" and out is None:
        raise ValueError("--format html needs --out FILE.html.")


def safe_csv(frame: pd.DataFrame) -> str:
    """`frame` as CSV, each text cell that begins with =, +, - or @ quoted with a leading ' (a
    spreadsheet would run it as a formula: a token string such as "=1+1" or "@SUM(A1)")."""

    def quote(cell):
        return "'" + cell if isinstance(cell, str) and cell.startswith(FORMULA_STARTS) else cell

    return frame.map(quote).to_csv(index=False)


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (figures are written, never shown), or an
    ImportError saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError("Plotting needs matplotlib: pip install matplotlib") from error
    return plt


def save_figure(figure, out: str | Path | None):
    """Write a matplotlib figure to `out` (.png, .svg, .pdf) atomically, if given; returns it."""
    if out is not None:
        with atomic_path(out) as tmp:  # the format from out's suffix (the temporary name ends in .tmp)
            figure.savefig(tmp, format=Path(out).suffix.removeprefix(".") or None)
    return figure
