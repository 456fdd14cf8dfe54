"""Activation, path and attribution patching on small random models (and TransformerLens as reference)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from conftest import tiny_config

import interp
from interp import metrics, patching
from interp.interventions import engine
from interp.interventions.ablation import Ablation, ablation_interventions
from interp.interventions.engine import RunOptions, Site
from interp.interventions.path_patching import PathPatcher, path_patching
from interp.tasks.ioi import ioi_dataset_for

BATCH, POS = 3, 7


@pytest.fixture(scope="module")
def model() -> interp.HookedTransformer:
    """Rotary, RMSNorm, gated MLPs and grouped-query attention: the SmolLM2 features, tiny."""
    torch.manual_seed(0)
    cfg = tiny_config(
        n_layers=3,
        n_kv_heads=2,
        normalization="rmsnorm",
        positional="rotary",
        activation="silu",
        gated_mlp=True,
    )
    return interp.HookedTransformer(cfg).eval()


@pytest.fixture(scope="module")
def prompts(model):
    generator = torch.Generator().manual_seed(1)
    clean = torch.randint(model.cfg.d_vocab, (BATCH, POS), generator=generator)
    corrupted = clean.clone()
    corrupted[:, 1:3] = torch.randint(model.cfg.d_vocab, (BATCH, 2), generator=generator)
    end = torch.tensor([6, 4, 5])
    metric = lambda logits: metrics.logit_diff(logits, clean[:, 0], clean[:, 1], pos=end)  # noqa: E731
    return clean, corrupted, end, metric


@pytest.mark.parametrize("component", patching.COMPONENTS)
def test_patching_activations_both_runs_share_changes_nothing(model, prompts, component):
    """Position 0 comes before the corrupted tokens (1 and 2), so both runs agree there (patching a
    run into itself is refused: every normalised value would be 0/0)."""
    clean, corrupted, _, metric = prompts
    for positions in ([0], {"FIRST": torch.zeros(BATCH, dtype=torch.long)}):
        result = patching.activation_patching(model, clean, corrupted, metric, component, positions=positions)
        torch.testing.assert_close(result.values, result.target.expand_as(result.values), atol=1e-5, rtol=0)


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_patching_the_whole_residual_stream_reproduces_the_source_run(model, prompts, direction):
    clean, corrupted, _, metric = prompts
    for component in ("resid_pre", "resid_mid", "resid_post"):
        result = patching.activation_patching(model, clean, corrupted, metric, component, direction=direction)
        torch.testing.assert_close(result.values, result.source.expand_as(result.values), atol=1e-5, rtol=0)
    assert not torch.allclose(result.source, result.target, atol=1e-3)  # the patch did something
    every_layer = [Site(interp.act_name("resid_pre", layer)) for layer in range(model.cfg.n_layers)]
    both = patching.patch_sites(model, clean, corrupted, metric, [every_layer], direction=direction)
    torch.testing.assert_close(both.values[0], both.source, atol=1e-5, rtol=0)


def test_batched_runs_started_mid_model_equal_separate_full_runs(model, prompts):
    clean, corrupted, end, metric = prompts
    batched = patching.activation_patching(
        model, clean, corrupted, metric, "z", positions=[1, 5], options=RunOptions(batch_size=11)
    )
    single = patching.activation_patching(
        model, clean, corrupted, metric, "z", positions=[1, 5], options=RunOptions(batch_size=1)
    )
    torch.testing.assert_close(batched.values, single.values, atol=1e-5, rtol=0)
    # The generic engine without cached residual streams runs every copy from the embeddings.
    _, sources = model.run_with_cache(clean, names_filter=lambda name: name.endswith("hook_z"))
    site_sets = [[Site(interp.act_name("z", layer), head=1, pos=end)] for layer in range(model.cfg.n_layers)]
    full = engine.run_site_sets(model, corrupted, site_sets, sources.cache_dict, metric)
    mid = patching.patch_sites(model, clean, corrupted, metric, site_sets)
    torch.testing.assert_close(full, mid.values, atol=1e-5, rtol=0)


def test_runs_sharing_a_prefix_equal_runs_computed_alone(model, prompts):
    """Sets that patch the same sites in early blocks share those blocks' computation; each result
    must still equal that set's own forward pass with hand-written hooks (embeddings and final
    norm patched too, so every segment is exercised)."""
    clean, corrupted, end, metric = prompts
    names = lambda name: name.endswith(("hook_z", "hook_embed", "ln_final.hook_normalized"))  # noqa: E731
    _, source = model.run_with_cache(clean, names_filter=names)
    early = [Site(interp.act_name("z", 0), head=[0, 2]), Site(interp.act_name("z", 1), head=1, pos=end)]
    site_sets = [
        early,
        early + [Site(interp.act_name("z", 2), head=3)],
        early + [Site(interp.act_name("z", 2), head=0)],
        early[:1] + [Site(interp.act_name("z", 2), head=0)],
        [Site("hook_embed", pos=2)] + early,
        early + [Site("ln_final.hook_normalized", pos=end)],
        [],
    ]
    _, target = engine.cached_run(model, corrupted, engine.start_names(model))
    for start in (target, None):
        shared = engine.run_site_sets(
            model, corrupted, site_sets, source.cache_dict, metric, target=start,
            options=RunOptions(batch_size=3),
        )  # fmt: skip
        for sites, value in zip(site_sets, shared, strict=True):
            hooks = [
                (site.name, lambda act, hook, site=site: torch.where(
                    engine.site_mask(site, act.shape), source[site.name], act))
                for site in sites
            ]  # fmt: skip
            expected = metric(model.run_with_hooks(corrupted, fwd_hooks=hooks))
            torch.testing.assert_close(value, expected, atol=1e-5, rtol=0)
    assert not torch.allclose(shared[1], shared[2], atol=1e-4)  # the sets do differ


def test_interventions_from_every_kind_of_source_equal_hand_written_hooks(model, prompts):
    """One run may mix sources (a cached run, a tensor, a function of the activation) and hooks that
    need a setting (hook_result, q_input): each run equals its forward pass with hand-written hooks,
    started mid-model or not, and later interventions overwrite earlier ones where they overlap."""
    clean, corrupted, end, metric = prompts
    z1, result0, q2 = interp.act_name("z", 1), interp.act_name("result", 0), interp.act_name("q_input", 2)
    with model.settings(use_attn_result=True):
        _, source = engine.cached_run(model, clean, [z1, result0])
    double = lambda act: 2 * act  # noqa: E731
    steer = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(2))
    runs = [
        [engine.Intervention(Site(z1), source), engine.Intervention(Site(z1, head=[0, 3]), torch.zeros(()))],
        [engine.Intervention(Site(result0, head=2, pos=end), double)],
        [Site(z1, head=1), engine.Intervention(Site(q2, head=0, pos=2), steer)],
        [],
    ]
    _, target = engine.cached_run(model, corrupted, engine.start_names(model))
    for start in (target, None):
        values = engine.run_site_sets(
            model, corrupted, runs, source, metric, target=start, options=RunOptions(batch_size=2)
        )
        for run, value in zip(runs, values, strict=True):
            hooks = []
            for entry in run:
                iv = entry if isinstance(entry, engine.Intervention) else engine.Intervention(entry, source)
                hooks.append((iv.site.name, lambda act, hook, iv=iv: torch.where(
                    engine.site_mask(iv.site, act.shape), iv.values(act), act)))  # fmt: skip
            with model.settings(use_attn_result=True, use_split_qkv_input=True):
                expected = metric(model.run_with_hooks(corrupted, fwd_hooks=hooks))
            torch.testing.assert_close(value, expected, atol=1e-5, rtol=0)
    assert len({round(float(v.mean()), 4) for v in values}) == len(runs)  # every run changed something
    assert not model.hook_settings.use_attn_result and not model.hook_settings.use_split_qkv_input
    with pytest.raises(ValueError, match="bare Site needs `sources`"):
        engine.run_site_sets(model, corrupted, [[Site(z1)]], None, metric)
    with pytest.raises(ValueError, match=r"no source values for \['blocks.2.attn.hook_z'\]"):
        engine.run_site_sets(model, corrupted, [[Site(interp.act_name("z", 2))]], source, metric)


def test_read_site_sets_reads_each_runs_activations_and_the_targets_where_unchanged(model, prompts):
    clean, corrupted, end, metric = prompts
    z0, pattern1, resid_final = (
        interp.act_name("z", 0),
        interp.act_name("pattern", 1),
        "blocks.2.hook_resid_post",
    )
    _, source = engine.cached_run(model, clean, [z0, interp.act_name("z", 2)])
    _, target = engine.cached_run(model, corrupted, engine.start_names(model) + [pattern1])
    runs = [[], [Site(z0, head=1)], [Site(interp.act_name("z", 2), pos=end)]]
    reads = engine.read_site_sets(
        model, corrupted, runs, [pattern1, resid_final], dict, source, target=target,
        options=RunOptions(batch_size=2),
    )  # fmt: skip
    assert reads[0][pattern1] is target[pattern1]  # the target run is read from its cache
    assert reads[2][pattern1] is target[pattern1]  # block 1 is unchanged when only block 2 is patched
    for run, read in zip(runs, reads, strict=True):
        hooks = [(site.name, lambda act, hook, site=site: torch.where(
            engine.site_mask(site, act.shape), source[site.name], act)) for site in run]  # fmt: skip
        with model.hooks(fwd_hooks=hooks):
            _, cache = model.run_with_cache(corrupted, names_filter=[pattern1, resid_final])
        for name in (pattern1, resid_final):
            torch.testing.assert_close(read[name], cache[name], atol=1e-5, rtol=0)
    assert not torch.allclose(reads[1][pattern1], reads[0][pattern1], atol=1e-4)
    with pytest.raises(ValueError, match="fire after the last hook read"):
        engine.read_site_sets(model, corrupted, runs, [pattern1], dict, source, target=target)
    with pytest.raises(ValueError, match="target cache lacks"):
        engine.read_site_sets(model, corrupted, [[]], [pattern1], dict, source, target={})


def test_patch_one_head_equals_the_sweep_and_a_hand_written_hook(model, prompts):
    clean, corrupted, end, metric = prompts
    patched = interp.patch(model, clean, metric, head=(1, 2), source=corrupted, pos=end)
    sweep = patching.activation_patching(
        model, clean, corrupted, metric, "z", positions={"END": end}, layers=[1], direction="noise"
    )
    torch.testing.assert_close(patched, sweep.per_example()[0, 2, 0], atol=1e-5, rtol=0)
    _, cache = model.run_with_cache(corrupted, names_filter=interp.act_name("z", 1))
    site = Site(interp.act_name("z", 1), head=2, pos=end)
    hook = lambda act, hook: torch.where(engine.site_mask(site, act.shape), cache[hook.name], act)  # noqa: E731
    expected = metric(model.run_with_hooks(clean, fwd_hooks=[(site.name, hook)]))
    torch.testing.assert_close(patched, expected, atol=1e-5, rtol=0)
    zeroed = interp.patch(
        model, clean, metric, site=Site(interp.act_name("mlp_out", 0)), source=torch.zeros(())
    )
    with model.hooks(fwd_hooks=[(interp.act_name("mlp_out", 0), lambda act, hook: torch.zeros_like(act))]):
        torch.testing.assert_close(zeroed, metric(model(clean)), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="exactly one of head"):
        interp.patch(model, clean, metric, source=corrupted)
    with pytest.raises(ValueError, match="same"):
        interp.patch(model, clean, metric, head=(0, 0), source=corrupted[:2])
    with pytest.raises(ValueError, match="out of range"):
        interp.patch(model, clean, metric, head=(5, 0), source=corrupted)


def test_per_prompt_positions_match_a_hand_written_hook(model, prompts):
    clean, corrupted, end, metric = prompts
    _, clean_cache = model.run_with_cache(clean)
    rows = torch.arange(BATCH)

    def patch_head(z, hook):
        z = z.clone()
        z[rows, end, 2] = clean_cache["z", 1][rows, end, 2]
        return z

    expected = metric(model.run_with_hooks(corrupted, fwd_hooks=[(interp.act_name("z", 1), patch_head)]))
    result = patching.activation_patching(model, clean, corrupted, metric, "z", positions={"END": end})
    assert result.dims == ("layer", "head", "position") and result.coords["position"] == ["END"]
    torch.testing.assert_close(result.per_example()[1, 2, 0], expected.detach(), atol=1e-5, rtol=0)


def test_results_as_labelled_tensor_and_tidy_frames(model, prompts):
    clean, corrupted, end, metric = prompts
    result = patching.activation_patching(
        model, clean, corrupted, metric, "attn_out", positions={"S": end - 2, "END": end}
    )
    result = dataclasses.replace(result, metric_name="logit diff")
    assert result.mean().shape == (model.cfg.n_layers, 2)
    frame = result.to_dataframe()
    assert list(frame.columns) == ["component", "layer", "head", "position", "metric", "example", "value"]
    assert len(frame) == model.cfg.n_layers * 2 * BATCH
    row = frame[(frame.layer == 1) & (frame.position == "END") & (frame.example == 2)]
    assert row.value.item() == pytest.approx(result.per_example()[1, 1, 2].item())
    summary = result.summary(n_boot=200)
    assert (summary.ci_low <= summary["mean"] + 1e-6).all() and (
        summary["mean"] <= summary.ci_high + 1e-6
    ).all()
    assert summary["mean"].to_numpy() == pytest.approx(result.mean().reshape(-1).numpy())


def test_logits_only_at_the_metric_positions_give_the_same_results(model, prompts):
    clean, corrupted, end, metric = prompts
    for run in (
        lambda **kw: patching.activation_patching(model, clean, corrupted, metric, "z", **kw),
        lambda **kw: path_patching(model, clean, corrupted, metric, [(2, 0, "q")], **kw),
        lambda **kw: patching.attribution_patching(model, clean, corrupted, metric, "mlp_out", **kw),
    ):
        full, reduced = run(), run(options=RunOptions(logit_pos=end))
        torch.testing.assert_close(reduced.values, full.values, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="outside logit_pos"):
        patching.activation_patching(model, clean, corrupted, metric, "z", options=RunOptions(logit_pos=0))
    with pytest.raises(ValueError, match="logit_pos"):
        patching.activation_patching(
            model, clean, corrupted, metric, "z", options=RunOptions(logit_pos=end[:2])
        )


def test_logits_only_of_the_metric_tokens_give_the_same_results(model, prompts):
    """logit_tokens: only the answers' logits are computed; a metric reading others fails loudly."""
    clean, corrupted, end, metric = prompts
    answers = clean[:, :2]  # the metric's logit(clean[:, 0]) - logit(clean[:, 1])
    patcher = PathPatcher(model, clean, corrupted, RunOptions(logit_pos=end))
    reading_answers = PathPatcher(model, clean, corrupted, RunOptions(logit_pos=end, logit_tokens=answers))
    full = patcher(metric, [(2, 0, "q")], receiver_pos=end)
    reduced = reading_answers(metric, [(2, 0, "q")], receiver_pos=end)
    torch.testing.assert_close(reduced.values, full.values, atol=1e-5, rtol=0)
    direct = path_patching(
        model, clean, corrupted, metric, options=RunOptions(logit_pos=end, logit_tokens=answers)
    )
    torch.testing.assert_close(direct.values, patcher(metric).values, atol=1e-5, rtol=0)
    _, cache = engine.cached_run(model, clean, [interp.act_name("z", 1)])
    sets = [[engine.Site(interp.act_name("z", 1), head=h)] for h in range(model.cfg.n_heads)] + [[]]
    run = lambda **kw: engine.run_site_sets(  # noqa: E731
        model, corrupted, sets, cache, metric, options=RunOptions(logit_pos=end, **kw)
    )
    torch.testing.assert_close(run(logit_tokens=answers), run(), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="outside logit_pos or logit_tokens"):
        run(logit_tokens=clean[:, :1])
    with pytest.raises(ValueError, match=r"logit_tokens must lie in \[0, 61\)"):
        run(logit_tokens=torch.tensor([61]))


def test_run_options_a_function_does_not_read_are_refused_and_old_keywords_named(model, prompts):
    clean, corrupted, end, metric = prompts
    options = RunOptions(logit_pos=end, logit_tokens=clean[:, :2])
    with pytest.raises(TypeError, match="read_site_sets does not read RunOptions' logit_pos, logit_tokens"):
        engine.read_site_sets(model, corrupted, [[]], ["blocks.0.hook_resid_pre"], dict, options=options)
    with pytest.raises(TypeError, match=r"run_site_sets takes logit_pos in options=RunOptions\(logit_pos="):
        engine.run_site_sets(model, corrupted, [[]], None, metric, logit_pos=end)
    with pytest.raises(TypeError, match=r"path_patching takes batch_size, progress in options=RunOptions\("):
        path_patching(model, clean, corrupted, metric, [(1, 0)], [(0, 0)], batch_size=2, progress=print)
    ablated = RunOptions(base=_ablated_heads(model, corrupted))
    with pytest.raises(TypeError, match="activation_patching does not read RunOptions' base"):
        patching.activation_patching(model, clean, corrupted, metric, "z", options=ablated)
    with pytest.raises(TypeError, match="attribution_patching does not read RunOptions' batch_size"):
        patching.attribution_patching(model, clean, corrupted, metric, "z", options=RunOptions(batch_size=2))
    with pytest.raises(
        TypeError, match=r"fourth argument is its RunOptions, got Tensor: pass RunOptions\(logit_pos="
    ):
        PathPatcher(model, clean, corrupted, end)  # the old positional logit_pos
    with pytest.raises(TypeError, match="PathPatcher does not read RunOptions' progress"):
        PathPatcher(model, clean, corrupted, RunOptions(progress=lambda *_: None))
    with pytest.raises(TypeError, match=r"no metric_name: .* dataclasses.replace\(result, metric_name=...\)"):
        patching.activation_patching(model, clean, corrupted, metric, "z", metric_name="m")
    with pytest.raises(ValueError, match="RunOptions.batch_size must be an integer >= 1, got 0"):
        RunOptions(batch_size=0)
    with pytest.raises(TypeError, match="RunOptions.base must be a list of Interventions, got Intervention"):
        RunOptions(base=ablated.base[0])


# --- TransformerLens as the reference ---------------------------------------------------------


@pytest.fixture(scope="module")
def bridge_and_model():
    """A random transformers Llama (GQA) as a TransformerBridge and as our model, same weights."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformer_lens.model_bridge import TransformerBridge

    torch.manual_seed(0)
    vocab = 97
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, vocab_size=vocab, max_position_embeddings=64,
    )  # fmt: skip
    hf_model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    ours = interp.from_hf(hf_model)  # before the bridge wraps hf_model's modules
    word_level = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_level, unk_token="t0", pad_token="t0"
    )
    bridge = TransformerBridge.boot_transformers("random-llama", hf_model=hf_model, tokenizer=tokenizer)
    return bridge, ours


@pytest.mark.parametrize(
    ("tl_function", "component", "positions", "direction"),
    [
        ("get_act_patch_attn_head_out_all_pos", "z", None, "denoise"),
        ("get_act_patch_attn_head_out_all_pos", "z", None, "noise"),
        ("get_act_patch_resid_pre", "resid_pre", "each", "denoise"),
        ("get_act_patch_mlp_out", "mlp_out", "each", "noise"),
        ("get_act_patch_attn_head_v_by_pos", "v", "each", "denoise"),
        ("get_act_patch_attn_head_q_all_pos", "q", None, "denoise"),
        ("get_act_patch_attn_head_pattern_all_pos", "pattern", None, "denoise"),
    ],
)
def test_equals_transformer_lens_patching(bridge_and_model, tl_function, component, positions, direction):
    import transformer_lens.patching as tl_patching

    bridge, ours = bridge_and_model
    generator = torch.Generator().manual_seed(2)
    clean = torch.randint(3, 97, (BATCH, POS), generator=generator)
    corrupted = clean.clone()
    corrupted[:, 2] = torch.randint(3, 97, (BATCH,), generator=generator)
    metric = lambda logits: metrics.logit_diff(logits, clean[:, 0], clean[:, 3])  # noqa: E731
    source, target = (clean, corrupted) if direction == "denoise" else (corrupted, clean)
    _, source_cache = bridge.run_with_cache(source)
    expected = getattr(tl_patching, tl_function)(bridge, target, source_cache, lambda lg: metric(lg).mean())
    result = patching.activation_patching(
        ours, clean, corrupted, metric, component, positions, direction=direction
    )
    got = result.mean()
    if positions is None:
        got = got[..., 0]  # [layer, head] (the single "all" position)
    elif got.ndim == 3:
        got = got.transpose(1, 2)  # TransformerLens: [layer, pos, head]
    torch.testing.assert_close(got, expected.float().cpu(), atol=1e-4, rtol=0)


# --- path patching ----------------------------------------------------------------------------


def _naive_path_patch(model, clean, corrupted, metric, sender, receivers, receiver_pos):
    """Wang et al.'s three runs written directly with hooks, one full forward each (MLPs recomputed)."""
    names = lambda name: name.endswith(("hook_z", "hook_resid_pre"))  # noqa: E731
    _, clean_cache = model.run_with_cache(clean, names_filter=names)
    _, corrupted_cache = model.run_with_cache(corrupted, names_filter=names)

    def freeze(z, hook):
        z = clean_cache[hook.name].clone()
        if hook.layer() == sender[0]:
            z[:, :, sender[1]] = corrupted_cache[hook.name][:, :, sender[1]]
        return z

    recorded = {}

    def record(resid, hook):
        recorded[hook.layer()] = resid.clone()

    fwd = [(interp.act_name("z", layer), freeze) for layer in range(model.cfg.n_layers)]
    fwd += [(interp.act_name("resid_pre", layer), record) for layer, _, _ in receivers]
    model.run_with_hooks(clean, fwd_hooks=fwd)
    rows = torch.arange(clean.shape[0])

    def patch_input(letter, layer, head):
        def hook(x, hook):
            x = x.clone()
            index = head if letter == "q" else head // model.cfg.group_size
            x[rows, receiver_pos, index] = recorded[layer][rows, receiver_pos]
            return x

        return hook

    fwd = [
        (interp.act_name(f"{letter}_input", layer), patch_input(letter, layer, head))
        for layer, head, inputs in receivers
        for letter in inputs
    ]
    with model.settings(use_split_qkv_input=True):
        return metric(model.run_with_hooks(clean, fwd_hooks=fwd)).detach()


def test_path_patching_equals_the_three_runs_written_out(model, prompts):
    clean, corrupted, end, metric = prompts
    receivers = [(2, 1, "qk"), (2, 3, "v"), (1, 0, "q")]
    result = path_patching(model, clean, corrupted, metric, receivers, receiver_pos=end)
    assert result.dims == ("layer", "head") and result.mean().shape == (2, model.cfg.n_heads)
    for layer, head in [(0, 0), (0, 3), (1, 2)]:
        expected = _naive_path_patch(model, clean, corrupted, metric, (layer, head), receivers, end)
        torch.testing.assert_close(result.per_example()[layer, head], expected, atol=1e-5, rtol=0)
    assert not torch.allclose(result.values, result.target.expand_as(result.values), atol=1e-4)


def test_path_patching_to_the_logits_of_an_attention_only_model_is_the_direct_effect(prompts):
    clean, corrupted, _, metric = prompts
    torch.manual_seed(3)
    model = interp.HookedTransformer(tiny_config(n_layers=2, attn_only=True)).eval()
    _, clean_cache = model.run_with_cache(clean)
    _, corrupted_cache = model.run_with_cache(corrupted)
    result = path_patching(model, clean, corrupted, metric, "logits")
    for layer, head in [(0, 1), (1, 3)]:
        delta = corrupted_cache["z", layer][:, :, head] - clean_cache["z", layer][:, :, head]
        resid = clean_cache["resid_post", 1] + delta @ model.blocks[layer].attn.W_O[head]
        expected = metric(model.unembed(model.ln_final(resid))).detach()
        torch.testing.assert_close(result.per_example()[layer, head], expected, atol=1e-5, rtol=0)


def test_path_patching_without_senders_or_with_late_senders_is_the_identity(model, prompts):
    clean, corrupted, end, metric = prompts
    for receivers in ("logits", [(1, 2, "qkv")]):
        result = path_patching(
            model, clean, corrupted, metric, receivers, senders=[[], (2, 0), (1, 3)], receiver_pos=end
        )
        torch.testing.assert_close(result.values[0], result.target, atol=1e-5, rtol=0)
    torch.testing.assert_close(result.values[1:], result.target.expand(2, BATCH), atol=1e-5, rtol=0)


def test_path_patching_sender_sets_and_mlp_senders(model, prompts):
    clean, corrupted, _, metric = prompts
    together = path_patching(model, clean, corrupted, metric, senders=[[(0, 1), (1, 2)], [(0, "mlp")]])
    assert together.coords["patch"] == ["L0H1 + L1H2", "MLP0"]
    frozen = path_patching(model, clean, corrupted, metric, senders=[(0, 1)], freeze_mlps=True)
    recomputed = path_patching(model, clean, corrupted, metric, senders=[(0, 1)])
    assert not torch.allclose(frozen.values, recomputed.values, atol=1e-6)  # the MLPs carry some of the path


# --- attribution patching ---------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_attribution_patching_is_exact_when_the_metric_is_linear_in_the_activation(prompts, direction):
    """One attention-only layer with norms made linear (a huge epsilon makes the RMS scale constant):
    the logits are then linear in z, v (the pattern does not depend on v), attn_out and resid_post."""
    clean, corrupted, end, _ = prompts
    torch.manual_seed(4)
    cfg = tiny_config(n_layers=1, attn_only=True, normalization="rmsnorm", norm_eps=1e6, positional="rotary")
    model = interp.HookedTransformer(cfg).double().eval()
    metric = lambda logits: 1e3 * metrics.logit_diff(logits, clean[:, 0], clean[:, 1], pos=end)  # noqa: E731
    for component in ("z", "v", "attn_out", "resid_post"):
        for positions in (None, "each"):
            kwargs = dict(component=component, positions=positions, direction=direction)
            exact = patching.activation_patching(model, clean, corrupted, metric, **kwargs)
            attribution = patching.attribution_patching(model, clean, corrupted, metric, **kwargs)
            assert exact.values.std() > 1e-3  # there is an effect to estimate
            torch.testing.assert_close(
                attribution.values.double(), exact.values.double(), atol=1e-4, rtol=1e-4
            )


def test_attribution_patching_correlates_with_exact_patching(model, prompts):
    clean, corrupted, end, metric = prompts
    frame = patching.attribution_vs_exact(model, clean, corrupted, metric, "z", positions={"END": end})
    assert list(frame.columns[-2:]) == ["exact", "attribution"]
    assert len(frame) == model.cfg.n_layers * model.cfg.n_heads
    assert 0.5 < frame.attrs["correlation"] <= 1.0


# --- bad input --------------------------------------------------------------------------------


def test_bad_input_raises_clear_errors(model, prompts):
    clean, corrupted, end, metric = prompts
    with pytest.raises(ValueError, match="same"):
        patching.activation_patching(model, clean, corrupted[:, :-1], metric)
    with pytest.raises(ValueError, match="same"):
        path_patching(model, clean, corrupted[:2], metric)
    with pytest.raises(ValueError, match="out of range"):
        patching.activation_patching(model, clean, corrupted, metric, "z", positions=[POS])
    with pytest.raises(ValueError, match="out of range for prompts of 7"):
        patching.activation_patching(model, clean, corrupted, metric, "z", positions={"END": end + 2})
    with pytest.raises(ValueError, match=r"\[batch=3\]"):
        patching.activation_patching(model, clean, corrupted, metric, "z", positions={"END": end[:2]})
    with pytest.raises(ValueError, match="unknown component"):
        patching.activation_patching(model, clean, corrupted, metric, "mlp_in")
    with pytest.raises(ValueError, match="unknown activation"):
        patching.patch_sites(model, clean, corrupted, metric, [Site("blocks.0.hook_mlp")])
    with pytest.raises(ValueError, match="no head axis"):
        patching.patch_sites(model, clean, corrupted, metric, [Site("blocks.0.hook_resid_pre", head=1)])
    with pytest.raises(ValueError, match="head"):
        patching.patch_sites(model, clean, corrupted, metric, [Site("blocks.0.attn.hook_z", head=9)])
    with pytest.raises(ValueError, match="direction"):
        patching.activation_patching(model, clean, corrupted, metric, direction="both")
    with pytest.raises(ValueError, match="one value per prompt"):
        patching.activation_patching(model, clean, corrupted, lambda logits: metric(logits).mean())
    with pytest.raises(ValueError, match="receiver"):
        path_patching(model, clean, corrupted, metric, receivers=[(1, 0, "x")])
    with pytest.raises(ValueError, match="sender"):
        path_patching(model, clean, corrupted, metric, senders=[(0, 7)])
    with pytest.raises(ValueError, match="attention-only"):
        attn_only = interp.HookedTransformer(tiny_config(attn_only=True))
        patching.activation_patching(attn_only, clean, corrupted, metric, "mlp_out")


def test_path_patching_under_the_callers_z_hooks_equals_the_runs_written_out(model, prompts):
    """A caller's hook on z (here not idempotent) runs before the frozen values overwrite z."""
    clean, corrupted, end, metric = prompts
    receivers = [(2, 1, "qk")]
    with model.hooks(fwd_hooks=[(interp.act_name("z", 1), lambda z, hook: 2 * z)]):
        result = path_patching(model, clean, corrupted, metric, receivers, receiver_pos=end)
        for sender in [(0, 3), (1, 2)]:
            expected = _naive_path_patch(model, clean, corrupted, metric, sender, receivers, end)
            torch.testing.assert_close(result.per_example()[sender], expected, atol=1e-5, rtol=0)


def test_a_path_patcher_reuses_its_runs_and_refuses_other_hooks(model, prompts):
    clean, corrupted, end, metric = prompts
    patcher = PathPatcher(model, clean, corrupted, RunOptions(logit_pos=end))
    for receivers in ("logits", [(2, 1, "qk"), (1, 0, "v")]):
        expected = path_patching(
            model, clean, corrupted, metric, receivers, receiver_pos=end, options=RunOptions(logit_pos=end)
        )
        got = patcher(metric, receivers, receiver_pos=end)
        torch.testing.assert_close(got.values, expected.values, atol=0, rtol=0)
    with model.hooks(fwd_hooks=[(interp.act_name("z", 0), lambda z, hook: z)]):
        assert not patcher.is_current()
        with pytest.raises(ValueError, match="hooks or weights changed"):
            patcher(metric)
    assert patcher.is_current()


@pytest.mark.parametrize("replace", ["load_state_dict(assign=True)", "param.data"])
def test_a_path_patcher_refuses_weights_replaced_without_an_in_place_op(replace):
    """Weights replaced by new tensors (not written in place, so their versions stay as they were)
    are other weights: the patcher's cached runs are of the old ones, and reusing it mixed them with
    the new ones (effects up to 22 off where they reach 56, on toy IOI) instead of refusing."""
    model = interp.load_model("toy-ioi")
    clean, abc, _ = ioi_dataset_for(model, 8, 0)
    patcher = PathPatcher(model, clean.tokens, abc.tokens)
    if replace == "param.data":
        for parameter in model.parameters():
            parameter.data = 1.5 * parameter.data
    else:
        model.load_state_dict({name: 1.5 * value for name, value in model.state_dict().items()}, assign=True)
    assert not patcher.is_current()
    with pytest.raises(ValueError, match="hooks or weights changed"):
        patcher(clean.logit_diff)


@pytest.mark.parametrize("columns", [None, torch.tensor([1, 3])])
def test_the_logit_buffer_holds_one_copy_of_the_batch_at_a_time(columns):
    """A pass of 3 stacked copies of a 2-prompt batch: each copy's logits in turn, in one reused
    [batch, pos, d_vocab] tensor, NaN except where that copy's logits were written."""
    n_copies, batch, n_pos, d_vocab = 3, 2, 4, 5
    k = d_vocab if columns is None else len(columns)
    picked = torch.arange(n_copies * batch * k, dtype=torch.float32).reshape(n_copies * batch, k)
    pos = torch.tensor([3, 1] * n_copies)
    storages = set()
    buffer = engine.LogitBuffer(columns)
    for _ in range(2):  # a second pass reuses the tensor and leaves no value of the first
        copies = buffer.copies(picked, pos, n_pos, batch, d_vocab)
        for i, logits in enumerate(copies):
            expected = torch.full((batch, n_pos, d_vocab), float("nan"))
            rows = picked[i * batch : (i + 1) * batch]
            for row in range(batch):
                if columns is None:
                    expected[row, pos[row]] = rows[row]
                else:
                    expected[row, pos[row], columns] = rows[row]
            torch.testing.assert_close(logits, expected, equal_nan=True)
            storages.add(logits.data_ptr())
        assert i == n_copies - 1
    assert len(storages) == 1


# --- base interventions -----------------------------------------------------------------------


def _by_hand(interventions):
    """Hand-written hooks making `interventions` (each overwrites what its site selects)."""
    return [(iv.site.name, lambda act, hook, iv=iv: torch.where(
        engine.site_mask(iv.site, act.shape), iv.values(act), act)) for iv in interventions]  # fmt: skip


def _ablated_heads(model, tokens):
    """Base interventions: head 0.2 zeroed, heads 1.0 and 1.3 set to their mean over `tokens`."""
    z0, z1 = interp.act_name("z", 0), interp.act_name("z", 1)
    _, cache = engine.cached_run(model, tokens, [z1])
    return [
        engine.Intervention(Site(z0, head=2), torch.zeros(())),
        engine.Intervention(Site(z1, head=[0, 3]), cache[z1].mean(0)),
    ]


@pytest.mark.parametrize("kind", ["ablated heads", "steered residual"])
def test_base_interventions_are_made_in_every_run_the_target_included(model, prompts, kind):
    """Runs under base interventions equal forward passes with the base's and the run's own
    interventions written as hooks (the base first), whether runs start from the cached target run
    (cached with the base) or not, and whether they read logits or activations. A base that reads its
    activation (steering: a * 0.5 + 0.1) at a block's input is made once where a run starts from the
    target's cached input to that block (it was made twice: 0.51 off)."""
    clean, corrupted, end, metric = prompts
    steer = engine.Intervention(Site("blocks.1.hook_resid_pre"), lambda a: a * 0.5 + 0.1)
    base = _ablated_heads(model, corrupted) if kind == "ablated heads" else [steer]
    z1, z2, resid2 = interp.act_name("z", 1), interp.act_name("z", 2), "blocks.2.hook_resid_pre"
    _, source = engine.cached_run(model, clean, [z1, z2])
    runs = [[], [Site(z1, head=0)], [Site(z2, pos=end)], [Site(z1, head=[1, 2]), Site(z2, head=3)]]
    _, target = engine.cached_run(model, corrupted, engine.start_names(model), base=base)
    for start in (target, None):
        options = RunOptions(base=base)
        values = engine.run_site_sets(model, corrupted, runs, source, metric, target=start, options=options)
        reads = engine.read_site_sets(
            model, corrupted, runs, [resid2], dict, source, target=start, options=options
        )
        for run, value, read in zip(runs, values, reads, strict=True):
            hooks = _by_hand(base + [engine.Intervention(site, source) for site in run])
            with model.hooks(fwd_hooks=hooks):
                logits, cache = model.run_with_cache(corrupted, names_filter=[resid2])
            torch.testing.assert_close(value, metric(logits), atol=1e-5, rtol=0)
            torch.testing.assert_close(read[resid2], cache[resid2], atol=1e-5, rtol=0)
    unablated = engine.run_site_sets(model, corrupted, [[]], source, metric)
    assert not torch.allclose(values[0], unablated[0], atol=1e-4)  # the base changes the target run


def test_path_patching_under_base_interventions_equals_the_runs_written_out_under_hooks(model, prompts):
    """The base interventions are made in all three runs of path patching, the clean and corrupted
    runs included: as Wang et al.'s runs written out under the base's hooks (IOI's step 5)."""
    clean, corrupted, end, metric = prompts
    base = _ablated_heads(model, corrupted)
    senders = [(0, 3), (1, 2), (0, 2)]
    for receivers in ([(2, 1, "qk"), (1, 3, "v")], "logits"):
        result = path_patching(
            model, clean, corrupted, metric, receivers, senders, receiver_pos=end,
            options=RunOptions(logit_pos=end, base=base),
        )  # fmt: skip
        with model.hooks(fwd_hooks=_by_hand(base)):
            hooked = path_patching(model, clean, corrupted, metric, receivers, senders, receiver_pos=end)
            if receivers != "logits":
                for sender, value in zip(senders, result.values, strict=True):
                    expected = _naive_path_patch(model, clean, corrupted, metric, sender, receivers, end)
                    torch.testing.assert_close(value, expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(result.values, hooked.values, atol=1e-5, rtol=0)
        torch.testing.assert_close(result.target, hooked.target, atol=1e-5, rtol=0)


def test_intervention_hooks_take_a_batchs_rows_of_per_prompt_values_and_tile_copies(model, prompts):
    clean, corrupted, _, _ = prompts
    z1 = interp.act_name("z", 1)
    _, source = engine.cached_run(model, clean, [z1])
    per_prompt = [engine.Intervention(Site(z1, head=2, pos=torch.tensor([1, 2, 3])), source)]
    with model.hooks(fwd_hooks=_by_hand(per_prompt)):
        expected = model(corrupted)
    rows = torch.tensor([2, 0])
    with torch.no_grad(), engine.intervened(model, per_prompt, rows):
        sub_batch = model(corrupted[rows])
    torch.testing.assert_close(sub_batch, expected[rows], atol=1e-5, rtol=0)
    with torch.no_grad(), engine.intervened(model, per_prompt):
        copies = model(corrupted.repeat(2, 1))
    torch.testing.assert_close(copies, expected.repeat(2, 1, 1), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="not copies of 3 prompts"), engine.intervened(model, per_prompt):
        model(corrupted[:2])


def test_read_with_grad_gives_the_gradient_with_respect_to_an_activation(model, prompts):
    """As the gradient with respect to a leaf tensor written in its place."""
    _, corrupted, _, metric = prompts
    z1 = interp.act_name("z", 1)
    with engine.read_with_grad(model, [z1]) as acts:
        (grad,) = torch.autograd.grad(metric(model(corrupted)).sum(), [acts[z1]])
    _, cache = engine.cached_run(model, corrupted, [z1])
    leaf = cache[z1].clone().requires_grad_(True)
    with torch.enable_grad(), model.hooks(fwd_hooks=[(z1, lambda act, hook: leaf)]):
        (expected,) = torch.autograd.grad(metric(model(corrupted)).sum(), [leaf])
    torch.testing.assert_close(grad, expected, atol=1e-6, rtol=0)
    assert grad.abs().sum() > 0


def test_a_walk_of_many_runs_shows_its_progress_before_they_finish(model, prompts):
    """Runs walked together finish together at the last block: meanwhile the count rises with the blocks
    walked (in runs' worth), never falls, and ends at every run; the values are the same without it."""
    clean, corrupted, end, metric = prompts
    names = [interp.act_name("z", layer) for layer in range(model.cfg.n_layers)]
    _, source = engine.cached_run(model, clean, names)
    sets = [[Site(name, head=head)] for name in names for head in range(2)]
    calls = []
    options = RunOptions(logit_pos=end)
    watched = dataclasses.replace(options, progress=lambda *call: calls.append(call))
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    with model.hooks(fwd_hooks=[(last, lambda act, hook: calls.append(("last block", 0, len(sets))))]):
        values = engine.run_site_sets(model, corrupted, sets, source, metric, options=watched)
    before_last = [done for stage, done, _ in calls[: calls.index(("last block", 0, len(sets)))]]
    assert len([count for count in before_last if 0 < count < len(sets)]) >= 2  # not all at the end
    counts = [done for stage, done, _ in calls if stage == "patched runs"]
    assert all(total == len(sets) for _, _, total in calls) and counts[-1] == len(sets)
    assert counts == sorted(set(counts))  # it never falls
    assert torch.equal(values, engine.run_site_sets(model, corrupted, sets, source, metric, options=options))


def test_patch_takes_a_cache_from_run_with_cache_as_its_source(model, prompts):
    """`interp.patch(..., source=cache)` with the ActivationCache of `run_with_cache`, as its docstring
    offers, equals the same values given as a dict (it raised 'ActivationCache object is not callable')."""
    clean, corrupted, end, metric = prompts
    _, cache = model.run_with_cache(clean, names_filter=[interp.act_name("z", 1)])
    from_cache = interp.patch(model, corrupted, metric, head=(1, 2), source=cache)
    from_dict = interp.patch(model, corrupted, metric, head=(1, 2), source=dict(cache.items()))
    torch.testing.assert_close(from_cache, from_dict)
    assert not torch.allclose(
        from_cache, interp.patch(model, corrupted, metric, head=(1, 2), source=torch.zeros(()))
    )


def test_ungrouped_keys_and_values_are_patched_per_query_heads_copy():
    """With `ungroup_grouped_query_attention` (TransformerLens's one copy of each key and value per
    query head), a k/v sweep has a column per query head, each patching that head's copy, and a path
    patching receiver (layer, h, "k") patches head h's copy: both copies of a group together are the
    grouped run's patch of their key/value head."""
    config = tiny_config(
        n_layers=3, n_kv_heads=2, normalization="rmsnorm", positional="rotary", init_std=0.15
    )
    model = interp.HookedTransformer(config)
    model.init_weights(seed=0)
    generator = torch.Generator().manual_seed(1)
    clean = torch.randint(2, model.cfg.d_vocab, (4, 7), generator=generator)
    corrupted = clean.clone()
    corrupted[:, [1, 2, 4]] = torch.randint(2, model.cfg.d_vocab, (4, 3), generator=generator)
    end = torch.tensor([6, 5, 4, 6])
    metric = lambda logits: metrics.logit_diff(logits, clean[:, 0], clean[:, 3], pos=end)  # noqa: E731
    senders = [[(0, 1)], [(1, 2)]]
    grouped = path_patching(model, clean, corrupted, metric, [(2, 3, "k")], senders)
    with model.settings(ungroup_grouped_query_attention=True):
        both_copies = path_patching(model, clean, corrupted, metric, [(2, 2, "k"), (2, 3, "k")], senders)
        one_copy = path_patching(model, clean, corrupted, metric, [(2, 3, "k")], senders)
        sweep = patching.activation_patching(model, clean, corrupted, metric, "k", layers=[1])
        _, clean_cache = model.run_with_cache(clean, names_filter="blocks.1.attn.hook_k")

        def copy_of_head_2(k, hook):
            k[:, :, 2] = clean_cache[hook.name][:, :, 2]
            return k

        by_hand = metric(
            model.run_with_hooks(corrupted, fwd_hooks=[("blocks.1.attn.hook_k", copy_of_head_2)])
        )
    torch.testing.assert_close(both_copies.values, grouped.values, atol=1e-5, rtol=0)
    assert not torch.allclose(one_copy.values, grouped.values, atol=1e-3)
    assert sweep.index["head"].tolist() == list(range(model.cfg.n_heads))  # [grid entry, prompt]
    torch.testing.assert_close(sweep.values[2], by_hand, atol=1e-5, rtol=0)


def test_a_final_norm_intervention_at_a_position_is_made_there_when_logits_are_read_at_another():
    """Logits made only where the metric reads (logit_pos), even with every block's z overwritten
    (runs carried at the read positions), leave a final-norm intervention at position 0 at position
    0: the last position's logits are those of the run without it."""
    model = interp.HookedTransformer(tiny_config(n_layers=2, init_std=0.15))
    model.init_weights(seed=0)
    tokens = torch.randint(2, model.cfg.d_vocab, (4, 7), generator=torch.Generator().manual_seed(1))
    metric = lambda logits: metrics.logit_diff(logits, tokens[:, 0], tokens[:, 3], pos=-1)  # noqa: E731
    zeroed = [engine.Intervention(Site(interp.act_name("z", layer)), torch.zeros(())) for layer in range(2)]
    steer = engine.Intervention(
        Site("ln_final.hook_normalized", pos=0), torch.full((model.cfg.d_model,), 3.0)
    )
    runs = [
        (zeroed, RunOptions()),
        ([*zeroed, steer], RunOptions()),
        ([*zeroed, steer], RunOptions(logit_pos=-1)),
    ]
    without, with_steer, read_at_last = (
        engine.run_site_sets(model, tokens, [run], None, metric, options=options)[0] for run, options in runs
    )
    torch.testing.assert_close(with_steer, without)
    torch.testing.assert_close(read_at_last, without)


def test_per_prompt_positions_and_a_list_of_positions_are_two_runs_in_one_call(model, prompts):
    """A LongTensor [batch] of positions patches prompt i at its own position, a list patches every
    prompt at all of them: in one call they are two runs with their own values, as when run alone. A
    0-d tensor is the int it holds; a boolean mask, floats or a 2-D tensor are refused by name (cast
    to ints, a mask would select positions 0 and 1)."""
    clean, corrupted, _, metric = prompts
    name = "blocks.0.attn.hook_z"
    per_prompt, as_list = Site(name, pos=torch.tensor([1, 2, 3])), Site(name, pos=[1, 2, 3])
    together = patching.patch_sites(model, clean, corrupted, metric, [per_prompt, as_list]).values
    alone = [
        patching.patch_sites(model, clean, corrupted, metric, [s]).values[0] for s in (per_prompt, as_list)
    ]
    torch.testing.assert_close(together, torch.stack(alone), atol=1e-6, rtol=0)
    assert not torch.allclose(alone[0], alone[1], atol=1e-3)
    for tensor, plain in ((Site(name, pos=torch.tensor(2)), Site(name, pos=2)),
                          (Site(name, head=torch.tensor(1)), Site(name, head=1))):  # fmt: skip
        got, expected = (
            patching.patch_sites(model, clean, corrupted, metric, [s]).values for s in (tensor, plain)
        )
        torch.testing.assert_close(got, expected, atol=0, rtol=0)
    mask = torch.tensor([False, True, True, False, False, False, False])
    for bad in (mask, mask.tolist(), torch.tensor([1.0, 2.0]), torch.tensor([[1, 2], [2, 3], [3, 4]])):
        with pytest.raises(ValueError, match="must be an int, a list of ints or a 1-D integer tensor"):
            patching.patch_sites(model, clean, corrupted, metric, [Site(name, pos=bad)])


def test_edits_of_the_attention_input_two_ways_in_one_sweep_are_each_made():
    """hook_attn_in and hook_q/k/v_input are two views of the attention's input whose settings cannot
    both be on (hook_attn_in did not fire): runs editing one and runs editing the other equal their own
    hooked forward passes at every batch size (stacked in one pass, the hook_attn_in edit was lost)."""
    model = interp.HookedTransformer(tiny_config(n_layers=2, init_std=0.15)).eval()
    model.init_weights(seed=2)
    tokens = torch.randint(2, model.cfg.d_vocab, (5, 6), generator=torch.Generator().manual_seed(1))
    metric = lambda logits: metrics.logit_diff(logits, tokens[:, 0], tokens[:, 1], pos=-1)  # noqa: E731
    edit = lambda act: act * 0.3 - 0.2  # noqa: E731
    sites = [Site("blocks.0.hook_attn_in", pos=-1), Site("blocks.0.hook_v_input", head=1)]
    runs = [[], *([engine.Intervention(site, edit)] for site in sites)]
    expected = []
    for run in runs:
        with model.settings(**engine.hook_settings_for(iv.site.name for iv in run)):
            expected.append(metric(model.run_with_hooks(tokens, fwd_hooks=_by_hand(run))))
    assert not torch.allclose(expected[1], expected[0], atol=1e-4)  # the edit moves the metric
    for batch_size in (1, 2, 3):
        options = RunOptions(logit_pos=-1, batch_size=batch_size)
        values = engine.run_site_sets(model, tokens, runs, None, metric, options=options)
        torch.testing.assert_close(values, torch.stack(expected), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="cannot both be on"):
        model.set_use_attn_in(True)
        model.set_use_split_qkv_input(True)


def test_a_head_ablated_after_its_whole_layer_is_overwritten_is_placed_by_its_prompts(model):
    """A run that zeroes every head of a block, then mean-ablates one of them (an ablation's values,
    placed by the pass's prompts), equals its hooked forward pass, narrowed or not (the engine computed
    the given z before the pass and failed: "an ablation's values are placed in a forward pass")."""
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(2, model.cfg.d_vocab, (6, 7), generator=generator)
    reference = torch.randint(2, model.cfg.d_vocab, (8, 7), generator=generator)
    metric = lambda logits: metrics.logit_diff(logits, tokens[:, 0], tokens[:, 1], pos=-1)  # noqa: E731
    cover = [engine.Intervention(Site(interp.act_name("z", layer)), torch.zeros(())) for layer in (1, 2)]
    mean = ablation_interventions(model, heads=[(1, 1)], ablation=Ablation("mean", reference=reference))
    runs = [[], [*cover, *mean]]
    expected = []
    for run in runs:
        with engine.intervened(model, run):
            expected.append(metric(model(tokens)))
    _, target = engine.cached_run(model, tokens, engine.start_names(model), logits=False)
    for start in (None, target):
        options = RunOptions(logit_pos=-1)
        values = engine.run_site_sets(model, tokens, runs, None, metric, target=start, options=options)
        torch.testing.assert_close(values, torch.stack(expected), atol=1e-5, rtol=0)


def test_reading_after_the_last_block_is_refused_saying_what_to_read(model):
    tokens = torch.randint(2, model.cfg.d_vocab, (4, 7), generator=torch.Generator().manual_seed(0))
    runs = [[], [engine.Intervention(Site("blocks.0.hook_mlp_out", pos=2), torch.zeros(()))]]
    with pytest.raises(ValueError, match=r"cannot read ln_final.hook_normalized, after the last block: read"):
        engine.read_site_sets(model, tokens, runs, ["ln_final.hook_normalized"], dict)
