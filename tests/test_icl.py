"""The in-context learning score and the heads that carry it: properties every good run has."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_same_finding_figures, tiny_config
from rich.console import Console
from typer.testing import CliRunner

import interp
from circuits.cli import app
from circuits.evidence import random_same_layer_sets
from circuits.finding import finding_report, write_finding_report
from circuits.heads import confirmed_induction, confirmed_induction_heads, head_report
from circuits.icl import (
    DocumentSplit,
    ICLSequences,
    ICLSettings,
    Windows,
    ablated_icl_scores,
    default_sequences,
    head_attributions,
    icl_report,
    plot_icl_over_training,
)
from circuits.icl.heads import ablated_z
from circuits.results_file import load_result, save_result
from circuits.sections import render_html, render_markdown
from interp.io.serialize import encode
from interp.tasks.corpus import BROWN_SOURCE, N_BROWN_TEXTS, brown_documents, document_tokens


@pytest.fixture(scope="module")
def toy() -> interp.HookedTransformer:
    return interp.load_model("toy-induction")


@pytest.fixture(scope="module")
def toy_heads(toy, tmp_path_factory):
    """(the induction heads interp heads confirms in toy-induction, the cache directory they went to)."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("INTERP_CACHE", str(cache))
        return confirmed_induction_heads(toy, n_samples=8), cache


@pytest.fixture(scope="module")
def toy_result(toy, toy_heads):
    return icl_report(toy, ICLSettings(n_documents=16, top=3, n_random=3), induction_heads=toy_heads[0])


def hand_scores(model: interp.HookedTransformer, tokens: torch.Tensor, windows: Windows) -> torch.Tensor:
    """Each document's late-window minus early-window loss, from model(tokens)'s own per-token loss."""
    losses = model(tokens, return_type="loss", loss_per_token=True)  # [:, t - 1] is token t's loss
    early = [t - 1 for t in windows.tokens(windows.early)]
    late = [t - 1 for t in windows.tokens(windows.late)]
    return (losses[:, late].mean(-1) - losses[:, early].mean(-1)).detach()


def test_toy_induction_uses_its_context_through_its_induction_heads(toy_result):
    result, figures = toy_result, toy_result.extras
    # repeated random tokens: the second copy is predictable only from the first
    assert figures.score.score < -3 and figures.score.ci[1] < 0
    assert figures.heldout.score < -3 and figures.discovery.score < -3
    *tops, induction = result.classes
    assert induction.heldout.drop > max(induction.random_effects) and induction.heldout.beyond_ci[0] > 0
    assert induction.details["attributed"] > 0
    # random heads are none of those chosen (the class, the top heads); on this 2 x 4 model the class
    # fills layer 1, so where a top head is in layer 0 the random sets are short of the class's size and
    # the class stays unconfirmed whatever its effect
    chosen = {*induction.heads, *(h.head for h in figures.heads)}
    drawn = {head for random_set in induction.random_sets for head in random_set}
    assert len(induction.random_sets) == 3 and not chosen & drawn
    assert induction.random_sets_short == (8 - len(chosen) < len(induction.heads))
    assert induction.verdict == ("unconfirmed" if induction.random_sets_short else "confirmed")
    # the top heads by attribution are those that carry the score on the held-out half, each a class of one
    # judged against random single heads (of its layer where it has others outside every class: layer 0)
    assert [top.heads for top in tops] == [[h.head] for h in figures.heads]
    assert [h.verdict for h in figures.heads] == [top.verdict for top in tops] == ["confirmed"] * 3
    assert all(h.exact > 0 and h.attributed > 0 for h in figures.heads)
    for top, effect in zip(tops, figures.heads, strict=True):
        drawn = [head for random_set in top.random_sets for head in random_set]
        assert (
            len(top.random_sets) == 3 and all(len(s) == 1 for s in top.random_sets) and not chosen & {*drawn}
        )
        assert effect.layer > 0 or all(head.startswith("L0") for head in drawn)
        assert top.heldout.drop == pytest.approx(effect.exact) and top.heldout.beyond > 0
    assert figures.loss_curve.shape == (result.settings.windows.n_tokens - 1,)


def test_icl_score_equals_the_models_own_losses(toy, toy_result):
    sequences = default_sequences(toy, 16, seed=0)
    hand = hand_scores(toy, sequences.tokens, sequences.windows)
    figures = toy_result.extras
    assert torch.allclose(figures.discovery.per_document, hand[:8], atol=1e-5)
    assert torch.allclose(figures.heldout.per_document, hand[8:], atol=1e-5)
    assert abs(figures.score.score - hand.mean().item()) < 1e-5


def test_every_heldout_document_is_scored_and_the_ablations_run_on_some(toy, toy_heads):
    split = DocumentSplit(discovery=4, ablated=4)
    settings = ICLSettings(n_documents=16, split=split, top=1, n_random=2)
    result = icl_report(toy, settings, induction_heads=toy_heads[0])
    sequences = default_sequences(toy, 16, seed=0)
    hand = hand_scores(toy, sequences.tokens, sequences.windows)
    chose, tested, figures = result.chose["documents"], result.tested["documents"], result.extras
    assert chose == sequences.names[:4] and tested == sequences.names[4:] and not set(chose) & set(tested)
    assert torch.allclose(figures.discovery.per_document, hand[:4], atol=1e-5)
    assert torch.allclose(figures.heldout.per_document, hand[4:], atol=1e-5)  # the headline: 12 held out
    assert figures.n_ablated(result) == 4 and split.sizes(16) == (4, 4)
    assert DocumentSplit(12, None).sizes(16) == (8, 8)
    *_, induction = result.classes  # the class test on the 4 ablated documents, as icl_report's engine runs
    _, clean, ablated = ablated_icl_scores(toy, sequences.tokens[4:8], sequences.windows, [toy_heads[0]])
    assert abs(induction.heldout.drop - (ablated[0] - clean).mean().item()) < 1e-5
    assert induction.heldout.n_prompts == len(induction.per_prompt) == 4


def test_the_headline_says_when_it_is_not_established(toy_result):
    figures = toy_result.extras
    assert figures.headline_verdict().startswith("established")
    per_document = torch.tensor([-0.5, 0.3, -0.4, 0.2, -0.3, 0.1, -0.2, 0.0])
    noisy = dataclasses.replace(figures.heldout, score=-0.1, ci=(-0.3, 0.1), per_document=per_document)
    verdict = dataclasses.replace(figures, heldout=noisy).headline_verdict()
    assert verdict.startswith("not established at 8 held-out documents") and "pass --n-documents" in verdict
    worse = dataclasses.replace(noisy, score=-0.01, ci=(-0.3, 0.1))  # needs thousands of documents
    brown = dataclasses.replace(figures, heldout=worse, source=BROWN_SOURCE).headline_verdict()
    assert f"more than the {N_BROWN_TEXTS} shipped texts hold: pass --n-documents {N_BROWN_TEXTS}" in brown
    own = dataclasses.replace(figures, heldout=worse).headline_verdict()  # the user's own documents
    assert re.search(r"pass --n-documents \d{4,} \(n_documents\)", own)
    worse = dataclasses.replace(noisy, score=0.05, ci=(-0.1, 0.2))
    assert "no sign" in dataclasses.replace(figures, heldout=worse).headline_verdict()
    two = dataclasses.replace(noisy, score=-9.9, ci=(-10.2, -9.7), per_document=per_document[:2])
    assert (
        dataclasses.replace(figures, heldout=two)
        .headline_verdict()
        .startswith("no verdict: 2 held-out documents, too few prompts")
    )  # a CI of two documents is their range: it was "established"
    from circuits.evidence import HeadClass
    from circuits.icl.pipeline import _judged
    from circuits.icl.results import TOP_FOUND_BY

    top = HeadClass(name="L0H1", heads=[(0, 1)], draws=[[(0, 2)]])  # a top head ablated on two documents
    changes = torch.tensor([[5.0, 5.1], [0.0, 0.1]], dtype=torch.float64)  # [the head, a random head]
    assert _judged(top, TOP_FOUND_BY, torch.zeros(2, 4), changes, 0).verdict == "unconfirmed"


def test_exact_ablation_equals_a_hooked_run(toy):
    sequences = default_sequences(toy, 8, seed=1)
    tokens, windows = sequences.tokens, sequences.windows
    _, cache = toy.run_with_cache(tokens)
    sets = [[(1, 0)], [(0, 1), (1, 2)]]
    for ablation in ("mean", "zero"):
        _, clean, ablated = ablated_icl_scores(toy, tokens, windows, sets, ablation)
        assert torch.allclose(clean, hand_scores(toy, tokens, windows), atol=1e-5)
        for heads, scores in zip(sets, ablated, strict=True):

            def by_hand(z, hook, heads=heads, ablation=ablation):  # the mean over every position
                for layer, head in heads:
                    if hook.name == interp.act_name("z", layer):
                        mean = cache[hook.name][:, :, head].mean((0, 1))
                        z[:, :, head] = 0 if ablation == "zero" else mean
                return z

            with toy.hooks(fwd_hooks=[(interp.act_name("z", layer), by_hand) for layer in (0, 1)]):
                assert torch.allclose(scores, hand_scores(toy, tokens, windows), atol=1e-5)


def test_resampling_identical_documents_changes_nothing(toy):
    sequences = default_sequences(toy, 4, seed=0)
    same = sequences.tokens[:1].repeat(4, 1)  # every document the same: another's z is its own
    attributions, _ = head_attributions(toy, same, sequences.windows, ablation="resample")
    assert attributions.abs().max() < 1e-5
    sets = [[(0, 1)], [(1, 0), (1, 3)]]
    _, clean, ablated = ablated_icl_scores(toy, same, sequences.windows, sets, ablation="resample")
    assert (ablated - clean).abs().max() < 1e-5


def test_resampling_gives_each_document_another_documents_z(toy):
    """No document draws its own z (an ablation that changes nothing), whatever the seed."""
    z = {"blocks.0.attn.hook_z": torch.arange(5.0)[:, None, None, None].expand(5, 3, 2, 4)}
    for seed in range(20):
        drawn = ablated_z(toy, z, "resample", seed)["blocks.0.attn.hook_z"][:, 0, 0, 0]
        assert (drawn != torch.arange(5.0)).all()


def test_the_induction_heads_are_read_from_the_cache(toy, toy_heads, monkeypatch):
    heads, cache = toy_heads
    assert heads and all(layer == 1 for layer, _ in heads)  # the second layer's heads
    (stored,) = (cache / "induction-heads").glob("*.json")
    stored.write_text(json.dumps({"model": "toy-induction", "heads": [[0, 3]]}))
    monkeypatch.setenv("INTERP_CACHE", str(cache))
    assert confirmed_induction_heads(toy, n_samples=8) == [(0, 3)]  # no head report ran
    assert confirmed_induction_heads(toy, n_samples=8, cache=False) == heads


@pytest.mark.parametrize("n_samples", [4, 8])
def test_the_induction_part_of_the_head_report_finds_its_induction_heads(toy, n_samples):
    """What `interp icl` computes without a cached head report: the head report's induction heads, in
    order, from the repeated probe and the induction check alone."""
    full = head_report(toy, n_samples=n_samples).extras.heads_of_type("induction")
    assert full and confirmed_induction(toy, n_samples=n_samples) == full


def test_cli_takes_the_induction_heads_from_a_head_report(toy_heads, tmp_path):
    runner = CliRunner()
    saved = runner.invoke(
        app, ["heads", "--model", "toy-induction", "--n-samples", "8", "--save", str(tmp_path / "h.json")]
    )
    assert saved.exit_code == 0, saved.output
    options = ["--n-documents", "8", "--top", "1", "--n-random", "2", "--save", str(tmp_path / "icl.json")]
    outcome = runner.invoke(
        app, ["icl", "--model", "toy-induction", "--induction-heads", str(tmp_path / "h.json"), *options]
    )
    assert outcome.exit_code == 0, outcome.output
    *_, induction = load_result(tmp_path / "icl.json").classes
    assert (
        induction.heads == [f"L{layer}H{head}" for layer, head in toy_heads[0]]
        and induction.details["found_by"] == "given"
    )
    outcome = runner.invoke(
        app, ["icl", "--model", "toy-induction", "--induction-heads", "none", *options[:4]]
    )
    assert outcome.exit_code == 0 and "No class tested" in outcome.output


def test_random_sets_come_from_the_class_layers_and_avoid_it():
    model = interp.HookedTransformer(tiny_config(n_layers=24, n_heads=8))
    heads = [(20, 1), (20, 4), (22, 0)]
    draws = random_same_layer_sets(model, heads, 5, seed=3)
    assert len(draws) == 5 and draws == random_same_layer_sets(model, heads, 5, seed=3)
    for draw in draws:
        assert sorted(layer for layer, _ in draw) == [20, 20, 22] and not set(draw) & set(heads)


def test_result_saves_and_renders_in_every_format(toy_result, tmp_path):
    save_result(toy_result, tmp_path / "icl.json")
    loaded = load_result(tmp_path / "icl.json")
    assert encode(loaded) == encode(toy_result)
    page = render_html(finding_report(loaded))
    assert "ICL score of toy-induction" in page and page.count("data:image/png;base64") == 1
    assert page.count('class="interp-heatmap"') == 1 and "<table>" in page
    console = Console(record=True, width=80)
    write_finding_report(loaded, "table", None, console)
    first = " ".join(console.export_text().split())
    assert first.startswith(  # the finding leads
        "In-context learning of toy-induction ICL score of toy-induction on 8 held-out documents:"
    )
    assert "data:image" not in first
    assert "that the model uses its context is established" in first
    for format in ("json", "markdown"):
        write_finding_report(loaded, format, tmp_path / f"icl.{format}", console)
        assert "confirmed" in (tmp_path / f"icl.{format}").read_text()


def test_the_report_renders_without_matplotlib(toy_result, monkeypatch):
    """matplotlib is not a requirement: the terminal and Markdown reports have no figure, and the HTML
    page says which figures need it."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    markdown = render_markdown(finding_report(toy_result))
    assert "ICL score of toy-induction" in markdown and "matplotlib" not in markdown
    page = render_html(finding_report(toy_result))
    assert "data:image/png" not in page
    assert "The figure of the loss per token: Plotting needs matplotlib" in page


def older_icl_file(finding, saved: Path, older: Path, class_effects: bool) -> None:
    """Save the ICL finding `finding` to `saved` and rewrite it as files saved before 2026-11-29 hold it
    (an ICLResult; with `class_effects`, each class as ICL's own record of it, a ClassEffect) into
    `older`."""
    save_result(finding, saved)
    document = json.loads(saved.read_text())
    stored, settings = document["result"]["fields"], finding.settings
    classes = stored["classes"]
    for node, judged in zip(classes, finding.classes, strict=True) if class_effects else []:
        fields, details = node["fields"], dict(node["fields"]["details"]["__items__"])
        heldout = fields["heldout"]["fields"]
        node.update(__dataclass__="ClassEffect", fields={
            "name": fields["name"], "heads": fields["heads"], **details, "change": heldout["drop"],
            "random_same_layers": judged.random_same_layers,
            "change_ci": heldout["drop_ci"], "random_sets": fields["random_sets"],
            "random_changes": fields["random_effects"], "difference": heldout["beyond"],
            "difference_ci": heldout["beyond_ci"], "verdict": fields["verdict"],
        })  # fmt: skip
    document["kind"] = "icl"
    document["result"] = {"__dataclass__": "ICLResult", "fields": {
        "model_name": finding.model, "provenance": finding.provenance, **stored["extras"]["fields"],
        "windows": encode(settings.windows), "ablation": settings.ablation, "seed": settings.seed,
        "discovery_names": finding.chose["documents"], "heldout_names": finding.tested["documents"],
        "n_ablated": finding.extras.n_ablated(finding), "classes": classes, "timings": stored["timings"],
    }}  # fmt: skip
    older.write_text(json.dumps(document))


@pytest.mark.parametrize("class_effects", [False, True], ids=["ClassVerdict", "ClassEffect"])
def test_an_older_icl_file_reads_with_the_same_numbers_and_renders_the_same(
    toy_result, class_effects, tmp_path
):
    """An ICLResult (saved before 2026-11-29), its classes as ClassVerdicts or, older, as ICL's own
    record (ClassEffect), reads as the Finding a fresh run makes: the same figures, documents and
    settings (the split as the sizes it made; the ClassEffect holds neither the per-document effect,
    the class's p nor the random sets' pooled mean, made of theirs)."""
    older_icl_file(toy_result, tmp_path / "icl.json", tmp_path / "older.json", class_effects)
    read = load_result(tmp_path / "older.json")
    assert_same_finding_figures(read, toy_result)
    settings, fresh = read.settings, toy_result.settings
    assert settings.split.sizes(settings.n_documents) == fresh.split.sizes(fresh.n_documents)
    assert dataclasses.replace(settings, split=fresh.split) == fresh
    for found, judged in zip(read.classes, toy_result.classes, strict=True):
        if class_effects:
            assert len(found.per_prompt) == 0 and len(judged.per_prompt) == found.heldout.n_prompts
            assert found.heldout.random_drop == pytest.approx(judged.heldout.random_drop, abs=1e-6)
            heldout = dataclasses.replace(found.heldout, random_drop=judged.heldout.random_drop)
            found = dataclasses.replace(
                found, heldout=heldout, per_prompt=judged.per_prompt, p=judged.p, p_bound=judged.p_bound
            )
        assert encode(found) == encode(judged)
    fresh = toy_result
    if class_effects:  # no p either: the report shows n/a
        without_p = [dataclasses.replace(c, p=math.nan, p_bound=False) for c in toy_result.classes]
        fresh = dataclasses.replace(toy_result, classes=without_p)
    assert render_markdown(finding_report(read)) == render_markdown(finding_report(fresh))


def test_bad_input_says_what_to_pass(toy):
    tokens = default_sequences(toy, 4).tokens
    short = ICLSequences(tokens=tokens[:, :30], source="cut", names=["a"] * 4, windows=Windows(12, 35, 21))
    with pytest.raises(ValueError, match="late window ends at token 45, beyond the documents' 30 tokens"):
        icl_report(toy, sequences=short, induction_heads=())
    with pytest.raises(ValueError, match="windows overlap"):
        default_sequences(toy, 4, windows=Windows(12, 20, 21))
    with pytest.raises(ValueError, match="token 0 has no prediction"):
        default_sequences(toy, 4, windows=Windows(5, 35, 21))
    with pytest.raises(ValueError, match=r"n_documents \(.*\) must be an integer >= 4"):
        default_sequences(toy, 3)
    with pytest.raises(ValueError, match="unknown ablation 'counterfactual'"):
        ICLSettings(ablation="counterfactual")
    with pytest.raises(
        ValueError, match="no tokenizer and was not trained on a task with repeated structure"
    ):
        default_sequences(interp.load_model("toy-ioi"), 8)
    with pytest.raises(ValueError, match="out of range"):
        icl_report(toy, ICLSettings(n_documents=4), induction_heads=[(2, 0)])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--induction-heads", "L1X0"], 'give heads as "L17H3,L19H0"'),
        (["--plot", "icl.txt"], "must end in .png, .svg or .pdf"),
        (["--late", "100"], "late window ends at token"),
        (["--early", "50", "--late", "60", "--window", "51"], "the windows overlap"),
        (["--format", "html"], "needs --out"),
    ],
)
def test_cli_refuses_bad_options(options, message):
    outcome = CliRunner().invoke(app, ["icl", "--model", "toy-induction", *options])
    assert outcome.exit_code == 2 and message in " ".join(outcome.output.split())


def test_brown_documents_fill_smollm2s_context(smollm2):
    documents = brown_documents()
    assert len(documents) == 125 and len({d.genre for d in documents}) == 15
    lengths = [len(smollm2.to_tokens(d.text, truncate=False)[0]) for d in documents]
    assert min(lengths) > smollm2.cfg.n_ctx // 4 and min(lengths) >= 2048
    sequences = default_sequences(smollm2, 6, seed=0)
    assert sequences.tokens.shape == (6, 526) and sequences.windows == Windows(50, 500, 51)
    texts = [d.text for d in documents[:2]]  # no token per document was an empty [2, 0] batch
    for n_tokens in (0, -5):
        with pytest.raises(ValueError, match="n_tokens \\(tokens per document\\) must be an integer >= 1"):
            document_tokens(smollm2, texts, n_tokens)


def test_the_phase_change_shows_across_training(checkpointed_run, tmp_path):
    options = ["--n-documents", "8", "--top", "1", "--n-random", "2", "--induction-heads", "L1H0"]
    files = ["--plot", str(tmp_path / "run.png"), "--save", str(tmp_path / "run.json")]
    outcome = CliRunner().invoke(app, ["icl", "--model", str(checkpointed_run), *options, *files])
    assert outcome.exit_code == 0, outcome.output
    assert "Across training" in outcome.output and (tmp_path / "run.png").stat().st_size > 1000
    curve = load_result(tmp_path / "run.json").extras.training
    assert curve.steps == [200, 400, 600]
    induction = curve.induction.groupby("step")["induction"].max()
    # as the induction head forms, later tokens are predicted from the first copy
    assert induction[600] > induction[200] + 0.2
    assert curve.scores[-1] < curve.scores[0] - 1 and curve.ci[-1][1] < curve.ci[0][0]
    figure = plot_icl_over_training(curve, tmp_path / "icl.png")
    assert (tmp_path / "icl.png").stat().st_size > 1000 and len(figure.axes) == 2
    rendered = CliRunner().invoke(app, ["render", str(tmp_path / "run.json"), "--format", "json"])
    training = json.loads(rendered.stdout)["training"]  # what the figure draws, as numbers
    assert training["induction"] == curve.induction.to_dict("records")


def test_a_file_saved_before_the_top_heads_were_classes_renders_by_the_rule_it_was_judged_by():
    """SmolLM2's `interp icl --save` of 2026-12-02 judged each top head by its exact change's CI alone: read
    back, its report says so (headline, section title, legend), its one class is the induction heads, and
    its top heads keep their saved verdicts; a result of today's code states the random baseline instead."""
    from circuits.icl.results import BEFORE_TOP_CLASSES, LEGEND

    older = load_result(Path(__file__).parent / "data" / "icl-smollm2-before-top-head-classes.json")
    text = render_markdown(finding_report(older))
    assert [c.name for c in older.classes] == ["induction"]
    assert [h.verdict for h in older.extras.heads] == ["unconfirmed", "unconfirmed", "confirmed"]
    assert "Top 3 heads by attribution: 1 confirmed by exact ablation on held-out documents (L7H5)." in text
    assert "## Top heads by attribution, confirmed by exact ablation" in text
    assert BEFORE_TOP_CLASSES in text and LEGEND not in text
    assert older.extras.json_fields(older)["legend"] == BEFORE_TOP_CLASSES
    current = load_result(Path(__file__).parents[1] / "docs" / "results" / "data" / "icl-smollm2-135m.json")
    now = render_markdown(finding_report(current))
    assert LEGEND in now and "confirmed beyond random heads of its layer" in now
    assert "## Top heads by attribution, each ablated alone" in now
