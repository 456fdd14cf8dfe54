"""Zero, mean and resample ablation of heads, MLPs and neurons; sweeps; keep-only-the-circuit."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from conftest import tiny_config

import interp
from interp import Ablation, ablation, edges, metrics
from interp.interventions import engine
from interp.interventions.engine import RunOptions
from interp.model.tokens import record_padding

BATCH, POS = 3, 6


@pytest.fixture(scope="module")
def model() -> interp.HookedTransformer:
    torch.manual_seed(0)
    return interp.HookedTransformer(
        tiny_config(n_layers=2, n_kv_heads=2, positional="rotary", d_mlp=40)
    ).eval()


@pytest.fixture(scope="module")
def data(model):
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(model.cfg.d_vocab, (BATCH, POS), generator=generator)
    reference = torch.randint(model.cfg.d_vocab, (5, POS), generator=generator)
    metric = lambda logits: metrics.logit_diff(logits, tokens[:, 0], tokens[:, 1])  # noqa: E731
    return tokens, reference, metric


def _z(model, tokens, layer, **ablate_kwargs):
    with ablation.ablate(model, **ablate_kwargs):
        _, cache = model.run_with_cache(tokens, names_filter=interp.act_name("z", layer))
    return cache["z", layer]


def test_ablating_nothing_is_the_identity(model, data):
    tokens, reference, _ = data
    expected = model(tokens)
    for method in ("zero", "mean", "resample"):
        with ablation.ablate(model, ablation=Ablation(method, reference=reference)):
            torch.testing.assert_close(model(tokens), expected)


def test_zero_ablation_zeroes_exactly_the_chosen_units(model, data):
    tokens, _, _ = data
    _, clean = model.run_with_cache(tokens)
    z = _z(model, tokens, 1, heads=[(1, 2), (1, 0)])
    assert (z[:, :, [0, 2]] == 0).all()
    torch.testing.assert_close(z[:, :, [1, 3]], clean["z", 1][:, :, [1, 3]], atol=1e-6, rtol=0)
    with ablation.ablate(model, neurons=[(0, 5), (0, 7)], mlps=[1]):
        _, cache = model.run_with_cache(tokens)
    assert (cache["post", 0][..., [5, 7]] == 0).all() and (cache["post", 0][..., 6] != 0).all()
    assert (cache["mlp_out", 1] == 0).all()


def test_mean_ablation_uses_the_reference_means(model, data):
    tokens, reference, _ = data
    _, ref_cache = model.run_with_cache(reference)
    ref_z = ref_cache["z", 0][:, :, 1]  # [n_ref, pos, d_head]
    # "mean" is one mean per position, as everywhere in interp (edges included)
    z = _z(model, tokens, 0, heads=[(0, 1)], ablation=Ablation("mean", reference=reference))
    torch.testing.assert_close(z[:, :, 1], ref_z.mean(0).expand_as(z[:, :, 1]))
    groups, reference_groups = torch.tensor([1, 0, 1]), torch.tensor([0, 1, 1, 0, 0])
    by_group = Ablation("mean", reference=reference, groups=reference_groups)
    z = _z(model, tokens, 0, heads=[(0, 1)], ablation=by_group, groups=groups)
    for prompt, group in enumerate(groups):
        torch.testing.assert_close(z[prompt, :, 1], ref_z[reference_groups == group].mean(0))
    # an ActivationCache of the reference run serves as the reference without a second run
    z = _z(model, tokens, 0, heads=[(0, 1)], ablation=Ablation("mean", reference=ref_cache))
    torch.testing.assert_close(z[:, :, 1], ref_z.mean(0).expand_as(z[:, :, 1]))
    # ... with groups too, as an ActivationCache or a plain dict of the hooks
    for cached in (ref_cache, {interp.act_name("z", 0): ref_cache["z", 0]}):
        by_group = Ablation("mean", reference=cached, groups=reference_groups)
        z = _z(model, tokens, 0, heads=[(0, 1)], ablation=by_group, groups=groups)
        for prompt, group in enumerate(groups):
            torch.testing.assert_close(z[prompt, :, 1], ref_z[reference_groups == group].mean(0))
    names = [interp.act_name("z", 0), interp.act_name("z", 1)]
    with pytest.raises(ValueError, match="lacks.*blocks.1.attn.hook_z"):
        ablation.Replacement(model, names, Ablation("mean", reference={names[0]: ref_cache["z", 0]}))
    with pytest.raises(ValueError, match="one group per reference prompt"):
        ablation.Replacement(model, names, Ablation("mean", reference=ref_cache, groups=torch.tensor([0, 1])))


@pytest.mark.parametrize("labels", [(5, 9), (-1, 0), (-1, -2)])
def test_mean_ablation_takes_any_integer_group_labels(model, data, labels):
    """Groups are labels, not indices: prompts of group g take the mean of the reference prompts of g
    (a label -1 is not the last group's); a group of the inputs that no reference prompt has is refused."""
    tokens, reference, _ = data
    _, ref_cache = model.run_with_cache(reference)
    ref_z = ref_cache["z", 0][:, :, 1]
    as_labels = torch.tensor(labels)
    reference_groups, groups = as_labels[[0, 1, 1, 0, 0]], as_labels[[1, 0, 1]]
    by_group = Ablation("mean", reference=reference, groups=reference_groups)
    z = _z(model, tokens, 0, heads=[(0, 1)], ablation=by_group, groups=groups)
    for prompt, group in enumerate(groups):
        torch.testing.assert_close(z[prompt, :, 1], ref_z[reference_groups == group].mean(0))
    with pytest.raises(ValueError, match=r"input prompts of groups \[7\] have no reference prompt"):
        _z(model, tokens, 0, heads=[(0, 1)], ablation=by_group, groups=torch.tensor([labels[0], 7, 7]))


def test_mean_ablation_of_padded_references_averages_their_real_tokens_only(model, data):
    """With the reference's mask, each position's mean is over the references real there (per group too),
    NaN where none is; without it the padding's activations would join the mean."""
    tokens, reference, _ = data
    real = torch.arange(POS) < torch.tensor([6, 3, 6, 2, 4])[:, None]  # [n_ref, pos]: right padding
    _, ref_cache = model.run_with_cache(reference)
    ref_z = ref_cache["z", 0][:, :, 1]  # [n_ref, pos, d_head]
    expected = torch.stack([ref_z[real[:, p], p].mean(0) for p in range(POS)])  # [pos, d_head]
    z = _z(model, tokens, 0, heads=[(0, 1)], ablation=Ablation("mean", reference=reference, mask=real))
    torch.testing.assert_close(z[:, :, 1], expected.expand_as(z[:, :, 1]))
    assert not torch.allclose(expected, ref_z.mean(0))  # the padding would have changed the means
    _, padded_cache = model.run_with_cache(record_padding(reference.clone(), real.long()))  # as to_tokens
    z = _z(model, tokens, 0, heads=[(0, 1)], ablation=Ablation("mean", reference=padded_cache))
    torch.testing.assert_close(z[:, :, 1], expected.expand_as(z[:, :, 1]))  # the cache's run's padding
    reference_groups, groups = torch.tensor([0, 1, 0, 0, 1]), torch.tensor([1, 0, 1])
    by_group = Ablation("mean", reference=ref_cache, mask=real, groups=reference_groups)
    with pytest.raises(ValueError, match="input prompt 0 is real at position 4, where none of the reference"):
        _z(model, tokens, 0, heads=[(0, 1)], ablation=by_group, groups=groups)  # group 1 ends at 4
    z = _z(model, tokens[:, :4], 0, heads=[(0, 1)], ablation=by_group, groups=groups)
    for prompt, group in enumerate(groups.tolist()):
        for p in range(4):
            rows = real[:, p] & (reference_groups == group)
            torch.testing.assert_close(z[prompt, p, 1], ref_z[rows, p].mean(0))
    names = [interp.act_name("z", 0)]
    with pytest.raises(ValueError, match="one row per reference prompt"):
        ablation.Replacement(model, names, Ablation("mean", reference=ref_cache, mask=real[:2]))
    with pytest.raises(ValueError, match=r"Ablation.mask is \(5, 5\): it must be \[5, 6\]"):
        ablation.Replacement(model, names, Ablation("mean", reference=ref_cache, mask=real[:, :5]))


def test_left_padded_reference_ids_given_a_mask_are_run_masked(model, data):
    """Bare ids (a tokenizer's input_ids, a slice: no recorded padding) with the Ablation's mask: the
    reference run masks their left padding, so each mean is over the references' real tokens as each
    runs alone, for heads and for edges (the run read the padding as tokens: 0.92 off on toy-induction)."""
    tokens, reference, _ = data
    lengths = [6, 3, 6, 2, 4]
    real = torch.arange(POS) >= torch.tensor([POS - n for n in lengths])[:, None]  # left padding
    rows = [reference[i, POS - n :][None] for i, n in enumerate(lengths)]
    alone = [model.run_with_cache(row)[1]["z", 0][0, :, 1] for row in rows]  # each reference alone
    expected = torch.stack([torch.stack([z[p] for z in alone if len(z) > p]).mean(0) for p in range(POS)])
    z = _z(model, tokens, 0, heads=[(0, 1)], ablation=Ablation("mean", reference=reference, mask=real))
    torch.testing.assert_close(z[:, :, 1], expected.expand_as(z[:, :, 1]), atol=1e-5, rtol=0)
    outputs = [edges.writer_outputs(model, row)[:, 0] for row in rows]  # [writer, pos, d_model] each
    by_hand = torch.stack(
        [torch.stack([o[:, p] for o in outputs if o.shape[1] > p]).mean(0) for p in range(POS)], 1
    )
    mean = edges.ablated_outputs(model, tokens, tokens, Ablation("mean", reference=reference, mask=real))
    torch.testing.assert_close(mean[:, 0], by_hand, atol=1e-5, rtol=0)


def test_resample_ablation_takes_a_reference_prompts_activation(model, data):
    tokens, reference, _ = data
    _, ref_cache = model.run_with_cache(reference)
    ref_z = ref_cache["z", 1][:, :, 3]
    reference_groups = torch.tensor([0, 1, 1, 0, 0])
    by_group = Ablation("resample", reference=reference, groups=reference_groups)
    z = _z(model, tokens, 1, heads=[(1, 3)], ablation=by_group, groups=torch.tensor([1, 1, 0]))
    for prompt, group in enumerate([1, 1, 0]):
        matches = [(z[prompt, :, 3] - ref_z[i]).abs().max() < 1e-6 for i in range(5)]
        assert sum(matches) == 1 and reference_groups[matches.index(True)] == group


def test_resample_ablation_draws_one_reference_prompt_per_input_prompt_for_every_site_and_run(model, data):
    """Every ablated site of a run reads the same reference prompt for an input prompt, and runs on as
    many prompts read the same draw: a patched run that changes nothing equals the run it patches."""
    tokens, reference, _ = data
    _, ref_cache = model.run_with_cache(reference)
    base = ablation.ablation_interventions(
        model, heads=[(0, 1), (1, 3)], ablation=Ablation("resample", reference=reference)
    )
    with engine.intervened(model, base):
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_z"))
        again = model(tokens)
        once_more = model(tokens)
    n_pos = tokens.shape[1]

    def reads(prompt: int, layer: int, head: int) -> list[bool]:  # which reference prompt's z it holds
        z = cache["z", layer][prompt, :, head]
        return [
            bool((z - ref_cache["z", layer][i, :n_pos, head]).abs().max() < 1e-6)
            for i in range(len(reference))
        ]

    for prompt in range(tokens.shape[0]):
        assert sum(reads(prompt, 0, 1)) == 1 and reads(prompt, 0, 1) == reads(prompt, 1, 3)
    torch.testing.assert_close(again, once_more, atol=0, rtol=0)


def test_a_resample_draw_does_not_depend_on_the_runs_before_it(model, data):
    """A resample ablation's draw for runs on n prompts is its seed's, whatever ran before under the same
    ablation: a run on fewer prompts first (a sanity check on one prompt, a sub-batch) drew from the
    same generator, and the later run on every prompt read other reference prompts."""
    tokens, reference, metric = data
    resample = Ablation("resample", reference=reference, seed=3)
    heads = [(0, 1), (1, 3)]
    with ablation.ablate(model, heads=heads, ablation=resample):
        alone = model(tokens)
    with ablation.ablate(model, heads=heads, ablation=resample):
        model(tokens[:1])
        after_one = model(tokens)
    torch.testing.assert_close(after_one, alone, atol=0, rtol=0)
    names = [interp.act_name("z", layer) for layer in (0, 1)]
    sets = [[(0, 1)], [(1, 3), (0, 0)]]
    fresh = ablation.ablated_metrics(
        model, tokens, metric, sets, ablation.Replacement(model, names, resample)
    )
    reused = ablation.Replacement(model, names, resample)
    ablation.ablated_metrics(
        model,
        tokens[:2],
        lambda logits: metrics.logit_diff(logits, tokens[:2, 0], tokens[:2, 1]),
        sets,
        reused,
    )
    later = ablation.ablated_metrics(model, tokens, metric, sets, reused)
    torch.testing.assert_close(later, fresh, atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["mean", "resample", "counterfactual"])
def test_ablated_runs_place_the_reference_by_each_prompts_position(model, data, kind):
    """Under `ablate`, a prompt's position p (counted from its first real token, as the model counts
    it) takes the reference's position p: left and right padding give each prompt the same logits
    (counterfactual pairs go by index), and a KV cache's continuation those of the whole run."""
    _, reference, _ = data
    reference = reference[:BATCH] if kind == "counterfactual" else reference
    lengths = torch.tensor([5, 2, 6])
    right = torch.arange(POS) < lengths[:, None]
    tokens = torch.randint(1, model.cfg.d_vocab, (BATCH, POS), generator=torch.Generator().manual_seed(2))
    left_tokens = torch.stack([row.roll(POS - n) for row, n in zip(tokens, lengths.tolist(), strict=True)])
    ablated = Ablation(kind, reference=reference)
    with ablation.ablate(model, heads=[(0, 1), (1, 3)], mlps=[0], ablation=ablated):
        by_right = model(tokens, attention_mask=right.long())[torch.arange(BATCH), lengths - 1]
        by_left = model(left_tokens, attention_mask=right.flip(1).long())[:, -1]
        whole = model(tokens)
        cache = interp.HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, BATCH)
        model(tokens[:, :4], past_kv_cache=cache)
        continued = model(tokens[:, 4:], past_kv_cache=cache)
    if kind != "counterfactual":
        torch.testing.assert_close(by_left, by_right, atol=1e-5, rtol=0)
    torch.testing.assert_close(continued, whole[:, 4:], atol=1e-5, rtol=0)
    short = Ablation(kind, reference=reference[:, :4])
    with (
        ablation.ablate(model, heads=[(0, 1)], ablation=short),
        pytest.raises(ValueError, match="reaches position 7 but the reference has only 4 positions"),
    ):
        model(tokens[:, 4:], past_kv_cache=cache)


def test_counterfactual_ablation_takes_the_paired_prompts_activation(model, data):
    tokens, reference, _ = data
    paired = reference[:BATCH]
    _, ref_cache = model.run_with_cache(paired)
    z = _z(model, tokens, 1, heads=[(1, 3)], ablation=Ablation("counterfactual", reference=paired))
    torch.testing.assert_close(z[:, :, 3], ref_cache["z", 1][:, :, 3], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="pairs reference prompt i with input prompt i"):
        _z(model, tokens, 1, heads=[(1, 3)], ablation=Ablation("counterfactual", reference=reference))


def test_counterfactual_pairs_padded_otherwise_are_refused(model, data):
    """Counterfactual values are placed by index: a pair left-padded alike takes its own prompt's values
    (as the pair run unpadded), one padded otherwise (tokenised apart: one side left-padded, or two
    columns wider) is refused where both paddings are known (it took a shifted prompt's: 2.4 off)."""
    tokens, reference, _ = data
    short = POS - 2  # prompt 1 of each side is two tokens shorter

    def padded(rows, left: bool, width: int = POS):
        ids = torch.zeros(BATCH, width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            n = short if i == 1 else POS
            at = slice(width - n, width) if left else slice(0, n)
            ids[i, at], mask[i, at] = row[:n], 1
        return record_padding(ids, mask)

    paired = reference[:BATCH]
    clean, corrupted = padded(tokens, left=True), padded(paired, left=True)
    z = _z(model, clean, 1, heads=[(1, 3)], ablation=Ablation("counterfactual", reference=corrupted))
    _, alone = model.run_with_cache(paired[1:2, :short])
    torch.testing.assert_close(z[1, POS - short :, 3], alone["z", 1][0, :, 3], atol=1e-5, rtol=0)
    for other in (padded(paired, left=False), padded(paired, left=True, width=POS + 2)):
        with pytest.raises(
            ValueError, match="counterfactual ablation places the reference prompt's values by index"
        ):
            _z(model, clean, 1, heads=[(1, 3)], ablation=Ablation("counterfactual", reference=other))


def test_the_four_ablations_are_one_vocabulary_for_heads_and_edges(model, data):
    """zero, mean (per position), resample and counterfactual mean the same for a head's output and
    for the edges out of it: ablating every edge out of a head equals ablating the head's output."""
    from interp import edges

    tokens, reference, _ = data
    paired = reference[:BATCH]
    graph = edges.edge_graph(model)
    for method in interp.types.ABLATIONS:
        edge_reference = None if method == "counterfactual" else reference  # edges: the corrupted prompts
        out = edges.ablated_outputs(model, tokens, paired, Ablation(method, reference=edge_reference))
        paired_or_not = paired if method == "counterfactual" else reference
        with ablation.ablate(model, heads=[(0, 1)], ablation=Ablation(method, reference=paired_or_not)):
            _, cache = model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_z")
        assert out.shape[0] == graph.n_writers
        if method in ("zero", "mean", "counterfactual"):  # resample draws its own prompts in each
            z_out = torch.einsum("bpe,ed->bpd", cache["z", 0][:, :, 1], model.W_O[0, 1])
            torch.testing.assert_close(
                out[graph.writers.index("a0.h1")].expand_as(z_out), z_out, atol=1e-5, rtol=0
            )


def test_ablation_sweep_matches_one_ablation_at_a_time(model, data):
    tokens, reference, metric = data
    for method in ("zero", "mean"):
        ablated = Ablation(method, reference=reference)
        sweep = ablation.ablation_sweep(model, tokens, metric, "heads", ablation=ablated)
        assert sweep.mean().shape == (model.cfg.n_layers, model.cfg.n_heads)
        for layer, head in [(0, 2), (1, 0)]:
            hooks = ablation.ablation_hooks(model, heads=[(layer, head)], ablation=ablated)
            expected = metric(model.run_with_hooks(tokens, fwd_hooks=hooks)).detach()
            torch.testing.assert_close(sweep.per_example()[layer, head], expected, atol=1e-5, rtol=0)
    # Padded references with their mask; logits only at the last position, for the two tokens read.
    real = torch.arange(POS) < torch.tensor([6, 3, 6, 2, 4])[:, None]
    answers = torch.stack([tokens[:, 0], tokens[:, 1]], -1)
    padded = Ablation("mean", reference=reference, mask=real)
    sweep = ablation.ablation_sweep(
        model, tokens, metric, ablation=padded, options=RunOptions(logit_pos=-1, logit_tokens=answers)
    )
    hooks = ablation.ablation_hooks(model, heads=[(1, 3)], ablation=padded)
    expected = metric(model.run_with_hooks(tokens, fwd_hooks=hooks)).detach()
    torch.testing.assert_close(sweep.per_example()[1, 3], expected, atol=1e-5, rtol=0)
    mlps = ablation.ablation_sweep(model, tokens, metric, "mlps", base=[(0, 1)])
    hooks = ablation.ablation_hooks(model, heads=[(0, 1)], mlps=[1])
    expected = metric(model.run_with_hooks(tokens, fwd_hooks=hooks)).detach()
    torch.testing.assert_close(mlps.per_example()[1], expected, atol=1e-5, rtol=0)
    assert set(mlps.to_dataframe().columns) >= {"component", "layer", "head", "position", "value"}


def test_keeping_the_whole_model_as_the_circuit_is_faithful(model, data):
    tokens, reference, metric = data
    every_head = [(layer, head) for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)]
    result = ablation.head_circuit_faithfulness(model, tokens, metric, every_head)
    assert result["circuit"] == pytest.approx(result["model"]) and result["faithfulness"] == pytest.approx(
        1.0
    )
    partial = ablation.head_circuit_faithfulness(model, tokens, metric, every_head[:3], ablation="zero")
    kept = model.run_with_hooks(tokens, fwd_hooks=ablation.circuit_hooks(model, every_head[:3], "zero"))
    assert metric(kept).mean().item() == pytest.approx(partial["circuit"], abs=1e-6)
    assert partial["circuit"] != pytest.approx(partial["model"])


def test_bad_input_raises(model, data):
    tokens, reference, metric = data
    with pytest.raises(ValueError, match="out of range"):
        ablation.ablation_hooks(model, heads=[(2, 0)])
    with pytest.raises(ValueError, match="out of range"):
        ablation.ablation_hooks(model, neurons=[(0, 40)])
    with pytest.raises(ValueError, match=r'needs reference prompts: give Ablation\("mean", reference=...\)'):
        ablation.ablation_hooks(model, heads=[(0, 0)], ablation="mean")
    with pytest.raises(ValueError, match="unknown ablation"):
        ablation.ablation_hooks(model, heads=[(0, 0)], ablation="random")
    with pytest.raises(ValueError, match="positions"):
        hooks = ablation.ablation_hooks(
            model, heads=[(0, 0)], ablation=Ablation("resample", reference=reference[:, :4])
        )
        model.run_with_hooks(tokens, fwd_hooks=hooks)
    with pytest.raises(ValueError, match="attention-only"):
        ablation.ablation_hooks(interp.HookedTransformer(tiny_config(attn_only=True)), mlps=[0])
    with pytest.raises(ValueError, match="'heads' or 'mlps'"):
        ablation.ablation_sweep(model, tokens, metric, "neurons")


def test_runs_that_ablate_whole_layers_skip_their_attention_and_equal_hooked_runs(model, data):
    """Sets overwriting every head of a layer are run with the attention skipped (`model.given_z`);
    mixed with sets that do not, each equals its run with ablation hooks."""
    tokens, reference, metric = data
    n_heads = model.cfg.n_heads
    names = [interp.act_name("z", layer) for layer in range(model.cfg.n_layers)]
    replacement = ablation.Replacement(model, names, Ablation("mean", reference=reference))
    layer0 = [(0, head) for head in range(n_heads)]
    sets = [layer0, layer0 + [(1, 1)], [(1, h) for h in range(n_heads)], [(0, 2)], layer0 + [(1, 0), (1, 3)]]
    sites = ablation.ablation_sites(model, heads=layer0)
    zeros = [engine.Intervention(site, torch.zeros(())) for site in sites]
    assert engine._overwrites_z(model, 0, zeros)
    got = ablation.ablated_metrics(model, tokens, metric, sets, replacement)
    for heads, value in zip(sets, got, strict=True):
        hooks = ablation.ablation_hooks(model, heads=heads, ablation=Ablation("mean", reference=reference))
        expected = metric(model.run_with_hooks(tokens, fwd_hooks=hooks)).detach()
        torch.testing.assert_close(value, expected, atol=1e-5, rtol=0)


def test_runs_that_ablate_every_later_head_carry_the_read_positions_only(data):
    """From the block on which every later block of a run ablates all heads (no attention computed),
    the run is carried at the positions the metric reads only (`engine._narrow_from`); each run
    equals its hooked run, at an int and at per-prompt positions, with a base ablated in every run,
    and with a hook of the caller's on a block, which then sees every position."""
    _, reference, _ = data
    torch.manual_seed(0)
    model = interp.HookedTransformer(
        tiny_config(n_layers=4, n_kv_heads=2, positional="rotary", d_mlp=40)
    ).eval()
    tokens = torch.randint(model.cfg.d_vocab, (engine.MIN_NARROWED_ROWS, POS))
    whole = lambda *layers: [(layer, head) for layer in layers for head in range(model.cfg.n_heads)]  # noqa: E731
    sets = [whole(2, 3), whole(3), whole(0, 2, 3), whole(3) + [(1, 0)], [(3, 1)], [], whole(1, 3)[:-1]]
    names = [interp.act_name("z", layer) for layer in range(model.cfg.n_layers)]
    mean = Ablation("mean", reference=reference)
    replacement = ablation.Replacement(model, names, mean)
    sources = replacement.sources(names, tokens, None)
    runs = [
        [engine.Intervention(site, sources) for site in ablation.ablation_sites(model, heads=heads)]
        for heads in sets
    ]
    assert [engine._narrow_from(model, run, [False] * 5) for run in runs] == [2, 3, 2, 3, 4, 4, 4]
    assert engine._narrow_from(model, runs[0], [False, False, False, True, False]) == 4  # a block hooked
    assert engine._narrow_from(model, runs[0], [False, False, False, False, True]) == 4  # the final norm
    base = replacement.interventions(ablation.ablation_sites(model, heads=whole(3)), tokens, None)
    seen = []
    observe = [("blocks.3.hook_resid_pre", lambda act, hook: seen.append(act.shape[1]))]
    for logit_pos, extra, hooks in (
        (-1, [], []),
        (torch.tensor([5, 3, 4, 2]), [], []),
        (2, whole(3), []),
        (-1, [], observe),
    ):
        metric = lambda logits, pos=logit_pos: metrics.logit_diff(logits, tokens[:, 0], tokens[:, 1], pos=pos)  # noqa: E731
        options = RunOptions(logit_pos=logit_pos, base=base if extra else ())
        with model.hooks(fwd_hooks=hooks):
            got = engine.run_site_sets(model, tokens, runs, None, metric, options=options)
        for heads, value in zip(sets, got, strict=True):
            ablate = ablation.ablation_hooks(model, heads=heads + extra, ablation=mean)
            expected = metric(model.run_with_hooks(tokens, fwd_hooks=ablate)).detach()
            torch.testing.assert_close(value, expected, atol=1e-5, rtol=0)
    assert seen and set(seen) == {POS}


def test_an_ablation_refuses_wrong_combinations_and_the_old_keywords(model, data):
    """An Ablation refuses what no function could use, with the reason; a bare kind is Ablation(kind);
    code written for the loose parameters (reference=, reference_mask=, ...) fails, never computes."""
    tokens, reference, metric = data
    real = torch.ones(5, POS, dtype=torch.bool)
    with pytest.raises(ValueError, match="unknown ablation 'random'; choose one of zero, mean"):
        Ablation("random")
    with pytest.raises(ValueError, match="resample ablation draws whole reference prompts"):
        Ablation("resample", reference=reference, mask=real)
    for kind in ("counterfactual", "zero"):
        with pytest.raises(ValueError, match=r"groups must be .* \(mean and resample ablations"):
            Ablation(kind, reference=reference, groups=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="one group per reference prompt"):
        Ablation("mean", reference=reference, groups=torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="one group per reference prompt"):
        Ablation("mean", groups=torch.zeros(5, dtype=torch.long))  # groups of no reference
    with pytest.raises(ValueError, match=r"Ablation.mask is \(5, 5\): it must be \[5, 6\]"):
        Ablation("mean", reference=reference, mask=real[:, :5])
    with pytest.raises(TypeError, match="Ablation.seed must be an integer"):
        Ablation("resample", reference=reference, seed=1.5)
    with pytest.raises(TypeError, match="ablation must be an Ablation or one of zero, mean"):
        ablation.ablation_hooks(model, heads=[(0, 0)], ablation=None)
    with pytest.raises(
        ValueError, match=r'resample ablation needs reference prompts: give Ablation\("resample"'
    ):
        ablation.ablation_sweep(model, tokens, metric, ablation="resample")
    assert torch.equal(
        ablation.ablation_sweep(model, tokens, metric, ablation="zero").values,
        ablation.ablation_sweep(model, tokens, metric, ablation=Ablation("zero")).values,
    )
    with pytest.raises(TypeError, match="reference"):
        ablation.ablation_hooks(model, heads=[(0, 0)], ablation="mean", reference=reference)
    with pytest.raises(TypeError, match="reference_mask"):
        ablation.ablation_sweep(
            model, tokens, metric, ablation=Ablation("mean", reference=reference), reference_mask=real
        )
    with pytest.raises(TypeError, match="seed"):
        ablation.head_circuit_faithfulness(model, tokens, metric, [(0, 0)], seed=1)
    with pytest.raises(TypeError):  # Replacement(model, names, kind, reference) is one argument too many
        ablation.Replacement(model, [interp.act_name("z", 0)], "mean", reference)
    with pytest.raises(TypeError):  # ablation_interventions' old positional reference
        ablation.ablation_interventions(model, [(0, 0)], (), (), "mean", reference)


@pytest.mark.parametrize("made_ungrouped", [False, True])
def test_key_value_values_taken_under_one_grouping_are_refused_under_the_other(model, data, made_ungrouped):
    """Under grouped-query attention a key or value hook holds one copy per key/value head, or per query
    head with ungroup_grouped_query_attention: mean values taken under one setting and used under the
    other failed deep in torch on the shapes. Now the error names the setting; under the setting they
    were taken with they ablate as before."""
    tokens, reference, _ = data
    name = "blocks.1.attn.hook_v"
    with model.settings(ungroup_grouped_query_attention=made_ungrouped):
        replacement = ablation.Replacement(model, [name], Ablation("mean", reference=reference))
        sites = [engine.Site(name)]
        with engine.intervened(model, replacement.interventions(sites)):
            ablated = model(tokens)
    other = model.settings(ungroup_grouped_query_attention=not made_ungrouped)
    refused = pytest.raises(ValueError, match="make the ablation under the setting it runs with")
    with other, refused, engine.intervened(model, replacement.interventions(sites)):
        model(tokens)
    same = model.settings(ungroup_grouped_query_attention=made_ungrouped)
    with same, engine.intervened(model, replacement.interventions(sites)):
        torch.testing.assert_close(model(tokens), ablated)


@pytest.mark.parametrize(
    "arch",
    [
        dict(positional="learned"),
        dict(positional="rotary", n_kv_heads=2, qk_norm="head", normalization="rmsnorm"),
        dict(positional="rotary", attn_types=["local", "global"] * 2, window_size=3, nope_layers=[1]),
        dict(positional="shortformer"),
        dict(positional="rotary", qk_norm="all_heads", nope_layers=[2]),  # block 2's keys: no hook gives them
    ],
    ids=["learned", "gqa-qk-norm", "local-nope", "shortformer", "nope-qk-norm"],
)
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_runs_that_write_at_the_read_positions_carry_them_alone_and_equal_hooked_runs(arch, padding):
    """A run whose interventions write at or after each prompt's read position only is carried at the
    read positions from the block after its last one, attending to the target run's keys and values
    (`engine._narrow_after`); each run equals its hooked forward pass, at an int and at per-prompt
    read positions, with a base made in every run, and the target run itself; an `AnswerMetric` is
    given the logits at the read positions only."""
    torch.manual_seed(0)
    model = interp.HookedTransformer(tiny_config(n_layers=4, d_mlp=40, **arch)).eval()
    batch, n_pos = 5, 9
    tokens = torch.randint(1, model.cfg.d_vocab, (batch, n_pos))
    real = torch.ones(batch, n_pos, dtype=torch.long)
    for row, pad in enumerate([0, 2, 1, 3, 0] if padding != "none" else []):
        real[row, :pad] = 0 if padding == "left" else 1
        real[row, n_pos - pad :] = 0 if padding == "right" else 1
    tokens = record_padding(tokens.masked_fill(real == 0, 0), real) if padding != "none" else tokens
    last = n_pos - 1 - (n_pos - real.sum(-1)) if padding == "right" else torch.full((batch,), n_pos - 1)
    source = torch.randn(batch, n_pos, model.cfg.n_heads, model.cfg.d_head)
    shift = torch.randn(model.cfg.d_model)
    z = lambda layer, heads, pos: engine.Intervention(  # noqa: E731
        engine.Site(interp.act_name("z", layer), head=heads, pos=pos), {interp.act_name("z", layer): source}
    )
    add = lambda layer, pos: engine.Intervention(  # noqa: E731
        engine.Site(interp.act_name("resid_pre", layer), pos=pos), lambda act: act + shift
    )
    base = [engine.Intervention(engine.Site(interp.act_name("z", 0), head=[1]), torch.zeros(()))]
    embedded = []  # passes from the embeddings: a run of the target (a shortformer's positions too)

    def count(activation: torch.Tensor, hook) -> None:
        embedded.append(1)

    for logit_pos in [-1, last] if padding != "right" else [last]:
        runs = [
            [z(1, [0, 2], logit_pos)],
            [z(0, [1], logit_pos), z(2, None, logit_pos)],
            [add(3, logit_pos)],
            [add(1, logit_pos), z(1, [3], logit_pos)],
            [z(1, [0], 2)],  # before the read positions: carried whole
            [],
        ]
        function = functools.partial(
            metrics.logit_diff, correct=tokens[:, 0], incorrect=tokens[:, 1], pos=logit_pos
        )
        answer = metrics.prob_metric(tokens[:, 2], pos=logit_pos)  # given the logits at logit_pos only
        assert [engine._reads_logit_pos_only(m, logit_pos, tokens) for m in (function, answer)] == [
            False,
            True,
        ]
        narrowed = engine._Narrowed.of(logit_pos, tokens)
        hooked = [False] * (model.cfg.n_layers + 1)
        after = [engine._narrow_after(model, run, base, hooked, narrowed) for run in runs]
        no_key_hook = arch.get("nope_layers") == [2] and arch.get("qk_norm") == "all_heads"
        assert after == ([4, 3, 4, 4, 4, 4] if no_key_hook else [2, 3, 4, 2, 4, 4])
        for options, metric in itertools.product(
            (RunOptions(logit_pos=logit_pos), RunOptions(logit_pos=logit_pos, base=base)), (function, answer)
        ):
            embedded.clear()
            _, target = engine.cached_run(model, tokens, engine.start_names(model), base=options.base)
            with model.hooks(fwd_hooks=[("hook_embed", count)]):
                got = engine.run_site_sets(model, tokens, runs, None, metric, target=target, options=options)
            from_resid = len(embedded)
            names = engine.start_names(model, keys_values=True)  # the keys and values cached too
            _, target = engine.cached_run(model, tokens, names, base=options.base)
            with model.hooks(fwd_hooks=[("hook_embed", count)]):
                again = engine.run_site_sets(
                    model, tokens, runs, None, metric, target=target, options=options
                )
            assert torch.equal(again, got) and len(embedded) - from_resid == from_resid - 1  # no target run
            for run, value in zip(runs, got, strict=True):
                hooks = engine.intervention_hooks([*options.base, *run])
                expected = metric(model.run_with_hooks(tokens, fwd_hooks=hooks)).detach()
                torch.testing.assert_close(value, expected, atol=1e-5, rtol=0)
