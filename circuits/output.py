"""Writing a rendered report: to the terminal, or atomically to a file (every report command)."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

from interp.io.files import write_text_atomic


def write_output(
    format: str,
    formats: Sequence[str],
    out: str | Path | None,
    console: Console,
    table: Callable[[Console], None],
    text: Callable[[str], str],
    width: int = 200,
) -> None:
    """Print a report, or write it to `out` atomically: `table(console)` draws the "table" format,
    `text(format)` renders the others. HTML needs `out`."""
    if format not in formats:
        raise ValueError(f"Unknown format {format!r}; choose one of {', '.join(formats)}.")
    if format == "html" and out is None:
        raise ValueError("--format html needs --out FILE.html.")
    if format == "table" and out is None:
        table(console)
    elif format == "table":
        buffer = Console(file=io.StringIO(), width=width)
        table(buffer)
        write_text_atomic(out, buffer.file.getvalue())
    elif out is None:
        console.print(text(format), markup=False, highlight=False, emoji=False, soft_wrap=True)
    else:
        write_text_atomic(out, text(format))
