"""The `interp` command line: a thin layer over `interp` and `circuits`.

Each command parses options, calls one library function, and renders its result.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import typer
from rich.console import Console
from rich.markup import escape

import interp
from interp.catalog import (
    CHECKPOINT_EVERY,
    COMPONENTS,
    DEFAULT_HOPS,
    DEFAULT_MODEL,
    DTYPES,
    EXPECTED_TIMES,
    OFFLINE_MODEL_NAMES,
    PRUNE_STEPS,
    QUICK_PRESETS,
    TASK_DEFAULTS,
    TASKS,
    expected_time_text,
)
from interp.runtime.memory import keep_freed_memory

if TYPE_CHECKING:  # interp.types imports torch, which --help does not load
    from interp.types import Progress

MIN_IOI_PROMPTS = 8  # fewer gives no meaningful bootstrap interval
# The stages of `interp retrieval` after the induction heads (circuits.heads.cache), as
# circuits.retrieval.find reports them ("Path patching: heads -> ..."), and of `interp icl` on a training run.
CHECKPOINTS_STAGE = "ICL and induction scores at each checkpoint"
RETRIEVAL_STAGES = ("Edge attribution (EAP)", "Path patching", "Held-out ablations")
EXAMPLES = {  # the end of each command's --help: its expected time (EXPECTED_TIMES) and examples
    command: (expected_time_text(command) + "\n\n" if command in EXPECTED_TIMES else "")
    + "Examples:\n\n"
    + "\n\n".join(f"  interp {command} {line}" for line in lines)
    for command, lines in {
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
    }.items()
}

app = typer.Typer(
    help="Mechanistic interpretability reports for transformer language models.", no_args_is_help=True
)
console = Console()


def _print_version(value: bool) -> None:
    if value:
        console.print(f"interp {version('interp')}")
        raise typer.Exit()


@app.callback(epilog="Example: interp heads --model smollm2-135m")
def _root(
    show_version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Mechanistic interpretability reports for transformer language models."""
    if os.environ.get("INTERP_RETURN_FREED_MEMORY") != "1":
        keep_freed_memory(True)  # the command's choice of allocator policy (see interp.runtime.memory)


MODEL_HELP = (
    f"A short name ({', '.join(OFFLINE_MODEL_NAMES)}), a transformers id, a directory or a .gguf file."
)


SAVE_HELP = (
    "Also write the full result to this .json file; `interp render` re-renders it in any format. A file "
    "there of another run (other options or weights) is refused, not replaced."
)
KEPT_SAVE_HELP = (
    SAVE_HELP + " Each stage is written to it as it finishes: a stopped run leaves the stages done "
    "(`interp render` shows them), and the same command with the same --save resumes from them."
)
QUICK_HELP = {command: preset.text() for command, preset in QUICK_PRESETS.items()}
RAY_HELP = 'Run on a Ray cluster: "local" starts one here, else its address ("auto", "ray://host:10001").'


def fail(message: str) -> typer.Exit:
    """Print a one-line error; the caller raises the returned exit (status 2)."""
    console.print(f"[red]error:[/red] {escape(message)}")  # escaped: messages may hold [brackets]
    return typer.Exit(2)


def check_format(format: str, out: str | None, formats: Sequence[str]) -> None:
    """Refuse an unknown report format, or HTML without --out, before any model is loaded."""
    from circuits.output import check_format as check

    try:
        check(format, formats, out)
    except ValueError as error:
        raise fail(str(error)) from error
    if out is not None:
        check_writable(out, "--out")


def check_save(
    save: str | None, command: str, options: dict, loaded: interp.HookedTransformer | None = None
) -> dict | None:
    """Refuse a --save path that is not a .json file, cannot be written, or holds what `interp COMMAND`
    with `options` may not replace (`circuits.results_file.check_save_file`: no result, another
    command's, or one of other options), before any model is loaded; with the `loaded` model, one of
    other weights too, before the work. Returns what the file is keyed by: `options` and, with
    `loaded`, its weights' fingerprint (None without --save)."""
    if save is None:
        return None
    if Path(save).suffix != ".json":
        raise fail(f"--save {save} must end in .json (the full result is JSON).")
    check_writable(save, "--save")
    settings = dict(options)
    if loaded is not None:
        from circuits.stages import weights_fingerprint

        settings["weights"] = weights_fingerprint(loaded)
    if Path(save).is_file():
        from circuits.results_file import check_save_file

        try:
            check_save_file(save, command, settings)
        except ValueError as error:
            raise fail(str(error)) from error
    return settings


def check_model(model: str) -> None:
    """Refuse a --model that names local files which are not a model (`interp.io.model_paths`: a
    missing directory or .gguf file), before anything is imported or loaded."""
    from interp.io.model_paths import check_local_source

    try:
        check_local_source(model)
    except (ValueError, FileNotFoundError) as error:
        raise fail(str(error)) from error


def check_pairs_file(option: str, path: str, metric: str = "logit_diff") -> None:
    """Refuse the prompt-pair file of `option` (--task, --pairs) when it is missing, unreadable or its
    pairs lack what `metric` reads (`circuits.pairs_file`), before anything is imported or loaded."""
    from circuits.pairs_file import check_pairs, read_pairs

    try:
        check_pairs(read_pairs(path), path, metric)
    except (ValueError, OSError) as error:
        raise fail(f"{option}: {error}") from error


def check_heads_file(induction_heads: str | None) -> None:
    """Refuse --induction-heads naming a result file that is not there, before anything is imported or
    loaded (`_heads_option` reads it)."""
    file = induction_heads if induction_heads is not None and induction_heads.endswith(".json") else None
    if file is not None and not Path(file).is_file():
        raise fail(f"--induction-heads {file}: no such file; write one with: interp heads --save {file}")


def check_plot(plot: str | None) -> None:
    """Refuse a --plot path that is not a figure file (.png, .svg, .pdf), before any model is loaded."""
    if plot is None:
        return
    if Path(plot).suffix not in (".png", ".svg", ".pdf"):
        raise fail(f"--plot {plot} must end in .png, .svg or .pdf.")
    check_writable(plot, "--plot")


def check_writable(path: str, option: str, directory: bool = False) -> None:
    """Refuse an output that cannot be written, before any model is loaded (not after the work)."""
    from circuits.output import check_writable as check

    try:
        check(path, option, directory)
    except ValueError as error:
        raise fail(str(error)) from error


def save_and_tell(
    result: object, out: str | None, save: str | None, command: str, settings: dict | None
) -> None:
    """Write the full result to `save` (if given) with the `command` and `settings` that made it (what
    `check_save` returned), and say which files were written."""
    from circuits.results_file import save_result

    if save is not None:
        save_result(result, save, command, settings)
    for path in (out, save):
        if path is not None:
            console.print(f"Wrote {path}", style="dim")


def apply_quick(command: str, quick: bool, **values: object) -> tuple:
    """The options `values` (name -> value, in order) with `interp COMMAND --quick`'s preset
    (`interp.catalog.QUICK_PRESETS`) applied to those left at their defaults, then {name: (the value
    with --quick, the value without)} (None without --quick), from which the command's note is made
    (`circuits.quick`, `quick_said`)."""
    if not quick:
        return (*values.values(), None)
    preset = QUICK_PRESETS[command]

    def with_quick(name: str, value: object) -> object:
        quick_value, default = preset.options.get(name, (value, value))
        return quick_value if value == default else value

    chosen = {name: with_quick(name, value) for name, value in values.items()}
    return (*chosen.values(), {name: (chosen[name], values[name]) for name in values})


def quick_said(note: str | None) -> str | None:
    """Say the --quick note (what the run uses instead of the defaults) on stderr; the note, which the
    report's model line carries (None without --quick)."""
    if note is not None:
        print(note[0].upper() + note[1:] + ".", file=sys.stderr, flush=True)
    return note


def with_note(provenance: str, note: str | None) -> str:
    """A report's model line with the --quick preset's note (the first line, or the model line, of
    every report)."""
    return provenance if note is None else f"{provenance}; {note}"


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


def kept_stages(save: str | None, command: str, settings: dict | None, stages, notes):
    """--save's `circuits.stages.StageResults` for `interp COMMAND` (None without --save): each stage
    written to `save` as it finishes, those of an earlier run with the same `settings` (what
    `check_save` returned, the weights' fingerprint among them) kept."""
    if save is None:
        return None
    from circuits.results_file import resume_stages

    try:
        return resume_stages(save, command, settings, list(stages), notes)
    except ValueError as error:
        raise fail(str(error)) from error


@contextmanager
def stopped_leaves(save: str | None) -> Iterator[None]:
    """On Ctrl-C (KeyboardInterrupt), say what --save holds and exit with status 130."""
    try:
        yield
    except KeyboardInterrupt:
        if save is None or not Path(save).is_file():
            raise
        console.print(f"Stopped: {save} holds the stages done; the same command resumes from them.")
        raise typer.Exit(130) from None


def load(model: str, dtype: str = "float32") -> interp.HookedTransformer:
    """Load a model for a command (in `dtype`, a name from DTYPES), turning loading errors into a
    one-line message."""
    import torch

    try:
        if not console.is_terminal:  # a log: a line, where a terminal shows a spinner
            print(f"Loading {model} ...", file=sys.stderr, flush=True)
        with console.status(f"Loading {model} ..."):
            return interp.load_model(model, dtype=getattr(torch, dtype))
    except (ValueError, FileNotFoundError, NotImplementedError) as error:
        raise fail(str(error)) from error


@contextmanager
def stage_bars(
    command: str, stages: Sequence[str], between: Sequence[str] = (), kept=None, save: str | None = None
) -> Iterator[Progress]:
    """The Progress callback of `interp COMMAND`, on stderr (stdout may hold the report): its planned
    `stages` announced with the command's expected time (and, with `kept`, --save's StageResults, as
    saved to `save` one by one; `between`: the work reported outside them), then bars on a terminal,
    else lines with a heartbeat (`circuits.progress_printer`)."""
    from rich.console import Console

    from circuits.progress_printer import progress_bars, progress_lines

    expected = expected_time_text(command) if command in EXPECTED_TIMES else None
    printer = progress_bars if Console(stderr=True).is_terminal else progress_lines
    saved_to = None if kept is None else save
    with printer(command, stages, expected, between, kept, saved_to) as progress:
        yield progress


@app.command(epilog=EXAMPLES["info"])
def info(model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP)) -> None:
    """Summarise a model and its top prediction on an IOI prompt."""
    check_model(model)
    loaded = load(model)
    cfg = loaded.cfg
    console.print(
        f"[bold]{cfg.model_name}[/bold] ({cfg.architecture}): {cfg.n_layers} layers, {cfg.n_heads} heads "
        f"({cfg.n_kv_heads} key/value), d_model {cfg.d_model}, d_mlp {cfg.d_mlp}, vocab {cfg.d_vocab}, "
        f"context {cfg.n_ctx}, {interp.parameter_count(loaded) / 1e6:.1f}M parameters"
    )
    if loaded.tokenizer is not None:
        prompt = "When Mary and John went to the store, John gave a drink to"
        logits = loaded(prompt)[0, -1]
        top = logits.topk(5)
        guesses = ", ".join(
            f"{loaded.to_string(i[None])!r} ({v:.2f})" for v, i in zip(top.values, top.indices, strict=True)
        )
        console.print(f"{prompt!r} -> {guesses}")


@app.command(epilog=EXAMPLES["heads"])
def heads(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    format: str = typer.Option("table", help="table, csv, json, markdown or html."),
    out: str | None = typer.Option(None, help="Write the report to this file instead of the terminal."),
    seed: int = typer.Option(0, min=0, help="Seed of the random probe sequences."),
    n_samples: int = typer.Option(
        16, min=2, help="Random sequences per probe (repeat length) to score and ablate on."
    ),
    wide: bool = typer.Option(
        False,
        "--wide",
        help="Every score column in the terminal table (the default on a terminal wide enough for it).",
    ),
    all_heads: bool = typer.Option(
        False, "--all", help="Every typed head in the terminal table, not only those confirmed by ablation."
    ),
    ray: str | None = typer.Option(None, help=RAY_HELP),
    save: str | None = typer.Option(None, help=KEPT_SAVE_HELP),
    dtype: Literal[DTYPES] = typer.Option(
        "float32",
        help="Load the model in this dtype. bfloat16 runs faster on CPUs with bf16 units (on one with "
        "AMX, SmolLM2's report took 17 s instead of 43 s) and slower on CPUs without; it changes the "
        "numbers slightly (the report's model line says which dtype ran).",
    ),
    quick: bool = typer.Option(False, "--quick", help=QUICK_HELP["heads"]),
) -> None:
    """Find previous-token, induction, fixed-offset, skip-gram ... heads, with causal checks."""
    check_model(model)
    from circuits.heads import head_report, remember_induction_heads
    from circuits.heads.pipeline import BETWEEN_STAGES, KEPT_STAGES, heads_stage_notes
    from circuits.heads.probes import HELD_OUT_RULE
    from circuits.heads.report import FORMATS, write_report
    from circuits.quick import heads_note
    from circuits.sweeps import run_on_ray

    check_format(format, out, FORMATS)
    n_samples, quick_sizes = apply_quick("heads", quick, n_samples=n_samples)
    quick_note = quick_said(heads_note(quick_sizes["n_samples"]) if quick_sizes else None)
    options = {
        "model": model,
        "n_samples": n_samples,
        "seed": seed,
        "dtype": dtype,
        "held_out": HELD_OUT_RULE,
    }
    check_save(save, "heads", options)
    loaded = load(model, dtype)
    keyed = check_save(save, "heads", options, loaded)
    try:
        if ray is None:
            kept = kept_stages(save, "heads", keyed, KEPT_STAGES, heads_stage_notes)
            bars = stage_bars("heads", KEPT_STAGES, BETWEEN_STAGES, kept, save)
            with stopped_leaves(save), bars as progress:
                report = head_report(loaded, n_samples=n_samples, seed=seed, progress=progress, stages=kept)
            remember_induction_heads(loaded, report, n_samples, seed)  # what interp icl, retrieval reuse
        else:
            report = run_on_ray(head_report, model, ray, dtype=dtype, n_samples=n_samples, seed=seed)
    except (ValueError, ImportError) as error:
        raise fail(str(error)) from error
    report.provenance = with_note(report.provenance, quick_note)
    write_report(report, format, out, console, wide=wide or None, all_heads=all_heads)
    save_and_tell(report, out, save, "heads", keyed)


@app.command(epilog=EXAMPLES["train"])
def train(
    task: Literal[TASKS] = typer.Option(..., help="The synthetic task."),
    layers: int | None = typer.Option(
        None,
        min=1,
        help=f"Number of layers (default: 2; hop: one more than --hops, {DEFAULT_HOPS + 1} for "
        f"{DEFAULT_HOPS}).",
    ),
    heads: int = typer.Option(4, min=1, help="Attention heads per layer."),
    d_model: int = typer.Option(64, min=1, help="Residual stream width (a multiple of --heads)."),
    attn_only: bool | None = typer.Option(
        None,
        "--attn-only/--with-mlps",
        help="Attention-only or with MLPs (default: attention-only).",
    ),
    steps: int | None = typer.Option(
        None,
        min=1,
        help="Optimizer steps (default: "
        + ", ".join(f"{task} {defaults.steps}" for task, defaults in TASK_DEFAULTS.items())
        + "; hop stops early once its held-out accuracy plateaus at 0.9 or more).",
    ),
    out: str = typer.Option(..., help="Output directory; interp.load_model(OUT) loads it."),
    seed: int = typer.Option(0, min=0, help="Seed of the initial weights and the data."),
    lr: float | None = typer.Option(
        None,
        help="Peak learning rate, warm-up and cosine decay (default: "
        + ", ".join(f"{task} {defaults.lr:g}" for task, defaults in TASK_DEFAULTS.items())
        + ").",
    ),
    batch_size: int = typer.Option(32, min=1, help="Sequences per step."),
    seq_len: int | None = typer.Option(
        None, min=5, help="Tokens per sequence (= n_ctx); induction 48, markov 64, hop 32; not for ioi."
    ),
    d_vocab: int | None = typer.Option(
        None,
        min=2,
        help="Vocabulary (induction 64; hop 9: BOS and 8 symbols) or Markov states (3); not for ioi.",
    ),
    positional: Literal["learned", "rotary", "none"] = typer.Option("learned", help="Position encoding."),
    checkpoint_every: int = typer.Option(
        CHECKPOINT_EVERY, min=0, help="Checkpoint every N steps (0: only the last); Ctrl-C saves one too."
    ),
    name: str | None = typer.Option(None, help="The model's name in reports (default: OUT's name)."),
    hops: int | None = typer.Option(
        None,
        min=1,
        help=f"The hop task's successive induction lookups per answer (default {DEFAULT_HOPS}); only with "
        "--task hop.",
    ),
) -> None:
    """Train a toy transformer on a synthetic task and write a checkpoint directory.

    With the defaults each task shows its phenomenon: induction heads that `interp heads` confirms,
    the toy IOI circuit that `interp ioi` finds, Markov chains predicted as well as by the in-context
    bigram statistics (the final line compares the two losses), the hop task's answers well above
    chance (held-out accuracy ~0.8 for 2 hops on 3 layers, chance 1/6; 1.0 for 1 hop on 2 layers,
    which stops early). Running the same command again resumes from the last checkpoint (after
    Ctrl-C too).
    """
    from interp.training import TRAIN_STAGE, latest_checkpoint, train_toy_model

    if lr is not None and lr <= 0:
        raise fail(f"--lr must be > 0, got {lr}.")
    if d_model % heads:
        raise fail(f"--d-model {d_model} is not a multiple of --heads {heads}.")
    if task == "ioi" and (seq_len is not None or d_vocab is not None):
        raise fail("the ioi task has a fixed vocabulary and length: drop --seq-len and --d-vocab.")
    if hops is not None and task != "hop":
        raise fail(
            f"--hops is the hop task's number of lookups: pass --task hop, or drop --hops (task {task})."
        )
    check_writable(out, "--out", directory=True)
    resumed = latest_checkpoint(Path(out))
    if resumed is not None:
        console.print(f"Resuming from {resumed} (delete {out} to start afresh).")
    try:
        with stage_bars("train", [TRAIN_STAGE]) as progress:
            model, log = train_toy_model(
                task, layers, heads, d_model, steps, out, attn_only=attn_only, seed=seed, lr=lr,
                batch_size=batch_size, seq_len=seq_len, d_vocab=d_vocab, positional=positional,
                checkpoint_every=checkpoint_every, name=name, hops=hops, progress=progress,
            )  # fmt: skip
    except ValueError as error:
        raise fail(str(error)) from error
    except KeyboardInterrupt:
        console.print(f"Interrupted; the last step is saved in {out}: run the same command to resume.")
        raise typer.Exit(130) from None
    last = log.evals[-1]
    if task == "ioi":
        detail = "loss on the answer; ln 2 = 0.693 is a coin flip between IO and S"
    elif task == "hop":
        detail = (
            f"answer accuracy {last['answer_accuracy']:.3f} after {model.cfg.hops} lookups, chance "
            f"{1 / (model.cfg.d_vocab - 1 - model.cfg.hops):.3f}"
        )
    elif task == "markov":
        detail = (
            f"the in-context bigram predictor {last['bigram_loss']:.3f}, uniform "
            f"{math.log(model.cfg.d_vocab):.3f}"
        )
    else:
        detail = (
            f"repeated random tokens: first half {last['first_half_loss']:.3f}, "
            f"repeated half {last['repeated_half_loss']:.3f}"
        )
    stopped = "" if log.stopped_early is None else " (stopped early: held-out accuracy on a plateau)"
    console.print(f"step {last['step']}{stopped}: task loss {last['eval_loss']:.3f} ({detail}). Wrote {out}")
    target = TASK_DEFAULTS[task].stop_above
    if target and last["accuracy"] < target:
        console.print(
            f"[yellow]The held-out accuracy {last['accuracy']:.3f} did not reach {target}: the model has not "
            f"learned the task yet (when it learns depends on the seed and the machine). Train again into a "
            f"fresh --out with more steps (--steps {2 * last['step']}) or another --seed.[/yellow]"
        )


@app.command(epilog=EXAMPLES["ioi"])
def ioi(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    n_prompts: int = typer.Option(
        64,
        min=MIN_IOI_PROMPTS,
        help="IOI prompts (the first 16 are used for path patching); as many held out.",
    ),
    seed: int = typer.Option(0, min=0, help="Seed of the IOI dataset."),
    format: str = typer.Option("table", help="table, json, markdown or html."),
    out: str | None = typer.Option(None, help="Write the report to this file instead of the terminal."),
    ray: str | None = typer.Option(None, help=RAY_HELP),
    save: str | None = typer.Option(None, help=KEPT_SAVE_HELP),
    quick: bool = typer.Option(False, "--quick", help=QUICK_HELP["ioi"]),
) -> None:
    """Find the IOI circuit (Wang et al. 2022) by path patching, and evaluate it."""
    check_model(model)
    from circuits.ioi import find_ioi_circuit
    from circuits.ioi.discover import BETWEEN_STAGES, KEPT_STAGES, ioi_stage_notes
    from circuits.ioi.report import FORMATS, write_ioi_report
    from circuits.quick import ioi_note
    from circuits.sweeps import run_on_ray

    check_format(format, out, FORMATS)
    n_prompts, quick_sizes = apply_quick("ioi", quick, n_prompts=n_prompts)
    quick_note = quick_said(ioi_note(quick_sizes["n_prompts"]) if quick_sizes else None)
    options = {"model": model, "n_prompts": n_prompts, "seed": seed}
    check_save(save, "ioi", options)
    loaded = load(model)
    keyed = check_save(save, "ioi", options, loaded)
    try:
        if ray is None:
            kept = kept_stages(save, "ioi", keyed, KEPT_STAGES, ioi_stage_notes)
            with stopped_leaves(save), stage_bars("ioi", KEPT_STAGES, BETWEEN_STAGES, kept, save) as progress:
                result = find_ioi_circuit(
                    loaded, n_prompts=n_prompts, seed=seed, progress=progress, stages=kept
                )
        else:
            result = run_on_ray(find_ioi_circuit, model, ray, n_prompts=n_prompts, seed=seed)
    except (ValueError, ImportError) as error:
        raise fail(str(error)) from error
    result.settings.provenance = with_note(result.settings.provenance, quick_note)
    write_ioi_report(result, format, out, console)
    save_and_tell(result, out, save, "ioi", keyed)


@app.command(epilog=EXAMPLES["patch"])
def patch(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    component: Literal[COMPONENTS] = typer.Option(
        "z", help="resid_pre/mid/post, attn_out, mlp_out, or per head z, result, q, k, v, pattern."
    ),
    direction: Literal["denoise", "noise"] = typer.Option(
        "denoise", help="denoise (corrupted run, clean activations) or noise."
    ),
    pairs: str | None = typer.Option(
        None,
        help="Your own prompt pairs: a .csv/.jsonl file as `interp circuit --task` reads (default: IOI).",
    ),
    n_prompts: int = typer.Option(
        8, min=1, help="IOI prompts; the corrupted prompts use three other names (ABC)."
    ),
    seed: int = typer.Option(0, min=0, help="Seed of the IOI dataset."),
    top: int = typer.Option(10, min=1, help="Rows to show; csv and json hold every patch."),
    format: str = typer.Option("table", help="table, csv, json, markdown or html."),
    out: str | None = typer.Option(None, help="Write the report to this file instead of the terminal."),
    save: str | None = typer.Option(None, help=SAVE_HELP),
) -> None:
    """Activation patching on IOI prompts or your own pairs.

    The metric is the normalised logit difference: 0 = the corrupted run, 1 = the clean run.
    """
    check_model(model)
    if pairs is not None:
        check_pairs_file("--pairs", pairs)
    from circuits.patch_report import FORMATS, ioi_patching, pairs_patching, write_patch_report

    check_format(format, out, FORMATS)
    options = {
        "model": model, "component": component, "direction": direction, "pairs": pairs,
        "pairs_file": None if pairs is None else file_digest(pairs), "n_prompts": n_prompts, "seed": seed,
    }  # fmt: skip
    check_save(save, "patch", options)
    loaded = load(model)
    keyed = check_save(save, "patch", options, loaded)
    try:
        with stage_bars("patch", ["patched runs"]) as progress:
            if pairs is None:
                report = ioi_patching(loaded, component, direction, n_prompts, seed, top, progress)
            else:
                report = pairs_patching(loaded, pairs, component, direction, top, progress)
    except (ValueError, FileNotFoundError) as error:
        raise fail(str(error)) from error
    write_patch_report(report, format, out, console)
    save_and_tell(report, out, save, "patch", keyed)


@app.command(epilog=EXAMPLES["circuit"])
def circuit(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    task: str = typer.Option(
        "ioi",
        help="ioi, induction, or a .csv/.jsonl file of prompt pairs (columns clean, corrupted, correct, "
        "incorrect; optional family, stratum, pos:NAME).",
    ),
    method: str = typer.Option(
        "prune",
        help="prune (a learned edge mask, started from eap-ig's ranks: the fewest edges for a faithful "
        "circuit in docs/results/circuits.md), eap, eap-ig (over inputs; seconds where prune takes "
        "minutes), eap-ig-activations (the reference code's), eap-ig-activations-grouped, exact (small "
        "models) or ensemble (eap-ig and prune's ranks averaged).",
    ),
    edges: int | None = typer.Option(
        None,
        "--edges",
        min=1,
        help="Circuit size in edges (or --fraction; neither: the smallest reaching --target).",
    ),
    fraction: float | None = typer.Option(None, help="Circuit size as a fraction of all edges."),
    target: float = typer.Option(
        0.8, help="Without --edges/--fraction: the faithfulness the circuit must reach."
    ),
    steps: int = typer.Option(5, min=1, help="Integrated-gradient steps (eap-ig)."),
    ig_points: str | None = typer.Option(
        None,
        help="EAP-IG's points over inputs: paper (alpha = k/m, k = 1..m) or mib (k = 0..m-1, the reference "
        "code's and MIB's). Default: mib with --mib-out, else paper.",
    ),
    max_memory: str | None = typer.Option(
        None, help="Memory budget of the edge scores (e.g. 2GiB): picks how many prompts run at once."
    ),
    ablation: str = typer.Option(
        "counterfactual", help="counterfactual (the corrupted prompt), mean or zero."
    ),
    bootstrap: int = typer.Option(
        0, help="Resamples of the prompts for each edge's selection frequency (0: not measured)."
    ),
    prune_steps: int = typer.Option(PRUNE_STEPS, help="Training steps of the edge mask (prune, ensemble)."),
    density: float | None = typer.Option(
        None,
        help="The fraction of edges the mask keeps (prune, ensemble); default: the circuit's size "
        "(--edges, --fraction), else 0.02.",
    ),
    checkpoint: str | None = typer.Option(
        None, help="The edge mask's checkpoint file: written as it trains, resumed from (prune, ensemble)."
    ),
    metric: str = typer.Option("logit_diff", help="logit_diff or prob (prompt-pair files)."),
    n_prompts: int = typer.Option(
        64,
        min=1,
        help="Prompt pairs (ioi, induction) that find the circuit, and as many held-out ones that test it.",
    ),
    seed: int = typer.Option(
        0,
        help="Seed of the prompts, the held-out families (or prompts) when none are named, the edge "
        "mask's prompt order and the random circuits and resamples.",
    ),
    heldout_families: str | None = typer.Option(
        None,
        help="With a prompt-pair file: the families (its family column) held out to test the circuit and "
        "the head classes, comma-separated (default: half of them, drawn with --seed).",
    ),
    curve: bool = typer.Option(
        False,
        help="Also measure the faithfulness curve (MIB's 10 sizes, top |score|, top signed and random "
        "circuits: up to 28 more edge-level runs, several times the scores' time) and CPR/CMD.",
    ),
    format: str = typer.Option("table", help="table, json, markdown or html."),
    out: str | None = typer.Option(None, help="Write the report to this file instead of the terminal."),
    mib_out: str | None = typer.Option(
        None, help="Also write the circuit in MIB's submission format (JSON)."
    ),
    save: str | None = typer.Option(None, help=SAVE_HELP),
    quick: bool = typer.Option(False, "--quick", help=QUICK_HELP["circuit"]),
) -> None:
    """Find an edge circuit (EAP, EAP-IG, a learned mask or their ensemble), and measure its faithfulness.

    The circuit is found on discovery prompts and its faithfulness measured on held-out ones: IOI's
    held-out templates and names, fresh induction sequences, or a prompt-pair file's held-out families
    (its `family` column; --heldout-families names them), else held-out prompts of it.
    """
    check_model(model)
    if Path(task).suffix:
        check_pairs_file("--task", task, metric)
    import json

    from circuits.edge_circuits import (
        CIRCUIT_METHODS,
        FORMATS,
        METRICS,
        EdgeCircuitSettings,
        find_edge_circuit,
        write_edge_report,
    )
    from circuits.edge_circuits.find import MASK_METHODS, edge_circuit_stages
    from circuits.edge_circuits.tasks import check_task_name, circuit_tasks
    from circuits.path import PATH_STAGES, PathSettings, head_path
    from circuits.quick import circuit_note
    from interp.edges import ABLATIONS, IG_POINTS, MIB_FRACTIONS, mib_json
    from interp.io.files import write_text_atomic
    from interp.types import memory_bytes

    check_format(format, out, FORMATS)
    heldout_names = _heldout_families(task, heldout_families)
    n_prompts, prune_steps, quick_sizes = apply_quick(
        "circuit", quick, n_prompts=n_prompts, prune_steps=prune_steps
    )
    if edges is not None and fraction is not None:
        raise fail("give the circuit size as --edges N or --fraction F (one of them), or neither to search.")
    if fraction is not None and not 0 < fraction <= 1:
        raise fail(f"--fraction {fraction} must lie in (0, 1]: the fraction of all edges, e.g. 0.05.")
    if not 0 < target <= 1:
        raise fail(f"--target {target} must lie in (0, 1]; 0.8 is a common choice.")
    if bootstrap < 0:
        raise fail(f"--bootstrap {bootstrap} must be 0 (not measured) or a number of resamples, e.g. 20.")
    if density is not None and not 0 < density < 1:
        raise fail(
            f"--density {density} must lie in (0, 1): the fraction of edges the mask keeps, e.g. 0.02."
        )
    if prune_steps < 1:
        raise fail(f"--prune-steps {prune_steps} must be at least 1.")
    if ig_points is not None and method.startswith("eap-ig-activations"):
        raise fail(f"--ig-points applies to eap-ig (over inputs); {method} takes alpha = k/m, k = 1..m.")
    ig_points = ig_points or ("mib" if mib_out is not None and method == "eap-ig" else "paper")
    if max_memory is not None:
        if method == "exact":
            raise fail("--max-memory applies to the gradient methods (eap, eap-ig, ...), not to exact.")
        try:
            memory_bytes(max_memory)
        except ValueError as error:
            raise fail(f"--max-memory: {error}") from error
    for name, value, allowed in [
        ("method", method, CIRCUIT_METHODS), ("ablation", ablation, ABLATIONS),
        ("ig-points", ig_points, IG_POINTS), ("metric", metric, METRICS),
    ]:  # fmt: skip
        if value not in allowed:
            raise fail(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}.")
    try:
        check_task_name(task)
    except ValueError as error:
        raise fail(str(error)) from error
    for path, option in ((mib_out, "--mib-out"), (checkpoint, "--checkpoint")):
        if path is not None:
            check_writable(path, option)
    options = {
        "model": model, "task": task, "task_file": file_digest(task) if Path(task).suffix else None,
        "method": method, "edges": edges, "fraction": fraction, "target": target, "steps": steps,
        "ig_points": ig_points, "ablation": ablation, "bootstrap": bootstrap, "prune_steps": prune_steps,
        "density": density, "metric": metric, "n_prompts": n_prompts, "seed": seed,
        "heldout_families": heldout_names, "curve": curve,
    }  # fmt: skip
    check_save(save, "circuit", options)
    loaded = load(model)
    keyed = check_save(save, "circuit", options, loaded)
    try:
        # a file: read once, split once by whole families, for the edges and the head classes alike
        prompt_pairs, heldout, pairs = circuit_tasks(loaded, task, n_prompts, seed, metric, heldout_names)
        searched = edges is None and fraction is None
        with_heads = pairs is not None and metric == "logit_diff"  # the user's pairs: head classes too
        stages = edge_circuit_stages(method, searched, curve, bootstrap) + list(
            PATH_STAGES if with_heads else []
        )
        if with_heads:  # checked before any long work
            pairs.check_ablation(ablation)
        settings = EdgeCircuitSettings(
            method=method, n_edges=edges, fraction=fraction, target=target, steps=steps,
            ig_points=ig_points, ablation=ablation, max_memory=max_memory,
            curve_fractions=MIB_FRACTIONS if curve else None, bootstrap=bootstrap,
            prune_steps=prune_steps, density=density, seed=seed,
        )  # fmt: skip
        quick_note = None
        if quick_sizes is not None:
            prompts = None if Path(task).suffix else quick_sizes["n_prompts"]
            mask_steps = quick_sizes["prune_steps"] if method in MASK_METHODS else None
            note = circuit_note(prompt_pairs.n_prompts, heldout.n_prompts, prompts, mask_steps, method)
            quick_note = quick_said(note)
        with stage_bars("circuit", stages) as progress:
            result = find_edge_circuit(
                loaded, prompt_pairs, settings, heldout=heldout, checkpoint=checkpoint, progress=progress
            )
            if with_heads:
                path_settings = PathSettings(seed=seed, ablation=ablation, heldout=heldout_names)
                result.heads = head_path(loaded, pairs, path_settings, progress)
    except (ValueError, FileNotFoundError) as error:
        raise fail(str(error)) from error
    result.provenance = with_note(result.provenance, quick_note)
    write_edge_report(result, format, out, console)
    if mib_out is not None:
        write_text_atomic(mib_out, json.dumps(mib_json(result.scores, result.circuit, loaded.cfg)))
        console.print(f"Wrote {mib_out}", style="dim")
    save_and_tell(result, out, save, "circuit", keyed)


def _heldout_families(task: str, option: str | None) -> tuple[str, ...] | None:
    """--heldout-families: the families named, checked against the prompt-pair file's family column
    before any model loads (None: half of them drawn)."""
    from circuits.evidence import split_families
    from circuits.path.task import read_pairs

    if option is None:
        return None
    if not Path(task).suffix:
        raise fail(
            f"--heldout-families names families of a prompt-pair file's family column; --task {task} holds "
            "out its own (IOI's held-out templates, fresh induction sequences)."
        )
    names = tuple(dict.fromkeys(name.strip() for name in option.split(",") if name.strip()))
    try:
        families = [str(row.get("family") or "") for row in read_pairs(task)]
        if not any(families):
            raise ValueError(f"{task} has no family column, so it has no families to hold out")
        split_families(families, heldout=names)
    except (ValueError, FileNotFoundError) as error:
        raise fail(f"--heldout-families: {error}") from error
    return names


@app.command(epilog=EXAMPLES["icl"])
def icl(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    n_documents: int | None = typer.Option(
        None,
        min=4,
        help="Documents (Brown corpus texts; a toy model's task sequences): --n-discovery rank the heads, "
        "the rest are held out and scored (default 60; with --fv 8, for the ICL score of the ablations).",
    ),
    n_discovery: int = typer.Option(
        12, min=2, help="Documents that rank the heads (at most half of them); the others test."
    ),
    n_ablated: int = typer.Option(
        12, min=2, help="Held-out documents the exact ablations run on (each costs ~6 forward passes)."
    ),
    early: int | None = typer.Option(
        None, min=1, help="Centre of the early window (default: token 50 on text)."
    ),
    late: int | None = typer.Option(
        None, min=2, help="Centre of the late window (default: token 500 on text)."
    ),
    window: int | None = typer.Option(
        None,
        min=1,
        help="Tokens averaged around each (default 51 on text; 1: Olsson et al.'s single tokens).",
    ),
    ablation: Literal["mean", "zero", "resample"] = typer.Option(
        "mean", help="mean (over every position of the documents), zero or resample (another document's)."
    ),
    induction_heads: str | None = typer.Option(
        None,
        help='The class to test: "L17H3,L19H0", a result of `interp heads --save`, or "none" '
        "(default: the heads interp heads confirms, cached after the first run).",
    ),
    top: int = typer.Option(3, min=0, help="Top heads by attribution to confirm by exact ablation."),
    n_random: int = typer.Option(4, min=1, help="Random same-layer head sets to compare the class with."),
    seed: int = typer.Option(0, min=0, help="Seed of the documents, the random sets and the bootstrap."),
    format: str = typer.Option("table", help="table, json, markdown or html."),
    out: str | None = typer.Option(None, help="Write the report to this file instead of the terminal."),
    plot: str | None = typer.Option(
        None,
        help="Also draw a figure (.png, .svg, .pdf): a training run across its steps, else loss per token.",
    ),
    save: str | None = typer.Option(None, help=KEPT_SAVE_HELP),
    fv: bool = typer.Option(
        False,
        "--fv",
        help="Function-vector heads (Todd et al.) on word-pair tasks instead, beside the induction heads.",
    ),
    tasks: str | None = typer.Option(
        None, help="With --fv: the word-pair tasks, the families (default: all eleven of interp's)."
    ),
    heldout_tasks: str | None = typer.Option(
        None,
        help="With --fv: the tasks that test; the others choose the heads and the layer "
        "(default: half of them, drawn with --seed).",
    ),
    heldout_templates: str | None = typer.Option(
        None,
        help="With --fv: the prompt templates that test (of qa, input_output, arrow, colon): the held-out "
        "tasks are tested in them, the discovery tasks in the others choose (default: half, by --seed).",
    ),
    n_prompts: int = typer.Option(8, min=2, help="With --fv: few-shot prompts per task, template and half."),
    n_shots: int = typer.Option(5, min=2, help="With --fv: solved examples per prompt."),
    fv_heads: int = typer.Option(10, min=1, help="With --fv: the top heads by AIE the vector sums."),
    candidates: int = typer.Option(
        30,
        min=1,
        help="With --fv: heads whose AIE is computed exactly (the top by attribution; 270: all).",
    ),
    quick: bool = typer.Option(False, "--quick", help=QUICK_HELP["icl"] + " Not with --fv."),
) -> None:
    """The in-context learning score (late minus early loss) and the heads that carry it.

    Every head is ranked by attribution on half the documents; the top heads and the induction heads
    (against random heads of the same layers) are confirmed by exact ablation on the other half. For
    a training run's directory, also the score and the induction scores at each checkpoint. With
    --fv: function-vector heads by their average indirect effect on word-pair tasks, the function
    vector added to zero-shot prompts, and which ablation (FV or induction heads) lowers few-shot
    accuracy and which the ICL score, all tested on held-out pairs against random heads.
    """
    check_model(model)
    check_heads_file(induction_heads)
    from circuits.icl import (
        DocumentSplit,
        ICLSettings,
        Windows,
        default_windows,
        icl_over_training,
        icl_report,
        plot_icl_over_training,
    )
    from circuits.icl.pipeline import icl_report_stages, icl_stage_notes
    from circuits.icl.report import FORMATS, loss_curve_figure, write_icl_report
    from circuits.quick import DocumentSizes, icl_note
    from interp.training import CHECKPOINTS
    from interp.types import as_stage

    check_format(format, out, FORMATS)
    check_plot(plot)
    heads = None if induction_heads is None else _heads_option(induction_heads)
    if fv and quick:
        raise fail("--quick applies to the ICL score, not to --fv (give --n-prompts, --candidates instead).")
    n_documents, n_discovery, n_ablated, quick_sizes = apply_quick(
        "icl", quick, n_documents=n_documents, n_discovery=n_discovery, n_ablated=n_ablated
    )
    if fv:
        _icl_fv(model, (tasks, heldout_tasks, heldout_templates), n_prompts, n_shots, fv_heads, candidates,
                n_random, n_documents or 8, heads, seed, format, out, save,
                (early, late, window, plot, ablation != "mean"))  # fmt: skip
        return
    n_documents = ICLSettings().n_documents if n_documents is None else n_documents
    quick_note = None
    if quick_sizes is not None:
        given, default = {name: value for name, (_, value) in quick_sizes.items()}, ICLSettings().n_documents
        used = DocumentSizes.of(n_documents, DocumentSplit(n_discovery, n_ablated))
        without = DocumentSplit(given["n_discovery"], given["n_ablated"])
        quick_note = quick_said(icl_note(used, DocumentSizes.of(given["n_documents"] or default, without)))
    if None not in (early, late, window):  # what does not depend on the model's context
        try:
            Windows(early, late, window).check(n_ctx=late + window)
        except ValueError as error:
            raise fail(str(error)) from error
    run = Path(model) if (Path(model) / CHECKPOINTS).is_dir() else None
    kept = icl_report_stages(find_induction_heads=heads is None)
    options = {
        "model": model, "n_documents": n_documents, "n_discovery": n_discovery, "n_ablated": n_ablated,
        "windows": [early, late, window], "ablation": ablation, "induction_heads": induction_class(heads),
        "top": top, "n_random": n_random, "seed": seed,
    }  # fmt: skip
    check_save(save, "icl", options)
    loaded = load(model)
    keyed = check_save(save, "icl", options, loaded)
    try:
        defaults = default_windows(loaded)
        windows = Windows(
            defaults.early if early is None else early,
            defaults.late if late is None else late,
            defaults.width if window is None else window,
        )
        done = kept_stages(save, "icl", keyed, kept, icl_stage_notes)
        between = [CHECKPOINTS_STAGE] if run is not None else []
        with stopped_leaves(save), stage_bars("icl", kept, between, done, save) as progress:
            settings = ICLSettings(
                n_documents=n_documents, split=DocumentSplit(n_discovery, n_ablated), windows=windows,
                ablation=ablation, top=top, n_random=n_random, seed=seed,
            )  # fmt: skip
            result = icl_report(loaded, settings, induction_heads=heads, progress=progress, stages=done)
            if run is not None:
                step = as_stage(progress, CHECKPOINTS_STAGE)
                result.training = icl_over_training(run, n_documents, windows, seed, progress=step)
        if plot is not None and run is not None:
            plot_icl_over_training(result.training, plot)
        elif plot is not None:
            loss_curve_figure(result, plot)
    except (ValueError, ImportError) as error:
        raise fail(str(error)) from error
    result.provenance = with_note(result.provenance, quick_note)
    write_icl_report(result, format, out, console)
    if plot is not None:
        console.print(f"Wrote {plot}", style="dim")
    save_and_tell(result, out, save, "icl", keyed)


def _icl_fv(model, families, n_prompts, n_shots, fv_heads, candidates, n_random, n_documents, heads, seed,
            format, out, save, icl_only) -> None:  # fmt: skip
    """`interp icl --fv`: function-vector heads beside the induction heads."""
    from circuits.icl import FunctionVectorSettings, function_vector_report
    from circuits.icl.fv_pipeline import function_vector_stages, fv_stage_notes
    from circuits.icl.report import FORMATS, write_fv_report
    from interp.tasks.icl_tasks import ICL_TASKS

    check_format(format, out, FORMATS)
    if candidates < fv_heads:
        raise fail(f"--candidates {candidates} must be at least --fv-heads {fv_heads}.")
    if any(value not in (None, False) for value in icl_only):
        raise fail("--early, --late, --window, --plot and --ablation apply to the ICL score, not to --fv.")

    def listed(text: str) -> list[str]:
        return [name.strip() for name in text.split(",") if name.strip()]

    tasks, heldout_tasks, heldout_templates = families  # --tasks, --heldout-tasks, --heldout-templates
    try:
        settings = FunctionVectorSettings(
            tasks=tuple(ICL_TASKS) if tasks is None else listed(tasks),
            heldout_tasks=None if heldout_tasks is None else listed(heldout_tasks), n_prompts=n_prompts,
            n_shots=n_shots, top=fv_heads, candidates=candidates, n_random=n_random, n_documents=n_documents,
            seed=seed, heldout_templates=None if heldout_templates is None else listed(heldout_templates),
        )  # fmt: skip
        settings.family_split()
        settings.template_split()
    except ValueError as error:
        raise fail(str(error)) from error
    stages = function_vector_stages(find_induction_heads=heads is None)
    heldout = None if settings.heldout_tasks is None else list(settings.heldout_tasks)
    templates = None if settings.heldout_templates is None else list(settings.heldout_templates)
    options = {
        "model": model, "tasks": settings.task_names, "heldout_tasks": heldout, "n_prompts": n_prompts,
        "n_shots": n_shots, "fv_heads": fv_heads, "candidates": candidates, "n_random": n_random,
        "n_documents": n_documents, "induction_heads": induction_class(heads), "seed": seed,
        "heldout_templates": templates,
    }  # fmt: skip
    check_save(save, "icl --fv", options)
    loaded = load(model)
    keyed = check_save(save, "icl --fv", options, loaded)
    try:
        done = kept_stages(save, "icl --fv", keyed, stages, fv_stage_notes)
        with stopped_leaves(save), stage_bars("icl --fv", stages, (), done, save) as progress:
            result = function_vector_report(
                loaded, settings, induction_heads=heads, progress=progress, stages=done
            )
    except ValueError as error:
        raise fail(str(error)) from error
    write_fv_report(result, format, out, console)
    save_and_tell(result, out, save, "icl --fv", keyed)


@app.command(epilog=EXAMPLES["retrieval"])
def retrieval(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    n_prompts: int = typer.Option(24, min=2, help="Discovery prompts (4 facts each) that find the heads."),
    n_heldout: int = typer.Option(
        24, min=2, help="Held-out prompts per fact count (2, 3, 6, 8) and template that test them."
    ),
    n_exact: int = typer.Option(12, min=0, help="Senders path-patched exactly per step (EAP ranks them)."),
    n_random: int = typer.Option(4, min=1, help="Random same-layer head sets to compare each class with."),
    n_two_hop: int = typer.Option(40, min=2, help="Two-hop prompts per query form (measured only)."),
    induction_heads: str | None = typer.Option(
        None,
        help='The induction heads to compare with: "L17H3,L19H0", a result of `interp heads --save`, or '
        '"none" (default: the heads interp heads confirms, cached after the first run).',
    ),
    seed: int = typer.Option(0, min=0, help="Seed of the prompts, the random sets and the bootstrap."),
    format: str = typer.Option("table", help="table, json, markdown or html."),
    out: str | None = typer.Option(None, help="Write the report to this file instead of the terminal."),
    save: str | None = typer.Option(None, help=SAVE_HELP),
    quick: bool = typer.Option(False, "--quick", help=QUICK_HELP["retrieval"]),
) -> None:
    """Retrieval from context: the heads that answer "The pet of John is" from facts stated before it.

    Heads are found on discovery prompts by path patching (EAP-ranked) and classed by where the last
    token attends; each class's drop (clean - ablated) beyond random heads is measured on held-out
    relations, names, fact counts and templates (beside the discovery prompts' figure), with the
    overlap with the induction heads of `interp heads`. Two-hop prompts are measured.
    """
    check_model(model)
    check_heads_file(induction_heads)
    from circuits.heads.cache import INDUCTION_HEADS_STAGE
    from circuits.quick import retrieval_note
    from circuits.retrieval import RetrievalSettings, find_retrieval_circuit
    from circuits.retrieval.report import FORMATS, write_retrieval_report

    check_format(format, out, FORMATS)
    heads = None if induction_heads is None else _heads_option(induction_heads)
    n_prompts, n_heldout, n_exact, n_two_hop, quick_sizes = apply_quick(
        "retrieval", quick, n_prompts=n_prompts, n_heldout=n_heldout, n_exact=n_exact, n_two_hop=n_two_hop
    )
    quick_note = quick_said(retrieval_note(quick_sizes) if quick_sizes else None)
    settings = RetrievalSettings(
        n_prompts=n_prompts, n_heldout=n_heldout, n_exact=n_exact, n_random=n_random, n_two_hop=n_two_hop,
        seed=seed,
    )  # fmt: skip
    options = {"model": model, **settings.recorded(), "induction_heads": induction_class(heads), "seed": seed}
    check_save(save, "retrieval", options)
    loaded = load(model)
    keyed = check_save(save, "retrieval", options, loaded)
    stages = ([INDUCTION_HEADS_STAGE] if heads is None else []) + list(RETRIEVAL_STAGES)
    try:
        with stage_bars("retrieval", stages) as progress:
            result = find_retrieval_circuit(loaded, settings, induction_heads=heads, progress=progress)
    except ValueError as error:
        raise fail(str(error)) from error
    result.provenance = with_note(result.provenance, quick_note)
    write_retrieval_report(result, format, out, console)
    save_and_tell(result, out, save, "retrieval", keyed)


@app.command(epilog=EXAMPLES["hop"])
def hop(
    model: str = typer.Option(..., help="A checkpoint of `interp train --task hop --hops K`."),
    n_sequences: int = typer.Option(
        256, min=8, help="Task sequences: half choose each hop's heads, half test them."
    ),
    min_attention: float = typer.Option(
        0.3, min=0.0, max=1.0, help="The query's attention to a hop's occurrence or target that a head needs."
    ),
    n_random: int = typer.Option(
        8, min=1, help="Random same-layer head sets to compare each hop's heads with."
    ),
    seed: int = typer.Option(
        0, min=0, help="Seed of the sequences (the eval stream), the random sets and the bootstrap."
    ),
    format: str = typer.Option("table", help="table, json, markdown or html."),
    out: str | None = typer.Option(None, help="Write the report to this file instead of the terminal."),
    plot: str | None = typer.Option(None, help="Also draw the lookup chain (.png, .svg, .pdf)."),
    save: str | None = typer.Option(None, help=SAVE_HELP),
) -> None:
    """Function composition as iterated induction: the heads that make each lookup of the k-hop task.

    For each hop, the heads that attend from the query to that hop's occurrence or target and whose
    output there the answer needs (mean ablation), chosen on half the sequences and tested on the
    other half against random heads of the same layers.
    """
    check_model(model)
    from circuits.hop import hop_report, lookup_chain_figure, write_hop_report
    from circuits.hop.locate import HOP_STAGES
    from circuits.hop.report import FORMATS

    check_format(format, out, FORMATS)
    if n_sequences % 2:
        raise fail(f"--n-sequences must be even (half discovery, half held out), got {n_sequences}.")
    if min_attention <= 0:
        raise fail(f"--min-attention must be > 0, got {min_attention}.")
    check_plot(plot)
    options = {
        "model": model, "n_sequences": n_sequences, "min_attention": min_attention, "n_random": n_random,
        "seed": seed,
    }  # fmt: skip
    check_save(save, "hop", options)
    loaded = load(model)
    keyed = check_save(save, "hop", options, loaded)
    try:
        with stage_bars("hop", HOP_STAGES) as progress:
            result = hop_report(loaded, n_sequences, seed, min_attention, n_random, progress)
        if plot is not None:
            lookup_chain_figure(result, plot)
    except (ValueError, ImportError) as error:
        raise fail(str(error)) from error
    write_hop_report(result, format, out, console)
    if plot is not None:
        console.print(f"Wrote {plot}", style="dim")
    save_and_tell(result, out, save, "hop", keyed)


def _heads_option(text: str) -> list[tuple[int, int]]:
    """--induction-heads: "L17H3,L19H0", "none", or a saved head report (its confirmed induction heads)."""
    import re

    if text.strip().lower() == "none":
        return []
    if text.endswith(".json"):
        from circuits.heads import HeadReport
        from circuits.results_file import load_result

        try:
            report = load_result(text)
        except (ValueError, FileNotFoundError) as error:
            raise fail(str(error)) from error
        if not isinstance(report, HeadReport):
            raise fail(f"{text} holds no head report; write one with: interp heads --save {text}")
        return report.heads_of_type("induction")
    labels = [label.strip() for label in text.split(",") if label.strip()]
    parsed = [re.fullmatch(r"L(\d+)H(\d+)", label, flags=re.IGNORECASE) for label in labels]
    if not labels or not all(parsed):
        raise fail(f'--induction-heads {text!r}: give heads as "L17H3,L19H0", a heads.json, or "none".')
    return [(int(match[1]), int(match[2])) for match in parsed]


@app.command(epilog=EXAMPLES["render"])
def render(
    result: str = typer.Argument(..., help="A result file written by a command's --save FILE.json."),
    format: str = typer.Option("table", help="table, csv, json, markdown or html (as the command offers)."),
    out: str | None = typer.Option(None, help="Write the report to this file instead of the terminal."),
) -> None:
    """Render a saved result again in another format, without recomputing it."""
    if not Path(result).is_file():
        raise fail(f"no result file {result}; write one with a command's --save FILE.json.")
    from circuits.results_file import load_result, result_formats, write_result_report

    try:
        loaded = load_result(result)
        check_format(format, out, result_formats(loaded))
        write_result_report(loaded, format, out, console)
    except (ValueError, FileNotFoundError) as error:
        raise fail(str(error)) from error
    if out is not None:
        console.print(f"Wrote {out}", style="dim")
