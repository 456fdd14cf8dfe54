"""One run, many formats: `--save FILE.json` then `interp render` gives the report the command wrote."""

from __future__ import annotations

import io
import itertools
import json
import re
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from typer.testing import CliRunner

import interp
from circuits.cli import app
from circuits.command import KIND_OF
from circuits.results_file import SCHEMA, load_result
from tests.browser import render_in_chromium

RUNS = {  # kind -> the command on a shipped toy model, and the formats it writes
    "heads": (
        ["heads", "--model", "toy-induction", "--n-samples", "4"],
        ["table", "csv", "json", "markdown", "html"],
    ),
    "ioi": (["ioi", "--model", "toy-ioi", "--n-prompts", "16"], ["table", "json", "markdown", "html"]),
    "circuit": (
        ["circuit", "--model", "toy-induction", "--task", "induction", "--method", "eap", "--fraction", "0.2",
         "--n-prompts", "8"],
        ["table", "json", "markdown", "html"],
    ),
    "patch": (
        ["patch", "--model", "toy-ioi", "--n-prompts", "4", "--top", "3"],
        ["markdown", "table", "csv", "json", "html"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(RUNS))
def test_render_of_a_saved_result_is_the_report_the_command_wrote(kind, tmp_path):
    command, formats = RUNS[kind]
    first, *others = formats
    saved = tmp_path / f"{kind}.json"
    direct = tmp_path / f"direct.{first}"
    run = CliRunner().invoke(app, [*command, "--format", first, "--out", str(direct), "--save", str(saved)])
    assert run.exit_code == 0, run.output
    document = json.loads(saved.read_text())
    assert document["schema"] == SCHEMA and document["kind"] == KIND_OF.get(kind, kind)
    rendered = tmp_path / f"rendered.{first}"
    run = CliRunner().invoke(app, ["render", str(saved), "--format", first, "--out", str(rendered)])
    assert run.exit_code == 0, run.output
    assert rendered.read_text() == direct.read_text()
    # Every other format renders from the same file, as the library renders the loaded result.
    result = load_result(saved)
    assert type(result).__name__ in {"Finding", "EdgeCircuitResult", "PatchReport"}
    for format in others:
        out = tmp_path / f"rendered.{format}"
        run = CliRunner().invoke(app, ["render", str(saved), "--format", format, "--out", str(out)])
        assert run.exit_code == 0, (format, run.output)
        assert out.stat().st_size > 100, format


def test_a_json_report_on_stdout_is_json_alone(tmp_path):
    """`--format json` with --save: stdout holds the JSON and nothing else (`| jq` reads it); the files
    written are named on stderr."""
    saved = tmp_path / "heads.json"
    run = CliRunner().invoke(
        app, ["heads", "--model", "toy-induction", "--format", "json", "--save", str(saved)]
    )
    assert run.exit_code == 0, run.output
    assert json.loads(run.stdout)["model"] == "toy-induction"
    assert f"Wrote {saved}" in run.stderr


def test_render_refuses_what_it_cannot_render(tmp_path):
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"model": "toy"}))
    run = CliRunner().invoke(app, ["render", str(summary)])
    assert run.exit_code == 2 and "not a saved result" in run.output and "--save" in run.output
    broken = tmp_path / "broken.json"
    broken.write_text(
        json.dumps({"schema": SCHEMA, "kind": "heads", "result": {"__dataclass__": "Nope", "fields": {}}})
    )
    run = CliRunner().invoke(app, ["render", str(broken)])
    assert run.exit_code == 2 and "does not hold a readable heads result" in " ".join(run.output.split())
    run = CliRunner().invoke(app, ["render", str(tmp_path / "missing.json")])
    assert run.exit_code == 2 and "no result file" in run.output
    saved = json.loads((Path(__file__).parents[1] / "docs/results/data/heads-toy-induction.json").read_text())
    newer = tmp_path / "newer.json"  # a file of a newer interp: upgrade, not "not a saved result"
    newer.write_text(json.dumps({**saved, "schema": "interp-result-99"}))
    run = CliRunner().invoke(app, ["render", str(newer)])
    assert run.exit_code == 2 and "saved by a newer interp" in " ".join(run.output.split())
    damaged = tmp_path / "damaged.json"  # a tensor one row short: one line, not torch's traceback
    text = json.dumps(saved)
    start = text.index('"shape": [') + len('"shape": [')
    damaged.write_text(text[:start] + "1" + text[start:])  # a shape that no longer fits its values
    run = CliRunner().invoke(app, ["render", str(damaged)])
    assert run.exit_code == 2 and "run `interp heads` again with --save" in " ".join(run.output.split())
    run = CliRunner().invoke(app, ["heads", "--model", "toy-induction", "--save", str(tmp_path / "x.txt")])
    assert run.exit_code == 2 and "must end in .json" in " ".join(run.output.split())


def test_every_format_of_a_loaded_result_matches_the_original(tmp_path):
    """The stored file holds everything each renderer reads: all formats agree byte for byte."""
    from circuits.heads import head_report
    from circuits.results_file import result_formats, save_result, write_result_report

    model = interp.load_model("toy-induction")
    report = head_report(model, n_samples=4)
    save_result(report, tmp_path / "heads.json")
    loaded = load_result(tmp_path / "heads.json")
    for format in result_formats(report):
        original, again = tmp_path / f"original.{format}", tmp_path / f"again.{format}"
        write_result_report(report, format, original, None)
        write_result_report(loaded, format, again, None)
        assert again.read_text() == original.read_text(), format


def test_patch_reads_the_users_pairs_and_refuses_unequal_lengths(smollm2, tmp_path):
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(
        "clean,corrupted,correct,incorrect\n"
        "When Mary and John left John gave it to,When Mary and John left Anna gave it to, Mary, John\n"
        "When Anna and Tom went out Tom gave it to,When Anna and Tom went out Mary gave it to, Anna, Tom\n"
    )
    from circuits.patch_report import pairs_patching

    report = pairs_patching(smollm2, pairs, component="resid_pre", top=3)
    summary = report.ranked().set_index(["layer", "position"])["mean"]
    assert report.task == "pairs.csv (2 pairs)"  # each layer at the token that differs and at the last
    assert sorted(summary.index) == sorted((layer, at) for layer in range(30) for at in ("END", "changed"))
    # Before layer 0 the prompts differ at that token only: patching it restores the clean run, the
    # last token (the same in both) nothing.
    assert abs(summary[0, "changed"] - 1) < 1e-3 and abs(summary[0, "END"]) < 1e-3, summary[0]
    unequal = tmp_path / "unequal.jsonl"
    unequal.write_text(
        json.dumps({"clean": "The cat sat on the", "corrupted": "A", "correct": " mat", "incorrect": " dog"})
    )
    with pytest.raises(ValueError, match="pair 1's clean and corrupted prompts have different numbers"):
        pairs_patching(smollm2, unequal)


@pytest.mark.parametrize(
    ("faithfulness", "method", "ablation", "expected", "advice"),
    [
        (0.93, "eap-ig", "counterfactual", "faithful", None),
        (1.31, "eap-ig", "counterfactual", "overshoots", "more edges"),
        (0.6, "eap-ig", "counterfactual", "partial", "more edges"),
        (0.21, "eap", "counterfactual", "not faithful", "--method prune"),
        (0.001, "eap-ig", "mean", "not faithful", "more edges"),
        (0.6, "prune", "counterfactual", "partial", "more edges"),
    ],
)
def test_every_faithfulness_comes_with_a_verdict(faithfulness, method, ablation, expected, advice):
    from circuits.edge_circuits.report import faithfulness_advice

    verdict = faithfulness_advice(faithfulness, method, ablation)
    assert verdict.startswith(expected + " ("), verdict
    assert ("try" in verdict) == (advice is not None) and (advice is None or advice in verdict)
    assert ("--method prune" in verdict) == (method != "prune" and expected not in ("faithful", "overshoots"))


def test_ioi_report_states_one_unit_per_figure_and_robust_z_as_a_number(tmp_path):
    """Accuracy and its CI both in %; robust z as its value: one decimal below 10, whole numbers
    beyond (never a bound such as "< -10", never -2360.7)."""
    markdown = tmp_path / "ioi.md"
    run = CliRunner().invoke(
        app,
        ["ioi", "--model", "toy-ioi", "--n-prompts", "16", "--format", "markdown", "--out", str(markdown)],
    )
    assert run.exit_code == 0, run.output
    text = markdown.read_text()
    accuracy = re.search(r"accuracy [\d.]+% \(95% CI \[([\d.]+)%, ([\d.]+)%\]\)", text)
    assert accuracy is not None, text[:500]
    lines = text.splitlines()
    start = lines.index("| class | head | effect | z | attention | found by | writes IO, S |") + 2
    rows = [line.split("|") for line in itertools.takewhile(lambda line: line.startswith("|"), lines[start:])]
    assert rows
    for row in rows:
        z = row[4].strip()
        assert re.fullmatch(r"[+-]\d\.\d", z) or re.fullmatch(r"[+-]\d{2,}", z), z


SAVED_REPORTS = {  # kind -> a saved result, and words its first lines must hold (the finding)
    "heads": ("docs/results/data/heads-toy-induction.json", "confirmed by ablation beyond random heads"),
    "ioi": ("docs/results/data/ioi-toy-ioi.json", "it recovers"),
    "circuit": ("tests/data/circuit-saved-before-held-out.json", "faithfulness"),
    "patch": ("tests/data/patch-result-1.json", "strongest"),
}


@pytest.mark.filterwarnings("ignore:.*bootstrap resamples")  # the saved patch result: 4 prompts
@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("kind", list(SAVED_REPORTS))
def test_terminal_reports_fit_the_width_and_open_on_the_finding(kind, width):
    """At 80 and 100 columns: no line wider than the terminal, no word cut short ("name_mov…"),
    the finding in the first lines; IOI's first lines give every class's held-out verdict and its
    tables name every head of the circuit whole."""
    from rich.console import Console

    from circuits.results_file import write_result_report

    path, finding = SAVED_REPORTS[kind]
    result = load_result(path)
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    write_result_report(result, "table", None, console)
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, max(lines, key=len)
    assert re.search(r"\w…", text) is None, re.search(r".{20}\w…", text)
    first = " ".join(lines[:4])
    assert finding in first, first
    if kind == "ioi":
        verdicts = {c.verdict for c in result.classes}
        assert verdicts - {"confirmed"}, "the saved toy result should show a class that is not confirmed"
        first = " ".join(" ".join(lines[:8]).split())  # the headline, unwrapped
        for verdict in verdicts:
            assert verdict.capitalize() in first, (verdict, first)
        for c in result.classes:
            assert c.name in first, (c.name, first)
            assert all(re.search(rf"\b{head}\b", text) for head in c.heads), (c.name, c.heads)


SCREENS = {  # kind -> what must be on the first screen of its HTML report
    "heads": "table",  # the summary per type
    "ioi": "svg.ioi-circuit",
    "circuit": "svg.edge-circuit",
}


@pytest.mark.parametrize("kind", list(SCREENS))
def test_html_reports_fit_the_window_and_show_the_finding_first(kind, tmp_path):
    """At 1400x900 in headless Chromium: nothing wider than the window (no sideways scrolling), and
    the finding (summary table, circuit diagram) starts on the first screen."""
    command, _ = RUNS[kind]
    page = tmp_path / f"{kind}.html"
    run = CliRunner().invoke(app, [*command, "--format", "html", "--out", str(page)])
    assert run.exit_code == 0, run.output
    shot = tmp_path / f"{kind}.png"
    shown = render_in_chromium(page, selectors=(SCREENS[kind],), screenshot=shot, timeout_s=90)  # busy CI
    assert not shown.script_errors and not shown.external_requests
    assert shown.page_width <= 1400, shown.page_width
    box = shown.boxes[SCREENS[kind]]
    assert box is not None and box["y"] < 900 and box["x"] + box["width"] <= 1400, box
    assert (tmp_path / f"{kind}.png").stat().st_size > 10_000


def _inside(box, frame) -> bool:
    return (
        box is not None
        and box["x"] >= frame["x"] - 1
        and box["y"] >= frame["y"] - 1
        and box["x"] + box["width"] <= frame["x"] + frame["width"] + 1
        and box["y"] + box["height"] <= frame["y"] + frame["height"] + 1
    )


def test_edge_graph_opens_on_the_circuits_logits_end_and_zooms(tmp_path):
    """A 24-layer graph is ~2,400 px wide: the first view must still show the logits and the last
    layer's nodes inside the 1400x900 window; "whole graph" brings layer 0 in; "+" enlarges."""
    from circuits.edge_circuits import EdgeCircuitSettings, find_edge_circuit, induction_task
    from circuits.edge_circuits.report import edge_sections, size_origin
    from circuits.sections import render_html
    from interp.viz import write_text
    from tests.conftest import tiny_config

    torch.manual_seed(0)
    model = interp.HookedTransformer(tiny_config(n_layers=24, n_heads=2))
    heldout = induction_task(model, n_prompts=4, seq_len=6, seed=1)
    settings = EdgeCircuitSettings(method="eap", n_edges=40, curve_fractions=None)
    task = induction_task(model, n_prompts=4, seq_len=6)
    result = find_edge_circuit(model, task, settings, heldout=heldout)
    assert "requested" in size_origin(result) and result.json_data()["circuit"]["size_target"] is None
    page = write_text(tmp_path / "circuit.html", render_html(edge_sections(result)))
    last = [f"m{model.cfg.n_layers - 1}", *(f"a{model.cfg.n_layers - 1}.h{h}" for h in range(2))]
    nodes = ("logits", *last, "a0.h0")
    selectors = (".interp-zoom svg", *(f'circle[data-node="{n}"]' for n in nodes))
    window = {"x": 0, "y": 0, "width": 1400, "height": 900}
    first = render_in_chromium(page, selectors=selectors, screenshot=tmp_path / "first.png")
    assert not first.script_errors and not first.external_requests and first.page_width <= 1400
    frame = first.boxes[".interp-zoom svg"]
    assert _inside(frame, window), frame
    for name in ("logits", last[0]):
        box = first.boxes[f'circle[data-node="{name}"]']
        assert _inside(box, frame), (name, box, frame)
    assert not _inside(first.boxes['circle[data-node="a0.h0"]'], frame)  # too wide to show whole
    whole = render_in_chromium(page, selectors=selectors, clicks=('button[data-zoom="whole"]',))
    assert all(_inside(whole.boxes[f'circle[data-node="{n}"]'], frame) for n in nodes)
    zoomed = render_in_chromium(page, selectors=selectors, clicks=('button[data-zoom="in"]',))
    before, after = first.boxes['circle[data-node="logits"]'], zoomed.boxes['circle[data-node="logits"]']
    assert after["width"] > before["width"] * 1.2, (before, after)


def test_heads_page_puts_heat_maps_side_by_side_with_a_viewer_per_typed_head(tmp_path):
    from circuits.heads.results import LEGEND, viewer_heads
    from circuits.heads.scores import SCORE_NAMES

    command, _ = RUNS["heads"]
    page, saved = tmp_path / "heads.html", tmp_path / "heads.json"
    run = CliRunner().invoke(app, [*command, "--format", "html", "--out", str(page), "--save", str(saved)])
    assert run.exit_code == 0, run.output
    report = load_result(saved)
    shown = viewer_heads(report.extras.rows(report))
    typed = [name for name in SCORE_NAMES if report.extras.heads_of_type(name)]
    assert typed and {name for name, _ in shown} == set(typed)
    maps = tuple(f".interp-heatmaps > div:nth-child({i})" for i in (1, 2))
    rendered = render_in_chromium(
        page,
        selectors=(*maps, ".head-viewer", "p.legend", ".interp-heatmap .interp-caption"),
        wait_for={".head-viewer .interp-attention div div": len(shown)},
        timeout_s=90,  # six circuitsvis viewers on a busy machine
    )
    assert not rendered.script_errors and not rendered.missing and rendered.page_width <= 1400
    first, second = (rendered.boxes[m] for m in maps)
    assert abs(first["y"] - second["y"]) < 1 and second["x"] >= first["x"] + first["width"], (first, second)
    assert rendered.counts[".head-viewer"] == len(shown)
    assert rendered.counts[".interp-heatmap .interp-caption"] == len(SCORE_NAMES) + 2
    for name, (layer, head) in shown:
        assert f"{name} L{layer}H{head}" in rendered.text
    assert " ".join(LEGEND.split()) in " ".join(rendered.text.split())
    assert "+1, attending to a token raises that token's logit" in rendered.text  # the copying map


@pytest.mark.parametrize(
    ("kind", "legend"),
    [("heads", "Δloss = ablated − clean loss"), ("ioi", "effect = (clean - patched mean logit diff)")],
)
def test_reports_state_their_sign_conventions_in_every_format(kind, legend, tmp_path):
    command, formats = RUNS[kind]
    saved = tmp_path / f"{kind}.json"
    run = CliRunner().invoke(app, [*command, "--save", str(saved)], env={"COLUMNS": "200"})
    assert run.exit_code == 0, run.output
    assert legend in " ".join(run.output.split())  # the terminal table
    for format in ("markdown", "html"):
        out = tmp_path / f"{kind}.{format}"
        run = CliRunner().invoke(app, ["render", str(saved), "--format", format, "--out", str(out)])
        assert run.exit_code == 0, run.output
        assert legend in " ".join(out.read_text().split()), format


ROOT = Path(__file__).resolve().parents[1]
RESULTS_DATA = ROOT / "docs" / "results" / "data"
SAVED_RESULTS = sorted(  # the saved results (not the pages' own data files)
    path for path in RESULTS_DATA.glob("*.json") if "kind" in json.loads(path.read_text())
)


@pytest.mark.parametrize("path", SAVED_RESULTS, ids=lambda path: path.name)
def test_every_result_on_the_results_pages_renders_in_every_format(path, tmp_path):
    """A result the results pages show renders in each format its kind writes (a head report saved
    without its attention patterns too: no viewer, not a KeyError)."""
    from circuits.results_file import result_formats

    result = load_result(path)
    for format in result_formats(result):
        out = tmp_path / f"report.{format}"
        rendered = CliRunner().invoke(app, ["render", str(path), "--format", format, "--out", str(out)])
        assert rendered.exit_code == 0, (format, rendered.output)
        assert out.stat().st_size > 0


def test_the_terminal_shows_bracketed_cells_and_titles_as_written():
    """Rich reads "[n/a, n/a]" (a CI that could not be had) as a markup tag and drops it; the terminal
    report shows every cell, column and title as text."""
    from rich.console import Console

    from circuits.sections import Report, Section, Table, print_report

    report = Report(
        title="Heads of [model]",
        headline=["one line"],
        sections=[Section(title="[a] classes", table=Table(columns=["[CI]"], rows=[["[n/a, n/a]"]]))],
    )
    console = Console(file=io.StringIO(), width=100)
    print_report(report, console)
    shown = console.file.getvalue()
    assert all(text in shown for text in ("Heads of [model]", "[a] classes", "[CI]", "[n/a, n/a]"))


def test_a_patch_report_of_grouped_keys_or_values_names_key_value_heads():
    """k and v of a grouped-query model are patched per key/value head: the report names each with the
    query heads it serves, never as the query head of the same index."""
    from circuits.patch_report import PatchReport, patch_headline, patch_sections
    from interp.interventions.patching import activation_patching

    torch.manual_seed(0)
    model = interp.HookedTransformer(tiny_config(n_kv_heads=2)).eval()  # 4 query heads, 2 per key/value head
    clean, corrupted = torch.randint(61, (2, 3, 6))
    metric = lambda logits: logits[:, -1, 0]  # noqa: E731
    result = activation_patching(model, clean, corrupted, metric, "v")
    assert result.coords["head"] == [0, 1]
    report = PatchReport(model="m", task="t", component="v", direction="denoise", result=result, group=2)
    best = report.ranked().iloc[0]
    first = 2 * int(best["kv_head"])
    assert f"L{best['layer']}KV{best['kv_head']} (query heads {first}-{first + 1})" in patch_headline(report)
    table = patch_sections(report).sections[0].table
    assert table.columns[1] == "key/value head" and table.rows[0][1].startswith(f"KV{best['kv_head']} (query")


def test_a_patch_report_of_one_prompt_pair_claims_no_ci():
    """One prompt pair: every bootstrap resample is that pair, so a CI would have width 0 and every
    patch would look certain; the CI is NaN, shown as "(no CI)", and no patch is counted as moving it."""
    from circuits.patch_report import PatchReport, patch_headline, patch_sections
    from interp.interventions.patching import activation_patching

    torch.manual_seed(0)
    model = interp.HookedTransformer(tiny_config()).eval()
    clean, corrupted = torch.randint(61, (2, 1, 6))
    result = activation_patching(model, clean, corrupted, lambda logits: logits[:, -1, 0], "z")
    report = PatchReport(model="m", task="t", component="z", direction="denoise", result=result)
    assert "(no CI) on the normalised logit difference; one prompt pair gives no CI" in patch_headline(report)
    # the strongest of every patch, measured where it was picked: said as such, never as a held-out finding
    assert patch_headline(report).endswith(
        "The same prompts rank and measure every patch (an exploratory scan, nothing held out): confirm a "
        "site on other prompts."
    )
    assert all(row[-1] == "(no CI)" for row in patch_sections(report).sections[0].table.rows)


def test_render_never_writes_over_the_result_it_reads(tmp_path):
    """`interp render R.json --out R.json` replaced the saved result by its rendering: refused."""
    saved = tmp_path / "r.json"
    saved.write_text((Path(__file__).parents[1] / "docs/results/data/heads-toy-induction.json").read_text())
    before = saved.read_text()
    run = CliRunner().invoke(app, ["render", str(saved), "--format", "json", "--out", str(saved)])
    assert run.exit_code == 2 and "--out" in run.output and saved.read_text() == before


def test_markdown_shows_user_text_and_small_figures_as_they_are():
    """Markdown escapes what would be HTML outside code spans (an edge reader "a3.h2<v>", a family named
    "<b>x</b>") and keeps a table row one row whatever newlines a name holds; a figure that is not 0
    never reads 0.00 (a CI of (0.00058, 0.00305) read "[+0.00, +0.00]"), nor does a patch's CI bound
    that excludes the unpatched value read as that value (0.9997 as "1.000")."""
    from circuits.patch_report import PatchReport, patch_sections
    from circuits.sections import Report, Section, Table, ci_text, render_markdown, signed
    from interp.interventions.patching import activation_patching

    table = Table(columns=["edge", "family"], rows=[["a3.h2<v>", "sing\nsubj"]])
    report = Report(
        title="t", headline=["`<|im_end|>` & <b>x</b>"], sections=[Section(title="s", table=table)]
    )
    text = render_markdown(report)
    assert "a3.h2&lt;v>" in text and "| sing subj |" in text and "`<|im_end|>` & &lt;b>x&lt;/b>" in text
    assert ci_text((0.00058, 0.00305), 2) == "[+0.001, +0.003]" and signed(-0.0041, 2) == "-0.004"
    assert signed(0.0, 2) == "+0.00" and signed(1e-9, 3) == "+0.000"
    torch.manual_seed(0)
    model = interp.HookedTransformer(tiny_config()).eval()
    clean, corrupted = torch.randint(61, (2, 4, 6))
    result = activation_patching(model, clean, corrupted, lambda logits: logits[:, -1, 0], "z")
    result.values[...] = 0.5
    result.values[0] = 0.9997 - 1e-5 * torch.arange(4)  # a CI below 1 that rounds to 1.000 in 3 decimals
    report = PatchReport(model="m", task="t", component="z", direction="noise", result=result)
    cells = [row[-1] for row in patch_sections(report).sections[0].table.rows]
    assert not any(cell.endswith("1.000]") for cell in cells), cells


def test_an_edge_report_keeps_its_graph_apart_from_its_provenance():
    """The provenance may end with a --quick note ("... a less faithful circuit for its size"): the graph's
    size ran on as if the circuit's ("...for its size: 81 edges between 10 nodes")."""
    from circuits.edge_circuits.report import edge_headline

    result = load_result(Path(__file__).parents[1] / "docs/results/data/circuit-toy-induction.json")
    assert any(". Its edge graph: 81 edges between" in line for line in edge_headline(result))
