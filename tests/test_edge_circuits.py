"""Edge circuits of tasks (circuits.edge_circuits): prompt-pair files, `interp circuit` and its reports."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

import interp
from circuits.cli import app
from circuits.edge_circuits import EdgeCircuitSettings, edge_task, find_edge_circuit, induction_task, ioi_task
from circuits.edge_circuits.find import split_task
from circuits.edge_circuits.report import circuit_svg, edge_headline, edge_sections, write_edge_report
from circuits.edge_circuits.tasks import heldout_edge_task
from circuits.evidence import split_families
from circuits.sections import render_html
from interp import edges, metrics
from interp.interventions.stats import faithfulness_ci

PAIRS = [
    # clean, corrupted (a different length), correct, incorrect
    ("When Mary and John went to the store, John gave a drink to",
     "When Mary and John went to the big old store, Mary gave a drink to", " Mary", " John"),
    ("The Eiffel Tower is in the city of", "The Colosseum is in the city of", " Paris", " Rome"),
    ("One, two, three, four,", "One, two, three,", " five", " four"),
]  # fmt: skip


def _write_pairs(tmp_path):
    csv_path, jsonl_path = tmp_path / "pairs.csv", tmp_path / "pairs.jsonl"
    lines = ["clean,corrupted,correct,incorrect"]
    lines += [",".join(json.dumps(field) for field in row) for row in PAIRS]
    csv_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    keys = ("clean", "corrupted", "correct", "incorrect")
    jsonl_path.write_text(
        "\n".join(json.dumps(dict(zip(keys, row, strict=True))) for row in PAIRS), encoding="utf-8"
    )
    return csv_path, jsonl_path


def test_prompt_pair_files_of_different_lengths(smollm2, tmp_path):
    csv_path, jsonl_path = _write_pairs(tmp_path)
    task = edge_task(smollm2, str(csv_path))
    same = edge_task(smollm2, str(jsonl_path))
    assert torch.equal(task.clean, same.clean) and torch.equal(task.corrupted, same.corrupted)
    ids = torch.arange(len(PAIRS))
    with torch.no_grad():
        padded = task.metric(smollm2(task.clean), ids)
        for i, (clean, _, correct, incorrect) in enumerate(PAIRS):  # each prompt alone, unpadded
            alone = metrics.logit_diff(
                smollm2(clean), torch.tensor([smollm2.to_single_token(correct)]),
                torch.tensor([smollm2.to_single_token(incorrect)]),
            )  # fmt: skip
            assert abs(float(padded[i]) - float(alone[0])) < 1e-4
        corrupted_alone = metrics.logit_diff(
            smollm2(PAIRS[2][1]), torch.tensor([smollm2.to_single_token(" five")]),
            torch.tensor([smollm2.to_single_token(" four")]),
        )  # fmt: skip
        corrupted = task.corrupted_metric(smollm2(task.corrupted), ids)
        assert abs(float(corrupted[2]) - float(corrupted_alone[0])) < 1e-4
    assert float(padded.mean()) > 0  # the model gets them right
    # Mean ablation averages the corrupted prompts' real tokens only; resample would mix lengths.
    lengths = [smollm2.to_tokens(corrupted, truncate=False).shape[1] for _, corrupted, *_ in PAIRS]
    assert task.corrupted_mask.sum(1).tolist() == lengths and len(set(lengths)) > 1
    with pytest.raises(ValueError, match="resample ablation would give a prompt another's tokens"):
        find_edge_circuit(smollm2, task, EdgeCircuitSettings(n_edges=10, ablation="resample"))
    prob = edge_task(smollm2, str(csv_path), metric="prob")
    with torch.no_grad():
        assert (
            (prob.metric(smollm2(prob.clean), ids) > 0) & (prob.metric(smollm2(prob.clean), ids) < 1)
        ).all()


def test_prompt_pair_files_refuse_bad_rows(smollm2, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text('clean,corrupted,correct\n"a b","a c"," x"\n', encoding="utf-8")
    with pytest.raises(ValueError, match="lacks incorrect"):
        edge_task(smollm2, str(bad))
    long_answer = tmp_path / "long.jsonl"
    long_answer.write_text(json.dumps({"clean": "a", "corrupted": "b", "correct": " Xylophonequasarzzq"}))
    with pytest.raises(ValueError, match="not one"):
        edge_task(smollm2, str(long_answer), metric="prob")
    text = tmp_path / "pairs.txt"
    text.write_text("clean corrupted", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\.csv"):
        edge_task(smollm2, str(text))


@pytest.fixture(scope="module")
def toy_result():
    model = interp.load_model("toy-induction").eval()
    task = induction_task(model, n_prompts=16, seed=1)
    return model, find_edge_circuit(
        model, task, EdgeCircuitSettings(method="eap-ig", n_edges=30, curve_fractions=(0.05, 0.2, 0.5, 1.0))
    )


def test_induction_circuit_of_the_toy_model(toy_result):
    model, result = toy_result
    graph = result.graph
    assert graph.n_edges == 81  # 2 layers x 4 heads, attention only
    with torch.no_grad():
        assert result.clean_metric > 2 > abs(result.corrupted_metric)  # it does induction
    assert 0 < result.circuit.sum() <= 30
    assert "logits" in result.nodes and any(node.startswith("a1.") for node in result.nodes)
    faithfulness = float(result.faithfulness.faithfulness[0])
    low, high = result.faithfulness.ci()
    assert low[0] <= faithfulness <= high[0]
    curve = result.curve
    assert abs(float(curve.faithfulness[-1]) - 1) < 1e-4
    assert curve.cpr > curve.random_cpr
    data = result.json_data()
    assert data["schema"] == "interp-edge-circuit-3" and data["graph"]["n_edges"] == 81
    assert len(data["circuit"]["edges"]) == data["circuit"]["n_edges"] == int(result.circuit.sum())
    assert data["curve"]["cpr"] == pytest.approx(curve.cpr)
    # EAP-IG's scores are effects in the metric's units already: the edges are listed by them
    assert result.removal is None and all(edge["removal_effect"] is None for edge in data["circuit"]["edges"])


def test_progress_reports_each_stage():
    model = interp.load_model("toy-induction").eval()
    task = induction_task(model, n_prompts=4, seed=1)
    calls = []
    find_edge_circuit(
        model,
        task,
        EdgeCircuitSettings(method="eap", n_edges=10, curve_fractions=(0.5, 1.0)),
        progress=lambda *c: calls.append(c),
    )
    assert list(dict.fromkeys(stage for stage, _, _ in calls)) == [
        "Edge scores",
        "Faithfulness",
        "Faithfulness curve",
    ]
    # 2 sizes of top |score|, top signed and random: at 1.0 all three are the model itself (no run);
    # at 0.5 up to three runs, and one of the empty circuit
    assert calls[-1] in [("Faithfulness curve", n, n) for n in (2, 3, 4)]


def test_reports_render_offline_in_chromium(toy_result, tmp_path):
    from tests.browser import render_in_chromium

    _, result = toy_result
    svg = circuit_svg(result)
    assert svg.count('class="edge"') == int(result.circuit.sum())
    path = tmp_path / "circuit.html"
    report = edge_sections(result)
    (edges,) = [section for section in report.sections if section.title.startswith("Circuit edges")]
    assert len(edges.table.rows) == int(result.circuit.sum())  # the page lists every edge
    path.write_text(render_html(report), encoding="utf-8")
    page = render_in_chromium(path, selectors=("svg.edge-circuit", "svg.faithfulness-curve", "table tr"))
    assert not page.script_errors and not page.external_requests and not page.missing
    assert page.counts["svg.edge-circuit"] == 1 and page.counts["svg.faithfulness-curve"] == 1
    assert "CPR" in page.text
    table = tmp_path / "circuit.txt"
    write_edge_report(result, "table", str(table), Console())
    assert "faithfulness" in table.read_text() and "Faithfulness curve" in table.read_text()
    assert "Edges coloured by" not in table.read_text()  # the graph's caption: the HTML page only


def test_interp_circuit_command(tmp_path):
    report, mib = tmp_path / "circuit.json", tmp_path / "mib.json"
    args = ["circuit", "--model", "toy-induction", "--task", "induction", "--method", "eap",
            "--fraction", "0.2", "--n-prompts", "8", "--format", "json", "--out", str(report),
            "--mib-out", str(mib), "--max-memory", "64MiB"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["method"]["name"] == "eap" and data["circuit"]["requested_edges"] == 16
    assert data["method"]["score_convention"].startswith("edge scores estimate m(edge ablated) - m(clean)")
    assert data["curve"] is None
    submission = json.loads(mib.read_text())
    assert len(submission["edges"]) == 81 and submission["nodes"]["logits"]["in_graph"]
    kept = {name for name, edge in submission["edges"].items() if edge["in_graph"]}
    assert kept == {f"{e['writer']}->{e['reader']}" for e in data["circuit"]["edges"]}


def test_a_saved_circuit_found_on_mib_s_graph_is_not_taken_for_one_on_the_model_s(tmp_path):
    """`--mib-out` finds the circuit on MIB's graph (`interp.ungrouped`), another graph than the model's
    under grouped-query attention; its --save file recorded the same settings as a run without it, so a
    resumed run could take one graph's stages for the other's."""
    saved, out = tmp_path / "r.json", tmp_path / "o.json"
    args = ["circuit", "--model", "toy-induction", "--task", "induction", "--method", "eap", "--edges", "8",
            "--n-prompts", "8", "--save", str(saved), "--format", "json", "--out", str(out)]  # fmt: skip
    first = CliRunner().invoke(app, [*args, "--mib-out", str(tmp_path / "mib.json")])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 2 and "graph 'mib' there, 'model' now" in again.output, again.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--edges", "5", "--fraction", "0.1"], "one of them"),
        (["--edges", "5", "--task", "nonsense"], "Unknown task"),
        (["--edges", "5", "--format", "html"], "needs --out"),
        (["--edges", "5", "--method", "acdc"], "method"),
    ],
)
def test_interp_circuit_refuses_bad_options(args, message):
    result = CliRunner().invoke(app, ["circuit", "--model", "toy-induction", "--n-prompts", "4", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_mib_export_has_a_key_and_value_edge_per_query_head_with_its_own_score():
    """MIB's graph (EAP-IG's, `ungroup_grouped_query_attention`) has a key and a value input per query
    head. The export wrote a grouped-query model's key/value-head edge once per query head of its group
    with the group's whole score, so each counted the group's effect. Now the circuit is found on
    `interp.ungrouped(model)`, the same function (equal logits) with the key/value heads copied: each
    query head's key edge has its own EAP score, and a group's add up to the key/value head's score of
    the grouped model. Scores per key/value head are refused."""
    llama = dict(normalization="rmsnorm", positional="rotary", gated_mlp=True, activation="silu")
    cfg = interp.Config(
        n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=29, n_ctx=16, init_std=0.15, **llama
    )
    model = interp.HookedTransformer(cfg)
    model.init_weights(seed=3)
    model.eval()
    copy = interp.ungrouped(model)
    generator = torch.Generator().manual_seed(0)
    clean = torch.randint(1, 29, (6, 9), generator=generator)
    corrupted = torch.cat([clean[:, :1], torch.randint(1, 29, (6, 8), generator=generator)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(copy(clean), model(clean), rtol=0, atol=1e-6)
    assert copy.cfg.n_kv_heads == 4 and "(key/value heads per query head)" in copy.cfg.model_name
    metric = edges.logit_diff_metric(torch.arange(6), torch.arange(6) + 7, torch.full((6,), 8))
    grouped = edges.edge_attribution(model, clean, corrupted, metric, method="eap")
    per_head = edges.edge_attribution(copy, clean, corrupted, metric, method="eap")
    with pytest.raises(ValueError, match="key and a value input per query head"):
        edges.mib_json(grouped, torch.zeros(grouped.graph.valid.shape, dtype=torch.bool), model.cfg)
    keep = edges.top_circuit(per_head, 10)
    mib = edges.mib_json(per_head, keep, copy.cfg)
    assert len(mib["edges"]) == per_head.graph.n_edges
    split = 0
    for writer in ("input", "a0.h1", "m0"):
        for layer, kind, kv in ((1, "k", 0), (1, "v", 1), (0, "k", 1)):
            if layer == 0 and writer != "input":
                continue
            heads = [f"{writer}->a{layer}.h{h}<{kind}>" for h in (2 * kv, 2 * kv + 1)]
            shares = [mib["edges"][name]["score"] for name in heads]
            whole = grouped.scores[grouped.graph.edge_index(f"{writer}->a{layer}.kv{kv}<{kind}>")]
            assert sum(shares) == pytest.approx(-float(whole), rel=1e-4, abs=1e-6)  # MIB's sign: negated
            split += shares[0] != pytest.approx(shares[1], rel=1e-3)
            for name in heads:
                w, r = per_head.graph.edge_index(name)
                assert mib["edges"][name]["in_graph"] == bool(keep[w, r])
    assert split >= 4  # the query heads' shares differ: each its own edge, not a copy of the group's


def test_ranked_path_patching_confirms_the_top_candidates_exactly():
    from circuits.ioi.patching import EAPRanking, path_patching_effects
    from interp.tasks.ioi import ioi_dataset_for

    model = interp.load_model("toy-ioi").eval()
    clean, abc, _ = ioi_dataset_for(model, 16)
    for receivers, receiver_input in [(None, None), ([(1, 0), (1, 2)], "q"), ([(1, 1)], "k")]:
        exhaustive = path_patching_effects(model, clean, abc, receivers, receiver_input)
        ranked = EAPRanking(n_exact=2)(model, clean, abc, receivers, receiver_input)
        assert torch.equal(ranked.isnan(), exhaustive.isnan())  # the same senders
        assert ((ranked - exhaustive).abs() < 1e-5).sum() >= 2  # two of them path-patched
        every = EAPRanking(n_exact=8)(model, clean, abc, receivers, receiver_input)
        torch.testing.assert_close(every, exhaustive, equal_nan=True)  # all candidates: the sweep itself


def test_without_a_size_the_circuit_is_the_smallest_reaching_the_target():
    from circuits.edge_circuits.find import smallest_faithful_size
    from circuits.edge_circuits.report import edge_headline, size_origin

    model = interp.load_model("toy-induction")
    task = induction_task(model, n_prompts=8)
    result = find_edge_circuit(
        model, task, EdgeCircuitSettings(method="eap", curve_fractions=None, target=0.8)
    )
    n, found = result.requested_edges, result.task  # the size is searched on the discovery prompts
    assert size_origin(result).startswith("smallest reaching faithfulness ≥ 0.8")
    assert result.json_data()["circuit"]["size_target"] == 0.8
    assert float(result.discovery_faithfulness.faithfulness[0]) >= 0.8
    one_less = interp.edges.faithfulness(
        model, found.clean, found.corrupted, found.metric,
        interp.edges.top_circuit(result.scores, n - 1)[None],
    )  # fmt: skip
    assert float(one_less.faithfulness[0]) < 0.8, n
    assert smallest_faithful_size(model, found, result.scores, 1.0)[0] >= n
    # the sizes the search tried: every smaller one below the target, the found one at its faithfulness
    tried = result.size_search
    assert n in tried and all(f < 0.8 for size, f in tried.items() if size < n)
    assert tried[n] == pytest.approx(float(result.discovery_faithfulness.faithfulness[0]), abs=1e-5)
    line = next(text for text in edge_headline(result) if text.startswith("size search"))
    assert f"{n}: {tried[n]:.2f}" in line
    assert result.json_data()["circuit"]["size_search"] == [list(pair) for pair in tried.items()]


def test_a_size_search_whose_faithfulness_falls_as_the_circuit_grows_says_so():
    """The bisection assumes faithfulness grows with size; the report names the largest fall to below the
    target among the sizes tried (beyond MONOTONE_TOLERANCE), and leaves unremarked a curve that only
    wobbles or falls while staying above the target."""
    from circuits.edge_circuits.report import MONOTONE_TOLERANCE, size_search_note

    falls = {56: 0.64, 113: 0.79, 155: 0.66, 176: 0.65, 194: 0.81, 282: 0.89}
    note = size_search_note(falls, 0.8)
    assert "113: 0.79, 155: 0.66" in note and "not monotone (0.79 at 113 edges, 0.65 at 176)" in note
    wobbles = {10: 0.5, 20: 0.7, 30: 0.7 - MONOTONE_TOLERANCE / 2, 40: 0.85}
    assert "not monotone" not in size_search_note(wobbles, 0.8)
    above = {10: 0.5, 20: 0.85, 30: 1.2, 40: 0.95}  # overshoots, then falls back, above the target throughout
    assert "not monotone" not in size_search_note(above, 0.8)


def _rows(tokens: torch.Tensor) -> set[tuple[int, ...]]:
    return {tuple(row) for row in tokens.tolist()}


def test_circuit_is_chosen_on_discovery_prompts_and_judged_on_held_out_ones():
    model = interp.load_model("toy-induction").eval()
    task = induction_task(model, n_prompts=16, seed=1)
    result = find_edge_circuit(
        model, task, EdgeCircuitSettings(method="eap", n_edges=12, curve_fractions=None)
    )
    found, held = result.task, result.heldout_task
    assert found.n_prompts + held.n_prompts == 16 and not _rows(found.clean) & _rows(held.clean)
    assert _rows(found.clean) | _rows(held.clean) == _rows(task.clean)
    mask = result.circuit[None]
    for prompts, measured in ((held, result.faithfulness), (found, result.discovery_faithfulness)):
        again = edges.faithfulness(model, prompts.clean, prompts.corrupted, prompts.metric, mask)
        assert torch.allclose(again.faithfulness, measured.faithfulness)
    data = result.json_data()
    again = edges.faithfulness(model, held.clean, held.corrupted, held.metric, mask)
    assert data["circuit"]["metric"] == pytest.approx(float(again.values[0].mean()), abs=1e-5)
    assert data["circuit"]["ablated_metric"] == pytest.approx(float(again.empty.mean()), abs=1e-5)
    assert data["task"]["n_prompts"] == found.n_prompts and data["task"]["n_heldout"] == held.n_prompts
    assert data["circuit"]["faithfulness"] == pytest.approx(float(result.faithfulness.faithfulness[0]))
    assert data["circuit"]["discovery_faithfulness"] == pytest.approx(
        float(result.discovery_faithfulness.faithfulness[0])
    )
    assert data["circuit"]["held_out_note"] == result.held_out_note() != ""

    # the note says where held-out faithfulness falls by the verdict's bands, not by a CI excluding 0
    def at(ratio: float) -> edges.Faithfulness:  # a circuit keeping `ratio` of the model's effect
        return edges.Faithfulness(values=torch.full((1, 8), ratio), full=torch.ones(8), empty=torch.zeros(8))

    cases = [
        (0.864, 0.611, "partial on held-out prompts: 0.611"),
        (0.83, 0.88, "faithful on held-out prompts, as on discovery (0.88; on discovery 0.83)"),
        (0.19, -0.07, "not faithful on held-out prompts, as on discovery (-0.07; on discovery 0.19)"),
    ]
    for discovery, heldout, said in cases:
        moved = dataclasses.replace(result, discovery_faithfulness=at(discovery), faithfulness=at(heldout))
        assert moved.held_out_note().startswith(said), moved.held_out_note()
    # other held-out prompts: the same circuit (chosen on the discovery prompts), another faithfulness
    fresh = induction_task(model, n_prompts=8, seed=7)
    first = find_edge_circuit(
        model, found, EdgeCircuitSettings(method="eap", n_edges=12, curve_fractions=None), heldout=held
    )
    second = find_edge_circuit(
        model, found, EdgeCircuitSettings(method="eap", n_edges=12, curve_fractions=None), heldout=fresh
    )
    assert torch.equal(first.circuit, second.circuit) and torch.equal(first.circuit, result.circuit)
    assert second.heldout_task is fresh and second.task is found
    assert not torch.equal(first.faithfulness.faithfulness, second.faithfulness.faithfulness)
    # held-out prompts that chose were judged on ("tested on 8 others") and their note read as held out
    for given in (found, task):
        with pytest.raises(ValueError, match="of the .* held-out prompts are discovery prompts"):
            find_edge_circuit(
                model,
                found,
                EdgeCircuitSettings(method="eap", n_edges=12, curve_fractions=None),
                heldout=given,
            )


def test_families_are_held_out_whole(smollm2, tmp_path):
    rows = ["clean,corrupted,correct,incorrect,family"]
    rows += [
        ",".join([*(json.dumps(field) for field in row), family])
        for row, family in zip(PAIRS + [(*row[:2], row[3], row[2]) for row in PAIRS], "aabbcc", strict=True)
    ]  # each pair once: a repeat in another family is refused (interp.tasks.pairs)
    path = tmp_path / "families.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    task = edge_task(smollm2, str(path))
    assert task.families == list("aabbcc")
    found, held, described = split_task(task)
    assert found.families and held.families and not set(found.families) & set(held.families)
    assert sorted(found.families + held.families) == list("aabbcc") and "tested on" in described
    csv_path, _ = _write_pairs(tmp_path)
    plain = edge_task(smollm2, str(csv_path))
    assert plain.families is None  # no family column: held-out prompts instead
    found, held, described = split_task(plain)
    assert found.n_prompts + held.n_prompts == 3 and not _rows(found.clean) & _rows(held.clean)
    assert "no family column" in described


def test_the_seed_draws_the_family_split():
    """One seed draws the held-out families (as `split_families`, the head path's split, does with it)
    and orders the edge mask's prompts: the same seed gives the same split and circuit, seeds differ."""
    model = interp.load_model("toy-induction").eval()
    task = induction_task(model, n_prompts=16, seed=1)
    task = dataclasses.replace(task, families=[f"f{i % 8}" for i in range(task.n_prompts)])
    held_out = {}
    for seed in range(20):
        found, held, described = split_task(task, seed=seed)
        drawn = split_families(task.families, seed=seed)
        assert set(held.families) == set(drawn.heldout) and set(found.families) == set(drawn.discovery)
        again = split_task(task, seed=seed)
        assert torch.equal(again[1].clean, held.clean) and again[2] == described
        held_out[seed] = frozenset(held.families)
    assert len(set(held_out.values())) > 10  # of the 70 ways to hold out 4 of 8 families
    other = next(seed for seed in range(1, 20) if held_out[seed] != held_out[0])

    def found_with(seed: int):
        settings = EdgeCircuitSettings(method="eap", n_edges=10, curve_fractions=None, seed=seed)
        return find_edge_circuit(model, task, settings)

    first, second, repeated = found_with(0), found_with(other), found_with(other)
    assert set(first.heldout_task.families) == held_out[0]
    assert set(second.heldout_task.families) == held_out[other] != held_out[0]
    assert repeated.split == second.split and torch.equal(repeated.scores.scores, second.scores.scores)
    assert torch.equal(repeated.faithfulness.values, second.faithfulness.values)
    graph = edges.edge_graph(model)
    assert EdgeCircuitSettings(seed=other).pruning(graph, 10).seed == other  # the mask's prompt order


def test_held_out_faithfulness_resamples_the_held_out_families():
    """The circuit's held-out faithfulness (and its curve's) claims to hold on families the edges were
    not chosen on, so its CI resamples the held-out families, then their prompts: the CI is
    `faithfulness_ci` over the families, not over the prompts alone, in the report's JSON too."""
    model = interp.load_model("toy-induction").eval()
    task = induction_task(model, n_prompts=32, seed=1)
    task = dataclasses.replace(task, families=[f"f{i % 8}" for i in range(task.n_prompts)])
    settings = EdgeCircuitSettings(method="eap", n_edges=10, curve_fractions=(0.1, 0.5))
    result = find_edge_circuit(model, task, settings)
    faith = result.faithfulness
    assert faith.families == result.heldout_task.families and len(set(faith.families)) == 4
    assert result.discovery_faithfulness.families == result.task.families
    assert result.curve.result.families == faith.families
    over_families = faithfulness_ci(faith.values, faith.full, faith.empty, families=faith.families)
    over_prompts = faithfulness_ci(faith.values, faith.full, faith.empty)
    assert all(torch.equal(a, b) for a, b in zip(faith.ci(), over_families, strict=True))
    assert not torch.equal(over_families[0], over_prompts[0])
    data = result.json_data()["circuit"]
    assert data["faithfulness_ci"] == [float(over_families[0][0]), float(over_families[1][0])]
    with pytest.raises(ValueError, match="family of each of the 16 prompts, got 3"):
        edges.faithfulness(model, *result.heldout_task.pair, result.circuit, families=["a", "b", "c"])


def test_ioi_held_out_prompts_come_from_other_templates():
    model = interp.load_model("toy-ioi").eval()
    found, held = ioi_task(model, 16), heldout_edge_task(model, "ioi", 16)
    _, _, described = split_task(found, held)
    assert not set(found.families) & set(held.families) and "tested on held-out template" in described
    assert not _rows(found.clean) & _rows(held.clean)
    toy = interp.load_model("toy-induction")
    fresh = heldout_edge_task(toy, "induction", 8)  # fresh random sequences
    assert not _rows(fresh.clean) & _rows(induction_task(toy, 8).clean)


def test_the_induction_task_draws_no_special_token(smollm2):
    """A and B hold no BOS and no special token (the tokenizer's `all_special_ids` and its special added
    tokens: chat and repository markers in SmolLM2, unused slots in Gemma 3), which are not text."""
    tokenizer = smollm2.tokenizer
    special = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
    special |= set(tokenizer.all_special_ids) | {smollm2.cfg.bos_token_id}
    assert set(smollm2.special_token_ids()) == special and len(special) == 17
    task = induction_task(smollm2, n_prompts=1000, seq_len=10)
    drawn = torch.cat([task.clean, task.corrupted], 1)[:, int(smollm2.cfg.default_prepend_bos) :]
    assert not set(drawn.unique().tolist()) & special


def test_results_saved_before_held_out_prompts_still_load_and_say_so():
    from pathlib import Path

    from circuits.edge_circuits.report import edge_sections
    from circuits.results_file import load_result

    old = load_result(Path(__file__).parents[1] / "tests/data/circuit-saved-before-held-out.json")
    assert not old.held_out and old.json_data()["circuit"]["discovery_faithfulness"] is None
    assert "a result saved before held-out prompts" in edge_sections(old).headline[0]


def test_a_learned_circuit_lists_its_edges_by_their_measured_effect_of_removal():
    """Edge pruning's scores only rank (all near -1): the report lists the circuit's edges by each
    edge's effect of removal on the held-out prompts, m(circuit without it) - m(circuit) in the metric's
    units, measured for the edges of largest estimate; the circuit itself is the mask's."""
    model = interp.load_model("toy-induction").eval()
    task = induction_task(model, n_prompts=16, seed=1)
    settings = EdgeCircuitSettings(method="prune", n_edges=20, curve_fractions=None, measured_edges=6)
    result = find_edge_circuit(model, task, settings)
    assert torch.equal(result.circuit, edges.top_circuit(result.scores, 20))  # the ordering changes no edge
    removal, circuit, graph = result.removal, result.circuit, result.graph
    kept = graph.edges(circuit)
    assert removal.edges.tolist() == [list(edge) for edge in kept] and removal.estimate.isfinite().all()
    assert removal.n_measured == min(6, len(kept))
    # each measured effect is m(circuit without the edge) - m(circuit), the faithfulness runs' values
    held = result.heldout_task
    measured = [edge for edge, (_, exact) in removal.effects().items() if exact]
    without = [circuit.clone() for _ in measured]
    for mask, (w, r) in zip(without, measured, strict=True):
        mask[w, r] = False
    circuits = torch.stack([circuit, *without])
    runs = edges.faithfulness(model, held.clean, held.corrupted, held.metric, circuits)
    effects = removal.effects()
    for k, edge in enumerate(measured, 1):
        assert effects[edge][0] == pytest.approx(float((runs.values[k] - runs.values[0]).mean()), abs=1e-4)
    # the measured edges are those of largest estimate on the discovery prompts (the held-out prompts'
    # own estimates chose them: their largest effects were measured where they were picked)
    found = result.task
    found = edges.removal_effects(model, *found.pair, circuit, 0, ablation=found.ablation("counterfactual"))
    chosen = sorted(range(len(kept)), key=lambda i: -abs(float(found.estimate[i])))[:6]
    assert sorted(measured) == sorted(kept[i] for i in chosen) and removal.ranked_elsewhere
    by_heldout = sorted(range(len(kept)), key=lambda i: -abs(float(removal.estimate[i])))[:6]
    assert sorted(chosen) != sorted(by_heldout)  # this case tells the two apart
    rows = result.circuit_edge_rows()
    assert rows[0].removal_measured and rows[0].removal_effect < 0
    flags = [row.removal_measured for row in rows]
    assert flags == sorted(flags, reverse=True)  # measured first ...
    sizes = [abs(row.removal_effect) for row in rows if row.removal_measured]
    assert sizes == sorted(sizes, reverse=True)  # ... by |effect|
    (table,) = [s for s in edge_sections(result).sections if s.title.startswith("Circuit edges")]
    assert table.table.columns[2] == "effect of removal"
    assert [cell[2].startswith("≈") for cell in table.table.rows] == [not flag for flag in flags]
    assert float(table.table.rows[0][2]) == pytest.approx(rows[0].removal_effect, abs=1e-3)
    note = " ".join(table.notes)
    assert "m(circuit without the edge) - m(circuit)" in note and task.metric_name in note
    assert "largest estimated effect on the discovery prompts" in note
    data = result.json_data()
    assert [edge["removal_effect"] for edge in data["circuit"]["edges"]] == [r.removal_effect for r in rows]
    with pytest.raises(ValueError, match="measured_edges=-1"):
        EdgeCircuitSettings(measured_edges=-1)
    with pytest.raises(ValueError, match="mask of this model's edge graph"):
        edges.removal_effects(model, held.clean, held.corrupted, held.metric, circuit[:, :3])


def test_circuit_task_reads_and_checks_a_pairs_file_once_before_a_model_loads(smollm2, tmp_path):
    """`CircuitTask` reads a prompt-pair file and refuses pairs its metric cannot read before any model
    is loaded; the prompts are then built from the rows it read, not from a second read of the file."""
    from circuits.edge_circuits.run import CircuitTask, circuit_prompts

    rows = [*PAIRS, *((*row[:2], row[3], row[2]) for row in PAIRS)]  # 8 pairs: 4 to choose, 4 to test
    rows += [("The cat sat on the", "The dog sat on the", " mat", " rug"),
             ("The sun rises in the", "The sun sets in the", " east", " west")]  # fmt: skip
    csv_path = tmp_path / "pairs.csv"
    csv_path.write_text(
        "\n".join(["clean,corrupted,correct,incorrect", *(",".join(map(json.dumps, r)) for r in rows)])
    )
    few = tmp_path / "few.csv"
    few.write_text("\n".join(csv_path.read_text().splitlines()[:8]) + "\n")
    with pytest.raises(ValueError, match="few.csv has 7 pairs: a circuit is chosen on some pairs and tested"):
        CircuitTask(task=str(few))
    no_incorrect = tmp_path / "no-incorrect.csv"
    no_incorrect.write_text("clean,corrupted,correct\nThe cat sat on the,The dog sat on the, mat\n")
    with pytest.raises(ValueError, match="lacks incorrect"):
        CircuitTask(task=str(no_incorrect))
    task = CircuitTask(task=str(csv_path))
    csv_path.unlink()  # read once, at construction
    prompts = circuit_prompts(smollm2, task, EdgeCircuitSettings(method="eap", n_edges=5, ablation="mean"))
    assert prompts.prompt_pairs.n_prompts + prompts.heldout.n_prompts == len(rows)
    assert prompts.pairs is not None and prompts.pairs.name == "pairs.csv"


def test_the_faithfulness_of_a_model_that_does_not_do_the_task_is_undetermined():
    """An untrained model's logit diff over everything ablated, the faithfulness's denominator, has a 95%
    CI that spans 0 (here each prompt is its own family: the CIs resample prompts): the edge circuit's
    faithfulness divides by noise, so its headline says "undetermined" and why, not a band with advice."""
    model = interp.load_model("toy-induction").eval()
    model.init_weights(4000)
    task = induction_task(model, n_prompts=32, seed=1)
    result = find_edge_circuit(
        model, task, EdgeCircuitSettings(method="eap", n_edges=10, curve_fractions=None)
    )
    summary = result.faithfulness.summary()
    low, high = summary.model_effect_ci
    assert low < 0 < high and summary.n_families == 0 and summary.ratio_ci[0] < summary.ratio_ci[1]
    headline = edge_headline(result)[0]
    assert headline.endswith("divides by noise: the model does not do the task here"), headline
    assert "try" not in headline.rsplit(":", 2)[-1]
