"""Device and dtype: every path runs on `interp.default_device()` ($INTERP_DEVICE, CPU by default)
in float32, bfloat16 and float16, and half precision stays close to float32."""

from __future__ import annotations

import pytest
import torch
from conftest import IOI_PROMPT

import interp
from circuits.heads import head_report
from circuits.ioi import find_ioi_circuit
from interp import metrics
from interp.interventions.ablation import ablate
from interp.interventions.engine import RunOptions
from interp.interventions.patching import activation_patching
from interp.interventions.path_patching import path_patching
from interp.tasks.ioi import ioi_dataset_for

HALF = [torch.bfloat16, torch.float16]
# Relative error of one rounding: 2^-8 (bf16), 2^-11 (fp16). Logits go through 30 layers of rounding.
LOGIT_TOLERANCE = {
    torch.bfloat16: 0.15,
    torch.float16: 0.02,
}  # measured 0.05, 0.004  # max |logit error| / max |logit|


def test_default_device_reads_interp_device(monkeypatch):
    monkeypatch.setenv("INTERP_DEVICE", "cpu")
    assert interp.default_device() == torch.device("cpu")
    monkeypatch.setenv("INTERP_DEVICE", "not-a-device")
    with pytest.raises(ValueError, match="INTERP_DEVICE"):
        interp.default_device()
    monkeypatch.setenv("INTERP_DEVICE", "cuda:99")
    with pytest.raises(ValueError, match=r"INTERP_DEVICE='cuda:99' but torch sees \d+ CUDA device"):
        interp.default_device()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"device": "cuda:99"}, r"device='cuda:99' but torch sees \d+ CUDA device\(s\) here"),
        ({"device": "meta"}, "a model on the meta device holds no weights"),
        ({"device": "gpu"}, "device='gpu' is not a torch device"),
        ({"device_map": {"blocks.0": "cpu", "blocks.1": 99}}, "a device of device_map=99 but torch sees"),
    ],
)
def test_a_device_this_machine_lacks_is_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        interp.load_model("toy-induction", **options)


def test_models_load_on_the_default_device(smollm2):
    assert smollm2.device.type == interp.default_device().type
    assert smollm2(IOI_PROMPT).device == smollm2.device


@pytest.fixture(scope="module", params=HALF, ids=lambda dtype: str(dtype).removeprefix("torch."))
def smollm2_half(request) -> interp.HookedTransformer:
    return interp.load_model("smollm2-135m", dtype=request.param).eval()


def test_half_precision_forward_and_cache(smollm2, smollm2_half):
    dtype = smollm2_half.dtype
    tokens = smollm2.to_tokens(IOI_PROMPT)
    with torch.no_grad():
        reference = smollm2(tokens)
        logits, cache = smollm2_half.run_with_cache(tokens)
    assert (
        logits.dtype == dtype and cache["resid_post", 5].dtype == dtype and cache["pattern", 5].dtype == dtype
    )
    error = (logits.float() - reference).abs().max() / reference.abs().max()
    assert error < LOGIT_TOLERANCE[dtype], f"{dtype}: relative logit error {error:.3f}"
    assert logits[0, -1].argmax() == reference[0, -1].argmax()  # " Mary"
    mary, john = smollm2.to_single_token(" Mary"), smollm2.to_single_token(" John")
    diff = reference[0, -1, mary] - reference[0, -1, john]
    half_diff = logits[0, -1, mary].float() - logits[0, -1, john].float()
    assert abs(half_diff - diff) < 0.2 * abs(diff)
    # Decompositions hold within the dtype's rounding.
    stack = cache.decompose_resid(layer=10, pos_slice=-1)
    resid = cache["resid_pre", 10][:, -1].float()
    assert (stack.float().sum(0) - resid).abs().max() < 0.02 * resid.abs().max()
    assert torch.allclose(cache["pattern", 5].float().sum(-1), torch.ones(()), atol=1e-2)


@pytest.fixture(scope="module")
def toy_ioi_models() -> dict[torch.dtype, interp.HookedTransformer]:
    return {dtype: interp.load_model("toy-ioi", dtype=dtype).eval() for dtype in [torch.float32, *HALF]}


@pytest.mark.parametrize("dtype", HALF, ids=lambda dtype: str(dtype).removeprefix("torch."))
def test_half_precision_patching_and_ablation(toy_ioi_models, dtype):
    results = {}
    for key in (torch.float32, dtype):
        model = toy_ioi_models[key]
        clean, abc, _ = ioi_dataset_for(model, 16, seed=1)
        clean, abc = clean.to(model.device), abc.to(model.device)
        end = clean.positions["END"]
        diff = lambda logits, c=clean, e=end: metrics.logit_diff(logits, c.io_token, c.s_token, pos=e)  # noqa: E731
        patched = activation_patching(model, clean.tokens, abc.tokens, diff, "resid_pre", clean.positions)
        paths = path_patching(model, clean.tokens, abc.tokens, diff, options=RunOptions(logit_pos=end))
        with ablate(model, heads=[(1, 0)], ablation="zero"), torch.no_grad():
            ablated = diff(model(clean.tokens)).float().cpu()
        results[key] = (patched.mean(), paths.mean(), ablated)
    scale = results[torch.float32][0].abs().max()
    for full, half in zip(results[torch.float32], results[dtype], strict=True):
        assert half.dtype == torch.float32  # results are float32 on CPU whatever the model's dtype
        assert (half - full).abs().max() < 0.05 * scale, f"{dtype}: {(half - full).abs().max():.3f}"


@pytest.mark.parametrize("dtype", HALF, ids=lambda dtype: str(dtype).removeprefix("torch."))
def test_half_precision_reports(toy_ioi_models, dtype):
    """`interp heads` and `interp ioi` on a half-precision model find what they find in float32."""
    full, half = toy_ioi_models[torch.float32], toy_ioi_models[dtype]
    heads_full = head_report(full, n_samples=8)
    heads_half = head_report(half, n_samples=8)
    for column in ("previous_token", "induction", "duplicate_token"):
        difference = heads_full.extras.score_grid(column) - heads_half.extras.score_grid(column)
        assert abs(difference).max() < 0.03
    ioi_full = find_ioi_circuit(full, n_prompts=32, evaluate=False).extras
    ioi_half = find_ioi_circuit(half, n_prompts=32, evaluate=False).extras
    assert (
        abs(ioi_half.baseline.logit_diff - ioi_full.baseline.logit_diff) < 0.02 * ioi_full.baseline.logit_diff
    )
    assert sorted(ioi_half.heads) == sorted(ioi_full.heads)


@pytest.mark.parametrize("dtype", HALF, ids=lambda dtype: str(dtype).removeprefix("torch."))
def test_gradient_methods_refuse_float16_and_run_in_bfloat16(toy_ioi_models, dtype):
    """float16 rounds gradients below 6e-8 to 0: attribution of a probability of 1e-8 scored every site
    0. Each gradient method refuses it, saying to use bfloat16, in which it runs."""
    from interp import edges
    from interp.interventions.patching import attribution_patching

    model = toy_ioi_models[dtype]
    clean, abc, _ = ioi_dataset_for(model, 4, seed=1)
    metric = metrics.logit_diff_metric(clean.io_token, clean.s_token, clean.positions["END"])
    pair = (model, clean.tokens, abc.tokens, metric)
    runs = {
        "attribution patching": lambda: attribution_patching(*pair),
        "edge attribution by eap": lambda: edges.edge_attribution(*pair, "eap"),
        "prune_edges": lambda: edges.prune_edges(*pair, edges.PruneSettings(steps=1)),
        "removal_effects": lambda: edges.removal_effects(*pair, edges.edge_graph(model).valid, 1),
    }
    for what, run in runs.items():
        if dtype == torch.float16:
            with pytest.raises(ValueError, match=f"{what}.* takes gradients, which float16 rounds"):
                run()
        else:
            run()


def test_float16_masked_means_are_summed_without_overflow():
    """400 activations of 300 sum to 120000, beyond float16's 65504: the mean is 300, not inf."""
    from interp.interventions.stats import masked_mean

    values = torch.full((400, 3, 1), 300.0, dtype=torch.float16)
    real = torch.ones(400, 3, 1, dtype=torch.bool)
    real[0, 0] = False
    mean = masked_mean(values, real, 0)
    assert mean.dtype == torch.float16 and torch.equal(mean, torch.full((3, 1), 300.0, dtype=torch.float16))
