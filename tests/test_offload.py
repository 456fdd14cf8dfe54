"""Models over several devices (load_model(device_map=...) through accelerate), tested here with
accelerate's CPU and disk offload: an offloaded model runs block by block and equals the model in memory."""

from __future__ import annotations

import pytest
import torch
from conftest import IOI_PROMPT

import interp
from circuits.heads import head_report
from circuits.ioi import find_ioi_circuit
from interp import metrics
from interp.interventions import engine
from interp.interventions.ablation import ablate
from interp.interventions.engine import RunOptions
from interp.interventions.patching import activation_patching
from interp.interventions.path_patching import path_patching
from interp.model.tokens import recorded_padding
from interp.runtime.streaming import cache_to_disk, load_activations
from interp.tasks.ioi import ioi_dataset_for

PROMPTS = [IOI_PROMPT, "When Tom and Anna went to the park, Anna gave a ball to"]


@pytest.fixture(scope="module")
def offloaded(tmp_path_factory) -> interp.HookedTransformer:
    """SmolLM2 under a CPU budget that holds the embeddings and a few blocks; the rest on disk."""
    folder = tmp_path_factory.mktemp("offload")
    model = interp.load_model(
        "smollm2-135m", device_map="auto", max_memory={"cpu": "300MiB"}, offload_folder=folder
    )
    return model.eval()


def test_auto_device_map_offloads_blocks_to_disk(offloaded):
    placement = [offloaded.hf_device_map[f"blocks.{layer}"] for layer in range(offloaded.cfg.n_layers)]
    assert placement[0] == "cpu" and placement[-1] == "disk"
    assert placement == sorted(placement)  # in memory first, then disk
    assert offloaded.blocks[-1].attn.W_Q.is_meta  # not in memory between forward passes


def test_offloaded_model_equals_the_model_in_memory(smollm2, offloaded):
    tokens = smollm2.to_tokens(PROMPTS)
    with torch.no_grad():
        reference, reference_cache = smollm2.run_with_cache(tokens)
        logits, cache = offloaded.run_with_cache(tokens)
    torch.testing.assert_close(logits, reference, rtol=1e-5, atol=1e-4)
    for name in ("blocks.2.hook_resid_post", "blocks.29.attn.hook_pattern", "ln_final.hook_scale"):
        torch.testing.assert_close(cache[name], reference_cache[name], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(offloaded.W_O, smollm2.W_O)  # offloaded weights are read in
    # Decompositions read the norms and W_O of offloaded blocks.
    mary, john = smollm2.to_single_token(" Mary"), smollm2.to_single_token(" John")
    heads = [c.stack_head_results(pos_slice=-1) for c in (reference_cache, cache)]
    torch.testing.assert_close(heads[1], heads[0], rtol=1e-4, atol=1e-4)
    parts = [c.decompose_resid(layer=20, pos_slice=-1, apply_ln=True) for c in (reference_cache, cache)]
    torch.testing.assert_close(parts[1], parts[0], rtol=1e-4, atol=1e-4)
    attrs = [
        c.logit_attrs(h, mary, john, pos_slice=-1)
        for c, h in zip((reference_cache, cache), heads, strict=True)
    ]
    torch.testing.assert_close(attrs[1], attrs[0], rtol=1e-4, atol=1e-4)


def test_patching_and_ablation_on_an_offloaded_model(tmp_path):
    """Toy IOI with its first block on disk: patching, ablation, generation and streaming agree."""
    device_map = {"blocks.0": "disk", "blocks.1": "cpu"}
    models = [
        interp.load_model("toy-ioi", device="cpu"),  # beside its offloaded copy, whose device is the CPU
        interp.load_model("toy-ioi", device_map=device_map, offload_folder=tmp_path),
    ]
    clean, abc, _ = ioi_dataset_for(models[0], 16, seed=2)
    end = clean.positions["END"]
    diff = lambda logits: metrics.logit_diff(logits, clean.io_token, clean.s_token, pos=end)  # noqa: E731
    results = []
    for model in models:
        patched = activation_patching(model, clean.tokens, abc.tokens, diff, "z", clean.positions)
        paths = path_patching(model, clean.tokens, abc.tokens, diff, options=RunOptions(logit_pos=end))
        with (
            ablate(model, heads=[(1, 0)], ablation=interp.Ablation("mean", reference=abc.tokens)),
            torch.no_grad(),
        ):
            ablated = diff(model(clean.tokens))
        results.append((patched.values, paths.values, ablated))
    for reference, offloaded in zip(*results, strict=True):
        torch.testing.assert_close(offloaded, reference, rtol=1e-5, atol=1e-5)
    assert results[0][0].abs().max() > 1  # patching moved the logit difference
    # generate's KV cache is updated in place inside the blocks, offloaded or not
    prompt = clean.tokens[:2, :6]
    assert torch.equal(
        models[1].generate(prompt, max_new_tokens=4), models[0].generate(prompt, max_new_tokens=4)
    )
    # the weights' fingerprint (what cached induction heads, checkpoints and --save are keyed by) reads the
    # offloaded block's weights in; and resid_post of block 0 and resid_pre of block 1, one tensor, are saved
    assert interp.weights_fingerprint(models[1]) == interp.weights_fingerprint(models[0])
    names = [
        "blocks.0.attn.hook_z",
        "blocks.0.hook_resid_post",
        "blocks.1.hook_resid_pre",
        "blocks.1.hook_resid_post",
    ]
    cache_to_disk(models[1], clean.tokens, names, tmp_path / "acts", batch_size=6)
    _, reference = models[0].run_with_cache(clean.tokens, names_filter=names)
    real = recorded_padding(clean.tokens).bool()  # the prompts' tokens; what padding holds is never read
    assert not bool(real.all())
    for name, activations in load_activations(tmp_path / "acts").items():
        torch.testing.assert_close(activations[real], reference[name][real], rtol=1e-5, atol=1e-5)


def test_narrowed_runs_on_an_offloaded_model_equal_the_model_in_memory(tmp_path):
    """Runs that patch heads at the read position only are carried at that position from the next block
    (`engine._narrow_after`), attending to the keys and values the target run cached: with that block on
    disk, its weights are read in and every run equals the model in memory's."""
    models = [
        interp.load_model("toy-ioi", device="cpu"),
        interp.load_model(
            "toy-ioi", device_map={"blocks.0": "cpu", "blocks.1": "disk"}, offload_folder=tmp_path
        ),
    ]
    assert models[1].blocks[1].attn.W_Q.is_meta
    clean, abc, _ = ioi_dataset_for(models[0], 16, seed=2)
    end, z = clean.positions["END"], interp.act_name("z", 0)
    metric = metrics.prob_metric(clean.io_token, pos=end)
    values = []
    for model in models:
        _, source = model.run_with_cache(abc.tokens, names_filter=z)
        runs = [
            [engine.Intervention(engine.Site(z, head=[head], pos=end), {z: source[z]})]
            for head in range(model.cfg.n_heads)
        ]
        narrowed = engine._Narrowed.of(end, clean.tokens)
        hooked = [False] * (model.cfg.n_layers + 1)
        assert [engine._narrow_after(model, run, [], hooked, narrowed) for run in runs] == [1] * len(runs)
        _, target = engine.cached_run(model, clean.tokens, engine.start_names(model, keys_values=True))
        options = RunOptions(logit_pos=end)
        values.append(
            engine.run_site_sets(model, clean.tokens, runs, None, metric, target=target, options=options)
        )
    torch.testing.assert_close(values[1], values[0], rtol=1e-5, atol=1e-6)
    assert (values[0] - metric(models[0](clean.tokens))).abs().max() > 0.1  # the patches move the metric


def test_device_map_errors(tmp_path):
    with pytest.raises(ValueError, match="one entry per block"):
        interp.load_model("toy-induction", device_map={"blocks.0": "cpu"})
    with pytest.raises(ValueError, match="offload_folder"):
        interp.load_model("toy-induction", device_map={"blocks.0": "cpu", "blocks.1": "disk"})
    with pytest.raises(ValueError, match="not both"):
        interp.load_model("toy-induction", device="cpu", device_map="auto")
    interp.load_model(
        "toy-induction", device_map={"blocks.0": "disk", "blocks.1": "cpu"}, offload_folder=tmp_path
    )
    with pytest.raises(ValueError, match="already holds"):  # accelerate would read the old weights
        interp.load_model(
            "toy-ioi", device_map={"blocks.0": "disk", "blocks.1": "cpu"}, offload_folder=tmp_path
        )
    model = interp.load_model(
        "toy-induction", device_map={"blocks.0": "disk", "blocks.1": "cpu"}, offload_folder=tmp_path / "2"
    )
    tokens = torch.randint(64, (2, 20))
    torch.testing.assert_close(model(tokens), interp.load_model("toy-induction", device="cpu")(tokens))


@pytest.mark.parametrize("max_memory", [None, {"cpu": "1KiB"}])
def test_auto_device_map_of_a_model_that_fits_on_one_device(tmp_path, max_memory):
    """device_map="auto" where every block fits on one device (the CPU, or the disk past a tiny
    budget): accelerate names the whole list of blocks, every block goes there."""
    model = interp.load_model(
        "toy-induction", device_map="auto", max_memory=max_memory, offload_folder=tmp_path
    )
    tokens = torch.randint(64, (2, 20))
    torch.testing.assert_close(model(tokens), interp.load_model("toy-induction", device="cpu")(tokens))


def test_reports_on_offloaded_models(tmp_path):
    """`interp heads` and `interp ioi` read weights (copying, composition, norms) of offloaded blocks."""
    device_map = {"blocks.0": "disk", "blocks.1": "cpu"}
    for name in ("toy-induction", "toy-ioi"):
        models = [
            interp.load_model(name, device="cpu"),
            interp.load_model(name, device_map=device_map, offload_folder=tmp_path / name),
        ]
        if name == "toy-induction":
            findings = [head_report(model, n_samples=8) for model in models]
            reports = [finding.extras.full_table(finding) for finding in findings]
            numeric = reports[0].select_dtypes("number").columns
            assert (reports[1][numeric] - reports[0][numeric]).abs().max().max() < 1e-5
            assert list(reports[1]["types"]) == list(reports[0]["types"])
        else:
            circuits = [find_ioi_circuit(model, n_prompts=32, evaluate=False).extras for model in models]
            assert circuits[1].heads == circuits[0].heads and circuits[0].heads
            assert abs(circuits[1].baseline.logit_diff - circuits[0].baseline.logit_diff) < 1e-4
