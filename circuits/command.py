"""The skeleton every analysis command of `interp` runs through, written once (`Command`).

    command = Command("hop", model, format, out, save, plot=plot)  # the model, files, format checked
    result = command.run(options, lambda loaded, progress, kept: hop_report(loaded, ...), HOP_STAGES)

Before any model loads: the model path, the input files (before torch is imported), the format and
every output path, the --quick preset (`quick`, `say`: its note on stderr) and --save (refused where it
holds another run). Then the model loads, the analysis runs with its announced stages (bars or log
lines; with --save, each kept stage written as it finishes and an earlier run's resumed), its errors
become one-line messages (exit status 2), the report is written in the chosen format with the --quick
note on its model line, and the files written are named. With `circuits.cli`, the only code that prints.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape

from interp.catalog import EXPECTED_TIMES, QUICK_PRESETS, expected_time_text

if TYPE_CHECKING:  # interp.types imports torch, which --help does not load
    from circuits.stages import StageResults
    from interp import HookedTransformer
    from interp.types import Progress

console = Console()
error_console = Console(stderr=True)
# The result kind (circuits.results_file.KINDS) of a command whose name is not its kind.
KIND_OF = {name: "finding" for name in ("hop", "retrieval", "ioi", "icl", "icl --fv", "heads")}
ERRORS = (ValueError, ImportError, FileNotFoundError)  # a run's errors said in one line (exit status 2)


# Each command's examples, the end of its --help (`help_epilog`), after its expected time.
COMMAND_EXAMPLES = {
    "info": ["--model toy-ioi"],
    "heads": ["--model smollm2-135m", "--model toy-induction --format html --out heads.html"],
    "train": [
        "--task induction --out runs/induction   # then: interp heads --model runs/induction",
        "--task ioi --seed 1 --out runs/ioi      # then: interp ioi --model runs/ioi",
        "--task hop --hops 2 --out runs/hop2   # 3 layers; then: interp hop --model runs/hop2",
    ],
    "ioi": ["--model smollm2-135m --format markdown --out ioi.md", "--model toy-ioi"],
    "patch": [
        "--component z --top 5",
        "--component resid_pre --format csv --out patch.csv",
        "--model smollm2-135m --pairs pairs.csv --save patch.json   # same-length clean/corrupted",
    ],
    "circuit": [
        "--model toy-ioi --task ioi --edges 30 --curve   # and the faithfulness curve, CPR and CMD",
        "--task ioi --method eap-ig --edges 300   # SmolLM2 in seconds: attribution, not a learned mask",
        "--model toy-induction --task induction --target 0.9   # the smallest circuit reaching 0.9",
        "--model smollm2-135m --task pairs.csv --fraction 0.05 --format html --out circuit.html",
    ],
    "icl": [
        "--format html --out icl.html   # SmolLM2 on 60 Brown corpus texts: 12 rank heads, 48 test",
        "--model toy-induction --induction-heads L1H0,L1H2",
        "--model runs/induction --plot icl.png   # a training run: the score across its checkpoints",
        "--fv --format html --out fv.html   # function-vector heads beside induction heads",
    ],
    "retrieval": [
        "--n-prompts 24 --save retrieval.json   # SmolLM2: facts in context, then a query",
        "--induction-heads none --format markdown --out retrieval.md",
    ],
    "hop": [
        "--model toy-hop --plot hop.png   # 3 layers trained on 2 hops, shipped",
        "--model runs/hop2 --save hop.json   # after: interp train --task hop --layers 3 --out runs/hop2",
    ],
    "render": [
        "heads.json --format html --out heads.html   # after: interp heads --save heads.json",
        "ioi.json --format markdown",
    ],
}


def help_epilog(command: str) -> str:
    """The end of `interp COMMAND --help`: its expected time (EXPECTED_TIMES) and its examples."""
    expected = expected_time_text(command) + "\n\n" if command in EXPECTED_TIMES else ""
    examples = "\n\n".join(f"  interp {command} {line}" for line in COMMAND_EXAMPLES[command])
    return expected + "Examples:\n\n" + examples


def fail(message: str) -> typer.Exit:
    """Print a one-line error on stderr (stdout holds the report); the caller raises the returned exit
    (status 2)."""
    error_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)  # escaped: [brackets]
    return typer.Exit(2)


@contextmanager
def refused(prefix: str = "", errors: tuple[type[Exception], ...] = (ValueError, OSError)) -> Iterator[None]:
    """An error of `errors` inside (a ValueError or an unreadable file), or running out of memory
    (torch's or Python's), becomes a one-line error (with `prefix`) and exit status 2; any other
    RuntimeError is raised as it is."""
    try:
        yield
    except errors as error:
        raise fail(f"{prefix}{error}") from error
    except (MemoryError, RuntimeError) as error:
        text = str(error).splitlines()[0] if str(error) else type(error).__name__
        memory = isinstance(error, MemoryError) or "can't allocate memory" in text or "out of memory" in text
        if not memory:
            raise
        raise fail(
            f"out of memory ({text[:160]}): the sizes asked for do not fit in this machine's memory; ask "
            "for fewer prompts, samples, sequences, resamples or steps, or a smaller --batch-size"
        ) from error


def refuse_bad_format(format: str, out: str | None, formats: Sequence[str]) -> None:
    """Exit with an error for an unknown report format, or HTML without --out, or an --out that
    cannot be written, before any model is loaded."""
    from circuits.output import check_format

    with refused():
        check_format(format, formats, out)
    refuse_unwritable(out, "--out")


def refuse_unwritable(path: str | None, option: str, directory: bool = False) -> None:
    """Exit with an error for an output path that cannot be written, before any model is loaded."""
    from circuits.output import check_writable

    if path is not None:
        with refused():
            check_writable(path, option, directory)


def refuse_shared_paths(read: dict[str, str | None], written: dict[str, str | None]) -> None:
    """Exit with an error where an option writes the file another option reads or writes (the report
    over the prompt-pair file, --save over the JSON report), before any model is loaded."""
    named: dict[Path, str] = {}
    for option, path in [*read.items(), *written.items()]:
        if path is None:
            continue
        other = named.setdefault(Path(path).resolve(), f"{option} {path}")
        if other != f"{option} {path}":
            raise fail(
                f"{option} {path} is the file of {other}, which it would replace; give each its own path."
            )


def given(context: Any, name: str) -> bool:
    """Whether the option `name` (its parameter's name) was given on the command line, by the command's
    typer.Context `context` (not left at its default)."""
    return getattr(context.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")


# interp circuit's options read by some methods only: option -> the methods that read it
METHOD_OPTIONS = {
    "checkpoint": ("prune", "ensemble"),  # the edge mask's
    "prune_steps": ("prune", "ensemble"),
    "steps": ("eap-ig", "eap-ig-activations", "eap-ig-activations-grouped", "ensemble"),  # EAP-IG's
    "ig_points": ("eap-ig", "ensemble"),
}


def check_method_options(context: Any, method: str, checkpoint: str | None, task_file: bool) -> None:
    """Before any model loads, exit with an error for an option `method` does not read
    (`METHOD_OPTIONS`), --target beside a size (--edges, --fraction), --n-prompts with a prompt-pair
    file, or a --checkpoint that cannot be written or is no checkpoint of this interp's."""
    for name, methods in METHOD_OPTIONS.items():
        if given(context, name) and method not in methods:
            option = "--" + name.replace("_", "-")
            raise fail(f"{option} is read by --method {' or '.join(methods)}, not by {method}: leave it out.")
    if given(context, "target") and (given(context, "edges") or given(context, "fraction")):
        raise fail(
            "--target is the faithfulness the searched circuit must reach; --edges and --fraction give its "
            "size instead: pass one of them or --target, not both."
        )
    if task_file and given(context, "n_prompts"):
        raise fail(
            "--n-prompts chooses IOI or induction prompts; a prompt-pair file's pairs are the prompts "
            "(--heldout-families chooses which test the circuit): leave it out."
        )
    if checkpoint is None:
        return
    refuse_unwritable(checkpoint, "--checkpoint")
    if Path(checkpoint).is_file():
        from interp.edges.pruning import read_mask_checkpoint

        with refused("--checkpoint: "):
            read_mask_checkpoint(checkpoint)


def check_table_only(format: str, **flags: bool) -> None:
    """Exit with an error for terminal-table options (`--wide`, `--all`) given with another format,
    where they would change nothing."""
    given_flags = [f"--{name}" for name, value in flags.items() if value]
    if given_flags and format != "table":
        raise fail(
            f"{' and '.join(given_flags)} shape the terminal table; --format {format} holds every column and "
            "head already: leave them out."
        )


ICL_MODE_OPTIONS = {  # the options of one mode of `interp icl`: False, the ICL score; True, --fv
    False: ("early", "late", "window", "plot", "ablation", "n_discovery", "n_ablated", "top"),
    True: ("tasks", "heldout_tasks", "heldout_templates", "n_prompts", "n_shots", "fv_heads", "candidates"),
}


def check_icl_mode_options(context: Any, fv: bool) -> None:
    """Exit with an error for an option of `interp icl` that the other mode reads (`ICL_MODE_OPTIONS`),
    before any model is loaded."""
    other = [name for name in ICL_MODE_OPTIONS[not fv] if given(context, name)]
    if other:
        options = ", ".join("--" + name.replace("_", "-") for name in other)
        mode = (
            "the ICL score (interp icl without --fv); leave them out of --fv"
            if fv
            else "the function-vector analysis (interp icl --fv); add --fv, or leave them out"
        )
        raise fail(f"{options}: options of {mode}.")


def check_plot(plot: str | None) -> None:
    """Refuse a --plot path that is not a figure file (.png, .svg, .pdf), before any model is loaded."""
    if plot is not None and Path(plot).suffix not in (".png", ".svg", ".pdf"):
        raise fail(f"--plot {plot} must end in .png, .svg or .pdf.")
    refuse_unwritable(plot, "--plot")


def check_model(model: str) -> None:
    """Refuse a --model that names local files which are not a model (`interp.io.model_paths`: a
    missing directory or .gguf file), and an INTERP_CACHE that is a file or a directory that cannot be
    made (where models and results are cached), before anything is imported or loaded."""
    from interp.io.model_paths import check_local_source

    with refused():
        check_local_source(model)
    cache = os.environ.get("INTERP_CACHE")
    if cache is not None and not Path(cache).expanduser().is_dir():  # (a read-only one may hold the models)
        refuse_unwritable(cache, "INTERP_CACHE", directory=True)


def check_pairs_file(
    option: str, path: str, metric: str = "logit_diff", ioi_only: Sequence[str] = ()
) -> None:
    """Refuse the prompt-pair file of `option` (--task, --pairs) when it is missing, unreadable or its
    pairs lack what `metric` reads (`interp.tasks.pairs`), or beside the given options `ioi_only`
    (parameter names) that choose IOI prompts, before anything is imported or loaded."""
    from interp.tasks.pairs import check_pairs, read_pairs

    if ioi_only:
        names = " and ".join("--" + name.replace("_", "-") for name in ioi_only)
        raise fail(f"{names} choose IOI prompts, which {option} {path} replaces: drop {names}, or {option}.")

    with refused(f"{option}: "):
        check_pairs(read_pairs(path), path, metric, offers_prob=option == "--task")  # circuit's --metric


def check_heads_file(induction_heads: str | None) -> None:
    """Refuse --induction-heads naming a result file that is not there, before anything is imported."""
    if (induction_heads or "").endswith(".json") and not Path(induction_heads).is_file():
        raise fail(
            f"--induction-heads {induction_heads}: no such file; write one with: interp heads --save "
            f"{induction_heads}"
        )


def heads_option(text: str | None) -> tuple[list[tuple[int, int]] | None, str | None]:
    """--induction-heads: "L17H3,L19H0", "none", or a saved head report (its confirmed induction
    heads); None when not given (the heads `interp heads` confirms). With the weights' fingerprint a
    report saved by `interp heads --save` records (else None), which `Command.run` checks."""
    import re

    if text is None:
        return None, None
    if text.strip().lower() == "none":
        return [], None
    if text.endswith(".json"):
        from circuits.finding import Finding
        from circuits.results_file import PartialResult, load_result

        with refused():
            report = load_result(text)
        if isinstance(report, PartialResult) and report.command == "heads":  # resumed by its own options
            made = {name: report.settings.get(name) for name in ("model", "n_samples", "seed", "dtype")}
            options = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in made.items() if value)
            raise fail(
                f"{text} holds an unfinished head report; finish it: interp heads {options} --save {text}"
            )
        if not isinstance(report, Finding) or report.analysis != "heads":
            raise fail(f"{text} holds no head report; write one with: interp heads --save {text}")
        import json

        weights = json.loads(Path(text).read_text()).get("settings", {}).get("weights")
        return report.extras.heads_of_type("induction"), weights
    labels = [label.strip() for label in text.split(",") if label.strip()]
    parsed = [re.fullmatch(r"L(\d+)H(\d+)", label, flags=re.IGNORECASE) for label in labels]
    if not labels or not all(parsed):
        raise fail(f'--induction-heads {text!r}: give heads as "L17H3,L19H0", a heads.json, or "none".')
    return [(int(match[1]), int(match[2])) for match in parsed], None


def induction_class(heads: list | None) -> list | str:
    """The induction heads in a --save file's options: those given, else the rule by which `interp
    heads` confirms them (so a file whose heads were confirmed under another rule is refused)."""
    from circuits.heads.probes import HELD_OUT_RULE

    return heads if heads is not None else f"confirmed by interp heads: {HELD_OUT_RULE}"


def file_digest(path: str) -> str | None:
    """A short hash of the file at `path` (None if there is none): a --save file's key for an input
    file, whose contents the result depends on."""
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16] if Path(path).is_file() else None


def load(model: str, dtype: str = "float32") -> HookedTransformer:
    """Load a model for a command (in `dtype`, a name from DTYPES), turning loading errors into a
    one-line message."""
    import torch

    import interp

    with refused(errors=(ValueError, FileNotFoundError, NotImplementedError)):
        if not console.is_terminal:  # a log: a line, where a terminal shows a spinner
            print(f"Loading {model} ...", file=sys.stderr, flush=True)
        with console.status(f"Loading {model} ..."):
            return interp.load_model(model, dtype=getattr(torch, dtype))


def stage_bars(
    command: str,
    stages: Sequence[str],
    between: Sequence[str] = (),
    kept=None,
    save: str | None = None,
    model: str | None = None,
    quick: bool = False,
) -> AbstractContextManager[Progress]:
    """The Progress callback of `interp COMMAND` (a context to enter), on stderr: its `stages` announced
    with the measured time on `model` (None: every measured time; `quick`: the preset's), then bars on a
    terminal, else lines with a heartbeat. `kept`: --save's StageResults, saved to `save`; `between`:
    work outside them."""
    from circuits.progress_printer import progress_printer

    expected = expected_time_text(command, model)
    if quick:
        time = QUICK_PRESETS[command].time
        expected = f"Expected time: {time.text()}." if model in (None, time.model) else None
    terminal = Console(stderr=True).is_terminal
    saved_to = None if kept is None else save
    return progress_printer(command, stages, terminal, expected, between, kept, saved_to)


class Command:
    """One run of `interp NAME`. On construction, before any model loads: `model`'s path, the `files`
    checks (run before torch is imported), `format`, `out`, --save and the other `outputs` (none the
    file of another option or among the `inputs`)."""

    def __init__(
        self,
        name: str,
        model: str,
        format: str,
        out: str | None,
        save: str | None = None,
        *,
        files: Sequence[Callable[[], None]] = (),
        inputs: dict[str, str | None] | None = None,
        plot: str | None = None,
        outputs: dict[str, str | None] | None = None,
    ) -> None:
        self.name, self.model, self.format, self.out, self.save = name, model, format, out, save
        self.outputs = {"--plot": plot, **(outputs or {})}  # the files the analysis writes
        self.note: str | None = None  # the --quick note, which the report's model line carries
        self.quick_run = False  # --quick: the plan quotes its preset's time
        self.heads_file: tuple[str, str] | None = None  # --induction-heads' report and its weights
        check_model(model)
        for check in files:
            check()
        from circuits.results_file import COMMAND_FORMATS, KINDS

        self.kind = KINDS[KIND_OF.get(name, name)]
        refuse_bad_format(format, out, COMMAND_FORMATS.get(name, self.kind[1]))
        check_plot(plot)
        for option, path in (outputs or {}).items():
            refuse_unwritable(path, option)
        if save is not None and Path(save).suffix != ".json":
            raise fail(f"--save {save} must end in .json (the full result is JSON).")
        refuse_unwritable(save, "--save")
        refuse_shared_paths(inputs or {}, {"--out": out, "--save": save, **self.outputs})

    def quick(
        self, quick: bool, context: Any, note: Callable[[dict], str] | None = None, **values: Any
    ) -> tuple:
        """`values` with the --quick preset (`interp.catalog.QUICK_PRESETS`) applied to the options not
        given in `context`, and {name: (with --quick, without)} for its note (None without --quick)."""
        if not quick:
            return (*values.values(), None)
        preset, self.quick_run = QUICK_PRESETS[self.name], True

        def with_quick(name: str, value: object) -> object:
            quick_value, default = preset.options.get(name, (value, value))
            return value if given(context, name) or value != default else quick_value

        chosen = {name: with_quick(name, value) for name, value in values.items()}
        sizes = {name: (chosen[name], values[name]) for name in values}
        if note is not None:
            self.say(note(sizes))
        return (*chosen.values(), sizes)

    def induction_heads(self, text: str | None) -> list[tuple[int, int]] | None:
        """--induction-heads (`heads_option`); a saved report's weights are checked against the model's
        once it loads (`run`): another model's heads are refused."""
        heads, weights = heads_option(text)
        self.heads_file = None if weights is None else (text, weights)
        return heads

    def say(self, note: str | None) -> None:
        """Say the --quick `note` (what the run uses instead of the defaults) on stderr; the report's
        model line carries it."""
        if note is not None:
            self.tell(note)
            self.note = note

    def tell(self, text: str | None) -> None:
        """Say `text` (a sentence without its full stop) on stderr, before the work."""
        if text is not None:
            print(text[0].upper() + text[1:] + ".", file=sys.stderr, flush=True)

    def keyed(self, options: dict, loaded: HookedTransformer | None = None) -> dict | None:
        """What the --save file is keyed by (None without --save): `options`, the code and, with the
        `loaded` model, its weights; refuses what `check_save_file` refuses."""
        if self.save is None:
            return None
        settings = dict(options) | {"code": self._code}
        if loaded is not None:
            from interp.model import weights_fingerprint

            settings["weights"] = weights_fingerprint(loaded)
        if Path(self.save).is_file():
            from circuits.results_file import check_save_file

            with refused():
                check_save_file(self.save, self.name, settings)
        return settings

    @functools.cached_property
    def _code(self) -> str:
        """The sources of interp and circuits (`source_key`), read once per run."""
        import circuits
        import interp
        from interp.io.source_code import source_key

        return source_key(interp, circuits)

    def run(
        self,
        options: dict,
        analyse: Callable[[HookedTransformer, Progress | None, StageResults | None], Any],
        stages: Sequence[str] | None,
        between: Sequence[str] = (),
        notes: Callable | None = None,
        dtype: str = "float32",
        remote: bool = False,
        prepare: Callable[[HookedTransformer], Any] | None = None,
        **render: Any,
    ) -> Any:
        """Load the model (in `dtype`), run analyse(model, progress, kept stages) with `stages`
        announced (kept and resumed with --save, given `notes`), write the report (`render`: the
        writer's options) and name the files written; return the result. `remote`: on a Ray cluster;
        `prepare`: what analyse gets instead of the model, made before the stages start. With --save,
        its file is held from before the model loads to the last write (`results_file.saving`)."""
        with ExitStack() as held:
            if self.save is not None:
                from circuits.results_file import saving

                with refused():  # another command saving to the same path at once
                    held.enter_context(saving(self.save))
            stages, notes = (None, None) if remote else (stages, notes)
            self.keyed(options)
            loaded = load(self.model, dtype)
            keyed = self.keyed(options, loaded)
            self._check_heads_file(loaded)
            with refused(errors=ERRORS):
                kept = None if notes is None else self._kept(keyed, stages, notes)
                bars = (
                    nullcontext()
                    if stages is None
                    else stage_bars(self.name, stages, between, kept, self.save, self.model, self.quick_run)
                )
                prepared = loaded if prepare is None else prepare(loaded)
                with self._stopped_leaves(kept is not None), bars as progress:
                    result = analyse(prepared, progress, kept)
            if self.note is not None:
                result.provenance = f"{result.provenance}; {self.note}"
            if self.save is not None:  # before the report, which a closed pipe (`| head`) stops
                from circuits.results_file import save_result

                save_result(result, self.save, self.name, keyed)
            self.kind[2](result, self.format, self.out, console, **render)
            for path in [*self.outputs.values(), self.out, self.save]:
                if path is not None:  # on stderr: stdout may hold the report (--format json | jq)
                    error_console.print(f"Wrote {path}", style="dim", soft_wrap=True)  # a path copied whole
            return result

    def _check_heads_file(self, loaded: HookedTransformer) -> None:
        """Refuse --induction-heads' report where it was saved for other weights than the model's."""
        if self.heads_file is None:
            return
        from interp.model import FINGERPRINT_SCHEME, weights_fingerprint

        path, weights = self.heads_file
        fingerprint = weights_fingerprint(loaded)
        if weights != fingerprint:
            older = not weights.startswith(f"{FINGERPRINT_SCHEME}-")
            whose = (
                "was saved by an older interp, whose weights fingerprint cannot tell models apart"
                if older
                else f"holds the head report of other weights than --model {self.model}'s"
            )
            raise fail(f"{path} {whose}; write one with: interp heads --model {self.model} --save FILE")

    def _kept(self, keyed: dict | None, stages: Sequence[str], notes: Callable) -> StageResults | None:
        """--save's StageResults (None without --save): each stage written as it finishes, those of an
        earlier run keyed alike kept."""
        if self.save is None:
            return None
        from circuits.results_file import resume_stages

        with refused():
            return resume_stages(self.save, self.name, keyed, list(stages), notes)

    @contextmanager
    def _stopped_leaves(self, keeps: bool) -> Iterator[None]:
        """With kept stages, on Ctrl-C (KeyboardInterrupt), say what --save holds and exit with status 130."""
        try:
            yield
        except KeyboardInterrupt:
            if not keeps or self.save is None:
                raise
            error_console.print(
                f"Stopped: {self.save} holds the stages done; the same command resumes from them."
                if Path(self.save).is_file()
                else f"Stopped before its first stage finished: nothing was saved to {self.save}."
            )
            raise typer.Exit(130) from None
