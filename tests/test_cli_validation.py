"""Every number and choice of the CLI is checked before any model is loaded or trained."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from circuits.cli import app

PAIRS = Path(__file__).parents[1] / "docs" / "guide" / "data" / "agreement.csv"
AGREEMENT_FRAMES = [
    f"The N {frame} the M" for frame in ("near", "of", "behind", "with", "next to", "from", "above")
] + ["The N that the M saw"]
BAD_ARGUMENTS = [
    # (command line, what the error names)
    (["heads", "--n-samples", "1"], "--n-samples"),
    (["heads", "--seed", "-1"], "--seed"),
    (["heads", "--format", "pdf"], "unknown format 'pdf'"),
    (["ioi", "--n-prompts", "3"], "--n-prompts"),
    (["ioi", "--n-prompts", "0"], "--n-prompts"),
    (["ioi", "--seed", "-2"], "--seed"),
    (["train", "--task", "induction", "--layers", "0", "--out", "{out}"], "--layers"),
    (["train", "--task", "induction", "--heads", "0", "--out", "{out}"], "--heads"),
    (["train", "--task", "induction", "--steps", "0", "--out", "{out}"], "--steps"),
    (["train", "--task", "induction", "--steps", "-5", "--out", "{out}"], "--steps"),
    (["train", "--task", "induction", "--lr", "0", "--out", "{out}"], "--lr"),
    (["train", "--task", "induction", "--batch-size", "0", "--out", "{out}"], "--batch-size"),
    (["train", "--task", "induction", "--d-model", "30", "--out", "{out}"], "not a multiple of --heads"),
    (["train", "--task", "induction", "--seq-len", "3", "--out", "{out}"], "--seq-len"),
    (["train", "--task", "markov", "--d-vocab", "1", "--out", "{out}"], "--d-vocab"),
    (["train", "--task", "induction", "--positional", "alibi", "--out", "{out}"], "--positional"),
    (["train", "--task", "induction", "--checkpoint-every", "-1", "--out", "{out}"], "--checkpoint-every"),
    (["train", "--task", "sorting", "--out", "{out}"], "--task"),
    (["train", "--task", "ioi", "--d-vocab", "40", "--out", "{out}"], "drop --seq-len and --d-vocab"),
    (["train", "--task", "induction", "--out", "{file}"], "is a file"),
    (["train", "--task", "induction", "--out", "/sys/interp-run"], "/sys takes no new file"),
    (["heads", "--out", "/sys/heads.md"], "--out /sys/heads.md cannot be written: /sys takes no new file"),
    (["heads", "--out", "{file}/sub/heads.md"], "a-file is a file, not a directory"),
    (["patch", "--out", "{dir}"], "is a directory; pass a file path"),
    (["ioi", "--save", "/sys/ioi.json"], "--save /sys/ioi.json cannot be written"),
    (["icl", "--plot", "/sys/icl.png"], "--plot /sys/icl.png cannot be written"),
    (["hop", "--model", "toy-hop", "--plot", "{file}/sub/chain.png"], "a-file is a file, not a directory"),
    (["patch", "--component", "zz"], "--component"),
    (["patch", "--direction", "sideways"], "--direction"),
    (["patch", "--n-prompts", "0"], "--n-prompts"),
    (["patch", "--top", "0"], "--top"),
    (["circuit", "--max-memory", "lots"], "--max-memory: memory size 'lots' is not a size"),
    (["circuit", "--max-memory", "0GiB"], "--max-memory"),
    (["circuit", "--method", "exact", "--max-memory", "2GiB"], "--max-memory"),
    (["circuit", "--method", "eap-ig-activations", "--ig-points", "mib"], "--ig-points"),
    (["circuit", "--heldout-families", "template 1"], "--task ioi holds out its own"),
    (["circuit", "--model", "toy-ioi", "--task", "induction"], "21 tokens) do not fit toy-ioi's context"),
    (
        ["circuit", "--task", "{pairs}", "--heldout-families", "The N near the M,The N under the M"],
        "held-out families ['The N under the M'] are not among the task's families ['The N near the M', ",
    ),
    (["circuit", "--task", "{pairs}", "--heldout-families", ", "], "no held-out family named"),
    (["circuit", "--task", "{pairs}", "--heldout-families", ",".join(AGREEMENT_FRAMES)], "every family"),
    (["circuit", "--task", "{file}.csv", "--heldout-families", "a"], "has no family column"),
]


@pytest.mark.parametrize(
    ("arguments", "message"), BAD_ARGUMENTS, ids=lambda a: " ".join(a) if isinstance(a, list) else ""
)
def test_bad_arguments_are_refused_before_work_starts(arguments, message, tmp_path):
    file = tmp_path / "a-file"
    file.write_text("")
    (tmp_path / "a-file.csv").write_text("clean,corrupted,correct,incorrect\nA B,C B, A, C\n")
    out = tmp_path / "model"
    arguments = [a.format(out=out, file=file, dir=tmp_path, pairs=PAIRS) for a in arguments]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.replace("│", " ").split())  # as one line, unwrapped
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    assert not out.exists()  # nothing was trained or written


# (command line, what the error names): a file or an option refused before any model loads; {missing}
# is a path under the test's directory that does not exist, {empty} an existing directory with no model.
REFUSED_BEFORE_LOADING = [
    (["info", "--model", "{missing}"], "no such file or directory"),
    (["heads", "--model", "{missing}/model"], "no such file or directory"),
    (["ioi", "--model", "{empty}"], "holds neither an interp checkpoint nor a transformers model"),
    (["info", "--model", "{unfinished}"], "pass its last checkpoint, {unfinished}/checkpoints/step_000300"),
    (["hop", "--model", "{missing}.gguf"], "no such file or directory"),
    (["patch", "--pairs", "{missing}.csv"], "--pairs: No prompt-pair file at"),
    (["patch", "--model", "toy-ioi", "--pairs", "{headless}"], "pair 1 lacks clean, corrupted, correct"),
    (
        ["patch", "--model", "toy-ioi", "--pairs", "{no_incorrect}"],
        "every pair needs clean, corrupted, correct, incorrect.",
    ),
    (["circuit", "--task", "{missing}.csv"], "--task: No prompt-pair file at"),
    (["circuit", "--task", "{missing}.jsonl", "--model", "{missing}"], "no such file or directory"),
    (["circuit", "--task", "{headless}"], "pair 1 lacks clean, corrupted, correct, incorrect"),
    (
        ["circuit", "--task", "{copied}"],
        "1 pairs have the same clean and corrupted prompt (the first: pair 2)",
    ),
    (["patch", "--pairs", "{copied}"], "1 pairs have the same clean and corrupted prompt"),
    (["patch", "--pairs", "{pairs}", "--n-prompts", "8"], "--n-prompts choose IOI prompts, which --pairs"),
    (["patch", "--pairs", "{pairs}", "--seed", "3"], "--seed choose IOI prompts, which --pairs"),
    (["circuit", "--task", "{pairs}", "--metric", "p"], "metric='p' is not one of"),
    (["circuit", "--task", "iio"], "Unknown task 'iio'"),
    (["circuit", "--metric", "p"], "unknown metric 'p'"),
    (["circuit", "--metric", "prob"], "--metric prob applies to prompt-pair files"),
    (["icl", "--n-shots", "3", "--tasks", "antonym"], "--tasks, --n-shots: options of the function-vector"),
    (["circuit", "--task", "induction", "--metric", "prob"], "--task induction measures its own"),
    (["circuit", "--task", "{pairs}", "--n-prompts", "8"], "--n-prompts chooses IOI or induction prompts"),
    (["circuit", "--edges", "0"], "--edges"),
    (["circuit", "--fraction", "1.5"], "--fraction 1.5 must lie in (0, 1]"),
    (
        ["circuit", "--edges", "10", "--target", "0.9"],
        "--edges and --fraction give its size instead",
    ),  # ignored
    (["circuit", "--fraction", "0.2", "--target", "0.95"], "pass one of them or --target, not both"),
    (
        ["heads", "--wide", "--format", "json"],
        "--wide shape the terminal table; --format json holds",
    ),  # ignored
    (["heads", "--all", "--wide", "--format", "markdown"], "--wide and --all shape the terminal table"),
    (["circuit", "--mib-out", "/sys/mib.json"], "--mib-out /sys/mib.json cannot be written"),
    (["circuit", "--checkpoint", "/sys/mask.pt"], "--checkpoint /sys/mask.pt cannot be written"),
    (["circuit", "--checkpoint", "{headless}"], "is no edge-mask checkpoint (torch.load cannot read it"),
    (
        ["circuit", "--method", "eap-ig", "--checkpoint", "{empty}/mask.pt"],
        "--checkpoint is read by --method prune",
    ),
    (["circuit", "--method", "eap", "--density", "0.1"], "--density is read by --method prune or ensemble"),
    (["circuit", "--method", "eap-ig", "--prune-steps", "45"], "--prune-steps is read by --method prune or"),
    (
        ["circuit", "--method", "prune", "--steps", "5"],
        "--steps is read by --method eap-ig or eap-ig-activations",
    ),
    (
        ["circuit", "--method", "eap", "--ig-points", "mib"],
        "--ig-points is read by --method eap-ig or ensemble",
    ),
    (["circuit", "--task", "{onefamily}"], "its family column gives all 2 pairs one family ('only')"),
    (["icl", "--induction-heads", "{missing}.json"], "no such file; write one with: interp heads --save"),
    (["icl", "--fv", "--induction-heads", "{missing}.json"], "no such file; write one with"),
    (["retrieval", "--induction-heads", "{missing}.json"], "no such file; write one with"),
    (["render", "{missing}.json"], "no result file"),
    (
        ["patch", "--pairs", "{own}", "--format", "csv", "--out", "{own}"],
        "--out {own} is the file of --pairs",
    ),
    (["circuit", "--task", "{own}", "--mib-out", "{own}"], "--mib-out {own} is the file of --task"),
    (
        ["heads", "--format", "json", "--out", "{empty}/r.json", "--save", "{empty}/r.json"],
        "is the file of --out",
    ),
]


@pytest.mark.parametrize(
    ("arguments", "message"), REFUSED_BEFORE_LOADING, ids=lambda a: " ".join(a) if isinstance(a, list) else ""
)
def test_files_and_options_are_refused_before_a_model_loads(arguments, message, tmp_path, monkeypatch):
    """No model loads before the refusal (a load fails the test), and a missing file is refused before
    torch is imported (its import is most of the seconds before a model loads: the refusal comes in
    well under 2 s on a busy machine)."""
    import circuits.command as skeleton

    def load(model, dtype="float32"):
        raise AssertionError(f"{model} was loaded before the bad input was refused")

    monkeypatch.setattr(skeleton, "load", load)
    (tmp_path / "empty").mkdir()
    (tmp_path / "headless.csv").write_text("prompt,answer\nA B,A\n")
    (tmp_path / "copied.csv").write_text("clean,corrupted,correct,incorrect\nA B,A C, D, E\nA B,A B, D, E\n")
    (tmp_path / "no_incorrect.csv").write_text("clean,corrupted,correct\nA B,A C, D\n")
    for step in ("step_000100", "step_000300"):  # a training run stopped before its final save
        (tmp_path / "unfinished" / "checkpoints" / step).mkdir(parents=True)
        (tmp_path / "unfinished" / "checkpoints" / step / "config.json").write_text("{}")
    (tmp_path / "own.csv").write_bytes(PAIRS.read_bytes())  # a file a refusal must leave as it is
    (tmp_path / "onefamily.csv").write_text(
        "clean,corrupted,correct,incorrect,family\nA B,A C, D, E,only\nF B,F C, D, E,only\n"
    )
    names = {"missing": tmp_path / "missing", "empty": tmp_path / "empty",
             "headless": tmp_path / "headless.csv", "copied": tmp_path / "copied.csv",
             "pairs": PAIRS, "own": tmp_path / "own.csv",
             "onefamily": tmp_path / "onefamily.csv", "no_incorrect": tmp_path / "no_incorrect.csv",
             "unfinished": tmp_path / "unfinished"}  # fmt: skip
    arguments, message = [a.format(**names) for a in arguments], message.format(**names)
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 2, result.output
    unwrapped = "".join(result.output.replace("│", "").split())  # the console may wrap within a long path
    assert "".join(message.split()) in unwrapped
    assert "Traceback" not in result.output
    assert (tmp_path / "own.csv").read_bytes() == PAIRS.read_bytes()


# Each command line of REFUSED_BEFORE_LOADING that names a missing file, run in one fresh process.
MISSING_FILE_RUNS = """
import json, sys
from circuits.cli import app

statuses = []
for arguments in json.loads(sys.argv[1]):
    try:
        app(arguments)
    except SystemExit as stop:
        statuses.append(stop.code)
print(json.dumps({"statuses": statuses, "torch": "torch" in sys.modules}))
"""


def test_a_missing_file_is_refused_before_torch_is_imported(tmp_path):
    """The refusals of missing files need neither a model nor torch (whose import takes seconds on a
    busy machine): in a fresh process, every one exits with status 2 and torch is never imported."""
    import json
    import subprocess
    import sys

    runs = [
        [a.format(missing=tmp_path / "missing") for a in arguments]
        for arguments, _ in REFUSED_BEFORE_LOADING
        if any("{missing}" in a for a in arguments)
    ]
    assert len(runs) >= 10
    done = subprocess.run(
        [sys.executable, "-c", MISSING_FILE_RUNS, json.dumps(runs)],
        cwd=Path(__file__).parents[1], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    found = json.loads(done.stdout.splitlines()[-1])
    assert found == {"statuses": [2] * len(runs), "torch": False}, done.stdout


def test_an_unknown_model_is_a_one_line_error_on_stderr():
    """One line on stderr, so that `interp heads --format json > r.json` leaves no error in r.json."""
    result = CliRunner().invoke(app, ["heads", "--model", "no/such-model-here", "--format", "json"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.stdout == "" and len(errors) == 1 and "cannot load 'no/such-model-here'" in errors[0]


def test_version_and_examples_in_help():
    from importlib.metadata import version

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"interp {version('interp')}"
    for command in ("info", "heads", "train", "ioi", "patch", "circuit", "icl", "retrieval", "render"):
        text = CliRunner().invoke(app, [command, "--help"]).output
        assert f"interp {command} " in text.split("Examples:")[-1], command


def test_info_counts_parameters_as_the_model_card(smollm2, smollm2_hf) -> None:
    """Tied embeddings count once, as transformers (and the model card's "135M") count them."""
    from interp import parameter_count

    assert parameter_count(smollm2) == smollm2_hf.num_parameters()
    untied = sum(p.numel() for p in smollm2.parameters())
    assert untied - parameter_count(smollm2) == smollm2.W_U.numel()  # the model does tie them


def test_the_help_examples_on_toy_models_run(tmp_path, monkeypatch):
    """Every example of a command's --help that names a shipped toy model runs as printed (the files
    it writes land in a temporary directory)."""
    import shlex

    from circuits.cli import EXAMPLES

    monkeypatch.chdir(tmp_path)
    runs = [
        shlex.split(line.split("#")[0])[1:]
        for text in EXAMPLES.values()
        for line in text.splitlines()
        if line.strip().startswith("interp ") and "--model toy-" in line
    ]
    assert len(runs) >= 4
    for arguments in runs:
        result = CliRunner().invoke(app, arguments)
        assert result.exit_code == 0, f"interp {' '.join(arguments)}: {result.output[-500:]}"


def test_an_unfinished_head_report_is_refused_with_the_command_that_finishes_it(tmp_path):
    """--induction-heads naming a stopped `interp heads --save` run: the advice is the command that
    resumes it, with the options it was made with (not a bare `interp heads --save`, which its file
    would refuse)."""
    from circuits.results_file import PartialResult, save_result

    settings = {"model": "toy-induction", "n_samples": 400, "seed": 0, "dtype": "float32", "weights": "ab"}
    partial = PartialResult(command="heads", settings=settings, stages=["one", "two"], done={}, notes={})
    path = tmp_path / "heads.json"
    save_result(partial, path, "heads", settings)
    result = CliRunner().invoke(app, ["icl", "--model", "toy-induction", "--induction-heads", str(path)])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "holds an unfinished head report" in said, said
    advice = f"interp heads --model toy-induction --n-samples 400 --dtype float32 --save {path}"
    assert "".join(advice.split()) in "".join(said.split())  # the console wraps long paths anywhere


@pytest.mark.parametrize("command", ["icl", "retrieval"])
def test_another_model_s_head_report_is_refused_as_induction_heads(command, tmp_path, smollm2):
    """toy-induction's saved head report names heads of toy-induction: given to a run on SmolLM2 (the
    default model) it is refused once the model loads (its weights are not the report's), not used as
    SmolLM2's induction heads; SmolLM2's own report, given with the model named by its GGUF's path, is
    taken (the weights decide, not the name); one saved by an older interp is refused as such."""
    saved = Path(__file__).parents[1] / "docs" / "results" / "data" / "heads-toy-induction.json"
    result = CliRunner().invoke(app, [command, "--induction-heads", str(saved)])
    assert result.exit_code == 2, result.output
    assert "holds the head report of other weights than --model smollm2-135m's" in " ".join(
        result.output.split()
    )
    from circuits.command import Command
    from interp.io.sources import OFFLINE_MODELS

    own = Path(__file__).parents[1] / "docs" / "results" / "data" / "heads-smollm2-135m.json"
    by_path = Command(command, str(OFFLINE_MODELS["smollm2-135m"]()), "table", None, None)
    assert by_path.induction_heads(str(own))
    by_path._check_heads_file(smollm2)  # the same weights: nothing refused
    older = tmp_path / "older.json"  # as an interp that fingerprinted a sample of the weights saved it
    weights = json.loads(own.read_text())["settings"]["weights"]
    older.write_text(own.read_text().replace(weights, "f9ddfcb311ab6366"))
    result = CliRunner().invoke(app, [command, "--induction-heads", str(older)])
    assert result.exit_code == 2, result.output
    assert "was saved by an older interp, whose weights fingerprint cannot tell models apart" in " ".join(
        result.output.split()
    )


def test_running_out_of_memory_is_a_one_line_error():
    """An allocation no machine can make (2**60 bytes, past any address space) inside a command's work:
    one line saying what to ask for (exit status 2), not torch's traceback; other RuntimeErrors pass."""
    import torch
    import typer

    import circuits.command as skeleton

    with pytest.raises(typer.Exit) as stopped, skeleton.refused():
        torch.empty(2**60, dtype=torch.uint8)
    assert stopped.value.exit_code == 2
    with pytest.raises(RuntimeError, match="not about memory"), skeleton.refused():
        raise RuntimeError("not about memory")


def test_an_interp_cache_that_is_a_file_is_refused_before_loading(tmp_path, monkeypatch):
    """INTERP_CACHE naming a file: refused before the model loads (it failed after the work, with a
    traceback from the cache's first write)."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "a-file"))
    for command in (["info", "--model", "toy-ioi"], ["heads", "--model", "toy-induction", "--quick"]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert f"INTERP_CACHE {tmp_path / 'a-file'} is a file; pass a directory" in result.output


def test_more_toy_ioi_prompts_than_its_held_out_split_holds_are_refused_before_the_stages():
    """toy-ioi's held-out templates and names make at most 226 distinct balanced prompts: 300 is refused
    before path patching starts (it was refused at stage 6 of 7, after the discovery's work), and before
    the stages are announced (it announced seven stages, then refused)."""
    result = CliRunner().invoke(app, ["ioi", "--model", "toy-ioi", "--n-prompts", "300"])
    assert result.exit_code == 2, result.output
    assert "at most 226 are distinct" in result.output and "7 stages" not in result.output


def test_info_of_a_small_attention_only_model():
    """toy-induction has no MLPs and under a million parameters: info says so, not "d_mlp 256" and
    "0.0M parameters"."""
    import interp

    result = CliRunner().invoke(app, ["info", "--model", "toy-induction"])
    n, said = interp.parameter_count(interp.load_model("toy-induction")), " ".join(result.output.split())
    assert result.exit_code == 0 and "attention only" in said and f"{n:,} parameters" in said
    assert "No tokenizer (it reads token ids), so no prediction on an IOI prompt." in said  # not silent


def test_info_gives_the_five_most_probable_next_tokens(smollm2):
    """`interp info` names the five most probable next tokens with their probabilities (it printed
    logits, unlabelled, that read as probabilities)."""
    result = CliRunner().invoke(app, ["info", "--model", "smollm2-135m"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    probabilities = [float(p) for p in re.findall(r"\(p (\d\.\d\d)\)", said)]
    prompt = "When Mary and John went to the store, John gave a drink to"
    with torch.no_grad():
        expected = smollm2(prompt)[0, -1].float().softmax(-1).topk(5).values
    assert probabilities == [round(float(p), 2) for p in expected], said
