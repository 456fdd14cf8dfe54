"""Per-head analyses of a post-norm model (Gemma 3: a norm between the heads' summed output and the
residual stream, local and global layers, grouped-query attention), on random weights from
transformers' config: each head's share of the attention output with that norm frozen at the run's
scale (the linearisation direct logit attribution makes), and patching at hook_z, which needs none."""

from __future__ import annotations

import pytest
import torch

import interp
from tests.test_equivalence import HF_CONFIGS, _random_hf_model

ATOL = 1e-4
BATCH, POS = 3, 12


@pytest.fixture(scope="module")
def gemma3():
    """(transformers' random Gemma 3 model, interp's model of it): 3 layers (local, global, local;
    window 5), 4 query heads sharing 2 key/value heads, pre- and post-norms."""
    hf = _random_hf_model(HF_CONFIGS["gemma3-local-global-rope"]())
    model = interp.load_model(hf)
    cfg = model.cfg
    assert cfg.post_norm and "local" in cfg.attn_types and cfg.n_kv_heads < cfg.n_heads
    return hf, model


def _tokens(model: interp.HookedTransformer, seed: int) -> torch.Tensor:
    return torch.randint(model.cfg.d_vocab, (BATCH, POS), generator=torch.Generator().manual_seed(seed))


def test_head_shares_add_up_to_each_attention_output(gemma3) -> None:
    _, model = gemma3
    _, cache = model.run_with_cache(_tokens(model, 1))
    stack, labels = cache.stack_head_contributions(return_labels=True)  # [layer * head, batch, pos, d]
    n_heads = model.cfg.n_heads
    assert labels[:n_heads] == [f"L0H{h}" for h in range(n_heads)]
    for layer, block in enumerate(model.blocks):
        shares = stack[layer * n_heads : (layer + 1) * n_heads]
        b_O = torch.zeros(model.cfg.d_model) if block.attn.b_O is None else block.attn.b_O
        bias = block.ln1_post.apply_to_stack(b_O, cache[f"blocks.{layer}.ln1_post.hook_scale"])
        torch.testing.assert_close(shares.sum(0) + bias, cache["attn_out", layer], atol=ATOL, rtol=0)
        raw = cache["z", layer].flatten(-2) @ block.attn.W_O.flatten(0, 1)  # the heads' summed output
        assert not torch.allclose(raw, cache["attn_out", layer], atol=1e-2)  # the norm does change it


def test_frozen_norm_attributions_add_up_to_the_logit_difference(gemma3) -> None:
    _, model = gemma3
    logits, cache = model.run_with_cache(_tokens(model, 1))
    answers, wrong = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    stack = cache.stack_head_contributions(pos_slice=-1, incl_remainder=True)  # heads + the rest
    attrs = cache.logit_attrs(stack, answers, wrong, pos_slice=-1)  # [layer * head + 1, batch]
    rows = torch.arange(BATCH)
    torch.testing.assert_close(
        attrs.sum(0), logits[rows, -1, answers] - logits[rows, -1, wrong], atol=ATOL, rtol=0
    )
    assert (attrs[:-1].abs() > 1e-3).any()


def test_each_heads_attribution_is_the_change_of_the_logit_difference_with_the_norms_frozen(gemma3) -> None:
    """Removing a last-layer head's output, with ln1_post's and the final norm's scales held at the clean
    run's (and the MLP after it held too), changes the logit difference by minus its attribution."""
    _, model = gemma3
    tokens = _tokens(model, 1)
    last = model.cfg.n_layers - 1
    logits, cache = model.run_with_cache(tokens)
    answers, wrong = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    rows = torch.arange(BATCH)

    def logit_diff(out: torch.Tensor) -> torch.Tensor:
        return out[rows, -1, answers] - out[rows, -1, wrong]

    stack = cache.stack_head_contributions(pos_slice=-1)[-model.cfg.n_heads :]  # the last layer's heads
    attrs = cache.logit_attrs(stack, answers, wrong, pos_slice=-1)  # [head, batch]
    held = (f"blocks.{last}.ln1_post.hook_scale", f"blocks.{last}.hook_mlp_out", "ln_final.hook_scale")
    frozen = [(name, lambda act, hook: cache[hook.name]) for name in held]
    for head in range(model.cfg.n_heads):

        def remove(z: torch.Tensor, hook, head: int = head) -> torch.Tensor:
            z = z.clone()
            z[:, :, head] = 0
            return z

        removed = model.run_with_hooks(tokens, fwd_hooks=[(interp.act_name("z", last), remove), *frozen])
        torch.testing.assert_close(logit_diff(removed) - logit_diff(logits), -attrs[head], atol=ATOL, rtol=0)


@pytest.mark.parametrize("layer", [0, 1, 2])  # local, global, local
def test_patching_a_head_at_hook_z_equals_transformers(gemma3, layer: int) -> None:
    """A head's z patched from other prompts: interp's logit differences are transformers' with the same
    head's slice of o_proj's input (the heads' z, concatenated) patched."""
    hf, model = gemma3
    clean, corrupted = _tokens(model, 1), _tokens(model, 2)
    head, d_head = 1, model.cfg.d_head
    rows, answers, wrong = torch.arange(BATCH), torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])

    def logit_diff(logits: torch.Tensor) -> torch.Tensor:
        return logits[rows, -1, answers] - logits[rows, -1, wrong]

    patched = interp.patch(model, clean, logit_diff, source=corrupted, head=(layer, head))

    o_proj = hf.model.layers[layer].self_attn.o_proj
    with torch.no_grad():
        captured = {}
        handle = o_proj.register_forward_pre_hook(lambda module, args: captured.update(z=args[0].clone()))
        hf(corrupted)
        handle.remove()

        def write(module, args):
            z = args[0].clone()
            columns = slice(head * d_head, (head + 1) * d_head)
            z[..., columns] = captured["z"][..., columns]
            return (z,)

        handle = o_proj.register_forward_pre_hook(write)
        expected = hf(clean).logits
        handle.remove()
        unpatched = hf(clean).logits
    torch.testing.assert_close(patched, logit_diff(expected), atol=ATOL, rtol=0)
    assert not torch.allclose(logit_diff(expected), logit_diff(unpatched), atol=1e-3)  # the patch acted
