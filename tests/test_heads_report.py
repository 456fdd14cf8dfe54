"""Rendering of the head report (the Finding "heads", circuits.heads.results) and `interp heads`."""

from __future__ import annotations

import dataclasses
import io
import json
import re
from collections import Counter

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

import interp
from circuits.cli import app
from circuits.finding import finding_report, write_finding_report
from circuits.heads import SCORE_NAMES, head_report
from circuits.heads.results import (
    SHORT,
    WIDE_TERMINAL,
    classified_rows,
    confirmed_rows,
    head_sections,
    to_csv,
    viewer_heads,
)
from circuits.sections import render_markdown, result_json
from interp.types import head_label
from tests.browser import render_in_chromium

XSS = "Say </script><script>alert(1)</script> twice: </script><script>alert(1)</script>"


@pytest.fixture(scope="module")
def smollm2_report(smollm2):
    """A quick SmolLM2 report whose first natural-text probe is a script injection attempt."""
    texts = [XSS, "The cat sat on the mat."]
    return head_report(smollm2, n_samples=4, seq_len=10, natural_text=texts, causal=False)


def test_json_has_every_head_with_scores_types_and_effects(smollm2_report, smollm2):
    data = json.loads(result_json(smollm2_report))
    assert data["analysis"] == "heads" and data["chose"] != data["tested"]
    assert data["model"] == smollm2.cfg.model_name
    assert data["settings"]["n_samples"] == 4 and data["settings"]["natural_text"][0] == XSS
    assert len(data["heads"]) == smollm2.cfg.n_layers * smollm2.cfg.n_heads
    for head in data["heads"]:
        assert set(SCORE_NAMES) <= set(head["scores"]) and set(head["types"]) <= set(SCORE_NAMES)
        for name in head["types"]:
            assert head["scores"][name] >= data["thresholds"][name]
        assert set(head["causal"]) == {"induction", "previous_token"}
    assert sum(bool(head["types"]) for head in data["heads"]) > 0


def test_json_holds_the_held_out_scores_and_the_resamples_the_cis_took(monkeypatch):
    """`--format json` left out each candidate's held-out score (the table's "held out" column, which
    decides the score-not-held verdict), and its settings said n_bootstrap 500 where the causal CIs
    took 1000 resamples. The CSV has each judged class's p and Holm's outcome. A model predicting another
    vocabulary than it reads is refused in words (a matrix-shape error from inside torch)."""
    import circuits.heads.causal as causal

    taken = []

    def judge(*args, **kwargs):
        taken.append(kwargs["n_boot"])
        return judge_class(*args, **kwargs)

    judge_class = causal.judge_class
    monkeypatch.setattr(causal, "judge_class", judge)
    finding = head_report(interp.load_model("toy-induction"), n_samples=4, seed=0, seq_len=12)
    data = json.loads(result_json(finding))
    assert set(taken) == {data["settings"]["n_bootstrap"]}
    table = finding.extras.full_table(finding).set_index(["layer", "head"])
    checked = 0
    for head in data["heads"]:
        for kind, record in head["causal"].items():
            held_out = table.loc[(head["layer"], head["head"]), f"{kind}_held_out_score"]
            if held_out == held_out:  # a candidate of that type (NaN otherwise)
                assert record["held_out_score"] == pytest.approx(held_out)
                checked += 1
    assert checked > 0
    csv = pd.read_csv(io.StringIO(to_csv(finding.extras.rows(finding)))).set_index(["layer", "head"])
    judged = [(c, held) for c, held in zip(data["classes"], data["holm"], strict=True) if c["p"] is not None]
    assert judged  # the CSV has each judged class's p and Holm's outcome, as the JSON's
    outcomes = {True: "holds", False: "does not hold", None: "cannot tell"}
    for found, held in judged:
        suffix = "" if found["details"]["effect"] == "alone" else "_with_others"
        column = f"{found['details']['type']}_beyond_random{suffix}"
        row = csv.loc[tuple(int(part) for part in re.findall(r"\d+", found["heads"][0]))]
        assert row[f"{column}_p"] == pytest.approx(found["p"], rel=1e-12)
        assert (row[f"{column}_p_bound"], row[f"{column}_holm"]) == (found["p_bound"], outcomes[held])
    cfg = interp.Config(n_layers=1, n_heads=2, d_model=16, d_vocab=40, d_vocab_out=10, n_ctx=32)
    with pytest.raises(ValueError, match="predicts 10 tokens but reads 40"):
        head_report(interp.HookedTransformer(cfg), n_samples=2, seq_len=8)


def test_csv_and_markdown(smollm2_report, tmp_path):
    rows = smollm2_report.extras.rows(smollm2_report)
    table = pd.read_csv(io.StringIO(to_csv(rows)))
    assert len(table) == len(smollm2_report.extras.table)
    assert {"layer", "head", *SCORE_NAMES, "types", "induction_effect"} <= set(table.columns)
    markdown = render_markdown(finding_report(smollm2_report))
    assert markdown.startswith("# Attention head types") and "| previous_token |" in markdown
    assert "Scores of every head" not in markdown  # the heat maps: the HTML page only
    typed = classified_rows(rows)
    assert all(head_label(row.layer, row.head) in markdown for row in typed.itertuples())
    with pytest.raises(ValueError, match="format"):
        write_finding_report(smollm2_report, "pdf", tmp_path / "heads.pdf", console=None)


def test_html_renders_offline_and_escapes_tokens(smollm2_report, tmp_path):
    # The head with the best skip_gram score typed skip_gram: its viewer shows the natural-text probe,
    # whose first text is the injection attempt (two short texts leave skip-gram scores undefined: NaN).
    table = smollm2_report.extras.table.copy()
    best = table["skip_gram"].fillna(-1.0).idxmax()
    table.at[best, "types"] = sorted({*table.at[best, "types"], "skip_gram"}, key=SCORE_NAMES.index)
    report = dataclasses.replace(
        smollm2_report, extras=dataclasses.replace(smollm2_report.extras, table=table)
    )
    shown = viewer_heads(report.extras.rows(report))
    assert ("skip_gram", (table.at[best, "layer"], table.at[best, "head"])) in shown
    path = tmp_path / "heads.html"
    write_finding_report(report, "html", path, console=None)
    result = render_in_chromium(
        path, selectors=(".interp-heatmap", ".interp-attention"), wait_for={".interp-attention canvas": 1},
        timeout_s=90,
    )  # fmt: skip
    assert result.script_errors == [] and result.dialogs == [] and result.external_requests == []
    assert result.missing == []
    assert result.counts[".interp-heatmap"] == len(SCORE_NAMES) + 2
    assert result.counts[".interp-attention"] == len(shown)  # one viewer per shown head
    assert "alert(1)" in result.text  # the injected script shows as text ...
    assert "<script>alert(1)</script>" not in result.dom  # ... and never becomes an element


def test_cli_heads_json_on_toy_checkpoint(tmp_path):
    out = tmp_path / "heads.json"
    runner = CliRunner()
    result = runner.invoke(app, ["heads", "--model", "toy-induction", "--format", "json", "--out", str(out),
                                 "--n-samples", "8", "--seed", "1"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["model"] == "toy-induction" and data["settings"]["seed"] == 1
    assert any("previous_token" in head["types"] and head["layer"] == 0 for head in data["heads"])
    table = runner.invoke(app, ["heads", "--model", "toy-induction", "--n-samples", "4"])
    assert table.exit_code == 0 and "Summary per type" in table.output


def test_cli_heads_in_bfloat16_says_so(tmp_path):
    out = tmp_path / "heads.md"
    args = [
        "heads",
        "--model",
        "toy-induction",
        "--n-samples",
        "4",
        "--format",
        "markdown",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, [*args, "--dtype", "bfloat16"])
    assert result.exit_code == 0, result.output
    assert "run in bfloat16" in out.read_text() and "L1H0" in out.read_text()
    assert CliRunner().invoke(app, [*args, "--dtype", "float64"]).exit_code == 2


@pytest.mark.parametrize("width", [80, 100, WIDE_TERMINAL])
def test_terminal_table_fits_the_terminal(width):
    """At 80 and 100 columns the compact table, at WIDE_TERMINAL every column; no line is wider, no word is
    split; the table names beyond/SE, what it sorts by, and shows the figure beyond random heads with its
    CI and the random heads' mean effect."""
    model = interp.load_model("toy-induction")
    report = head_report(model, n_samples=8)
    console = Console(file=io.StringIO(), width=width)
    write_finding_report(report, "table", None, console)
    text = console.file.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    heads = text[: text.index("Head classes (held out)")]  # the standard class tables fold long names
    words = set(heads.replace("│", " ").replace("┃", " ").replace(",", " ").split())
    for name in SCORE_NAMES:  # every type name the heads' table shows is whole (or its short column name)
        assert all(word in (name, SHORT[name]) for word in words if name.startswith(word) and len(word) > 2)
    assert "induction ✓" in text and "L1H0" in text and "…" not in text
    assert "beyond/SE" in text and "beyond random" in text and "(0." in text and "w/o" not in text
    assert text.index("Summary per type") < text.index("Heads confirmed by ablation")
    wide = "ind@" in text
    assert wide == (width >= WIDE_TERMINAL)
    if wide:  # every score, per repeat length too
        assert all(f"ind@{n}" in text for n in report.extras.induction_lengths) and "kcomp" in text
    else:
        assert "--wide shows every score" in text


def test_cli_heads_wide(tmp_path):
    narrow = CliRunner().invoke(
        app, ["heads", "--model", "toy-induction", "--n-samples", "4"], terminal_width=80
    )
    wide = CliRunner().invoke(app, ["heads", "--model", "toy-induction", "--n-samples", "4", "--wide"])
    assert narrow.exit_code == 0 and wide.exit_code == 0
    assert "--wide shows every score" in narrow.output and "ind@" not in narrow.output
    # The test terminal has 80 columns: --wide says it cannot fit and shows the compact table.
    assert f"--wide needs {WIDE_TERMINAL} columns and this terminal has 80" in " ".join(wide.output.split())
    assert max(len(line) for line in wide.stdout.splitlines()) <= 80  # the report; stderr logs progress
    out = tmp_path / "wide.txt"  # a file is 200 columns wide: every score
    wide = CliRunner().invoke(
        app, ["heads", "--model", "toy-induction", "--n-samples", "4", "--wide", "--out", str(out)]
    )
    assert wide.exit_code == 0 and "ind@" in out.read_text()


def test_terminal_report_leads_with_the_summary_and_the_confirmed_heads():
    model = interp.load_model("toy-induction")
    report = head_report(model, n_samples=8)
    lead, every = Console(file=io.StringIO(), width=80), Console(file=io.StringIO(), width=80)
    write_finding_report(report, "table", None, lead, all_heads=False)
    write_finding_report(report, "table", None, every, all_heads=True)
    text, all_text = lead.file.getvalue(), every.file.getvalue()
    assert text.index("Summary per type") < text.index("Heads confirmed by ablation")
    rows = report.extras.rows(report)
    confirmed = confirmed_rows(rows)
    assert len(confirmed) > 0 and all(head_label(r.layer, r.head) in text for r in confirmed.itertuples())
    evidence = confirmed["_evidence"].tolist()
    assert evidence == sorted(evidence, reverse=True)
    unconfirmed = classified_rows(rows).drop(confirmed.index)
    for row in unconfirmed.itertuples():
        assert head_label(row.layer, row.head) in all_text
    typed = rows.table[rows.table["types"].map(len) > 0].drop(confirmed.index)  # first_token too
    if len(typed):
        assert f"{len(typed)} more typed head" in " ".join(text.split())


def test_a_file_saved_before_the_random_baseline_still_renders_its_marks_and_order():
    """The toy-induction report saved before the random baseline (its effects confirmed over 2 standard
    errors and 0.02): L1H3 and L0H3 are confirmed only with the other candidates of their type ablated.
    Their ✓ carries the mark the legend explains, and the table's order is the effect/SE of the effect
    that confirmed them, not of their effect alone."""
    from circuits.heads.causal import MIN_EFFECT
    from circuits.heads.results import WITH_OTHERS_MARK, confirmed_with_others_only
    from circuits.results_file import load_result

    report = load_result("tests/data/heads-toy-induction-before-random-baseline.json")
    heads = report.extras.rows(report)
    assert "induction_beyond_random" not in heads.table and not report.classes  # before the random baseline
    confirmed = confirmed_rows(heads)
    rows = head_sections(heads, wide=False, all_heads=False)[1].table.rows
    marked = 0
    for row, cells in zip(confirmed.to_dict("records"), rows, strict=True):
        for kind in ("induction", "previous_token"):
            if not row[f"{kind}_confirmed"]:
                continue
            effect, se = row[f"{kind}_effect"], row[f"{kind}_effect_se"]
            only_with_others = not effect > max(2 * se, MIN_EFFECT[kind])  # the rule it was saved under
            assert confirmed_with_others_only(row, kind) == only_with_others
            assert (f"{kind} ✓{WITH_OTHERS_MARK}" in cells[1]) == only_with_others, cells
            if only_with_others:
                marked += 1
                with_others = row[f"{kind}_effect_with_others"] / row[f"{kind}_effect_with_others_se"]
                assert row["_evidence"] == pytest.approx(with_others), cells
    assert marked >= 1
    evidence = confirmed["_evidence"].tolist()
    assert evidence == sorted(evidence, reverse=True)
    assert all(cells[-1] == "" for cells in rows)  # no random baseline to show
    assert "beyond random" not in finding_report(report).headline[0]
    assert "saved before the effects were judged" in render_markdown(finding_report(report))


def test_each_confirmed_head_is_beyond_random_heads_of_its_layer_with_a_ci():
    """toy-induction: every head the report confirms has, for the effect that confirms it, its random
    heads' mean effect and its figure beyond them with a 95% CI above 0 and at least 0.02, in the table,
    the JSON and the terminal; ✓ carries the with-others mark exactly when that effect is the one with
    the others ablated; the classes' table names each class's random heads; the legend points to the
    confirmation rule the Settings state."""
    from circuits.heads.results import LEGEND, WITH_OTHERS_MARK, class_name

    model = interp.load_model("toy-induction")
    report = head_report(model, n_samples=8)
    data = {(h["layer"], h["head"]): h for h in json.loads(result_json(report))["heads"]}
    heads = report.extras.rows(report)
    confirmed = confirmed_rows(heads)
    assert {(1, h) for h in range(4)} & set(zip(confirmed["layer"], confirmed["head"], strict=True))
    rows = head_sections(heads, wide=False, all_heads=False)[1].table.rows
    for row, cells in zip(confirmed.to_dict("records"), rows, strict=True):
        for kind in ("induction", "previous_token"):
            if not row[f"{kind}_confirmed"]:
                continue
            by = row[f"{kind}_confirmed_by"]
            assert by in ("alone", "with_others_ablated")
            figures = data[row["layer"], row["head"]]["causal"][kind]["beyond_random"][by]
            assert figures["ci"][0] > 0 and figures["beyond"] >= 0.02
            assert figures["beyond"] == pytest.approx(
                data[row["layer"], row["head"]]["causal"][kind][
                    "effect" if by == "alone" else "effect_with_others_ablated"
                ]
                - figures["random_effect"],
                abs=1e-5,
            )
            drawn = Counter(data[row["layer"], row["head"]]["causal"][kind]["random_heads"])
            assert sum(drawn.values()) == len(drawn) * (5 // len(drawn))  # 5, or a pool of k each 5 // k
            judged = report.verdict(class_name(kind, head_label(row["layer"], row["head"]), by))
            assert judged.verdict == "confirmed" and judged.heldout.beyond == figures["beyond"]
            assert (f"{kind} ✓{WITH_OTHERS_MARK}" in cells[1]) == (by == "with_others_ablated"), cells
        if sum(row[f"{kind}_confirmed"] for kind in ("induction", "previous_token")) == 1:  # the one shown
            beyond = f"{figures['beyond']:+.2f} [{figures['ci'][0]:+.2f}, {figures['ci'][1]:+.2f}]"
            assert cells[-1] == f"{beyond} ({figures['random_effect']:.2f})"
    evidence = confirmed["_evidence"].tolist()
    assert evidence == sorted(evidence, reverse=True)
    classes = next(s for s in finding_report(report).sections if s.title == "Head classes (held out)").table
    random_heads = [cells[classes.columns.index("random heads")].split() for cells in classes.rows]
    assert random_heads == [[label for draw in c.random_sets for label in draw] for c in report.classes]
    assert all(len(labels) == len(set(labels)) * (5 // len(set(labels))) for labels in random_heads)
    assert "beyond random heads of their layers" in finding_report(report).headline[0]
    legend = " ".join(LEGEND.split())
    assert f"✓{WITH_OTHERS_MARK}: confirmed only with the other candidates" in legend
    settings = next(s for s in finding_report(report).sections if s.title == "Settings").lines[0]
    assert "the Settings' causal_method" in legend and "positive at most repeat lengths" in settings


def test_the_heads_left_out_of_the_table_are_counted_by_type(smollm2_report):
    """SmolLM2 types most heads first_token (attention sinks): the note under the table counts every
    typed head it leaves out, per type, and says that --all leaves out the first_token-only ones."""
    from circuits.heads.results import headline

    heads = smollm2_report.extras.rows(smollm2_report)
    table = heads.table
    typed = table[table["types"].map(len) > 0]
    sinks = table[table["types"].map(lambda types: list(types) == ["first_token"])]
    assert len(sinks) > len(classified_rows(heads)) > 0  # most typed heads are sinks
    shown = head_sections(heads, wide=False, all_heads=False)[1]
    note = " ".join(" ".join(shown.notes).split())
    assert len(shown.table.rows) == len(confirmed_rows(heads))
    assert f"{len(typed) - len(shown.table.rows)} more typed heads" in note
    for name in {name for types in typed["types"] for name in types}:
        count = sum(name in types for types in typed.drop(confirmed_rows(heads).index)["types"])
        assert f"{count} {name}" in note, (name, note)
    assert f"the {len(sinks)} typed first_token only" in note
    listed = head_sections(heads, wide=False, all_heads=True)[1]
    assert len(listed.table.rows) == len(classified_rows(heads))
    assert f"Not listed: {len(sinks)} heads typed first_token only" in " ".join(listed.notes)
    assert f"{len(typed) - len(confirmed_rows(heads))} more heads typed" in headline(heads)


def test_an_older_head_report_file_reads_as_the_finding_with_the_same_numbers(tmp_path):
    """A HeadReport file (what --save wrote before the Finding: the whole table, the settings as a dict),
    made here from a fresh toy-induction finding, reads as the Finding "heads": every column of its
    table and its CSV the same, each class the same figures (not its per-sequence ones, which such a
    file does not hold), and the same report but for the strata's CIs, whether the lengths differ
    (`ClassVerdict.differ_p`) and the classes' p-values with Holm's correction (`ClassVerdict.p`), which
    it does not hold either."""
    from circuits.results_file import load_result
    from circuits.sections import NO_P_VALUES
    from interp.io.serialize import encode

    finding = head_report(interp.load_model("toy-induction"), n_samples=8)
    figures, rows = finding.extras, finding.extras.rows(finding)
    p_columns = [
        column for column in rows.table if column.endswith(("_p", "_p_bound", "_holm"))
    ]  # since 12-02
    older = {
        "model_name": finding.model, "table": rows.table.drop(columns=p_columns), "settings": rows.settings,
        "thresholds": figures.thresholds, "n_layers": figures.n_layers, "n_heads": figures.n_heads,
        "group_effects": figures.group_effects, "str_tokens": figures.str_tokens,
        "patterns": figures.patterns, "provenance": finding.provenance,
    }  # fmt: skip
    document = {"schema": "interp-result-3", "kind": "heads",
                "result": {"__dataclass__": "HeadReport", "fields": encode(older)["__items__"]}}  # fmt: skip
    document["result"]["fields"] = {name: value for name, value in document["result"]["fields"]}
    path = tmp_path / "older.json"
    path.write_text(json.dumps(document))
    loaded = load_result(path)
    assert loaded.analysis == "heads" and loaded.settings == finding.settings
    assert loaded.chose == finding.chose and loaded.tested == finding.tested
    older_csv, csv = (pd.read_csv(io.StringIO(to_csv(r))) for r in (loaded.extras.rows(loaded), rows))
    bounds = [column for column in p_columns if column.endswith("_p_bound")]
    assert p_columns and not older_csv[p_columns].drop(columns=bounds).notna().any().any()  # no p saved
    assert not older_csv[bounds].any().any()
    pd.testing.assert_frame_equal(
        older_csv.drop(columns=p_columns), csv.drop(columns=p_columns), check_exact=True
    )
    assert [c.name for c in loaded.classes] == [c.name for c in finding.classes] and finding.classes
    for old, new in zip(loaded.classes, finding.classes, strict=True):
        assert (old.verdict, old.heads, old.random_sets) == (new.verdict, new.heads, new.random_sets)
        assert (old.heldout.beyond, old.heldout.beyond_ci, old.heldout.random_drop) == (
            new.heldout.beyond, new.heldout.beyond_ci, new.heldout.random_drop
        )  # fmt: skip
        assert [(s.name, s.beyond, s.holds) for s in old.strata] == [
            (s.name, s.beyond, s.holds) for s in new.strata
        ]
    ci = re.compile(r"\[[-+]\d+\.\d\d, [-+]\d+\.\d\d\] \| (yes|no) \| [\d.e-]* \|$")  # CI, verdict, p
    p = re.compile(r"\| (&lt; )?\d[\d.e-]* \| ([a-z][a-z-]*) \|$")  # a class's p (a bound: <), verdict
    holm = re.compile(r"(if none had an effect\.) Holm's correction .*$")
    fresh = render_markdown(finding_report(finding)).splitlines()
    new = [p.sub(r"| n/a | \2 |", ci.sub(r"(no CI) | \1 |  |", line)) for line in fresh]
    new = [holm.sub(rf"\1 {NO_P_VALUES}", line) for line in new]
    assert render_markdown(finding_report(loaded)).splitlines() == new


def test_cli_heads_bad_options():
    runner = CliRunner()
    assert runner.invoke(app, ["heads", "--model", "toy-induction", "--format", "pdf"]).exit_code == 2
    assert runner.invoke(app, ["heads", "--model", "toy-induction", "--format", "html"]).exit_code == 2
    assert runner.invoke(app, ["heads", "--model", "toy-induction", "--n-samples", "1"]).exit_code == 2


def test_the_standard_error_beyond_random_is_as_wide_as_its_ci():
    """The JSON's SE of an effect beyond random (and the table's order by effect / SE) took the
    sequences' spread only, while the CI also resamples the random heads: 3-12 times narrower than the
    CI on toy-induction. It now counts both (within a quarter of the CI's half-width / 1.96)."""
    from circuits.heads.results import beyond_se
    from circuits.results_file import load_result

    report = load_result("docs/results/data/heads-toy-induction.json")
    for found in report.classes:
        low, high = found.heldout.beyond_ci
        assert 0.75 < (high - low) / 3.92 / beyond_se(found) < 1.25, found.name
