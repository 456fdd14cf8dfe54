"""The k-hop induction task and the heads that make each lookup: properties every good run has."""

from __future__ import annotations

import io
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import TRAIN_SEED
from rich.console import Console
from typer.testing import CliRunner

import interp
from circuits.cli import app
from circuits.finding import finding_report, write_finding_report
from circuits.hop import carries, hop_report, hop_task_of, lookup_chain_figure
from circuits.hop.locate import attention_to_hops, lookup_positions
from circuits.results_file import load_result, save_result
from circuits.sections import render_html, render_markdown
from interp.io.serialize import encode
from interp.tasks import HopTask, hop_targets, split_generator
from interp.training import ToyModelSettings, make_task, train_toy_model


def brute_force_hops(row: list[int], start: int, hops: int) -> list[int]:
    """The positions k lookups reach from `start`, by reading the row: the last earlier occurrence of
    the current token, then the position after it; -1 once one is missing."""
    reached, current = [], start
    for _ in range(hops):
        if current >= 0:
            earlier = [q for q in range(current) if row[q] == row[current]]
            current = earlier[-1] + 1 if earlier else -1
        reached.append(current)
    return reached


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_hop_targets_are_the_brute_force_lookups(hops):
    tokens = torch.randint(1, 5, (16, 20), generator=torch.Generator().manual_seed(hops))
    reached = hop_targets(tokens, hops)  # [batch, hops, pos]
    for b, row in enumerate(tokens.tolist()):
        for p in range(len(row)):
            assert reached[b, :, p].tolist() == brute_force_hops(row, p, hops)


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_every_hop_task_row_has_its_answer_after_exactly_k_lookups(hops):
    task = HopTask(hops, d_vocab=9, n_ctx=32)
    batch = task.sample(64, split_generator(0))
    assert batch.tokens.shape == (64, 32) and (batch.tokens[:, 0] == task.bos).all()
    assert (batch.tokens[:, 1:] != task.bos).all()
    for row, mask, targets in zip(batch.tokens.tolist(), batch.loss_mask, batch.targets, strict=True):
        path = [task.query, *brute_force_hops(row, task.query, hops)]
        assert min(path) >= 0  # every hop exists
        answer = row[path[-1]]
        assert row[-1] == answer and targets[task.query] == answer
        assert all(row[p] != answer for p in path[:-1])  # fewer lookups give another token
        for p in range(len(row) - 1):  # every counted prediction is of its own k-hop token
            last = brute_force_hops(row, p, hops)[-1]
            assert bool(mask[p]) == (last >= 0)
            if last >= 0:
                assert targets[p] == row[last]


@pytest.mark.parametrize(("hops", "d_vocab"), [(1, 9), (2, 9), (3, 9), (4, 6)])
def test_hop_chance_is_a_uniform_guess_over_the_symbols_the_answer_can_be(hops, d_vocab):
    """From three hops on, the tokens the fewer hops reach recur: chance was 1 / (d_vocab - 1 - hops),
    0.200 for three hops (0.19 by the rows) and 1.0 for four hops over five symbols (0.51)."""
    task = HopTask(hops, d_vocab=d_vocab, n_ctx=32)
    tokens = task.sample(256, split_generator(1)).tokens
    excluded = [
        {row[p] for p in [task.query, *brute_force_hops(row, task.query, hops)[:-1]]}
        for row in tokens.tolist()
    ]
    by_rows = sum(1 / (d_vocab - 1 - len(tokens)) for tokens in excluded) / len(excluded)
    assert task.chance_of(tokens) == pytest.approx(by_rows, rel=1e-12)
    if hops <= 2:
        assert task.chance == pytest.approx(1 / (d_vocab - 1 - hops), rel=1e-12)
    else:  # 4,096 rows of a fixed seed: within sampling error of another 256
        assert task.chance < 1 / (d_vocab - 1 - hops) and task.chance == pytest.approx(by_rows, abs=0.02)


def test_hop_task_is_seeded_and_its_splits_differ():
    task = make_task("hop", hops=2)
    first, again = task.sample(8, split_generator(3)), task.sample(8, split_generator(3))
    assert torch.equal(first.tokens, again.tokens)
    assert not torch.equal(task.eval_batch(8, 3).tokens, first.tokens)


def test_hops_is_refused_without_the_hop_task():
    with pytest.raises(ValueError, match="hop task"):
        make_task("induction", hops=2)
    result = CliRunner().invoke(app, ["train", "--task", "induction", "--hops", "2", "--out", "unused"])
    assert result.exit_code == 2 and "--task hop" in result.output


@pytest.fixture(scope="module")
def toy_hop_result():
    """toy-hop's lookups: a 3-layer attention-only model trained on the 2-hop task (interp/data), with
    `interp hop`'s defaults (256 sequences, 8 random sets: layer 0 has three other heads, so fewer sets
    leave the baseline too uncertain to confirm a route)."""
    return hop_report(interp.load_model("toy-hop"))


def test_toy_hop_makes_its_first_lookup_in_an_earlier_layer_than_its_second(toy_hop_result):
    result, figures = toy_hop_result, toy_hop_result.extras
    assert figures.accuracy_ci[0] > 2 * figures.chance  # it composes the two lookups on held-out sequences
    first, second = result.classes
    assert first.verdict == second.verdict == "confirmed"  # each beats random heads of its layers
    assert max(first.details["layers"]) < min(second.details["layers"])
    for lookup in result.classes:
        attention = lookup.details["attention"]
        assert lookup.heldout.beyond_ci[0] > 0 and sum(attention) / len(attention) >= 0.3
    # hop 1's head finds the query's token earlier (a duplicate-token head), hop 2's heads the token after
    assert (first.details["side"], second.details["side"]) == ("occurrence", "target")
    for j, lookup in enumerate(result.classes):  # its heads attend to the hop more than the other heads
        chosen = torch.zeros(figures.attention.shape[1:], dtype=torch.bool)
        for label in lookup.heads:
            layer, head = map(int, label[1:].split("H"))
            chosen[layer, head] = True
        assert figures.attention[j][chosen].min() > figures.attention[j][~chosen].mean()
    claimed = {label for lookup in result.classes for label in lookup.heads}
    for found in [*result.classes, *figures.paths]:  # no hop is compared with another hop's heads
        assert found.random_sets and not claimed & {label for draw in found.random_sets for label in draw}
    report = render_markdown(finding_report(result))
    for lookup in result.classes:  # same-layer sets where its layers have enough unclaimed heads, and said
        layers = [int(label[1:].split("H")[0]) for label in lookup.heads]
        n_heads = figures.attention.shape[-1]  # [hop, layer, head]
        free = {layer: n_heads - sum(int(c[1:].split("H")[0]) == layer for c in claimed) for layer in layers}
        assert lookup.random_same_layers == all(layers.count(layer) <= free[layer] for layer in layers)
        line = next(line for line in report.splitlines() if line.startswith(f"- {lookup.name}: "))
        assert ("from other layers too" in line) != lookup.random_same_layers


def test_toy_hop_carries_hop_1s_result_to_hop_2s_queries(toy_hop_result):
    """Path patching L0H2 -> the layer-2 heads: hop 1's result reaches them through their queries,
    beyond random layer-0 senders, and through layer 1's heads (where another layer-0 head, drawn among
    the random senders, carries nearly as much); not through their keys or values."""
    routes = {path.details["route"]: path for path in toy_hop_result.extras.paths}
    assert set(routes) == {"q", "k", "v", "via L1"}
    first, second = toy_hop_result.classes
    for path in routes.values():
        assert (path.details["from_hop"], path.details["to_hop"], path.heads) == (1, 2, first.heads)
        assert path.details["receivers"] == second.heads
    query = routes["q"].heldout
    assert carries(routes["q"]) and query.drop_ci[0] > 0 and query.beyond_ci[0] > 0
    via = routes["via L1"].heldout
    assert via.drop_ci[0] > 0 and via.beyond > 0
    assert routes["q"].heldout.drop > max(abs(routes["k"].heldout.drop), abs(routes["v"].heldout.drop)) + 0.5
    assert not carries(routes["k"]) and not carries(routes["v"])


def test_the_paths_read_as_the_standard_class_table_of_their_senders(toy_hop_result):
    """Each route is a class of hop j's heads: the paths section is the standard class table (the same
    class, heads and beyond-random columns), its verdict whether the route carries the result."""
    sections = {section.title: section for section in finding_report(toy_hop_result).sections}
    paths = sections["What carries each hop's result to the next hop's heads"].table
    standard = sections["Head classes (held out)"].table
    assert paths.columns[:2] == standard.columns[:2] and paths.columns[-3:] == standard.columns[-3:]
    for path, row in zip(toy_hop_result.extras.paths, paths.rows, strict=True):
        cells = dict(zip(paths.columns, row, strict=True))
        assert (cells["class"], cells["heads"], cells["route"]) == (
            path.name,
            " ".join(path.heads),
            path.details["route"],
        )
        assert (cells["verdict"] == "confirmed") == carries(path)


def test_hop_result_saves_renders_and_draws(toy_hop_result, tmp_path):
    save_result(toy_hop_result, tmp_path / "hop.json")
    again = load_result(tmp_path / "hop.json")
    assert encode(again) == encode(toy_hop_result)
    markdown = render_markdown(finding_report(again))
    assert markdown.index("accuracy") < markdown.index("Hop 1 -> hop 2") < markdown.index("| class |")
    page = render_html(finding_report(again))
    assert page.index("accuracy") < page.index("<table") and page.count('class="legend"') == 2
    assert page.count('class="interp-heatmap"') == len(again.classes)
    assert "<script src" not in page and "http" not in page.split("<body>")[1]  # opens offline
    figure = lookup_chain_figure(again, tmp_path / "chain.svg")
    assert (tmp_path / "chain.svg").read_text().lstrip().startswith("<?xml")
    chain, path = figure.axes[-1], again.extras.example_path
    arrows = [
        a for a in chain.texts if getattr(a, "arrow_patch", None) and a.xyann[0] == path[0] and a.xy[1] >= 0
    ]
    for lookup in again.classes:  # each lookup's arrow ends where its heads attend more
        label = next(t for t in chain.texts if t.get_text().startswith(f"{lookup.name}: "))
        assert label.get_text().endswith(f"(to the {lookup.details['side']})")
    hop = {lookup.name: lookup for lookup in again.classes}
    ends = sorted(a.xy[0] for a in arrows)
    wanted = sorted(
        path[j + 1] - (hop[f"hop {j + 1}"].details["side"] == "occurrence") for j in range(len(hop))
    )
    assert ends == wanted


def older_hop_file(saved: Path, older: Path) -> None:
    """Rewrite the saved hop finding `saved` as files saved before 2026-11-29 hold it (a HopResult, each hop
    a HopLookup, each path a HopPath) into `older`."""
    document = json.loads(saved.read_text())
    finding = document["result"]["fields"]
    settings, figures = finding["settings"]["fields"], finding["extras"]["fields"]

    def as_older(node: dict, dataclass: str, names: dict[str, str]) -> dict:
        """A stored ClassVerdict as the older `dataclass`: each of its own field's `names`, from a
        ClassVerdict field, held-out figure or detail of that name."""
        fields = node["fields"]
        found = {**fields, **fields["heldout"]["fields"], **dict(fields["details"]["__items__"])}
        return {"__dataclass__": dataclass, "fields": {new: found[old] for new, old in names.items()}}

    held = {"random_sets": "random_sets", "difference": "beyond", "difference_ci": "beyond_ci"}
    lookup = {"hop": "hop", "heads": "heads", "layers": "layers", "attention": "attention",
              "change": "drop", "change_ci": "drop_ci", "random_changes": "random_effects",
              "verdict": "verdict", **held}  # fmt: skip
    path = {"from_hop": "from_hop", "to_hop": "to_hop", "senders": "heads", "receivers": "receivers",
            "route": "route", "effect": "drop", "effect_ci": "drop_ci", "random_effects": "random_effects",
            **held}  # fmt: skip
    lookups = [as_older(node, "HopLookup", lookup) for node in finding["classes"]]
    paths = []
    for node in figures.pop("paths"):
        paths.append(as_older(node, "HopPath", path))
        paths[-1]["fields"]["carries"] = node["fields"]["verdict"] == "confirmed"
    document["kind"] = "hop"
    document["result"] = {"__dataclass__": "HopResult", "fields": {
        "model_name": finding["model"], "provenance": finding["provenance"],
        "n_sequences": settings["n_sequences"], "seed": settings["seed"],
        "min_attention": settings["min_attention"], **figures, "lookups": lookups,
        "paths": paths,
    }}  # fmt: skip
    older.write_text(json.dumps(document))


def test_an_older_hop_file_reads_with_the_same_numbers_and_renders_the_same(toy_hop_result, tmp_path):
    """A HopResult (saved before 2026-11-29), with its hops as HopLookups and paths as HopPaths, a hop with
    no head among them, reads as the Finding a fresh run makes; the per-prompt effects, which it does not
    hold, empty, and the classes' p-values NaN (its report says so)."""
    none_found = hop_report(interp.load_model("toy-hop"), n_sequences=32, n_random=2, min_attention=0.9)
    assert none_found.classes[-1].verdict == "not found" and not none_found.classes[-1].heads
    for result in (toy_hop_result, none_found):
        save_result(result, tmp_path / "hop.json")
        older_hop_file(tmp_path / "hop.json", tmp_path / "older.json")
        read = load_result(tmp_path / "older.json")
        # an older file kept no n_random: it is read as the number of random sets, which a pool of k sets
        # (k < n_random) now makes n_random // k * k
        settings = replace(result.settings, n_random=len(result.classes[0].random_sets))
        assert read.settings == settings and read.chose == result.chose and read.tested == result.tested
        fresh_verdicts = [*result.classes, *result.extras.paths]
        for found, fresh in zip([*read.classes, *read.extras.paths], fresh_verdicts, strict=True):
            assert len(found.per_prompt) == 0
            assert found.heldout.random_drop == pytest.approx(fresh.heldout.random_drop, nan_ok=True)
            same = {
                "per_prompt": fresh.per_prompt,
                "heldout": replace(found.heldout, random_drop=fresh.heldout.random_drop),
                "details": {**found.details, **{k: v for k, v in fresh.details.items() if k == "side"}},
                "p": fresh.p,
                "p_bound": fresh.p_bound,
            }  # an older file kept no side a hop's heads attend to, nor a class's p
            assert encode(replace(found, **same)) == encode(fresh)  # NaN equals NaN here
        without_p = [replace(c, p=math.nan, p_bound=False) for c in result.classes]
        paths = [replace(c, p=math.nan, p_bound=False) for c in result.extras.paths]
        fresh = replace(result, classes=without_p, extras=replace(result.extras, paths=paths))
        assert render_markdown(finding_report(read)) == render_markdown(finding_report(fresh))


def test_hop_attention_leaves_out_sequences_where_two_hops_share_a_position():
    """From three hops on, one hop's occurrence or target can be another's: its attention would count for
    both hops, so those sequences are NaN for the hop; every other one reads the query's pattern."""
    model = interp.load_model("toy-hop")
    task = HopTask(3, model.cfg.d_vocab, model.cfg.n_ctx, bos=hop_task_of(model).bos)
    tokens = task.eval_batch(64, 0).tokens
    targets = lookup_positions(task, tokens)  # [batch, hops]
    attention = attention_to_hops(model, tokens, task.query, targets)  # [side, hop, layer, head, batch]
    _, cache = model.run_with_cache(tokens)
    shared_rows = 0
    for b, row in enumerate(targets.tolist()):
        windows = [{t - 1, t} for t in row]
        for j, window in enumerate(windows):
            if any(window & other for i, other in enumerate(windows) if i != j):
                shared_rows += 1
                assert attention[:, j, ..., b].isnan().all()
                continue
            for layer in range(model.cfg.n_layers):
                pattern = cache["pattern", layer][b, :, task.query]  # [head, key]
                expected = torch.stack([pattern[:, row[j] - 1], pattern[:, row[j]]])
                assert torch.allclose(attention[:, j, layer, :, b], expected)
    assert 0 < shared_rows < 64 * 3


def test_hop_report_refuses_a_model_of_another_task():
    with pytest.raises(ValueError, match="--task hop"):
        hop_report(interp.load_model("toy-induction"))


def test_a_short_hop_training_records_its_task_and_lowers_the_loss(tmp_path):
    settings = ToyModelSettings(
        task="hop", n_layers=2, n_heads=2, d_model=32, steps=150, hops=1, seed=TRAIN_SEED
    )
    model, log = train_toy_model(settings, tmp_path / "hop", checkpoint_every=0)
    loaded = interp.load_model(str(tmp_path / "hop"))
    assert (loaded.cfg.task, loaded.cfg.hops) == ("hop", 1)
    assert hop_task_of(loaded).hops == 1
    assert log.evals[-1]["eval_loss"] < log.evals[0]["eval_loss"] - 0.1


def test_interp_hop_saves_what_render_shows_again_and_refuses_bad_options(tmp_path):
    direct, saved, again = tmp_path / "hop.md", tmp_path / "hop.json", tmp_path / "again.md"
    run = CliRunner().invoke(
        app,
        ["hop", "--model", "toy-hop", "--n-sequences", "32", "--n-random", "2", "--format", "markdown",
         "--out", str(direct), "--save", str(saved), "--plot", str(tmp_path / "chain.png")],
    )  # fmt: skip
    assert run.exit_code == 0, run.output
    run = CliRunner().invoke(app, ["render", str(saved), "--format", "markdown", "--out", str(again)])
    assert run.exit_code == 0 and again.read_text() == direct.read_text()
    run = CliRunner().invoke(
        app, ["render", str(saved), "--format", "html", "--out", str(tmp_path / "hop.html")]
    )
    assert run.exit_code == 0 and (tmp_path / "hop.html").read_text().startswith("<!DOCTYPE html>")
    assert (tmp_path / "chain.png").stat().st_size > 1000
    for options, message in [
        (["--n-sequences", "33"], "even"),
        (["--plot", "chain.gif"], ".png"),
        (["--format", "html"], "--out FILE.html"),
    ]:
        run = CliRunner().invoke(app, ["hop", "--model", "toy-hop", *options])
        assert run.exit_code == 2 and message in run.output, run.output
    run = CliRunner().invoke(app, ["hop", "--model", "toy-induction"])
    assert run.exit_code == 2 and "--task hop" in run.output


@pytest.mark.parametrize("width", [80, 100])
def test_hop_terminal_report_fits_and_opens_on_the_accuracy(toy_hop_result, width):
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    write_finding_report(toy_hop_result, "table", None, console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= width
    assert re.search(r"\w…", text) is None  # cells wrap, never cut
    assert "Hop induction" in text.splitlines()[0] and "accuracy" in text.splitlines()[1]


def test_a_hop_run_ending_below_its_target_says_so(tmp_path):
    """Issue 49 (12): the hop task learns at a step that varies with the seed and the machine; a run
    that ends before its eval accuracy reaches the early-stopping target says so, with what to do."""
    result = CliRunner().invoke(
        app, ["train", "--task", "hop", "--steps", "240", "--out", str(tmp_path / "run")]
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "did not reach 0.9" in text and "Train again into a fresh --out" in text
