"""The `interp` command line: each command parses its options, builds the settings of one library
function (they check themselves before any model loads) and runs it through `circuits.command.Command`,
the skeleton every analysis shares (model, progress, --quick, --save and resume, formats, errors)."""

from __future__ import annotations

import os
from importlib.metadata import version
from pathlib import Path
from typing import Literal

import typer

import circuits.command as skeleton
import interp
import interp.catalog as catalog
from circuits.command import Command, check_heads_file, console, fail, induction_class, refused
from interp.catalog import COMPONENTS, DEFAULT_HOPS, DTYPES, TASK_DEFAULTS, TASKS
from interp.runtime.memory import keep_freed_memory

EXAMPLES = {command: skeleton.help_epilog(command) for command in skeleton.COMMAND_EXAMPLES}  # --help ends
# fmt: off
app, opt = typer.Typer(no_args_is_help=True), typer.Option  # opt: the options below, one a line


def _print_version(value: bool) -> None:
    if value:
        console.print(f"interp {version('interp')}")
        raise typer.Exit()


@app.callback(epilog="Example: interp heads --model smollm2-135m")
def _root(show_version: bool = opt(False, "--version", callback=_print_version, is_eager=True,
                                   help="Print the version and exit.")) -> None:
    """Mechanistic interpretability reports for transformer language models."""
    if os.environ.get("INTERP_RETURN_FREED_MEMORY") != "1":
        keep_freed_memory(True)  # the command's choice of allocator policy (see interp.runtime.memory)


SAVE_HELP = ("Also write the full result to this .json file; `interp render` re-renders it in any format. A "
             "file there of another run (other options or weights) is refused, not replaced.")
KEPT_SAVE_HELP = SAVE_HELP + (" Each stage is written to it as it finishes: a stopped run leaves the stages "
                              "done (`interp render` shows them), and the same command with the same --save "
                              "resumes from them.")
QUICK_HELP = {command: preset.text() for command, preset in catalog.QUICK_PRESETS.items()}
RAY_HELP = 'Run on a Ray cluster: "local" starts one here, else its address ("auto", "ray://host:10001").'
HEADS_HELP = ('"L17H3,L19H0", a result of `interp heads --save`, or "none" (default: the heads interp heads '
              "confirms, cached after the first run).")
# The options most commands share (typer reads each as a description, so one serves every command).
MODEL = opt(catalog.DEFAULT_MODEL, help=f"A short name ({', '.join(catalog.OFFLINE_MODEL_NAMES)}), a "
        f"transformers id, a directory or a .gguf file.")
OUT = opt(None, help="Write the report to this file instead of the terminal.")
FORMAT = opt("table", help="table, json, markdown or html.")
FORMAT_CSV = opt("table", help="table, csv, json, markdown or html.")
SAVE, KEPT_SAVE = opt(None, help=SAVE_HELP), opt(None, help=KEPT_SAVE_HELP)


def listed(text: str | None) -> list[str] | None:
    """A comma-separated option's names, in order (None when not given)."""
    return None if text is None else [name.strip() for name in text.split(",") if name.strip()]


@app.command(epilog=EXAMPLES["info"])
def info(model: str = MODEL) -> None:
    """Summarise a model and its five most probable next tokens on an IOI prompt."""
    skeleton.check_model(model)
    loaded = skeleton.load(model)
    cfg, n = loaded.cfg, interp.parameter_count(loaded)
    console.print(
        f"[bold]{cfg.model_name}[/bold] ({cfg.architecture}): {cfg.n_layers} layers, {cfg.n_heads} heads "
        f"({cfg.n_kv_heads} key/value), d_model {cfg.d_model}, "
        f"{'attention only' if cfg.attn_only else f'd_mlp {cfg.d_mlp}'}, vocab {cfg.d_vocab}, context "
        f"{cfg.n_ctx}, " + (f"{n / 1e6:.1f}M parameters" if n >= 1e6 else f"{n:,} parameters"))
    if loaded.tokenizer is None:
        return console.print("No tokenizer (it reads token ids), so no prediction on an IOI prompt.")
    prompt = "When Mary and John went to the store, John gave a drink to"
    top = loaded(prompt)[0, -1].float().softmax(-1).topk(5)
    guesses = ", ".join(
        f"{loaded.to_string(i[None])!r} (p {v:.2f})" for v, i in zip(top.values, top.indices, strict=True)
    )
    console.print(f"{prompt!r} -> {guesses}")


@app.command(epilog=EXAMPLES["heads"])
def heads(
    ctx: typer.Context, model: str = MODEL, format: str = FORMAT_CSV, out: str | None = OUT,
    seed: int = opt(0, min=0, help="Seed of the random probe sequences."),
    n_samples: int = opt(16, min=2, help="Random sequences per probe (repeat length) to score and ablate "
            "on."),
    wide: bool = opt(False, "--wide", help="Every score column in the terminal table (the default on a "
            "terminal wide enough for it)."),
    all_heads: bool = opt(False, "--all", help="Every typed head in the terminal table, not only those "
            "confirmed by ablation."),
    ray: str | None = opt(None, help=RAY_HELP), save: str | None = KEPT_SAVE,
    dtype: Literal[DTYPES] = opt("float32", help="Load the model in this dtype. bfloat16 runs faster on CPUs "
            "with bf16 units (on one with AMX, SmolLM2's report took 17 s instead of 43 s) and slower on "
            "CPUs without; it changes the numbers slightly (the report's model line says which dtype ran)."),
    quick: bool = opt(False, "--quick", help=QUICK_HELP["heads"]),
) -> None:
    """Find previous-token, induction, fixed-offset, skip-gram ... heads, with causal checks."""
    skeleton.check_table_only(format, wide=wide, all=all_heads)
    command = Command("heads", model, format, out, save)
    from circuits.heads import head_report, remember_induction_heads
    from circuits.heads.pipeline import BETWEEN_STAGES, KEPT_STAGES, heads_stage_notes
    from circuits.heads.probes import HELD_OUT_RULE
    from circuits.quick import heads_note
    from circuits.sweeps import run_on_ray
    n_samples, _ = command.quick(quick, ctx, lambda s: heads_note(s["n_samples"]), n_samples=n_samples)
    options = dict(model=model, n_samples=n_samples, seed=seed, dtype=dtype, held_out=HELD_OUT_RULE)
    def analyse(loaded, progress, kept):
        if ray is not None:
            return run_on_ray(head_report, model, ray, dtype=dtype, n_samples=n_samples, seed=seed)
        report = head_report(loaded, n_samples=n_samples, seed=seed, progress=progress, stages=kept)
        remember_induction_heads(loaded, report, n_samples, seed)  # what interp icl, retrieval reuse
        return report

    command.run(options, analyse, KEPT_STAGES, BETWEEN_STAGES, heads_stage_notes, dtype, ray is not None,
                wide=wide or None, all_heads=all_heads)


@app.command(epilog=EXAMPLES["train"])
def train(
    task: Literal[TASKS] = opt(..., help="The synthetic task."),
    layers: int | None = opt(None, min=1, help=f"Number of layers (default: 2; hop: one more than --hops, "
            f"{DEFAULT_HOPS + 1} for {DEFAULT_HOPS})."),
    heads: int = opt(4, min=1, help="Attention heads per layer."),
    d_model: int = opt(64, min=1, help="Residual stream width (a multiple of --heads)."),
    attn_only: bool | None = opt(None, "--attn-only/--with-mlps", help="Attention-only or with MLPs "
            "(default: attention-only)."),
    steps: int | None = opt(None, min=1, help="Optimizer steps (default: " + ", ".join(
            f"{task} {defaults.steps}" for task, defaults in TASK_DEFAULTS.items())
            + "; hop stops early once its eval accuracy plateaus at 0.9 or more)."),
    out: str = opt(..., help="Output directory; interp.load_model(OUT) loads it."),
    seed: int = opt(0, min=0, help="Seed of the initial weights and the data."),
    lr: float | None = opt(None, help="Peak learning rate, warm-up and cosine decay (default: " + ", ".join(
                           f"{task} {defaults.lr:g}" for task, defaults in TASK_DEFAULTS.items()) + ")."),
    batch_size: int = opt(32, min=1, help="Sequences per step."),
    seq_len: int | None = opt(None, min=5, help="Tokens per sequence (= n_ctx); induction 48, markov 64, hop "
            "32; not for ioi."),
    d_vocab: int | None = opt(None, min=2, help="Vocabulary (induction 64; hop 9: BOS and 8 symbols) or "
            "Markov states (3); not for ioi."),
    positional: Literal["learned", "rotary", "none"] = opt("learned", help="Position encoding."),
    checkpoint_every: int = opt(catalog.CHECKPOINT_EVERY, min=0, help="Checkpoint every N steps (0: only the "
            "last); Ctrl-C saves one too."),
    name: str | None = opt(None, help="The model's name in reports (default: OUT's name)."),
    hops: int | None = opt(None, min=1, help=f"The hop task's successive induction lookups per answer "
            f"(default {DEFAULT_HOPS}); only with --task hop."),
) -> None:
    """Train a toy transformer on a synthetic task and write a checkpoint directory.

    With the defaults each task shows its phenomenon: induction heads that `interp heads` confirms,
    the toy IOI circuit that `interp ioi` finds, Markov chains predicted as well as by the in-context
    bigram statistics (the final line compares the two losses), the hop task's answers well above
    chance (held-out accuracy ~0.8 for 2 hops on 3 layers, chance 1/6; 1.0 for 1 hop on 2 layers,
    which stops early). Running the same command again resumes from the last checkpoint (after
    Ctrl-C too).
    """
    import interp.training as training
    with refused():
        settings = training.ToyModelSettings(
            task=task, n_layers=layers, n_heads=heads, d_model=d_model, steps=steps, attn_only=attn_only,
            seed=seed, lr=lr, batch_size=batch_size, seq_len=seq_len, d_vocab=d_vocab, positional=positional,
            hops=hops, name=name)
    skeleton.refuse_unwritable(out, "--out", directory=True)
    try:
        with refused(errors=(ValueError,)), skeleton.stage_bars("train", [training.TRAIN_STAGE]) as progress:
            model, log = training.train_toy_model(
                settings, out, checkpoint_every=checkpoint_every, progress=progress)
    except KeyboardInterrupt:  # the library's log says which step it saved, if any (stderr)
        raise typer.Exit(130) from None
    line, warning = training.training_summary(model, log)
    console.print(f"{line} Wrote {out}" + ("" if warning is None else f"\n[yellow]{warning}[/yellow]"))


@app.command(epilog=EXAMPLES["ioi"])
def ioi(
    ctx: typer.Context, model: str = MODEL,
    n_prompts: int = opt(64, min=8, help="IOI prompts (the first 16 are used for path "
            "patching); as many held out."),
    seed: int = opt(0, min=0, help="Seed of the IOI dataset."),
    format: str = FORMAT, out: str | None = OUT, ray: str | None = opt(None, help=RAY_HELP),
    save: str | None = KEPT_SAVE, quick: bool = opt(False, "--quick", help=QUICK_HELP["ioi"]),
) -> None:
    """Find the IOI circuit (Wang et al. 2022) by path patching, and evaluate it."""
    command = Command("ioi", model, format, out, save)
    from circuits.ioi import find_ioi_circuit
    from circuits.ioi.discover import BETWEEN_STAGES, KEPT_STAGES, check_sizes, ioi_stage_notes
    from circuits.quick import ioi_note
    from circuits.sweeps import run_on_ray
    n_prompts, _ = command.quick(quick, ctx, lambda sizes: ioi_note(sizes["n_prompts"]), n_prompts=n_prompts)
    def analyse(loaded, progress, kept):
        if ray is not None:
            return run_on_ray(find_ioi_circuit, model, ray, n_prompts=n_prompts, seed=seed)
        return find_ioi_circuit(loaded, n_prompts=n_prompts, seed=seed, progress=progress, stages=kept)

    command.run(dict(model=model, n_prompts=n_prompts, seed=seed), analyse, KEPT_STAGES, BETWEEN_STAGES,
                ioi_stage_notes, remote=ray is not None, prepare=lambda m: check_sizes(m, n_prompts, seed))


@app.command(epilog=EXAMPLES["patch"])
def patch(
    ctx: typer.Context, model: str = MODEL,
    component: Literal[COMPONENTS] = opt("z", help="resid_pre/mid/post, attn_out, mlp_out, or per head z, "
            "result, q, k, v, pattern."),
    direction: Literal["denoise", "noise"] = opt("denoise", help="denoise (corrupted run, clean activations) "
            "or noise."),
    pairs: str | None = opt(None, help="Your own prompt pairs: a .csv/.jsonl file as `interp circuit --task` "
            "reads (default: IOI)."),
    n_prompts: int = opt(8, min=1, help="IOI prompts; the corrupted prompts use three other names (ABC)."),
    seed: int = opt(0, min=0, help="Seed of the IOI dataset."),
    top: int = opt(10, min=1, help="Rows to show; csv and json hold every patch."),
    format: str = FORMAT_CSV, out: str | None = OUT, save: str | None = SAVE,
) -> None:
    """Activation patching on IOI prompts or your own pairs.

    The metric is the normalised logit difference: 0 = the corrupted run, 1 = the clean run.
    """
    ioi_only = [option for option in ("n_prompts", "seed") if skeleton.given(ctx, option)]  # --pairs: refused
    files = [] if pairs is None else [lambda: skeleton.check_pairs_file("--pairs", pairs, ioi_only=ioi_only)]
    command = Command("patch", model, format, out, save, files=files, inputs={"--pairs": pairs})
    from circuits.patch_report import ioi_patching, pairs_patching
    options = dict(model=model, component=component, direction=direction, pairs=pairs, n_prompts=n_prompts,
                   pairs_file=None if pairs is None else skeleton.file_digest(pairs), seed=seed)
    command.run(options, lambda loaded, progress, _: ioi_patching(
        loaded, component, direction, n_prompts, seed, top, progress) if pairs is None else pairs_patching(
        loaded, pairs, component, direction, top, progress), ["patched runs"])


@app.command(epilog=EXAMPLES["circuit"])
def circuit(
    ctx: typer.Context, model: str = MODEL,
    task: str = opt("ioi", help="ioi, induction, or a .csv/.jsonl file of prompt pairs (columns clean, "
            "corrupted, correct, incorrect; optional family, stratum, pos:NAME)."),
    method: str = opt("prune", help="prune (a learned edge mask, started from eap-ig's ranks: the fewest "
            "edges for a faithful circuit in docs/results/circuits.md), eap, eap-ig (over inputs; seconds "
            "where prune takes minutes), eap-ig-activations (the reference code's), "
            "eap-ig-activations-grouped, exact (small models) or ensemble (eap-ig and prune's ranks "
            "averaged)."),
    edges: int | None = opt(None, "--edges", min=1, help="Circuit size in edges (or --fraction; neither: the "
            "smallest reaching --target)."),
    fraction: float | None = opt(None, help="Circuit size as a fraction of all edges."),
    target: float = opt(0.8, help="Without --edges/--fraction: the faithfulness the circuit must reach."),
    steps: int = opt(5, min=1, help="Integrated-gradient steps (eap-ig)."),
    ig_points: str | None = opt(None, help="EAP-IG's points over inputs: paper (alpha = k/m, k = 1..m) or "
            "mib (k = 0..m-1, the reference code's and MIB's). Default: mib with --mib-out, else paper."),
    max_memory: str | None = opt(None, help="Memory budget of the edge scores (e.g. 2GiB): picks how many "
            "prompts run at once."),
    ablation: str = opt("counterfactual", help="counterfactual (the corrupted prompt), mean or zero."),
    bootstrap: int = opt(0, help="Resamples of the prompts for each edge's selection frequency (0: not "
            "measured)."),
    prune_steps: int = opt(catalog.PRUNE_STEPS, help="Training steps of the edge mask (prune, ensemble)."),
    density: float | None = opt(None, help="The fraction of edges the mask keeps (prune, ensemble); default: "
            "the circuit's size (--edges, --fraction), else 0.02."),
    checkpoint: str | None = opt(None, help="The edge mask's checkpoint file: written as it trains, resumed "
            "from (prune, ensemble)."),
    metric: str = opt("logit_diff", help="logit_diff or prob (prompt-pair files)."),
    n_prompts: int = opt(64, min=1, help="Prompt pairs (ioi, induction) that find the circuit, and as many "
            "held-out ones that test it."),
    seed: int = opt(0, help="Seed of the prompts, the held-out families (or prompts) when none are named, "
            "the edge mask's prompt order and the random circuits and resamples."),
    heldout_families: str | None = opt(None, help="With a prompt-pair file: the families (its family column) "
            "held out to test the circuit and the head classes, comma-separated (default: half of them, "
            "drawn with --seed); a head class needs 4 or more for a verdict."),
    curve: bool = opt(False, help="Also measure the faithfulness curve (MIB's 10 sizes, top |score|, top "
            "signed and random circuits: up to 28 more edge-level runs, several times the scores' time) and "
            "CPR/CMD."),
    format: str = FORMAT, out: str | None = OUT,
    mib_out: str | None = opt(None, help="Also write the circuit in MIB's submission format (JSON), found on "
            "MIB's graph: a key and a value input per query head (interp.ungrouped)."),
    save: str | None = SAVE, quick: bool = opt(False, "--quick", help=QUICK_HELP["circuit"]),
) -> None:
    """Find an edge circuit (EAP, EAP-IG, a learned mask or their ensemble), and measure its faithfulness.

    The circuit is found on discovery prompts and its faithfulness measured on held-out ones: IOI's
    held-out templates and names, fresh induction sequences, or a prompt-pair file's held-out families
    (its `family` column; --heldout-families names them), else held-out prompts of it.
    """
    is_file = bool(Path(task).suffix)
    files = [lambda: skeleton.check_pairs_file("--task", task, metric)] if is_file else []
    inputs = {"--task": task if is_file else None, "--checkpoint": checkpoint}  # the mask's: read and written
    outputs = {"--mib-out": mib_out}
    command = Command("circuit", model, format, out, save, files=files, inputs=inputs, outputs=outputs)
    skeleton.check_method_options(ctx, method, checkpoint, is_file)
    from circuits.edge_circuits import EdgeCircuitSettings
    from circuits.edge_circuits.run import CircuitTask, circuit_prompts, run_circuit
    from interp.edges import MIB_FRACTIONS
    n_prompts, prune_steps, sizes = command.quick(quick, ctx, n_prompts=n_prompts, prune_steps=prune_steps)
    heldout = None if heldout_families is None else tuple(dict.fromkeys(listed(heldout_families)))
    with refused():
        circuit_task = CircuitTask(task=task, n_prompts=n_prompts, metric=metric, heldout_families=heldout)
        settings = EdgeCircuitSettings(
            method=method, n_edges=edges, fraction=fraction, target=target, steps=steps,
            ig_points=ig_points or ("mib" if mib_out is not None and method == "eap-ig" else "paper"),
            ablation=ablation, max_memory=max_memory, curve_fractions=MIB_FRACTIONS if curve else None,
            bootstrap=bootstrap, prune_steps=prune_steps, density=density, seed=seed)
    options = dict(model=model, task=task, task_file=skeleton.file_digest(task) if is_file else None,
                   method=method, edges=edges, fraction=fraction, target=target, steps=steps, curve=curve,
                   ig_points=settings.ig_points, ablation=ablation, bootstrap=bootstrap, seed=seed,
                   prune_steps=prune_steps, density=density, metric=metric, n_prompts=n_prompts,
                   heldout_families=heldout, graph="model" if mib_out is None else "mib")
    command.tell(circuit_task.heads_note())
    def prepare(loaded):  # the prompts, checked before the stages start; --quick says their split's sizes
        prompts = circuit_prompts(loaded, circuit_task, settings)
        command.say(prompts.quick_note(sizes, settings) if sizes else None)
        return prompts

    command.run(options, lambda prompts, progress, _: run_circuit(prompts, settings, checkpoint, mib_out,
                progress), circuit_task.stages(settings), prepare=prepare)


@app.command(epilog=EXAMPLES["icl"])
def icl(
    ctx: typer.Context, model: str = MODEL,
    n_documents: int | None = opt(None, min=4, help="Documents (Brown corpus texts; a toy model's task "
            "sequences): --n-discovery rank the heads, the rest are held out and scored (default 60; with "
            "--fv 8, for the ICL score of the ablations)."),
    n_discovery: int = opt(12, min=2, help="Documents that rank the heads (at most half of them); the others "
            "test."),
    n_ablated: int = opt(12, min=2, help="Held-out documents the exact ablations run on (at most all of them;"
            " each costs ~6 forward passes)."),
    early: int | None = opt(None, min=1, help="Centre of the early window (default: token 50 on text)."),
    late: int | None = opt(None, min=2, help="Centre of the late window (default: token 500 on text)."),
    window: int | None = opt(None, min=1, help="Tokens averaged around each (default 51 on text; 1: Olsson "
            "et al.'s single tokens)."),
    ablation: Literal["mean", "zero", "resample"] = opt("mean", help="mean (over every position of the "
            "documents), zero or resample (another document's)."),
    induction_heads: str | None = opt(None, help="The class to test: " + HEADS_HELP),
    top: int = opt(3, min=0, help="Top heads by attribution, each tested alone by exact ablation."),
    n_random: int = opt(4, min=1, help="Random same-layer head sets to compare each class with."),
    seed: int = opt(0, min=0, help="Seed of the documents, the random sets and the bootstrap."),
    format: str = FORMAT, out: str | None = OUT,
    plot: str | None = opt(None, help="Also draw a figure (.png, .svg, .pdf): a training run across its "
            "steps, else loss per token."),
    save: str | None = KEPT_SAVE,
    fv: bool = opt(False, "--fv", help="Function-vector heads (Todd et al.) on word-pair tasks instead, "
            "beside the induction heads."),
    tasks: str | None = opt(None, help="With --fv: the word-pair tasks, the families (default: all twenty of "
            "interp's)."),
    heldout_tasks: str | None = opt(None, help="With --fv: the tasks that test; the others choose the heads "
            "and the layer (default: half of them, drawn with --seed)."),
    heldout_templates: str | None = opt(None, help="With --fv: the prompt templates that test (of qa, "
            "input_output, arrow, colon): the held-out tasks are tested in them, the discovery tasks in the "
            "others choose (default: half, by --seed)."),
    n_prompts: int = opt(8, min=2, help="With --fv: few-shot prompts per task, template and half."),
    n_shots: int = opt(5, min=2, help="With --fv: solved examples per prompt."),
    fv_heads: int = opt(10, min=1, help="With --fv: the top heads by AIE the vector sums."),
    candidates: int = opt(30, min=1, help="With --fv: heads whose AIE is computed exactly (the top by "
            "attribution; 270: all)."),
    quick: bool = opt(False, "--quick", help=QUICK_HELP["icl"] + " Not with --fv."),
) -> None:
    """The in-context learning score (late minus early loss) and the heads that carry it.

    Every head is ranked by attribution on half the documents; the top heads (each alone) and the induction
    heads are tested against random heads of the same layers by exact ablation on the other half. For
    a training run's directory, also the score and the induction scores at each checkpoint. With
    --fv: function-vector heads by their average indirect effect on word-pair tasks, the function
    vector added to zero-shot prompts, and which ablation (FV or induction heads) lowers few-shot
    accuracy and which the ICL score, all tested on held-out pairs against random heads.
    """
    files, inputs = [lambda: check_heads_file(induction_heads)], {"--induction-heads": induction_heads}
    name = "icl --fv" if fv else "icl"
    command = Command(name, model, format, out, save, files=files, inputs=inputs, plot=plot)
    heads = command.induction_heads(induction_heads)
    if fv and quick:
        raise fail("--quick applies to the ICL score, not to --fv (give --n-prompts, --candidates instead).")
    skeleton.check_icl_mode_options(ctx, fv)
    if fv:
        from circuits.icl import FunctionVectorSettings, function_vector_report
        from circuits.icl.fv_pipeline import MEANS_STAGE, function_vector_stages, fv_stage_notes
        from interp.tasks.icl_tasks import ICL_TASKS
        with refused():
            settings = FunctionVectorSettings(
                tasks=tuple(ICL_TASKS) if tasks is None else listed(tasks),
                heldout_tasks=listed(heldout_tasks),
                n_prompts=n_prompts, n_shots=n_shots, top=fv_heads, candidates=candidates, n_random=n_random,
                n_documents=n_documents or 8, seed=seed, heldout_templates=listed(heldout_templates))
        options = dict(model=model, tasks=settings.task_names, heldout_tasks=listed(heldout_tasks), seed=seed,
                       n_prompts=n_prompts, n_shots=n_shots, fv_heads=fv_heads, candidates=candidates,
                       n_random=n_random, n_documents=n_documents or 8,
                       induction_heads=induction_class(heads),
                       heldout_templates=listed(heldout_templates))
        command.run(options, lambda loaded, progress, kept: function_vector_report(
            loaded, settings, induction_heads=heads, progress=progress, stages=kept),
            function_vector_stages(find_induction_heads=heads is None), (MEANS_STAGE,), fv_stage_notes)
        return
    from circuits.icl import DocumentSplit, ICLSettings, Windows, icl_analysis, training_run
    from circuits.icl.pipeline import CHECKPOINTS_STAGE, icl_report_stages, icl_stage_notes
    from circuits.quick import icl_sizes_note
    default = ICLSettings().n_documents
    n_documents, n_discovery, n_ablated, _ = command.quick(
        quick, ctx, lambda sizes: icl_sizes_note(sizes, DocumentSplit, default), n_documents=n_documents,
        n_discovery=n_discovery, n_ablated=n_ablated)
    n_documents = default if n_documents is None else n_documents
    with refused():
        settings = ICLSettings(
            n_documents=n_documents, split=DocumentSplit(n_discovery, n_ablated), ablation=ablation, top=top,
            windows=None if None in (early, late, window) else Windows(early, late, window),
            n_random=n_random, seed=seed)
    options = {"model": model, "n_documents": n_documents, "n_discovery": n_discovery, "n_ablated": n_ablated,
               "windows": [early, late, window], "ablation": ablation, "top": top, "n_random": n_random,
               "induction_heads": induction_class(heads), "seed": seed}
    command.run(options, lambda loaded, progress, kept: icl_analysis(
        loaded, settings, (early, late, window), model, heads, plot, progress, kept),
        icl_report_stages(find_induction_heads=heads is None),
        [CHECKPOINTS_STAGE] if training_run(model) is not None else [], icl_stage_notes)


@app.command(epilog=EXAMPLES["retrieval"])
def retrieval(
    ctx: typer.Context, model: str = MODEL,
    n_prompts: int = opt(24, min=2, help="Discovery prompts (4 facts each) that find the heads."),
    n_heldout: int = opt(24, min=2, help="Held-out prompts per fact count (2, 3, 6, 8) and template that "
            "test them."),
    n_exact: int = opt(12, min=0, help="Senders path-patched exactly per step (and any EAP rates large)."),
    n_random: int = opt(4, min=1, help="Random same-layer head sets to compare each class with."),
    n_two_hop: int = opt(40, min=2, help="Two-hop prompts per query form (measured only)."),
    induction_heads: str | None = opt(None, help="The induction heads to compare with: " + HEADS_HELP),
    seed: int = opt(0, min=0, help="Seed of the prompts, the random sets and the bootstrap."),
    format: str = FORMAT, out: str | None = OUT, save: str | None = SAVE,
    quick: bool = opt(False, "--quick", help=QUICK_HELP["retrieval"]),
) -> None:
    """Retrieval from context: the heads that answer "The pet of John is" from facts stated before it.

    Heads are found on discovery prompts by path patching (EAP-ranked) and classed by where the last
    token attends; each class's drop (clean - ablated) beyond random heads is measured on held-out
    relations, names, fact counts and templates (beside the discovery prompts' figure), with the
    overlap with the induction heads of `interp heads`. Two-hop prompts are measured.
    """
    files, inputs = [lambda: check_heads_file(induction_heads)], {"--induction-heads": induction_heads}
    command = Command("retrieval", model, format, out, save, files=files, inputs=inputs)
    from circuits.heads.cache import INDUCTION_HEADS_STAGE
    from circuits.quick import retrieval_note
    from circuits.retrieval import RetrievalSettings, find_retrieval_circuit
    from circuits.retrieval.find import RETRIEVAL_STAGES
    heads = command.induction_heads(induction_heads)
    n_prompts, n_heldout, n_exact, n_two_hop, _ = command.quick(
        quick, ctx, retrieval_note, n_prompts=n_prompts, n_heldout=n_heldout, n_exact=n_exact,
        n_two_hop=n_two_hop)
    with refused():
        settings = RetrievalSettings(n_prompts=n_prompts, n_heldout=n_heldout, n_exact=n_exact,
                                     n_random=n_random, n_two_hop=n_two_hop, seed=seed)
    options = {"model": model, **settings.recorded(), "induction_heads": induction_class(heads), "seed": seed}
    command.run(options, lambda loaded, progress, _: find_retrieval_circuit(
        loaded, settings, induction_heads=heads, progress=progress),
        [INDUCTION_HEADS_STAGE] * (heads is None) + list(RETRIEVAL_STAGES))


@app.command(epilog=EXAMPLES["hop"])
def hop(
    model: str = opt(..., help="A checkpoint of `interp train --task hop --hops K`."),
    n_sequences: int = opt(256, min=8, help="Task sequences: half choose each hop's heads, half test them."),
    min_attention: float = opt(0.3, min=0.0, max=1.0, help="The query's attention to a hop's occurrence or "
            "target that a head needs."),
    n_random: int = opt(8, min=1, help="Random same-layer head sets to compare each hop's heads with."),
    seed: int = opt(0, min=0, help="Seed of the sequences (the eval stream), the random sets and the "
            "bootstrap."),
    format: str = FORMAT, out: str | None = OUT,
    plot: str | None = opt(None, help="Also draw the lookup chain (.png, .svg, "
            ".pdf)."), save: str | None = SAVE,
) -> None:
    """Function composition as iterated induction: the heads that make each lookup of the k-hop task.

    For each hop, the heads that attend from the query to that hop's occurrence or target and whose
    output there the answer needs (mean ablation), chosen on half the sequences and tested on the
    other half against random heads of the same layers.
    """
    command = Command("hop", model, format, out, save, plot=plot)
    from circuits.hop import hop_report, lookup_chain_figure
    from circuits.hop.locate import HOP_STAGES, HopSettings
    with refused():
        settings = HopSettings(n_sequences=n_sequences, seed=seed, min_attention=min_attention,
                               n_random=n_random)
    def analyse(loaded, progress, _):
        finding = hop_report(loaded, **vars(settings), progress=progress)
        if plot is not None:
            lookup_chain_figure(finding, plot)
        return finding

    command.run({"model": model, **vars(settings)}, analyse, HOP_STAGES)
# fmt: on


@app.command(epilog=EXAMPLES["render"])
def render(
    result: str = typer.Argument(..., help="A result file written by a command's --save FILE.json."),
    format: str = typer.Option("table", help="table, csv, json, markdown or html (as the command offers)."),
    out: str | None = OUT,
) -> None:
    """Render a saved result again in another format, without recomputing it."""
    if not Path(result).is_file():
        raise fail(f"no result file {result}; write one with a command's --save FILE.json.")
    from circuits.results_file import load_result, result_formats, write_result_report

    skeleton.refuse_shared_paths({"RESULT": result}, {"--out": out})
    with refused():
        loaded = load_result(result)
        skeleton.refuse_bad_format(format, out, result_formats(loaded))
        write_result_report(loaded, format, out, console)
    if out is not None:
        console.print(f"Wrote {out}", style="dim")
