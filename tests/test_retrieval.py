"""Retrieval from context: the prompts (on SmolLM2's tokenizer), the metric, the finder's validation,
and the property every good run has: ablating the retrieval heads it confirms lowers retrieval
accuracy more than ablating random heads from the same layers."""

from __future__ import annotations

import html
import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import assert_same_finding_figures
from rich.console import Console
from typer.testing import CliRunner

from circuits.cli import app
from circuits.evidence import (
    DEPENDENCE_ALPHA,
    EFFECT_SIGN,
    MIN_STRATUM_PROMPTS,
    FamilySplit,
    faithfulness_verdict,
    random_same_layer_sets,
)
from circuits.finding import Finding, finding_report, write_finding_report
from circuits.progress_printer import ProgressPrinter
from circuits.results_file import load_result, save_result
from circuits.retrieval import RetrievalSettings, accuracy, find_retrieval_circuit
from circuits.retrieval.find import (
    DEPENDENT_KINDS,
    RETRIEVAL_STAGES,
    discovery_evidence,
    edge_scores,
    path_patching_step,
    validate_classes,
)
from circuits.sections import ci_text, render_html, render_markdown, result_json, signed
from interp.interventions.ablation import Ablation, Replacement, ablated_metrics
from interp.io.serialize import encode
from interp.tasks.ioi import single_token_names
from interp.tasks.ioi_templates import HELDOUT_NAMES, NAMES
from interp.tasks.retrieval import (
    DISCOVERY_RELATIONS,
    FACT_TEMPLATES,
    HELDOUT_RELATIONS,
    RELATIONS,
    make_retrieval_prompts,
    make_two_hop_prompts,
)


@pytest.mark.parametrize(
    ("split", "n_facts", "query", "template"),
    [
        ("discovery", 4, "statement", "of"),
        ("heldout", 7, "question", "of"),
        ("heldout", 3, "statement", "for"),
    ],
)
def test_prompts_hold_their_facts_where_they_say(smollm2, split, n_facts, query, template) -> None:
    prompts = make_retrieval_prompts(smollm2, 14, n_facts, split, seed=3, query=query, template=template)
    rows = torch.arange(len(prompts))
    tokens, pos = prompts.tokens, prompts.positions
    assert tokens.shape[0] == 14 and prompts.n_facts == n_facts
    assert (pos["END"] == tokens.shape[1] - 1).all()
    assert torch.equal(tokens.gather(1, prompts.values), prompts.candidates)
    assert torch.equal(prompts.candidates[rows, prompts.queried], prompts.answer)
    assert torch.equal(tokens[rows, pos["VALUE"]], prompts.answer)
    assert torch.equal(tokens[rows, pos["NAME"]], tokens[rows, pos["QUERY"]])  # the query names its subject
    assert (pos["NAME"] < pos["VALUE"]).all() and (pos["VALUE"] < pos["QUERY"]).all()
    for row in range(len(prompts)):  # distinct subjects and values per prompt
        assert len(set(tokens[row, prompts.names[row]].tolist())) == n_facts
        assert len(set(prompts.candidates[row].tolist())) == n_facts
    changed = prompts.corrupted != tokens  # the corrupted query names a stranger, nothing else differs
    assert torch.equal(changed.nonzero()[:, 1], pos["QUERY"])
    assert not (prompts.corrupted[rows, pos["QUERY"]][:, None] == tokens.gather(1, prompts.names)).any()
    assert sorted(set(prompts.queried.tolist())) == list(range(n_facts))  # every position queried
    table = DISCOVERY_RELATIONS if split == "discovery" else HELDOUT_RELATIONS
    assert set(prompts.relation) <= set(table) and prompts.template == template
    names = NAMES if split == "discovery" else HELDOUT_NAMES
    subjects = set(single_token_names(smollm2, names).values())
    assert set(tokens.gather(1, prompts.names).flatten().tolist()) <= subjects
    again = make_retrieval_prompts(smollm2, 14, n_facts, split, seed=3, query=query, template=template)
    assert torch.equal(again.tokens, tokens)  # seeded
    assert torch.equal(prompts[0].tokens, tokens[:1]) and torch.equal(
        prompts[-1].tokens, tokens[-1:]
    )  # (a TypeError)


@pytest.mark.parametrize(
    ("split", "n_facts"), [("heldout", 2), ("heldout", 3), ("heldout", 6), ("discovery", 4)]
)
def test_every_relation_is_queried_at_every_index(smollm2, split, n_facts) -> None:
    """The queried fact's index moves on for each relation each round: with 11 held-out relations the
    old rule (i + i // 11) queried every relation at one index for 2, 3, 4 and 6 facts."""
    prompts = make_retrieval_prompts(smollm2, 3 * 11 * n_facts, n_facts, split, seed=0)
    pairs = set(zip(prompts.relation, prompts.queried.tolist(), strict=True))
    assert pairs == {(relation, index) for relation in set(prompts.relation) for index in range(n_facts)}


def test_discovery_and_heldout_share_no_relation_or_name() -> None:
    assert not set(DISCOVERY_RELATIONS) & set(HELDOUT_RELATIONS)
    assert set(DISCOVERY_RELATIONS) | set(HELDOUT_RELATIONS) == set(RELATIONS)
    assert len(HELDOUT_RELATIONS) >= 4 and len(FACT_TEMPLATES) >= 2  # several families, two templates
    assert not set(NAMES) & set(HELDOUT_NAMES)


def test_no_word_of_a_discovery_prompt_is_a_held_out_subject(smollm2) -> None:
    """Held-out subjects are names no discovery prompt holds, as a subject or as a value (a mother's
    name: 12 of 48 held-out subjects were discovery values, 3 of them discovery answers)."""
    discovery = make_retrieval_prompts(smollm2, 64, 4, "discovery", seed=0)
    heldout = make_retrieval_prompts(smollm2, 64, 4, "heldout", seed=0)
    subjects = {smollm2.to_string(t).strip() for t in heldout.tokens.gather(1, heldout.names).flatten()}
    words = {smollm2.to_string(t).strip() for t in discovery.tokens.flatten()}
    assert subjects and not subjects & words


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"n_facts": 9}, "n_facts"), ({"split": "test"}, "split"), ({"query": "ask"}, "query"),
     ({"relations": ["weather"]}, "unknown relations"), ({"template": "by"}, "template")],
)  # fmt: skip
def test_bad_prompt_arguments_are_refused(smollm2, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        make_retrieval_prompts(smollm2, 4, **kwargs)


def test_metric_is_the_answer_minus_the_best_other_candidate(smollm2) -> None:
    prompts = make_retrieval_prompts(smollm2, 6, 3, seed=1)
    logits = torch.randn(
        6, prompts.tokens.shape[1], smollm2.cfg.d_vocab, generator=torch.Generator().manual_seed(0)
    )
    expected = []
    for row in range(6):
        end = logits[row, -1]
        others = [end[c] for i, c in enumerate(prompts.candidates[row].tolist()) if i != prompts.queried[row]]
        expected.append(end[prompts.answer[row]] - max(others))
    assert torch.allclose(prompts.logit_diff(logits), torch.stack(expected))
    assert torch.equal(prompts.correct(logits), torch.stack(expected) > 0)
    rows = torch.tensor([2, 4])  # a sub-batch, as the engine hands it over
    assert torch.allclose(prompts.logit_diff(logits[rows], rows), torch.stack(expected)[rows])


def test_two_hop_is_measured_against_chance_with_a_ci(smollm2) -> None:
    prompts = make_two_hop_prompts(smollm2, 8, 4, seed=0)
    assert torch.equal(prompts.candidates[torch.arange(8), prompts.queried], prompts.answer)
    with torch.no_grad():
        logits = smollm2(prompts.tokens)
    measured = accuracy("two-hop", prompts.logit_diff(logits), 4)
    by_hand = (logits[:, -1].gather(1, prompts.candidates).argmax(1) == prompts.queried).double().mean()
    assert measured.accuracy == pytest.approx(float(by_hand))
    assert measured.chance == 0.25 and measured.n_prompts == 8
    assert measured.ci[0] <= measured.accuracy <= measured.ci[1]


def ablated_diffs(model, prompts, head_sets) -> torch.Tensor:
    """[set, prompt] the logit diffs with each set's heads mean-ablated over the corrupted prompts."""
    mean = Ablation("mean", reference=prompts.corrupted)
    replacement = Replacement(model, model.layer_hook_names("z"), mean)
    with torch.no_grad():
        return ablated_metrics(model, prompts.tokens, prompts.logit_diff, head_sets, replacement).float()


@pytest.fixture(scope="module")
def small_result(smollm2) -> Finding:
    """The finder on few prompts, with one head for the induction class (no head report); what it
    reports is the stages `interp retrieval` announces, in order (a stage "discovery ablations" was not)."""
    settings = RetrievalSettings(
        n_prompts=12, n_heldout=12, n_exact=6, n_random=1, n_two_hop=4, heldout_facts=(3, 6)
    )
    calls = []
    result = find_retrieval_circuit(
        smollm2, settings, induction_heads=[(17, 3)], progress=lambda *c: calls.append(c)
    )
    printer = ProgressPrinter("retrieval", list(RETRIEVAL_STAGES), lambda _: None)
    for call in calls:
        printer(*call)
    assert printer.unplanned == [] and printer.seen == list(RETRIEVAL_STAGES)
    return result


def test_confirmed_retrieval_heads_ablated_lower_the_logit_diff_beyond_random_heads(smollm2, small_result):
    confirmed = [c for c in small_result.classes if c.verdict != "unconfirmed" and c.name != "induction"]
    assert confirmed, [(c.name, c.verdict) for c in small_result.classes]
    heads = sorted({(int(h[1:].split("H")[0]), int(h.split("H")[1])) for c in confirmed for h in c.heads})
    prompts = make_retrieval_prompts(smollm2, 64, 5, "heldout", seed=11)  # a fact count the finder never saw
    draws = random_same_layer_sets(smollm2, heads, 2, seed=0)
    diffs = ablated_diffs(smollm2, prompts, [[], heads, *draws]).mean(1)  # the finder's metric, per set
    assert diffs[1] < diffs[2:].mean() and diffs[1] < diffs[0], diffs


def test_result_is_consistent(small_result) -> None:
    r, figures = small_result, small_result.extras
    assert figures.discovery.chance == 0.25 and figures.heldout.n_prompts == 48
    assert figures.heldout.chance == pytest.approx((1 / 3 + 1 / 6) / 2)
    assert [a.n_prompts for a in figures.heldout_by_facts] == [24, 24]
    verdicts = {"confirmed", "unconfirmed", *(f"{kind}-dependent" for kind in DEPENDENT_KINDS)}
    for c in r.classes:
        assert c.verdict in verdicts
        assert {s.name for s in c.strata} >= {"3 facts", "6 facts", "template of", "template for"}
        assert (c.verdict != "unconfirmed") == (c.heldout.beyond_ci[0] > 0)  # drops: positive helps
        assert all((s.holds is None) == (s.n_prompts < MIN_STRATUM_PROMPTS) for s in c.strata)
        assert all(s.holds == (s.beyond > 0) for s in c.strata if s.holds is not None)
        failing = [s.kind for s in c.strata if s.holds is False]  # in the order facts, template, relation
        differing = [kind for kind in dict.fromkeys(failing) if c.differ_p[kind] < DEPENDENCE_ALPHA]
        if c.verdict != "unconfirmed":  # a kind whose strata differ no more than chance does not count
            assert c.verdict == (f"{differing[0]}-dependent" if differing else "confirmed")
        assert c.heldout.n_prompts == 48 and c.discovery.n_prompts == 12
        assert 0 <= c.details["accuracy"] <= 1 and 0 <= c.details["random_accuracy"] <= 1
    assert r.classes[-1].name == "induction" and r.classes[-1].details["induction_overlap"] == ["L17H3"]


def test_faithfulness_is_held_out_with_the_classes_strata(small_result) -> None:
    """The circuit's faithfulness is that of the held-out logit diffs the report states, on every
    held-out prompt, and per fact count, template and relation: the strata the classes are judged in."""
    r, figures = small_result, small_result.extras
    kept = figures.circuit_logit_diff - figures.ablated_logit_diff
    assert r.faithfulness.n_prompts == 48
    assert r.faithfulness.ratio == pytest.approx(
        kept / (figures.model_logit_diff - figures.ablated_logit_diff)
    )
    strata = [(s.kind, s.name, s.n_prompts) for s in r.faithfulness_strata]
    assert strata == [(s.kind, s.name, s.n_prompts) for s in r.classes[0].strata]
    assert sum(n for kind, _, n in strata if kind == "facts") == 48


def test_finding_saves_and_renders_again(small_result, tmp_path) -> None:
    r = small_result
    path = tmp_path / "retrieval.json"
    save_result(r, path)
    assert encode(load_result(path)) == encode(r)
    page = tmp_path / "retrieval.html"
    run = CliRunner().invoke(app, ["render", str(path), "--format", "html", "--out", str(page)])
    assert run.exit_code == 0, run.output
    text = page.read_text()
    assert text == render_html(finding_report(r))
    assert text.index("Retrieval from context by") < text.index("<table")
    for c in r.classes:  # every class with its verdict, in the classes' table
        assert f"<td>{c.name}</td><td>{html.escape(' '.join(c.heads))}</td>" in text
        assert f"<td>{c.verdict}</td></tr>" in text
    assert "<script src" not in text and "http" not in text.split("<body>")[1]  # opens offline
    out = tmp_path / "retrieval.md"
    write_finding_report(r, "markdown", str(out), Console())
    markdown = out.read_text()
    assert markdown.startswith("# Retrieval from context")
    order = ["## What chose and what tested", "## Head classes", "## Faithfulness (held out)", "## Accuracy"]
    assert [markdown.index(title) for title in order] == sorted(markdown.index(title) for title in order)


def older_retrieval_file(saved: Path, older: Path, faithfulness: float | None = None) -> None:
    """Rewrite the saved retrieval finding `saved` as files saved before 2026-11-29 hold it (a
    RetrievalResult, each class a RetrievalClass, faithfulness a float: `faithfulness` where given)
    into `older`."""
    document = json.loads(saved.read_text())
    finding, fresh = document["result"]["fields"], load_result(saved)
    classes = []
    for node in finding["classes"]:
        fields = dict(node["fields"])
        details = dict(fields.pop("details")["__items__"])
        for name in ("sign", "random_effects", "per_prompt"):
            del fields[name]
        classes.append({"__dataclass__": "RetrievalClass", "fields": {**fields, **details}})
    chose, tested = fresh.chose, fresh.tested
    document["kind"] = "retrieval"
    document["result"] = {"__dataclass__": "RetrievalResult", "fields": {
        "model_name": fresh.model, "provenance": fresh.provenance, "seed": fresh.settings.seed,
        "settings": encode(fresh.settings.recorded()),
        "relations": encode(FamilySplit(tuple(chose["relations"]), tuple(tested["relations"]))),
        "templates": encode({"discovery": chose["templates"], "heldout": tested["templates"]}),
        **finding["extras"]["fields"], "classes": classes,
        "faithfulness": encode(fresh.faithfulness.ratio if faithfulness is None else faithfulness),
        "timings": finding["timings"],
    }}  # fmt: skip
    older.write_text(json.dumps(document))


def test_an_older_retrieval_file_reads_with_the_same_numbers_and_renders_the_same(small_result, tmp_path):
    """A RetrievalResult (saved before 2026-11-29), its classes as RetrievalClasses, reads as the Finding a
    fresh run makes: the same settings, families, figures and classes (the random sets' and per-prompt
    effects, which it does not hold, empty); its faithfulness the same ratio, without the CI, per-prompt
    figures and strata it does not hold (NaN, none); undefined (NaN) as none."""
    r = small_result
    save_result(r, tmp_path / "retrieval.json")
    older_retrieval_file(tmp_path / "retrieval.json", tmp_path / "older.json")
    read = load_result(tmp_path / "older.json")
    assert read.settings == r.settings
    assert_same_finding_figures(read, r)
    for found, fresh in zip(read.classes, r.classes, strict=True):
        assert len(found.per_prompt) == 0 and found.random_effects == []
        same = replace(found, per_prompt=fresh.per_prompt, random_effects=fresh.random_effects)
        assert encode(same) == encode(fresh)
    assert (read.faithfulness.n_prompts, read.faithfulness.ratio) == (48, r.faithfulness.ratio)
    assert math.isnan(read.faithfulness.ratio_ci[0]) and read.faithfulness_strata == []
    figures = {"faithfulness": r.faithfulness, "faithfulness_strata": r.faithfulness_strata}
    assert render_markdown(finding_report(replace(read, **figures))) == render_markdown(finding_report(r))
    assert "nan" not in render_markdown(finding_report(read)).lower()  # figures it does not hold: "n/a"
    older_retrieval_file(tmp_path / "retrieval.json", tmp_path / "undefined.json", faithfulness=math.nan)
    undefined = load_result(tmp_path / "undefined.json")
    assert undefined.faithfulness is None
    assert "Circuit faithfulness on held-out prompts: n/a" in render_markdown(finding_report(undefined))


def test_the_headline_reads_the_circuits_faithfulness_with_its_ci_and_its_band(small_result):
    """The headline's faithfulness is the faithfulness section's: its CI and band, never a bare figure
    (`--quick` on SmolLM2 read "-0.0001" two lines below "query: confirmed"); where it is below the
    partial band beside a confirmed class, it says the classes are needed but not sufficient."""
    summary, first, *others = small_result.faithfulness, *small_result.classes
    cases = [(summary.ratio, summary.ratio_ci), (-0.0001, (-0.77, 0.77)), (0.9, (0.85, 0.95))]
    for (ratio, ci), verdict in itertools.product(cases, ("confirmed", "unconfirmed")):
        moved = replace(
            small_result,
            faithfulness=replace(summary, ratio=ratio, ratio_ci=ci),
            classes=[replace(first, verdict=verdict), *(replace(c, verdict="unconfirmed") for c in others)],
        )
        text = " ".join(render_markdown(finding_report(moved)).split())
        line = text.split("Circuit faithfulness on held-out prompts: ")[1]
        said = f"{signed(ratio, 2)} {ci_text(ci, 2)}, {faithfulness_verdict(moved.faithfulness)}"
        assert line.startswith(" ".join(said.split()))
        needed = f"The confirmed classes ({first.name}) are needed" in text and "not sufficient" in text
        assert needed == (verdict == "confirmed" and ratio < 0.5)


def test_cli_refuses_bad_options_before_loading_a_model() -> None:
    result = CliRunner().invoke(app, ["retrieval", "--format", "html", "--model", "no-such-model"])
    assert result.exit_code != 0 and "html" in result.output
    result = CliRunner().invoke(app, ["retrieval", "--induction-heads", "L1X2", "--model", "no-such-model"])
    assert result.exit_code != 0 and "--induction-heads" in result.output


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"n_prompts": 1}, "n_prompts"), ({"n_random": True}, "n_random"),
     ({"heldout_facts": (2, 2)}, "distinct fact counts in 2..8, got \\[2, 2\\]: a count given twice"),
     ({"heldout_facts": (9,)}, "distinct fact counts in 2..8")],
)  # fmt: skip
def test_settings_refuse_bad_counts_before_any_run(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        RetrievalSettings(**kwargs)


def test_relations_that_chose_the_heads_never_test_them(small_result) -> None:
    r = small_result
    chose, tested = r.chose["relations"], r.tested["relations"]
    assert chose and tested and not set(chose) & set(tested)
    assert set(tested) <= set(HELDOUT_RELATIONS) and len(tested) >= 4
    assert r.chose["templates"] == ["of"] and "for" in r.tested["templates"]  # a template never seen
    strata = {s.name for c in r.classes for s in c.strata}
    assert not strata & set(chose)  # every reported stratum is a held-out relation
    assert set(tested) <= strata
    summary = json.loads(result_json(r))
    assert summary["effect_sign"] == EFFECT_SIGN
    assert summary["chose"] == r.chose and summary["tested"] == r.tested
    markdown = render_markdown(finding_report(r))
    assert f"chose: relations {', '.join(chose)}; templates of" in markdown
    assert f"tested: relations {', '.join(tested)}; templates of, for" in markdown


def test_reported_effects_are_held_out_drops_whatever_the_discovery_prompts(smollm2) -> None:
    """A fixed selection's reported effect depends only on the held-out prompts, is the drop clean -
    ablated, and sits beside the discovery figure, which the discovery prompts alone move."""
    classes = {"query": [(19, 1), (20, 1)]}
    heldout = [
        make_retrieval_prompts(smollm2, 8, n, "heldout", seed=5, template=t)
        for n, t in ((3, "of"), (3, "for"))
    ]
    found = [make_retrieval_prompts(smollm2, 8, 4, "discovery", seed) for seed in (0, 1)]
    runs = [
        validate_classes(smollm2, classes, [], {"discovery": [one], "heldout": heldout}, [], 2, 0)[0][0]
        for one in found
    ]
    assert runs[0].heldout == runs[1].heldout  # the discovery prompts do not enter the reported figure
    assert runs[0].discovery != runs[1].discovery and runs[0].discovery.n_prompts == 8
    draws = random_same_layer_sets(smollm2, classes["query"], 2, seed=0)
    diffs = torch.cat([ablated_diffs(smollm2, p, [[], classes["query"], *draws]) for p in heldout], 1)
    drop, random_drop = diffs[0] - diffs[1], (diffs[0] - diffs[2:]).mean()
    assert runs[0].heldout.drop == pytest.approx(drop.mean().item(), abs=1e-5)  # clean - ablated
    assert runs[0].heldout.random_drop == pytest.approx(random_drop.item(), abs=1e-5)
    assert runs[0].heldout.beyond == pytest.approx((drop.mean() - random_drop).item(), abs=1e-5)


def test_no_head_is_selected_on_eap_s_estimate(smollm2) -> None:
    """Every head path patching selects was patched exactly, even with no fixed number of exact senders
    (n_exact=0): EAP's estimate of a head's drop can be a third smaller than the exact one (it leaves
    out the route through the MLPs), so a selection on it mixes two scales."""
    settings = RetrievalSettings(n_prompts=8, n_exact=0)
    discovery = make_retrieval_prompts(smollm2, 8, 4, "discovery", seed=0)
    evidence = discovery_evidence(smollm2, discovery, edge_scores(smollm2, discovery, None))
    _, found = path_patching_step(smollm2, evidence, None, "logits", settings)
    assert found
    patched = evidence.patcher(
        discovery.logit_diff, receivers="logits", senders=[(h.layer, h.index) for h in found]
    )
    exact = (patched.target.mean() - patched.values.mean(-1)).tolist()
    assert [h.effect for h in found] == pytest.approx(exact, abs=1e-5)
