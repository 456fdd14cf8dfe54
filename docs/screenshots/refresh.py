"""The README's screenshots: the first screen (1400x900) of each HTML report, on the shipped toy models
and on the offline SmolLM2-135M.

    python docs/screenshots/refresh.py [toy|smollm2 ...] [--kinds heads ioi circuit] [--work DIR]

Each analysis runs once, with `--save` (skipped when the work folder already holds its JSON);
`interp render --format html` writes the page and headless Chromium (tests/browser.py) takes the
screenshot, saved here as <kind>-<models>.png. The SmolLM2 runs take minutes each on a CPU.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from circuits.cli import app  # noqa: E402
from tests.browser import render_in_chromium  # noqa: E402

RUNS = {  # models -> kind -> the command's arguments
    "toy": {
        "heads": ["heads", "--model", "toy-induction"],
        "ioi": ["ioi", "--model", "toy-ioi"],
        "circuit": ["circuit", "--model", "toy-induction", "--task", "induction"],
    },
    "smollm2": {
        "heads": ["heads"],
        "ioi": ["ioi"],
        # A requested size, that of the smallest faithful learned circuit on unseen prompts
        # (docs/results/circuits.md); the search for it takes over 10 minutes here.
        "circuit": ["circuit", "--task", "ioi", "--edges", "1500"],
    },
}


def interp(*args: str) -> None:
    """Run the `interp` command in this process; a failure stops the script."""
    try:
        app(list(args), standalone_mode=False)
    except SystemExit as stop:
        if stop.code:
            raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(RUNS), help=f"any of {', '.join(RUNS)}")
    parser.add_argument("--kinds", nargs="+", choices=list(RUNS["toy"]), default=list(RUNS["toy"]))
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "screenshots")
    options = parser.parse_args()
    unknown = set(options.models) - set(RUNS)
    if unknown:
        parser.error(f"unknown models {', '.join(sorted(unknown))}; choose from {', '.join(RUNS)}")
    options.work.mkdir(parents=True, exist_ok=True)
    for models in options.models:
        for kind in options.kinds:
            command = RUNS[models][kind]
            saved, page = options.work / f"{kind}-{models}.json", options.work / f"{kind}-{models}.html"
            if not saved.is_file():
                interp(*command, "--format", "json", "--out", str(options.work / "output.json"),
                       "--save", str(saved))  # fmt: skip
            interp("render", str(saved), "--format", "html", "--out", str(page))
            shot = Path(__file__).parent / f"{kind}-{models}.png"
            shown = render_in_chromium(page, screenshot=shot, timeout_s=120)
            if shown.script_errors or shown.external_requests:
                raise SystemExit(f"{page}: {shown.script_errors or shown.external_requests}")
            print(f"{shot.relative_to(ROOT)} ({shown.page_width} px wide)")


if __name__ == "__main__":
    main()
