"""Every number and choice of the CLI is checked before any model is loaded or trained."""

from __future__ import annotations

from pathlib import Path

import pytest
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


def test_an_unknown_model_is_a_one_line_error():
    result = CliRunner().invoke(app, ["info", "--model", "no/such-model-here"])
    assert result.exit_code == 2 and "error:" in result.output and "Traceback" not in result.output


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
