"""The one analysis path on a user's prompt pairs: families held out whole, named positions, the
engine's ablations, and every reported figure measured on held-out families only."""

import csv
import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

import interp
from circuits.cli import app
from circuits.edge_circuits import EdgeCircuitSettings, find_edge_circuit, ioi_task
from circuits.edge_circuits.report import edge_headline, edges_against_heads
from circuits.edge_circuits.run import CircuitTask, circuit_prompts
from circuits.evidence import (
    P_RESAMPLES,
    Strata,
    beyond_ci,
    beyond_random,
    ci_verdict,
    class_verdict,
    faithfulness_verdict,
    head_class,
    judge_class,
    label_strata,
    mean_ci,
    random_same_layer_sets,
    split_families,
    stratum_drops,
)
from circuits.finding import finding_report
from circuits.ioi.task import IOI_POSITIONS, ioi_pair_task
from circuits.path import PathSettings, head_path, pair_task
from circuits.path.steps import discover, estimated_drops, metric_with_heads_ablated
from circuits.path.task import NO_FAMILY
from circuits.results_file import load_result
from circuits.sections import (
    ONE_RANDOM_SET,
    SHORT_RANDOM_SETS,
    ClassView,
    class_sections,
    render_html,
    render_markdown,
    result_json,
    write_sections,
)
from interp.interventions.engine import RunOptions
from interp.interventions.patching import attribution_patching
from interp.io.serialize import encode

AGREEMENT = Path(__file__).parents[1] / "docs" / "guide" / "data" / "agreement.csv"
SETTINGS = PathSettings(n_candidates=8, max_heads=4, n_random=3)


AGREEMENT_SIZE = {"per_family": 4, "families": 8}  # the `agreement` task's: 4 of its families held out


def agreement_rows(per_family: int = 6, families: int = 4) -> list[dict[str, str]]:
    with AGREEMENT.open(newline="") as file:
        rows = list(csv.DictReader(file))
    kept, seen = [], {}
    for row in rows:
        seen.setdefault(row["family"], 0)
        if len(seen) <= families and seen[row["family"]] < per_family:
            seen[row["family"]] += 1
            kept.append(row)
    return kept


@pytest.fixture(scope="module")
def agreement(smollm2):
    return pair_task(smollm2, agreement_rows(**AGREEMENT_SIZE), name="agreement")


@pytest.fixture(scope="module")
def result(smollm2, agreement):
    return head_path(smollm2, agreement, SETTINGS)


def test_a_verdict_does_not_rest_on_which_random_sets_were_drawn():
    """The CI beyond random resamples the random sets as well as the prompts: a class that beats four
    random sets but not a fifth as strong as itself is not confirmed, though its CI over prompts alone
    (the random sets' mean taken as known) excludes zero."""
    prompts = torch.linspace(-1, 1, 32)
    found = 0.1 + 0.05 * prompts
    random_sets = torch.stack(
        [0.01 * prompts, -0.01 * prompts, 0.02 * prompts, 0 * prompts, 0.3 + 0.05 * prompts]
    )
    over_prompts = mean_ci(found - random_sets.mean(0))
    assert over_prompts[0] > 0  # the old CI: confirmed
    tested = beyond_random(found, random_sets)
    assert tested.beyond_ci[0] < 0 < tested.beyond_ci[1]
    assert tested.beyond == pytest.approx(float((found - random_sets.mean(0)).mean()))
    alike = torch.stack([0.01 * prompts] * 5)  # random sets that agree: the prompts' CI alone
    assert beyond_ci(torch.cat([found[None], alike])) == pytest.approx(
        mean_ci(found - alike.mean(0)), abs=1e-6
    )
    with pytest.raises(ValueError, match="at least one random set"):
        beyond_ci(found[None])


def test_a_stratum_holds_by_its_direction_or_by_its_ci():
    beyond = torch.tensor([0.5, 0.7, 0.6, 0.4, -0.2, 0.1, -0.3, 0.2, 3.0, 2.0, 4.0])
    effects = torch.stack([beyond, torch.zeros_like(beyond)])  # against one random set of no effect
    strata = label_strata("family", ["a"] * 4 + ["b"] * 4 + ["c"] * 3)
    by_mean = stratum_drops(effects, strata)
    assert [(s.kind, s.name, s.n_prompts, s.holds) for s in by_mean] == [
        ("family", "a", 4, True), ("family", "b", 4, False), ("family", "c", 3, None),
    ]  # fmt: skip
    assert by_mean[0].beyond_ci[0] > 0 and by_mean[2].beyond_ci is None  # 3 prompts: no CI, no verdict
    assert by_mean[2].beyond == pytest.approx(3.0)
    by_ci = stratum_drops(effects, strata, by_ci=("family",))
    assert [s.holds for s in by_ci] == [True, False, None]
    assert [s.holds for s in stratum_drops(-effects, strata, sign=-1)] == [s.holds for s in by_mean]
    assert stratum_drops(effects, [("order", "none", torch.zeros(11, dtype=torch.bool))]) == []
    assert class_verdict(True, by_mean, {"family": "all"}) == "family-dependent"  # c does not count
    assert class_verdict(True, by_mean[:1] + by_mean[2:], {"family": "all"}) == "confirmed"
    assert class_verdict(True, by_mean[2:], {"family": "most"}) == "confirmed"  # no family to judge by


def test_a_task_without_positions_or_families_names_the_positions_where_its_prompts_differ():
    """toy-ioi's IOI prompts against their ABC corruptions (the three names changed), given as a user's
    pairs with no named position and no family: the changed positions are IO, S1 and S2, classes are
    named by attention to them, and each prompt, its own family, gets no row of its own."""
    toy = interp.load_model("toy-ioi")
    ioi = ioi_pair_task(toy, 16)
    n = len(ioi)
    task = dataclasses.replace(
        ioi, positions={}, families=tuple(NO_FAMILY.format(i) for i in range(n)), strata=("all",) * n,
        heldout_families=None, has_families=False,
    )  # fmt: skip
    named = task.with_changed_positions()
    assert list(named.positions) == ["changed 1", "changed 2", "changed 3"]
    names = torch.stack([ioi.positions[name] for name in IOI_POSITIONS]).sort(0).values
    assert torch.equal(torch.stack(list(named.positions.values())), names)
    assert not task.split()[1].has_families
    result = head_path(toy, task, PathSettings(n_candidates=8, max_heads=6, n_random=4))
    assert not result.extras.by_family and result.extras.notes[0].startswith("no position was named")
    assert any(c.name.startswith("to changed") for c in result.classes)
    assert all(set(c.details["attention"]) == set(named.positions) for c in result.classes)
    assert all(s.kind != "family" for c in result.classes for s in c.strata)
    assert "nan" not in render_markdown(finding_report(result)).lower()
    same = dataclasses.replace(task, corrupted=task.clean, corrupted_end=task.end)
    assert same.with_changed_positions().positions == {}  # nothing differs: nothing to name


ANALYSES = ("path/steps.py", "ioi/evaluate.py", "retrieval/find.py", "icl/pipeline.py", "icl/fv_pipeline.py",
            "hop/locate.py")  # fmt: skip


def test_nothing_is_confirmed_where_the_model_shows_no_behaviour():
    """An untrained model of toy-ioi's shape prefers neither answer (its held-out logit diff's CI spans
    0), yet one of its heads lowers the logit diff by 0.002 beyond random heads on the held-out
    prompts, a CI over the prompts that excludes 0 (8 of 300 such models had a class "confirmed" or
    "stratum-dependent" so, before the CIs resampled the templates): the path confirms no class of a
    behaviour the model does not show. Nor does a faithfulness get a band: the model's effect over
    everything ablated spans 0 on the held-out prompts, for the heads and for the edges (the heads kept
    gave "not faithful" at -1.89, the edges "overshoots" at 1.52)."""
    model = interp.load_model("toy-ioi")
    model.init_weights(4000)
    result = head_path(model, ioi_pair_task(model, 64), PathSettings())
    assert any(ci_verdict(mean_ci(c.per_prompt), c.sign) == "confirmed" for c in result.classes)
    assert [c.verdict for c in result.classes] == ["unconfirmed"] * len(result.classes)
    assert any("prefers neither answer on the held-out prompts" in note for note in result.extras.notes)
    assert faithfulness_verdict(result.faithfulness).startswith("undetermined: the model's own effect")
    low, high = result.faithfulness.model_effect_ci
    assert low < 0 < high
    settings = EdgeCircuitSettings(method="eap", n_edges=20, curve_fractions=None)
    heldout = ioi_task(model, 64, split="heldout")
    edge = find_edge_circuit(model, ioi_task(model, 64), settings, heldout=heldout)
    headline = edge_headline(edge)[0]
    assert headline.endswith(
        f"({float(edge.faithfulness.faithfulness[0]):.2f}) divides by noise: the model does not do the task "
        "here"
    ), headline
    assert (
        "overshoots" not in headline and "undetermined: the model's own effect on these prompts" in headline
    )
    assert "undetermined on held-out prompts of the 2 held-out families (" in headline  # toy-ioi holds out 2
    assert "(95% CI over prompts within each family; " in headline
    none_kept = render_markdown(finding_report(dataclasses.replace(result, classes=[])))
    assert "no class was kept, so none is judged per stratum or family" in none_kept
    assert "no strata or families" not in none_kept  # the faithfulness is still given per stratum


def test_random_same_layer_baselines_are_drawn_and_compared_in_one_module():
    circuits = Path(__file__).parents[1] / "circuits"
    for path in circuits.rglob("*.py"):
        if path != circuits / "evidence.py":
            calls = re.findall(r"\b(random_same_layer_sets|beyond_random|stratum_drops)\(", path.read_text())
            assert not calls, f"{path} draws or compares random heads itself ({calls}); call judge_class"
    assert all("judge_class(" in (circuits / name).read_text() for name in ANALYSES)


def test_one_judge_reads_the_strata_kinds_it_is_given(tiny_model):
    found = head_class(tiny_model, "movers", [(1, 2)], 4, seed=3)
    assert found.draws == random_same_layer_sets(tiny_model, [(1, 2)], 4, seed=3)
    assert all(draw[0][0] == 1 and draw != [(1, 2)] for draw in found.draws)
    outside = [(0, 0), (1, 0)]
    alone = head_class(tiny_model, "m", [(1, 2)], 3, outside=outside)
    assert alone.draws == [[(1, 0)]] * 3
    generator = torch.Generator().manual_seed(0)
    random = 0.1 * torch.randn(4, 24, generator=generator)  # [draw, prompt]
    helps = 1 + 0.1 * torch.randn(24, generator=generator)
    for judged in (
        judge_class(alone, torch.cat([helps[None], random[:3]])),
        judge_class(found, torch.cat([helps[None], random])),
    ):
        lines = class_sections([judged], ClassView())[0].lines
        assert judged.one_random_set == (judged.random_sets == [["L1H0"]] * 3)  # the report says so
        assert any(ONE_RANDOM_SET in line for line in lines) == judged.one_random_set
    for outside in ([(1, 0)], []):  # too few heads outside the class: random sets of fewer heads than it
        short = head_class(tiny_model, "pair", [(1, 1), (1, 2)], 3, outside=outside)
        assert all(len(draw) == len(outside) for draw in short.draws)
        judged = judge_class(short, torch.cat([helps[None], random[:3] if outside else torch.zeros(3, 24)]))
        assert judged.verdict == "unconfirmed" and judged.random_sets_short
        lines = class_sections([judged], ClassView())[0].lines
        if outside:  # a baseline of fewer heads: shown, and said to be short
            assert judged.heldout.beyond_ci[0] > 0 and any(SHORT_RANDOM_SETS in line for line in lines)
        else:  # none at all: no figure beyond random (an empty set's 0 made the raw drop read as one)
            assert math.isnan(judged.heldout.beyond) and any("no random heads" in line for line in lines)
    helps[16:] = -0.5  # not in the third template
    strata = label_strata("order", ["ABBA", "BABA"] * 12) + label_strata(
        "template", [f"T{i // 8}" for i in range(24)]
    )
    ruled = Strata(strata, {"order": "all", "template": "most"})
    judged = judge_class(found, torch.cat([helps[None], random]), strata=ruled)
    assert judged.verdict == "confirmed" and judged.heldout.beyond_ci[0] > 0
    assert [s.holds for s in judged.strata] == [True, True, True, True, False]
    assert judged.note == "measured on held-out data only (none of it chose the heads)"
    helps[:8], helps[8:] = 3.0, -0.2  # holds in one template of three (pooled, it still holds)
    assert judge_class(found, torch.cat([helps[None], random]), strata=ruled).verdict == "template-dependent"
    assert judge_class(found, torch.cat([helps[None], random]), strata=Strata(strata)).verdict == "confirmed"
    against = head_class(tiny_model, "negative", [(1, 2)], 4, seed=3, sign=-1)
    lowers = torch.cat([-1 - 0.1 * torch.rand(1, 24, generator=generator), random])
    judged = judge_class(against, lowers, discovery=lowers, strata=ruled)
    assert judged.verdict == "confirmed" and judged.heldout.beyond_ci[1] < 0  # in its direction
    assert judged.note.startswith("holds on held-out families (-")  # its figures as measured: negative
    assert f"{judged.heldout.beyond:+.3g} against {judged.discovery.beyond:+.3g}" in judged.note
    assert judge_class(against, lowers, evidence_holds=False).verdict == "unconfirmed"
    assert class_verdict(True, judged.strata, {"order": "all", "relation": "all"}) == "confirmed"
    with pytest.raises(ValueError, match="unknown dependence rule"):
        class_verdict(True, judged.strata, {"order": "every"})


def test_families_are_held_out_whole(agreement):
    split = agreement.family_split()
    discovery, heldout = agreement.split()
    assert set(discovery.families) == set(split.discovery) and set(heldout.families) == set(split.heldout)
    assert not set(discovery.families) & set(heldout.families)
    assert len(discovery) + len(heldout) == len(agreement)
    named = split_families(agreement.families, heldout=["The N of the M"])
    assert named.heldout == ("The N of the M",)
    with pytest.raises(ValueError, match="not among the task's families"):
        split_families(agreement.families, heldout=["no such frame"])
    with pytest.raises(ValueError, match="every family of the task is held out"):
        split_families(agreement.families, heldout=sorted(set(agreement.families)))
    with pytest.raises(ValueError, match="no held-out family named"):
        split_families(agreement.families, heldout=[])
    with pytest.raises(ValueError, match="needs two or more"):
        split_families(["one"] * 5)


def test_a_family_column_is_all_or_nothing(smollm2):
    rows = agreement_rows(per_family=2, families=2)
    rows[0] = {**rows[0], "family": ""}
    with pytest.raises(ValueError, match="lack a family"):
        pair_task(smollm2, rows)


def test_named_positions_find_the_kth_occurrence(smollm2):
    text = "When Mary and John went to the store, John gave a drink to"
    row = {"clean": text, "corrupted": text.replace("John", "Paul"), "correct": " Mary", "incorrect": " John",
           "pos:S1": " John", "pos:S2": " John#2", "pos:IO": " Mary"}  # fmt: skip
    task = pair_task(smollm2, [row, {**row, "correct": " John", "incorrect": " Mary"}])  # not a repeat
    tokens = smollm2.to_str_tokens(task.clean[0])
    johns = [i for i, token in enumerate(tokens) if token == " John"]
    assert task.positions["S1"].tolist() == [johns[0]] * 2 and task.positions["S2"].tolist() == [johns[1]] * 2
    assert tokens[int(task.positions["IO"][0])] == " Mary"
    with pytest.raises(ValueError, match="does not occur 3 time"):
        pair_task(smollm2, [{**row, "pos:S2": " John#3"}])


def test_counterfactual_ablation_of_pairs_of_different_lengths_is_refused(smollm2):
    row = {"clean": "The keys near the old cabinet", "corrupted": "The key near the cabinet",
           "correct": " are", "incorrect": " is"}  # fmt: skip
    task = pair_task(smollm2, [row, {**row, "correct": " is", "incorrect": " are"}])  # not a repeat
    with pytest.raises(ValueError, match="different lengths.*--ablation mean"):
        head_path(smollm2, task, SETTINGS)
    task.check_ablation("mean")  # the mean over the corrupted prompts reads no other prompt's padding


def test_pairs_without_a_contrast_are_refused(smollm2, agreement):
    """A family whose corrupted prompts were copied from the clean ones: every effect on it would be 0
    (held out, it made every class unconfirmed and the faithfulness undefined): refused when the file is
    read (`interp circuit` and `interp patch`: before a model loads, test_cli_validation), and in a task
    built from tokens before the path's first patched run."""
    rows = agreement_rows(**AGREEMENT_SIZE)
    copied = rows[:-6] + [{**row, "corrupted": row["clean"]} for row in rows[-6:]]
    with pytest.raises(
        ValueError, match=f"6 pairs have the same clean and corrupted prompt .the first: pair {len(rows) - 5}"
    ):
        pair_task(smollm2, copied)
    same = torch.arange(len(agreement)) >= len(agreement) - 6
    tokens = dataclasses.replace(
        agreement, corrupted=torch.where(same[:, None], agreement.clean, agreement.corrupted)
    )
    with pytest.raises(
        ValueError, match=f"6 pairs have the same clean and corrupted prompt.*{rows[-6]['family']}"
    ):
        head_path(smollm2, tokens, SETTINGS)
    tokens.check_ablation("mean")  # the mean over the corrupted prompts still differs from each clean run


def test_a_path_without_a_faithfulness_reports_why(result):
    """Where the model does as well with every head ablated, the faithfulness is None (as every analysis
    gives it) and the report says what every head's ablation moved instead of a ratio."""
    report = render_markdown(finding_report(dataclasses.replace(result, faithfulness=None)))
    assert "have no faithfulness (the metric moves" in report
    assert "keep faithfulness" not in report


def test_the_paths_ablation_is_patching_each_heads_output_from_the_corrupted_prompt(smollm2, agreement):
    task = agreement.subset(range(6))
    head = (26, 0)
    with torch.no_grad():
        _, corrupted = smollm2.run_with_cache(task.corrupted, names_filter="blocks.26.attn.hook_z")

        def write(z, hook):
            z[:, :, head[1]] = corrupted[hook.name][:, :, head[1]]
            return z

        expected = task.metric(
            smollm2.run_with_hooks(task.clean, fwd_hooks=[("blocks.26.attn.hook_z", write)])
        )
    measured = metric_with_heads_ablated(smollm2, task, [[head]], "counterfactual")[0]
    torch.testing.assert_close(measured, expected.float(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("ablation", ["counterfactual", "mean"])
def test_heads_are_ranked_by_an_estimate_of_the_paths_own_ablation(smollm2, agreement, ablation):
    """Step 1's estimated drop is attribution patching of the ablation the path then measures: minus
    the gradient on the clean run times (what the ablation writes - the clean z), written here with
    plain hooks; for counterfactual ablation it is interp's attribution_patching (noising) too."""
    task = agreement.subset(range(6))
    names = smollm2.layer_hook_names("z")
    with torch.no_grad():
        _, corrupted = smollm2.run_with_cache(task.corrupted, names_filter=names)
    mask = torch.ones_like(task.corrupted) if task.corrupted_mask is None else task.corrupted_mask
    real = mask.bool()[..., None, None]
    kept = {}

    def keep(z, hook):
        z.retain_grad()
        kept[hook.name] = z

    task.metric(
        smollm2.run_with_hooks(task.clean, fwd_hooks=[(name, keep) for name in names])
    ).sum().backward()
    expected = []
    for name in names:
        z = corrupted[name]
        written = z if ablation == "counterfactual" else (z * real).sum(0) / real.sum(0)
        expected.append(-((written - kept[name].detach()) * kept[name].grad).sum((1, 3)).mean(0))
    estimated = estimated_drops(smollm2, task, ablation)
    torch.testing.assert_close(estimated, torch.stack(expected).flatten().float().cpu(), atol=1e-4, rtol=1e-3)
    if ablation == "counterfactual":
        noising = attribution_patching(
            smollm2, task.clean, task.corrupted, task.metric, "z", direction="noise",
            options=RunOptions(logit_pos=task.end),
        )  # fmt: skip
        torch.testing.assert_close(
            estimated, (noising.target[None] - noising.values).mean(-1), atol=1e-4, rtol=1e-3
        )


def test_every_reported_effect_is_measured_on_held_out_families(smollm2, agreement, result):
    discovery, heldout = agreement.split()
    assert set(result.tested["families"]) == set(heldout.families)
    assert set(result.chose["families"]) == set(discovery.families)
    heads, _ = discover(smollm2, discovery, SETTINGS)  # the selection sees discovery prompts only
    assert sorted(heads) == sorted(
        (int(label[1:].split("H")[0]), int(label.split("H")[1])) for c in result.classes for label in c.heads
    )
    cfg = smollm2.cfg
    unclaimed = [(layer, head) for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]
    unclaimed = [
        head for head in unclaimed if head not in set(heads)
    ]  # no class's random set holds a class's head
    for check in result.classes:
        members = [(int(label[1:].split("H")[0]), int(label.split("H")[1])) for label in check.heads]
        draws = random_same_layer_sets(smollm2, members, SETTINGS.n_random, SETTINGS.seed, unclaimed)
        assert not {f"L{layer}H{head}" for draw in draws for layer, head in draw} & {
            label for c in result.classes for label in c.heads
        }
        values = metric_with_heads_ablated(smollm2, heldout, [[], members, *draws], SETTINGS.ablation)
        drops = values[0][None] - values[1:]
        again = beyond_random(drops[0], drops[1:], SETTINGS.seed, P_RESAMPLES, list(heldout.families))
        assert again.beyond == pytest.approx(check.heldout.beyond, abs=1e-4)
        assert again.beyond_ci == pytest.approx(check.heldout.beyond_ci, abs=1e-4)
        assert {s.name for s in check.strata if s.kind == "family"} == set(heldout.families)


def test_subject_heads_carry_agreement_on_held_out_frames(result):
    """SmolLM2 reads the subject's number at the verb: a class attending to the subject is kept,
    confirmed beyond random same-layer heads on sentence frames that did not choose it."""
    to_subject = [c for c in result.classes if c.name == "to subject"]
    assert to_subject and to_subject[0].verdict == "confirmed"
    assert to_subject[0].details["attention"]["subject"] >= SETTINGS.attention_threshold
    assert to_subject[0].heldout.beyond_ci[0] > 0
    faithfulness = result.faithfulness
    assert 0 < faithfulness.ratio_ci[0] <= faithfulness.ratio <= faithfulness.ratio_ci[1]


def test_the_report_renders_the_same_content_in_every_format(result, tmp_path):
    report = finding_report(result)
    markdown = render_markdown(report)
    assert "## What chose and what tested" in markdown and "tested: families" in markdown
    assert all(name in markdown for name in result.tested["families"])
    parsed = json.loads(result_json(result))  # numbers, not the report's text
    assert parsed["classes"][0]["name"] == result.classes[0].name
    assert parsed["classes"][0]["heldout"]["beyond_ci"] == list(result.classes[0].heldout.beyond_ci)
    assert "<table>" in render_html(report)
    out = tmp_path / "report.md"
    write_sections(report, "markdown", out, Console(), result)
    assert out.read_text() == markdown.rstrip("\n") + "\n"  # a text file ends its last line, once
    write_sections(report, "json", out, Console(), result)
    assert out.read_text() == result_json(result) + "\n"


def test_one_held_out_family_is_claimed_for_its_prompts_not_for_families(smollm2):
    """Two families split one against one: the CIs resample the held-out family's prompts only, so the
    report claims what holds on new prompts of that family, never on held-out families."""
    task = pair_task(smollm2, agreement_rows(per_family=6, families=2), name="agreement")
    finding = head_path(smollm2, task, SETTINGS)
    [family] = finding.tested["families"]
    report = finding_report(finding)
    text = "\n".join([*report.headline, *(line for section in report.sections for line in section.lines)])
    assert f"confirmed on held-out prompts of the one held-out family ({family})" in report.headline[0]
    assert "CIs: 95% bootstrap over prompts" in text and "held-out families" not in text
    assert all("held-out families" not in found.note for found in finding.classes)


def test_interp_circuit_holds_out_the_families_named(tmp_path):
    path, saved = tmp_path / "agreement.csv", tmp_path / "circuit.json"
    rows = agreement_rows(per_family=3)
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    named = ("The N of the M", "The N that the M saw")
    run = CliRunner().invoke(
        app,
        ["circuit", "--task", str(path), "--method", "eap", "--edges", "50", "--save", str(saved),
         "--heldout-families", ",".join(named)],
    )  # fmt: skip
    assert run.exit_code == 0, run.output
    result = load_result(saved)
    assert result.heads.tested == {"families": list(named)}
    assert result.heads.chose == {"families": ["The N near the M", "The N behind the M"]}
    assert set(result.heldout_task.families) == set(named)  # the edge circuit's held-out prompts too
    assert not set(result.task.families) & set(named) and "tested on" in result.split
    rendered = tmp_path / "circuit-summary.json"
    run = CliRunner().invoke(app, ["render", str(saved), "--format", "json", "--out", str(rendered)])
    assert run.exit_code == 0, run.output
    heads = json.loads(rendered.read_text())["heads"]  # the head path's numbers, not its report's text
    assert heads["tested"] == {"families": list(named)}
    assert heads["faithfulness"]["ratio_ci"] == list(result.heads.faithfulness.ratio_ci)  # over 2 families
    for found, check in zip(heads["classes"], result.heads.classes, strict=True):
        assert found["heads"] == check.heads and found["heldout"]["beyond"] == check.heldout.beyond
    older = tmp_path / "older.json"  # the head path as files saved before 2026-11-29 hold it
    document = json.loads(saved.read_text())
    document["result"]["fields"]["heads"] = older_path_result(document["result"]["fields"]["heads"])
    older.write_text(json.dumps(document))
    read = load_result(older).heads
    for found, check in zip(read.classes, result.heads.classes, strict=True):
        assert repr((found.details, found.heldout, found.strata)) == repr(
            (check.details, check.heldout, check.strata)
        )
    assert (read.chose, read.tested) == (result.heads.chose, result.heads.tested)
    assert encode(read.faithfulness) == encode(result.heads.faithfulness)
    assert encode(read.extras) == encode(result.heads.extras)

    def markdown(found) -> str:  # such files hold the model's name, not its provenance
        return render_markdown(finding_report(found)).replace(f"Model: {found.provenance}.", "Model: .")

    assert markdown(read) == markdown(result.heads)
    run = CliRunner().invoke(app, ["render", str(saved), "--format", "markdown"])
    assert run.exit_code == 0 and "(95% CI over prompts within each family;" in run.output  # the edges'
    assert "prompts of the 2 held-out families (The N of the M, The N that the M saw)" in run.output
    assert not re.search(r"\bnan\b", run.output, re.IGNORECASE), "a CI over 2 families shows as NaN"


def older_path_result(node: dict) -> dict:
    """A stored head-path Finding as files saved before 2026-11-29 hold it: a PathResult whose classes
    are ClassChecks (the attention a field of their own, no random sets or per-prompt effects)."""
    fields, figures = node["fields"], node["fields"]["extras"]["fields"]
    classes = []
    for check in fields["classes"]:
        check_fields = dict(check["fields"])
        attention = dict(check_fields.pop("details")["__items__"])["attention"]
        for name in ("random_sets", "random_effects", "per_prompt"):
            del check_fields[name]
        classes.append({"__dataclass__": "ClassCheck", "fields": {**check_fields, "attention": attention}})
    (axis, chose), (_, tested) = fields["chose"]["__items__"][0], fields["tested"]["__items__"][0]
    summary = fields["faithfulness"]["fields"]
    return {"__dataclass__": "PathResult", "fields": {
        "task": figures["task"], "model": fields["model"], "settings": fields["settings"],
        "chose": {"__tuple__": chose}, "tested": {"__tuple__": tested}, "by_family": axis == "families",
        "n_discovery": figures["n_discovery"], "n_heldout": figures["n_heldout"],
        "all_heads_drop": figures["all_heads_drop"], "drops": figures["drops"], "classes": classes,
        "faithfulness": summary["ratio"], "faithfulness_ci": summary["ratio_ci"],
        "faithfulness_summary": fields["faithfulness"], "faithfulness_strata": fields["faithfulness_strata"],
        "sign_rule": "drop", "notes": figures["notes"],
    }}  # fmt: skip


def test_the_edge_circuit_and_the_head_classes_are_tested_on_the_same_held_out_prompts(smollm2, tmp_path):
    """Issue 50: a file is read once and split once by whole families. Eleven pairs without a family
    column (each prompt its own family): the edge circuit chooses and tests on exactly the prompts the
    head classes do (the path's rounded half, 6 held out, not 11 // 2); with families drawn by a seed,
    the edge circuit's held-out prompts are the head path's held-out families' prompts."""
    path, saved = tmp_path / "eleven.csv", tmp_path / "circuit.json"
    columns = ("clean", "corrupted", "correct", "incorrect")
    rows = [{key: row[key] for key in columns} for row in agreement_rows(per_family=3)][:11]
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows(rows)
    run = CliRunner().invoke(
        app, ["circuit", "--task", str(path), "--method", "eap", "--edges", "20", "--save", str(saved)]
    )
    assert run.exit_code == 0, run.output
    result, task = load_result(saved), pair_task(smollm2, path)
    chose = [task.families.index(label) for label in result.heads.chose["prompts"]]
    tested = [task.families.index(label) for label in result.heads.tested["prompts"]]
    figures = result.heads.extras
    assert (len(chose), len(tested)) == (figures.n_discovery, figures.n_heldout) == (5, 6)
    assert torch.equal(result.task.clean, task.clean[chose])
    assert torch.equal(result.heldout_task.clean, task.clean[tested])
    drawn = pair_task(smollm2, AGREEMENT)
    for seed in range(4):
        prompts = circuit_prompts(smollm2, CircuitTask(task=str(AGREEMENT)), EdgeCircuitSettings(seed=seed))
        found, held = drawn.split(seed=seed)  # as head_path draws it with PathSettings(seed=seed)
        assert prompts.heldout.families == list(held.families)
        assert prompts.prompt_pairs.families == list(found.families)
        assert prompts.pairs.heldout_families == tuple(dict.fromkeys(held.families))


def test_interp_circuit_on_a_pairs_file_reports_head_classes_held_out(tmp_path):
    path = tmp_path / "agreement.csv"
    rows = agreement_rows(per_family=3)
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    run = CliRunner().invoke(app, ["circuit", "--task", str(path), "--method", "eap", "--edges", "50"])
    assert run.exit_code == 0, run.output
    assert "Head classes (held out)" in run.stdout and "What chose and what tested" in run.stdout
    assert "stage 3 of 6: Discover heads" in run.stderr  # the head path's stages join the plan
    unequal = tmp_path / "unequal.csv"
    nouns = [
        ("keys", "key", "box"),
        ("boxes", "box", "key"),
        ("cats", "cat", "dog"),
        ("dogs", "dog", "cat"),
        ("pens", "pen", "cup"),
        ("cups", "cup", "pen"),
        ("lamps", "lamp", "desk"),
        ("desks", "desk", "lamp"),
    ]
    unequal.write_text(  # 8 pairs (4 to choose, 4 to test), each corrupted prompt a token shorter
        "clean,corrupted,correct,incorrect\n"
        + "".join(
            f"The {many} near the old {other},The {one} near the {other}, are, is\n"
            for many, one, other in nouns
        )
    )
    for metric in ("logit_diff", "prob"):  # the edges alone (prob: no head classes) are refused too
        options = ["--method", "eap", "--edges", "50", "--metric", metric]
        run = CliRunner().invoke(app, ["circuit", "--task", str(unequal), *options])
        assert run.exit_code != 0 and "different lengths" in " ".join(run.output.split())
        assert "Edge scores" not in run.stderr  # refused before any long work
    # a mean over corrupted prompts all shorter than a clean one has no mean at its last positions
    options = ["--method", "prune", "--prune-steps", "2", "--edges", "50", "--ablation", "mean"]
    run = CliRunner().invoke(app, ["circuit", "--task", str(unequal), *options])
    said = " ".join(run.output.split())
    assert run.exit_code != 0 and "'s clean prompt is" in said and "longer than every" in said, said
    assert "Edge scores" not in run.stderr  # refused before any long work


def test_interp_circuit_on_pairs_without_positions_or_families(tmp_path):
    """A user's pairs with neither named positions nor families: the classes are named by the positions
    where the prompts differ, no prompt gets a row (or a verdict) of its own, no figure is NaN, and an
    edge circuit that keeps less than the heads alone is explained."""
    path, saved = tmp_path / "pairs.csv", tmp_path / "circuit.json"
    columns = ("clean", "corrupted", "correct", "incorrect")
    rows = [{key: row[key] for key in columns} for row in agreement_rows()]
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    run = CliRunner().invoke(
        app, ["circuit", "--task", str(path), "--method", "eap", "--edges", "50", "--save", str(saved)]
    )
    assert run.exit_code == 0, run.output
    result = load_result(saved)
    heads = result.heads
    assert not heads.extras.by_family and "held out" in run.stdout and "nan" not in run.stdout.lower()
    assert (
        "changed (pair 1: ' lamps' -> ' lamp')" in heads.extras.notes[0]
    )  # the subject, where the pairs differ
    assert "to changed" in [c.name for c in heads.classes]
    [chose], [tested] = heads.chose.values(), heads.tested.values()
    named = [*chose, *tested]  # each pair its own family, numbered from 1 as the file's messages count
    assert sorted(named, key=lambda name: int(name.split()[1])) == [f"pair {i + 1}" for i in range(len(rows))]
    assert not [s for c in heads.classes for s in c.strata]  # no stratum column, no family column
    explained = edges_against_heads(result)
    edges_kept = float(result.faithfulness.faithfulness[0])
    assert bool(explained) == (edges_kept < heads.faithfulness.ratio)
    assert all(" ".join(line.split()) in " ".join(run.stdout.split()) for line in explained)
    high = float(result.faithfulness.ci()[1][0])  # the edges' CI, as the report gives it
    less = dataclasses.replace(result, heads=with_faithfulness(heads, high + 0.5, (high + 0.01, high + 1)))
    assert "ablate different things" in edges_against_heads(less)[0]
    assert f"({heads.extras.all_heads_drop:+.2f})" in edges_against_heads(less)[2]
    overlapping = dataclasses.replace(result, heads=with_faithfulness(heads, high + 0.5, (high, high + 1)))
    [line] = edges_against_heads(overlapping)  # the heads keep more, but not beyond the edges' CI
    assert "CIs overlap: no difference is shown" in line and "miss" not in line
    more = dataclasses.replace(less, heads=with_faithfulness(heads, edges_kept - 0.5, (-1.0, 1.0)))
    assert edges_against_heads(more) == []
    assert (
        edges_against_heads(dataclasses.replace(less, heads=dataclasses.replace(heads, faithfulness=None)))
        == []
    )


def with_faithfulness(found, ratio: float, ci: tuple[float, float]):
    """The head path's finding `found` with its faithfulness ratio and CI set."""
    faithfulness = dataclasses.replace(found.faithfulness, ratio=ratio, ratio_ci=ci)
    return dataclasses.replace(found, faithfulness=faithfulness)


def test_faithfulness_gives_the_per_prompt_error_beside_the_ratio(smollm2, agreement, result):
    """Issue 49 (7): the heads' faithfulness on held-out families with its per-prompt error and the
    share of prompts within ±20%, recomputed here from the metric per prompt; per family too."""
    _, heldout = agreement.split()
    heads = [
        (int(label[1:].split("H")[0]), int(label.split("H")[1])) for c in result.classes for label in c.heads
    ]
    every = [(layer, head) for layer in range(smollm2.cfg.n_layers) for head in range(smollm2.cfg.n_heads)]
    outside = [head for head in every if head not in set(heads)]
    full, kept, none = metric_with_heads_ablated(smollm2, heldout, [[], outside, every], SETTINGS.ablation)
    summary = result.faithfulness
    assert summary.ratio == pytest.approx(
        float((kept.mean() - none.mean()) / (full.mean() - none.mean())), abs=1e-4
    )
    assert summary.error == pytest.approx(
        float((kept - full).abs().mean() / (full.mean() - none.mean()).abs()), abs=1e-4
    )
    within = ((kept - full).abs() <= 0.2 * (full - none).abs()).float().mean()
    assert summary.within == pytest.approx(float(within), abs=1e-6)
    families = {s.name: s for s in result.faithfulness_strata if s.kind == "family"}
    assert set(families) == set(heldout.families)
    markdown = render_markdown(finding_report(result))
    assert "## Faithfulness (held out)" in markdown and "per-prompt error" in markdown


def test_a_pairs_file_whose_split_holds_out_too_few_families_says_so_before_it_runs(tmp_path):
    """Four families hold out two by default (six, three): too few to stand for new families, so the
    verdicts will be about those families' prompts, which the command says before its long work, with
    what to do for a claim about new families; eight hold out four, and a metric other than the logit
    difference says instead why there are no head classes."""
    two_named = ("The N near the M", "The N of the M")
    cases = [(4, None, "2 of the file's 4"), (6, None, "3 of the file's 6"), (8, None, None),
             (8, two_named, "2 of the file's 8")]  # fmt: skip
    for families, heldout, said in cases:
        path = tmp_path / f"agreement{families}.csv"
        rows = agreement_rows(per_family=2, families=families)
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        note = CircuitTask(task=str(path), heldout_families=heldout).heads_note()
        if said is None:
            assert note is None
            continue
        assert note.startswith(
            f"{said} families are held out: too few to stand for new families (at least 4)"
        )
        assert "verdicts and the faithfulness will be about these families' prompts" in note
        assert "--heldout-families" in note
        assert (
            CircuitTask(task=str(path), metric="prob")
            .heads_note()
            .startswith("no head classes with --metric prob")
        )
