"""Memory-bounded caching: run_with_cache stops after the blocks it needs, cached tensors can move
to CPU as they are made, and cache_to_disk streams a prompt set to safetensors shards with resume."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

import interp
from interp.model.hooks import observer
from interp.runtime.streaming import cache_to_disk, iter_shards, load_activations


@pytest.fixture
def model() -> interp.HookedTransformer:
    torch.manual_seed(0)
    return interp.HookedTransformer(tiny_config(n_layers=4)).to(interp.default_device()).eval()


def _tokens(n: int, pos: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(61, (n, pos), generator=torch.Generator().manual_seed(seed))


class CallCounter:
    """A forward hook counting how often a hook point fires."""

    def __init__(self):
        self.calls = 0

    def __call__(self, act, hook):
        self.calls += 1


def test_run_with_cache_stops_after_the_last_needed_block(model):
    """Without logits the run stops after the last block the cache needs (a block's own module hook
    counts its runs), unless a hook on the model needs a later one: hooks added to the model fire, as
    in TransformerLens."""
    tokens = _tokens(3).to(model.device)
    wanted = ["hook_embed", "blocks.1.attn.hook_pattern", "blocks.1.hook_resid_post"]
    full_logits, full = model.run_with_cache(tokens)
    later = CallCounter()
    handle = model.blocks[2].register_forward_hook(lambda module, args, output: later(output, None))
    try:
        out, cache = model.run_with_cache(tokens, names_filter=wanted, return_type=None)
        assert out is None and later.calls == 0  # blocks 2 and 3 never ran
        assert set(cache.keys()) == set(wanted)
        for name in wanted:  # (SDPA runs where no pattern is observed: equal up to rounding)
            torch.testing.assert_close(cache[name], full[name], rtol=1e-5, atol=1e-6)
        logits, _ = model.run_with_cache(tokens, names_filter=wanted)  # the logits need every block
        assert later.calls == 1
        torch.testing.assert_close(logits, full_logits, rtol=1e-5, atol=1e-5)
        model.run_with_cache(tokens, names_filter=["ln_final.hook_scale"], return_type=None)
        assert later.calls == 2
        # An explicit stop_at_layer is the caller's: its residual stream comes back, as before.
        resid, _ = model.run_with_cache(tokens, names_filter=wanted, return_type=None, stop_at_layer=3)
        assert later.calls == 3
        torch.testing.assert_close(resid, full["blocks.2.hook_resid_post"], rtol=1e-5, atol=1e-5)
        on_the_model = CallCounter()
        with model.hooks(fwd_hooks=[("blocks.2.hook_resid_pre", on_the_model)]):
            model.run_with_cache(tokens, names_filter=wanted, return_type=None)
        assert on_the_model.calls == 1 and later.calls == 4  # block 2 ran for the hook on it
    finally:
        handle.remove()


def test_run_with_cache_moves_tensors_as_they_are_made(model):
    tokens = _tokens(2).to(model.device)
    _, full = model.run_with_cache(tokens)
    seen_devices = []

    def after_cached(act, hook):  # runs after the caching hook of the same point
        seen_devices.append(act.device)

    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_post", after_cached)]):
        _, cache = model.run_with_cache(tokens, device="cpu")
    assert all(tensor.device.type == "cpu" for tensor in cache.cache_dict.values())
    assert seen_devices == [model.device]  # the forward pass itself stays on the model's device
    assert all(torch.equal(cache[name], full[name].cpu()) for name in full)


def test_cache_to_disk_resumes_after_an_interruption(model, tmp_path):
    tokens = _tokens(22)  # 6 shards of 4 (the last has 2 rows)
    names = ["blocks.0.hook_resid_post", "blocks.2.attn.hook_z"]
    out = tmp_path / "acts"

    class Interrupt(Exception):
        pass

    batches = CallCounter()

    def interrupt_on_third_batch(act, hook):
        batches(act, hook)
        if batches.calls == 3:
            raise Interrupt

    with (
        pytest.raises(Interrupt),
        model.hooks(fwd_hooks=[("hook_embed", observer(interrupt_on_third_batch))]),
    ):
        cache_to_disk(model, tokens, names, out, batch_size=4)
    assert sorted(p.name for p in out.iterdir()) == [
        "job.json",
        "shard_00000.safetensors",
        "shard_00001.safetensors",
    ]  # complete shards only: no temporary file is left behind
    with pytest.raises(ValueError, match="incomplete"):
        load_activations(out)

    resumed = CallCounter()
    with model.hooks(fwd_hooks=[("hook_embed", observer(resumed))]):  # observers: not part of the job
        cache_to_disk(model, tokens, names, out, batch_size=4)
    assert resumed.calls == 4  # shards 2..5 only

    _, reference = model.run_with_cache(tokens.to(model.device), names_filter=names)
    loaded = load_activations(out)
    for name in names:
        assert loaded[name].shape == reference[name].shape
        torch.testing.assert_close(loaded[name], reference[name].cpu(), rtol=1e-5, atol=1e-6)
    rows = [r for r, _ in iter_shards(out, names[:1])]
    assert rows[0] == range(0, 4) and rows[-1] == range(20, 22)
    # one name as a string (was read letter by letter: "File does not contain tensor b"); an uncached one
    assert torch.equal(load_activations(out, names[0])[names[0]], loaded[names[0]])
    with pytest.raises(ValueError, match="holds no activations of blocks.1.hook_resid_post; it cached"):
        load_activations(out, ["blocks.1.hook_resid_post"])

    with pytest.raises(ValueError, match="another job"):
        cache_to_disk(model, tokens[:8], names, out, batch_size=4)


@pytest.mark.parametrize("side", ["left", "right"])
def test_cache_to_disk_keeps_the_padding_the_tokens_record(smollm2, side, tmp_path):
    """Texts of SmolLM2 padded on the model's side, one beginning with <|im_end|> (its pad and EOS
    id): the shards dropped the mask `to_tokens` records, so left padding masked that real first token
    (756 off at real tokens) and right-padded ids were refused as carrying no mask. The shards equal
    `run_with_cache` at every real token, and the same ids under another mask are another job."""
    name = "blocks.3.hook_resid_post"
    texts = ["<|im_end|>The cat sat on the mat", "When Mary and John went to the store, John gave a drink to"]
    smollm2.default_padding_side = side
    try:
        tokens, mask = smollm2.to_tokens_and_mask(texts)
        _, cache = smollm2.run_with_cache(smollm2.to_tokens(texts), names_filter=[name])
        cache_to_disk(smollm2, texts, [name], tmp_path / "texts", batch_size=1)
        stored = load_activations(tmp_path / "texts")[name]
        real = mask.bool()
        torch.testing.assert_close(stored[real], cache[name][real], atol=1e-4, rtol=0)
        unmasked = tokens.clone()  # the same ids, every token real
        with pytest.raises(ValueError, match="holds the activations of another job"):
            cache_to_disk(
                smollm2,
                interp.model.tokens.record_padding(unmasked, torch.ones_like(mask)),
                [name],
                tmp_path / "texts",
                batch_size=1,
            )
    finally:
        smollm2.default_padding_side = "right"
