"""Edge pruning (a learned mask over the edge graph), selection frequencies and ensembles."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

import interp
from circuits.cli import app
from circuits.edge_circuits import EdgeCircuitSettings, find_edge_circuit, induction_task
from circuits.edge_circuits.report import curve_svg, edge_sections
from circuits.sections import render_markdown
from interp import edges
from interp.edges.pruning import checkpoint_step
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def toy_induction():
    model = interp.load_model("toy-induction").eval()
    return model, induction_task(model, 32, seed=0), induction_task(model, 16, seed=1)


@pytest.mark.parametrize("config", [{}, {"n_kv_heads": 2}, {"parallel_residual": True}], ids=str)
def test_mask_of_ones_is_the_model_and_of_zeros_the_ablated_graph(config):
    """The differentiable run equals the model (mask 1), the fully ablated graph (mask 0) and the
    discrete edge-level run of any mask, to 1e-5; its gradient is the finite difference's."""
    torch.manual_seed(0)
    model = interp.HookedTransformer(tiny_config(**config)).eval()
    clean, corrupted = torch.randint(61, (2, 3, 7))
    graph = edges.edge_graph(model)
    ablated = edges.ablated_outputs(model, clean, corrupted)
    ones = torch.ones(graph.n_writers, graph.n_readers)
    with torch.no_grad():
        full = model(clean)
        none = edges.edge_forward(model, graph, clean, edges.EdgeRun(keep=0 * ones[None], ablated=ablated))
    torch.testing.assert_close(
        edges.masked_logits(model, graph, clean, ones, ablated), full, atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        edges.masked_logits(model, graph, clean, 0 * ones, ablated), none, atol=1e-5, rtol=0
    )
    mask = torch.rand(graph.n_writers, graph.n_readers)
    with torch.no_grad():
        discrete = edges.edge_forward(model, graph, clean, edges.EdgeRun(keep=mask[None], ablated=ablated))
    torch.testing.assert_close(
        edges.masked_logits(model, graph, clean, mask, ablated), discrete, atol=1e-5, rtol=0
    )

    model = model.to(torch.float64)
    ablated, dense = ablated.double(), mask.double().requires_grad_(True)

    def value(m: torch.Tensor) -> torch.Tensor:
        return edges.masked_logits(model, graph, clean, m, ablated)[:, -1, :5].pow(2).sum()

    # A dense mask, and one that ablates most edges (the product then sums every writer less the kept).
    sparse = torch.zeros_like(dense)
    sparse[0], sparse[1, -1] = 1, 0.5
    for mask in (dense, sparse.requires_grad_(True)):
        with torch.no_grad():
            discrete = edges.edge_forward(
                model, graph, clean, edges.EdgeRun(keep=mask[None], ablated=ablated)
            )
        torch.testing.assert_close(edges.masked_logits(model, graph, clean, mask, ablated), discrete)
        value(mask).backward()
        for w, r in [(0, 0), (1, graph.n_readers - 1), (graph.n_writers - 1, graph.n_readers - 1)]:
            step = torch.zeros_like(mask)
            step[w, r] = 1e-6
            difference = (value(mask.detach() + step) - value(mask.detach() - step)) / 2e-6
            assert mask.grad[w, r].item() == pytest.approx(difference.item(), rel=1e-4, abs=1e-6)


def test_pruning_keeps_the_behaviour_with_few_edges(toy_induction):
    """A mask trained towards 10 % of toy-induction's edges ranks them so that a small circuit is faithful
    on held-out prompts, as faithful as EAP-IG's at MIB's sizes (CMD no worse than EAP-IG's + 0.1)."""
    model, task, held = toy_induction
    scores = edges.prune_edges(
        model, task.clean, task.corrupted, task.metric, edges.PruneSettings(density=0.1, steps=60)
    )
    graph = scores.graph
    assert scores.method == "prune" and bool((scores.scores[graph.valid] < 0).all())
    half = edges.top_circuit(scores, graph.n_edges // 2)
    result = edges.faithfulness(model, held.clean, held.corrupted, held.metric, half)
    low, _ = result.ci()
    assert float(low[0]) > 0.8  # half the edges (~40 of 81) keep the behaviour on unseen prompts
    curve = edges.faithfulness_curve(
        model, held.clean, held.corrupted, held.metric, scores, random_baseline=False
    )
    eap_ig = edges.edge_attribution(model, task.clean, task.corrupted, task.metric, "eap-ig")
    reference = edges.faithfulness_curve(
        model, held.clean, held.corrupted, held.metric, eap_ig, random_baseline=False
    )
    assert curve.cmd < reference.cmd + 0.1


def test_resumed_pruning_follows_the_same_trajectory(toy_induction, tmp_path):
    """Interrupted after step 7 with checkpoints every 5 steps, the rerun resumes at step 5 and ends
    where the uninterrupted run ends."""
    model, task, _ = toy_induction
    args = (model, task.clean[:8], task.corrupted[:8], edges.subset_metric(task.metric, torch.arange(8)))
    pruning = edges.PruneSettings(steps=12, batch_size=4, checkpoint_every=5)
    whole = edges.prune_edges(*args, pruning)
    path = tmp_path / "mask.pt"

    def stop_at_7(stage: str, done: int, total: int) -> None:
        if stage == "Edge pruning" and done == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        edges.prune_edges(*args, pruning, checkpoint=path, progress=stop_at_7)
    seen = []
    resumed = edges.prune_edges(
        *args, pruning, checkpoint=path, progress=lambda stage, d, t: seen.append((stage, d))
    )
    # Said first, the start ranking not run again.
    resumed_from = (f"Edge pruning: resumed from {path} at step 5 of 12", 5)
    assert seen == [resumed_from, *[("Edge pruning", d) for d in range(6, 13)]]
    torch.testing.assert_close(resumed.scores, whole.scores, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="checkpoint of another pruning run"):
        edges.prune_edges(*args, edges.PruneSettings(steps=13, batch_size=4), checkpoint=path)
    # A resample run's checkpoint is its seed's: another seed draws other prompts, so it starts over.
    short = edges.PruneSettings(steps=2, batch_size=4)
    edges.prune_edges(*args, short, ablation=interp.Ablation("resample"), checkpoint=tmp_path / "resample.pt")
    with pytest.raises(ValueError, match="checkpoint of another pruning run"):
        edges.prune_edges(
            *args, short, ablation=interp.Ablation("resample", seed=1), checkpoint=tmp_path / "resample.pt"
        )


def test_pruning_with_autograd_off_trains_the_mask_as_with_it_on(toy_induction):
    """A caller that turned autograd off globally (`torch.set_grad_enabled(False)`, TransformerLens's
    habit, or `cache.toggle_autodiff(False)`) gets the same mask: the scores' training turns it on for
    itself, as every other gradient method does (it raised "element 0 of tensors does not require grad")."""
    model, task, _ = toy_induction
    args = (model, task.clean[:8], task.corrupted[:8], edges.subset_metric(task.metric, torch.arange(8)))
    pruning = edges.PruneSettings(steps=4, batch_size=4)
    with_grad = edges.prune_edges(*args, pruning)
    torch.set_grad_enabled(False)
    try:
        without = edges.prune_edges(*args, pruning)
        assert not torch.is_grad_enabled()  # the caller's mode is left as it was
    finally:
        torch.set_grad_enabled(True)
    assert torch.equal(without.scores, with_grad.scores)


def test_a_checkpoint_resumes_only_its_own_run(toy_induction, tmp_path):
    """A mask's checkpoint is refused, before any start ranking, naming what differs: on another model
    with the same edge graph (toy-induction with one weight scaled), with another metric on the same
    prompts (p(A[-1]) instead of the logit difference), on other prompts; a file that is no checkpoint
    and a checkpoint of the old format (keyed by the settings alone) are refused in one line.
    `checkpoint_step` says where the same run resumes, and refuses as `prune_edges` does."""
    model, task, _ = toy_induction
    rows = torch.arange(8)
    clean, corrupted, metric = task.clean[:8], task.corrupted[:8], edges.subset_metric(task.metric, rows)
    short = edges.PruneSettings(steps=2, batch_size=4)
    path = tmp_path / "mask.pt"
    assert checkpoint_step(model, clean, corrupted, metric, short, path) is None  # no file yet
    edges.prune_edges(model, clean, corrupted, metric, short, checkpoint=path)
    assert checkpoint_step(model, clean, corrupted, metric, short, path) == 2
    seen = []

    def refused(message: str, run_model, run_clean, run_corrupted, run_metric) -> None:
        with pytest.raises(ValueError, match=message):
            edges.prune_edges(
                run_model, run_clean, run_corrupted, run_metric, short, checkpoint=path,
                progress=lambda *report: seen.append(report),
            )  # fmt: skip
        with pytest.raises(ValueError, match=message):
            checkpoint_step(run_model, run_clean, run_corrupted, run_metric, short, path)

    other = copy.deepcopy(model)
    with torch.no_grad():
        other.blocks[1].attn.W_Q.mul_(1.5)
    assert edges.edge_graph(other).n_edges == edges.edge_graph(model).n_edges
    refused("another pruning run, with other model weights", other, clean, corrupted, metric)
    prob = edges.subset_metric(edges.prob_metric(task.metric.correct, task.metric.pos), rows)
    refused(
        "another pruning run, with other metric; give another checkpoint file", model, clean, corrupted, prob
    )
    later = edges.subset_metric(task.metric, rows + 8)
    refused("another pruning run, with other prompts", model, task.clean[8:16], task.corrupted[8:16], later)
    assert seen == []  # refused before the start ranking (EAP-IG) or any step
    junk = tmp_path / "notes.json"
    junk.write_text('{"schema": "interp-result-3"}')
    old = tmp_path / "old.pt"  # what the old key (settings alone) wrote
    state = torch.load(path, weights_only=True)
    settings = {k: v for k, v in state["key"].items() if k not in ("weights", "graph", "prompts", "metric")}
    torch.save(
        {"settings": settings, **{k: state[k] for k in ("step", "scores", "last", "optimizer", "stable")}},
        old,
    )
    for file, message in [(junk, "is no edge-mask checkpoint"), (old, "of an older format")]:
        with pytest.raises(ValueError, match=message) as error:
            edges.prune_edges(model, clean, corrupted, metric, short, checkpoint=file)
        assert "\n" not in str(error.value) and "delete" in str(error.value)


def test_a_checkpoint_of_another_start_ranking_or_other_code_is_refused(toy_induction, tmp_path, monkeypatch):
    """A mask's checkpoint resumes only from the start ranking it began from (its ranks, not only its
    method: EAP-IG of 2 or of 5 steps; the same one in another batch size resumes) and only under the
    interp code that wrote it; one keyed by an older interp's sampled fingerprint is refused as such."""
    from interp.edges import pruning

    model, task, _ = toy_induction
    rows = torch.arange(8)
    clean, corrupted, metric = task.clean[:8], task.corrupted[:8], edges.subset_metric(task.metric, rows)
    short, path = edges.PruneSettings(steps=2, batch_size=4), tmp_path / "mask.pt"
    start = edges.edge_attribution(model, clean, corrupted, metric, "eap-ig", steps=2)
    first = edges.prune_edges(model, clean, corrupted, metric, short, start=start, checkpoint=path)
    again = edges.prune_edges(model, clean, corrupted, metric, short, start=start, checkpoint=path)
    torch.testing.assert_close(again.scores, first.scores, atol=0, rtol=0)
    rebatched = edges.edge_attribution(model, clean, corrupted, metric, "eap-ig", steps=2, batch_size=3)
    assert not torch.equal(rebatched.scores, start.scores)  # float rounding: the same ranking, to RANKS_TOL
    edges.prune_edges(model, clean, corrupted, metric, short, start=rebatched, checkpoint=path)
    other = edges.edge_attribution(model, clean, corrupted, metric, "eap-ig", steps=5)
    with pytest.raises(ValueError, match="another pruning run, with other start ranking; give another"):
        edges.prune_edges(model, clean, corrupted, metric, short, start=other, checkpoint=path)
    monkeypatch.setattr(pruning, "source_key", lambda *packages: "0" * 16)
    for resume in (
        lambda: edges.prune_edges(model, clean, corrupted, metric, short, start=start, checkpoint=path),
        lambda: checkpoint_step(model, clean, corrupted, metric, short, path, start="eap-ig"),
    ):
        with pytest.raises(ValueError, match="another pruning run, with other interp code; give another"):
            resume()
    state = torch.load(path, weights_only=True)
    state["key"]["weights"] = "476d8f67b7272857"  # as an interp that fingerprinted a sample wrote it
    torch.save(state, path)
    with pytest.raises(ValueError, match="written by an older interp, whose key cannot tell models apart"):
        edges.prune_edges(model, clean, corrupted, metric, short, start=start, checkpoint=path)


def test_a_checkpoint_is_refused_by_a_run_that_would_learn_another_mask(tmp_path):
    """Each of these resumed another run's checkpoint and went on from its mask: another patience, a
    start ranking given where the checkpoint's run ranked the edges itself (and the reverse), a mean
    ablation over another padding mask. `find_edge_circuit` kept no checkpoint unless it reported
    progress (and said it resumed from the file it never wrote)."""
    from circuits.edge_circuits.tasks import edge_task

    model = interp.load_model("toy-ioi").eval()
    task = edge_task(model, "ioi", 8)
    clean, corrupted, metric = task.pair
    short = edges.PruneSettings(steps=2, batch_size=4, patience=None)
    path = tmp_path / "mask.pt"
    edges.prune_edges(model, clean, corrupted, metric, short, checkpoint=path)
    assert checkpoint_step(model, clean, corrupted, metric, short, path) == 2
    start = edges.edge_attribution(model, clean, corrupted, metric, "eap-ig", steps=3)
    for settings, given in [(replace(short, patience=3), None), (short, start)]:
        with pytest.raises(ValueError, match="checkpoint of another pruning run"):
            edges.prune_edges(model, clean, corrupted, metric, settings, start=given, checkpoint=path)
    with pytest.raises(ValueError, match="checkpoint of another pruning run"):
        checkpoint_step(model, clean, corrupted, metric, short, path, start="eap-ig")
    given = tmp_path / "given.pt"
    edges.prune_edges(model, clean, corrupted, metric, short, start=start, checkpoint=given)
    with pytest.raises(ValueError, match="checkpoint of another pruning run"):
        edges.prune_edges(model, clean, corrupted, metric, short, checkpoint=given)
    mask = task.corrupted_mask
    other = mask.clone()
    other[:4] = 1
    assert not torch.equal(mask, other)
    mean = tmp_path / "mean.pt"
    edges.prune_edges(
        model, clean, corrupted, metric, short, start=start, ablation=interp.Ablation("mean", mask=mask),
        checkpoint=mean,
    )  # fmt: skip
    with pytest.raises(ValueError, match="checkpoint of another pruning run"):
        edges.prune_edges(
            model, clean, corrupted, metric, short, start=start, ablation=interp.Ablation("mean", mask=other),
            checkpoint=mean,
        )  # fmt: skip
    settings = EdgeCircuitSettings(method="prune", n_edges=10, curve_fractions=None, prune_steps=2)
    circuit = tmp_path / "circuit.pt"
    find_edge_circuit(model, edge_task(model, "ioi", 16), settings, checkpoint=str(circuit))
    assert circuit.exists()  # without a progress callback too


def test_the_kl_objective_of_a_plain_metric_reads_each_prompts_last_real_token():
    """A metric that does not say where it reads (a plain function of the logits) on prompts padded on
    the right: the mask's KL was taken at the last column, padding for the shorter prompts; it is taken
    at each prompt's last real token, as the same metric made an AnswerMetric says it reads."""
    from circuits.edge_circuits.tasks import edge_task
    from interp.model.tokens import record_padding

    model = interp.load_model("toy-ioi").eval()
    task = edge_task(model, "ioi", 8)
    clean, corrupted, metric = task.pair
    end = metric.pos
    real = (torch.arange(clean.shape[1])[None] <= end[:, None]).long()
    assert (end < clean.shape[1] - 1).any()  # some prompts end before the last column
    clean, corrupted = record_padding(clean.clone(), real), record_padding(corrupted.clone(), real)

    def plain(logits: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        rows = torch.arange(len(logits)) if rows is None else rows
        at = logits[torch.arange(len(logits)), end[rows]]
        return (
            at.gather(1, metric.correct[rows, None])[:, 0] - at.gather(1, metric.incorrect[rows, None])[:, 0]
        )

    start = edges.edge_attribution(model, clean, corrupted, metric, "eap-ig", steps=3)
    settings = edges.PruneSettings(density=0.1, steps=6, batch_size=4, objective="kl", patience=None)
    told = edges.prune_edges(model, clean, corrupted, metric, settings, start=start)
    untold = edges.prune_edges(model, clean, corrupted, plain, settings, start=start)
    torch.testing.assert_close(untold.scores, told.scores, atol=1e-5, rtol=0)


def test_nan_edge_scores_are_refused_where_they_are_ranked(toy_induction):
    """NaN sorts as the largest |score|: `top_circuit` kept it as the strongest edge, and
    `normalised_ranks` (ensembles, the mask's start) gave it rank 1."""
    model, task, _ = toy_induction
    scores = edges.edge_attribution(
        model, task.clean[:4], task.corrupted[:4], edges.subset_metric(task.metric, torch.arange(4)), "eap"
    )
    graph = scores.graph
    w, r = graph.valid.nonzero()[3].tolist()
    broken = replace(
        scores,
        scores=scores.scores.clone().index_put_(
            (torch.tensor(w), torch.tensor(r)), torch.tensor(float("nan"))
        ),
    )
    name = f"{graph.writers[w]} -> {graph.readers[r]}"
    for rank in (
        lambda: edges.top_circuit(broken, 1),
        lambda: edges.normalised_ranks(broken),
        lambda: edges.ensemble([scores, broken]),
    ):
        with pytest.raises(
            ValueError, match=rf"the edge scores hold 1 non-finite values \(first: {name} = nan\)"
        ):
            rank()


def test_circuit_checkpoint_of_another_run_is_refused(tmp_path, monkeypatch):
    """`interp circuit --checkpoint` (the audit's runs): a mask learned on toy-ioi's IOI is refused on
    toy-induction (the same 81 edges) in one line, before the edge scores; the same run resumes and its
    report says so; a file that is no checkpoint is refused in one line, not a traceback."""
    runner = CliRunner()
    monkeypatch.chdir(tmp_path)
    common = ["circuit", "--quick", "--edges", "20", "--prune-steps", "4", "--checkpoint", "ck.pt"]
    ioi = ["--model", "toy-ioi", "--task", "ioi"]
    first = runner.invoke(app, [*common, *ioi])
    assert first.exit_code == 0, first.output
    assert "resumed" not in first.output
    result = runner.invoke(app, [*common, "--model", "toy-induction", "--task", "induction"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "error: ck.pt is the checkpoint of another pruning run, with other model weights" in said
    assert "delete ck.pt" in said and "Traceback" not in said and "stage 1 of 4: Edge scores" not in said
    again = runner.invoke(app, [*common, *ioi])
    assert again.exit_code == 0, again.output
    said = " ".join(again.output.split())
    assert "Edge pruning: resumed from ck.pt at step 4 of 4" in said  # the progress line
    assert "the edge mask resumed from ck.pt at step 4 of 4" in said  # the report's
    with open("junk.json", "w") as file:
        file.write('{"schema": "interp-result-3"}')
    junk = runner.invoke(app, [*common[:-1], "junk.json", *ioi])
    assert junk.exit_code == 2, junk.output
    said = " ".join(junk.output.split())
    assert "error: --checkpoint: junk.json is no edge-mask checkpoint" in said and "Traceback" not in said


def test_selection_frequencies(toy_induction):
    """Per-prompt scores average to the batch's scores (read at each prompt's own position too);
    frequencies lie in [0, 1], the strongest edge and an edge planted as essential on every prompt
    are selected in every resample."""
    model, task, _ = toy_induction
    clean, corrupted, metric = (
        task.clean[:12],
        task.corrupted[:12],
        edges.subset_metric(task.metric, torch.arange(12)),
    )
    each = edges.prompt_scores(model, clean, corrupted, metric, "eap")
    batch = edges.edge_attribution(model, clean, corrupted, metric, "eap")
    torch.testing.assert_close(each.mean(0), batch.scores, atol=1e-5, rtol=1e-4)
    at = torch.arange(12) % (clean.shape[1] - 1) + 1  # each prompt read at its own position
    each_at = edges.prompt_scores(model, clean, corrupted, metric, "eap", reader_pos=at)
    batch_at = edges.edge_attribution(model, clean, corrupted, metric, "eap", reader_pos=at)
    torch.testing.assert_close(each_at.mean(0), batch_at.scores, atol=1e-5, rtol=1e-4)
    graph = batch.graph
    weakest = batch.scores.abs().masked_fill(~graph.valid, torch.inf).flatten().argmin()
    writer, reader = divmod(int(weakest), graph.n_readers)
    planted = each.clone()
    planted[:, writer, reader] = -100.0

    def scores_of(rows: torch.Tensor) -> edges.EdgeScores:
        return edges.mean_scores(graph, planted, rows, batch)

    frequency = edges.selection_frequency(scores_of, 12, 10, n_boot=20)
    assert bool((frequency >= 0).all() and (frequency <= 1).all()) and bool(
        (frequency[~graph.valid] == 0).all()
    )
    assert frequency[writer, reader] == 1.0
    strongest = graph.edge_index(batch.top(1)[0][0])
    assert frequency[strongest] == 1.0
    assert 0 < frequency.sum() <= 10


def test_ensemble_ranks():
    graph = edges.edge_graph(tiny_config())
    first, second = edges.random_scores(graph, 0), edges.random_scores(graph, 1)
    alone = edges.ensemble([first])
    assert torch.equal(edges.top_circuit(alone, 20), edges.top_circuit(first, 20))
    both = edges.ensemble([first, second]).scores[graph.valid]
    assert bool((both <= 0).all() and (both >= -1).all())
    with pytest.raises(ValueError, match="at least one"):
        edges.ensemble([])


def test_tied_scores_share_their_rank_and_an_ensemble_has_no_sign():
    """Edges of equal |score| share their mean rank (their order in the graph decided it before), so a
    member that cannot tell edges apart leaves the ensemble to the others; an ensemble's scores only
    rank, and the report says its CPR follows that order, not a sign."""
    graph = edges.edge_graph(tiny_config())
    values = edges.random_scores(graph, 0).scores
    tied = values.masked_fill(values.abs() < values.abs()[graph.valid].median(), 0.0)
    ranks = edges.normalised_ranks(replace(edges.random_scores(graph, 0), scores=tied))[graph.valid]
    zero = tied[graph.valid] == 0
    assert ranks[zero].unique().numel() == 1
    assert torch.allclose(ranks[zero], (zero.sum() - 1) / 2 / (graph.valid.sum() - 1))
    flat = replace(edges.random_scores(graph, 0), scores=torch.zeros_like(values))
    other = edges.random_scores(graph, 1)
    both = edges.ensemble([other, flat])
    assert torch.equal(edges.top_circuit(both, 20), edges.top_circuit(other, 20))


def test_circuit_methods_report_frequencies(toy_induction):
    model, _, _ = toy_induction
    task = induction_task(model, 8, seed=0)
    settings = EdgeCircuitSettings(
        method="ensemble", n_edges=10, curve_fractions=(0.1, 0.5), bootstrap=3, prune_steps=10
    )
    result = find_edge_circuit(model, task, settings)
    data = result.json_data()
    assert data["method"]["name"] == "ensemble(eap-ig,prune)" and data["method"]["bootstrap"] == 3
    assert all(0 <= edge["frequency"] <= 1 for edge in data["circuit"]["edges"])
    assert all(edge["frequency"] is not None for edge in data["top_edges"])
    page = render_markdown(edge_sections(result))
    assert "in the method's rank order: its scores have no sign" in page and "signed score" not in page
    assert "another CPU's float rounding" in page  # a learned mask's circuit is one CPU's
    assert "(rank order)" in curve_svg(result)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--method", "mask"], "unknown method 'mask'; choose one of eap, eap-ig"),
        (["--bootstrap", "-1"], "--bootstrap"),
        (["--density", "1.5"], "--density"),
        (["--prune-steps", "0"], "--prune-steps"),
    ],
)
def test_circuit_method_options_are_checked(arguments, message):
    result = CliRunner().invoke(app, ["circuit", *arguments])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.replace("│", " ").split())
    if arguments[0] == "--method":
        assert "prune, ensemble" in " ".join(result.output.replace("│", " ").split())


def test_pruning_recovers_the_planted_circuit():
    """On the hand-set induction model whose 7 edges are the whole circuit, the mask's top 7 edges are
    exactly those (precision and recall 1)."""
    from circuits.edge_circuits.ground_truth import planted_induction, score_method

    def find(model, task, n_edges):
        scores = edges.prune_edges(
            model, task.clean, task.corrupted, task.metric, edges.PruneSettings(density=0.1, steps=40)
        )
        return edges.top_circuit(scores, n_edges)

    assert score_method(find, planted_induction()) == (1.0, 1.0)


def test_the_mask_shrinks_to_its_size_and_its_circuit_ranks_first(toy_induction):
    """The mask keeps start_factor times the final size at first (at most every edge), shrinks
    monotonically over the ramp's share of the steps to ceil(density N) and stays there; the final
    circuit's edges are exactly the ranking's top k; a start ranking of another graph or with NaN is
    refused, as is an objective that is not finite."""
    from interp.edges.pruning import mask_sizes

    old = edges.PruneSettings(density=300 / 70_651, steps=100, start_factor=10, ramp=0.6)
    sizes = mask_sizes(70_651, old)
    assert sizes[0] == 3000 and sizes[59] > 300 and sizes[60:] == [300] * 40
    assert all(a >= b for a, b in zip(sizes, sizes[1:], strict=False))
    sizes = mask_sizes(70_651, edges.PruneSettings(density=300 / 70_651))  # the defaults: 45 steps, 3x, 40 %
    assert sizes[0] == 900 and sizes[17] > 300 and sizes[18:] == [300] * 27
    assert mask_sizes(81, edges.PruneSettings(density=0.1, steps=10, start_factor=10))[0] == 81
    model, task, _ = toy_induction
    scores = edges.prune_edges(
        model, task.clean, task.corrupted, task.metric, edges.PruneSettings(density=0.1, steps=20)
    )
    graph, k = scores.graph, mask_sizes(81, edges.PruneSettings(density=0.1, steps=20))[-1]
    values = scores.scores[graph.valid]
    final = values < -(20 + 1) / (20 + 2)  # the final circuit: last = steps + 1
    assert int(final.sum()) == k
    assert bool(values[final].max() < values[~final].min())  # it ranks first
    other = edges.EdgeScores(
        graph=graph, scores=torch.zeros(3, 4), method="eap", ablation="counterfactual", steps=1, n_prompts=1
    )
    with pytest.raises(ValueError, match="another graph"):
        edges.prune_edges(
            model, task.clean, task.corrupted, task.metric, edges.PruneSettings(steps=1), start=other
        )
    broken = scores.scores.clone()
    broken[graph.valid.nonzero()[0].tolist()] = float("nan")
    nan_start = edges.EdgeScores(
        graph=graph, scores=broken, method="eap-ig", ablation="counterfactual", steps=5, n_prompts=1
    )
    with pytest.raises(ValueError, match="non-finite"):
        edges.prune_edges(
            model, task.clean, task.corrupted, task.metric, edges.PruneSettings(steps=1), start=nan_start
        )

    def nan_metric(logits, rows=None):
        return task.metric(logits, rows) * float("nan")

    with pytest.raises(ValueError, match="objective is nan at step 1"):
        edges.prune_edges(
            model, task.clean, task.corrupted, nan_metric, edges.PruneSettings(steps=2), start=scores
        )


def test_a_negative_position_prunes_as_the_same_position_counted_from_the_start():
    """pos=-2 reads the token before the last, as pos=L-2 does: pruning, which runs each step only up
    to the last position the metric reads, learns the same scores for both."""
    model = interp.HookedTransformer(tiny_config(n_layers=2, d_vocab=29))
    model.init_weights(seed=0)
    generator = torch.Generator().manual_seed(2)
    clean = torch.randint(1, 29, (4, 6), generator=generator)
    corrupted = torch.cat([clean[:, :1], torch.randint(1, 29, (4, 5), generator=generator)], 1)
    correct, incorrect = (
        torch.randint(29, (4,), generator=generator),
        torch.randint(29, (4,), generator=generator),
    )
    settings = edges.PruneSettings(density=0.1, steps=4, batch_size=4, patience=None)
    scores = [
        edges.prune_edges(model, clean, corrupted, edges.logit_diff_metric(correct, incorrect, pos), settings)
        for pos in (-2, 4)
    ]
    torch.testing.assert_close(scores[0].scores, scores[1].scores, rtol=0, atol=0)
