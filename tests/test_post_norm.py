"""Per-head analyses of a post-norm model (Gemma 3: a norm between the heads' summed output and the
residual stream, local and global layers, grouped-query attention), on random weights from
transformers' config: each head's share of the attention output with that norm frozen at the run's
scale (the linearisation direct logit attribution makes), and patching at hook_z, which needs none."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import transformers

import interp
from circuits.discovery import end_logits_and_cache
from circuits.finding import finding_report
from circuits.heads.weights import copying_scores, k_composition_scores
from circuits.icl import function_vector, mean_head_outputs, task_prompts
from circuits.ioi import find_ioi_circuit
from circuits.ioi.evidence import direct_logit_attributions
from circuits.retrieval import RetrievalSettings, find_retrieval_circuit
from circuits.retrieval.find import attention_and_direct
from circuits.sections import render_markdown
from interp.interventions.engine import cached_run, start_names
from interp.io.sources import read_source
from interp.model.cache import direct_attribution_linearisation
from interp.tasks import IOIPrompts
from interp.tasks.icl_tasks import ICL_TASKS, single_token_pairs, split_pairs
from interp.tasks.ioi import ioi_dataset_for
from interp.tasks.ioi_toy import ToyIOITask
from interp.tasks.retrieval import make_retrieval_prompts
from tests.test_equivalence import _SMALL, HF_CONFIGS, _random_hf_model

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


# ---------------------------------------------------------------------------------------------
# The analyses that class heads by their direct logit attribution, on random Gemma 3 models.


def _gemma3_config(vocab_size: int) -> transformers.Gemma3TextConfig:
    """HF_CONFIGS' random Gemma 3 (local, global, local; grouped-query) with another vocabulary."""
    return transformers.Gemma3TextConfig(
        **{**_SMALL, "num_hidden_layers": 3, "vocab_size": vocab_size, "max_position_embeddings": 256},
        head_dim=16,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    )


@pytest.fixture(scope="module")
def gemma3_toy_ioi() -> interp.HookedTransformer:
    """A random Gemma 3 over the toy IOI task's vocabulary, recorded as a model of that task."""
    loaded = read_source(_random_hf_model(_gemma3_config(ToyIOITask().d_vocab)))
    cfg = dataclasses.replace(loaded.cfg, task="ioi", model_name="gemma3-toy-ioi")
    return interp.HookedTransformer.from_weights(loaded._replace(cfg=cfg))


@pytest.fixture(scope="module")
def gemma3_text(smollm2) -> interp.HookedTransformer:
    """A random Gemma 3 with SmolLM2's tokenizer (retrieval's prompts are text)."""
    return interp.load_model(
        _random_hf_model(_gemma3_config(len(smollm2.tokenizer))), tokenizer=smollm2.tokenizer
    )


def _answered(model: interp.HookedTransformer, split: str) -> tuple[IOIPrompts, IOIPrompts]:
    """The toy IOI prompts of `split` (clean, ABC) on which the random model prefers the indirect
    object, so that the analysis has a logit difference to explain."""
    clean, abc, _ = ioi_dataset_for(model, 64, 0, split)
    with torch.no_grad():
        keep = (clean.logit_diff(model(clean.tokens)) > 0).nonzero()[:, 0]
    return clean[keep], abc[keep]


def _frozen_norm_removals(model, tokens, read) -> torch.Tensor:
    """[head] the mean change of read(logits) [batch] when each last-layer head's output is removed with
    the norms between it and the logits (its ln1_post, the final norm) held at the clean run's scales,
    and the MLP after it held too: minus each head's direct attribution, if that linearises the norms."""
    last = model.cfg.n_layers - 1
    held = (f"blocks.{last}.ln1_post.hook_scale", f"blocks.{last}.hook_mlp_out", "ln_final.hook_scale")
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=list(held))
        changes = []
        for head in range(model.cfg.n_heads):

            def remove(z: torch.Tensor, hook, head: int = head) -> torch.Tensor:
                z = z.clone()
                z[:, :, head] = 0
                return z

            hooks = [
                (interp.act_name("z", last), remove),
                *((name, lambda act, hook: cache[hook.name]) for name in held),
            ]
            changes.append((read(model.run_with_hooks(tokens, fwd_hooks=hooks)) - read(logits)).mean())
    return torch.stack(changes).cpu()


def test_ioi_direct_logit_attribution_is_the_change_with_the_norms_frozen(gemma3_toy_ioi) -> None:
    model = gemma3_toy_ioi
    clean, _ = _answered(model, "discovery")
    attributions = direct_logit_attributions(model, clean)  # {"IO", "S"}: [layer, head]
    rows, end = torch.arange(len(clean)), clean.positions["END"]
    for role, token in (("IO", clean.io_token), ("S", clean.s_token)):
        removed = _frozen_norm_removals(
            model,
            clean.tokens,
            lambda logits, token=token: logits[rows, end, token] - logits[rows, end].mean(-1),
        )  # the logit against the mean logit over the vocabulary
        torch.testing.assert_close(removed, -attributions[role][-1], atol=ATOL, rtol=0)


def test_retrieval_direct_attribution_is_the_change_with_the_norms_frozen(gemma3_text) -> None:
    model = gemma3_text
    prompts = make_retrieval_prompts(model, 8, 4, "discovery", seed=0)
    _, direct = attention_and_direct(model, prompts)  # [layer, head], along answer - best other value
    with torch.no_grad():
        candidate = prompts.candidate_logits(model(prompts.tokens))
    rows = torch.arange(len(prompts))
    other = prompts.candidates[rows, candidate.scatter(1, prompts.queried[:, None], float("-inf")).argmax(1)]
    end = prompts.positions["END"]
    removed = _frozen_norm_removals(
        model, prompts.tokens, lambda logits: logits[rows, end, prompts.answer] - logits[rows, end, other]
    )
    torch.testing.assert_close(removed, -direct[-1], atol=ATOL, rtol=0)


def test_the_ioi_circuit_runs_on_a_post_norm_model_and_its_report_states_the_linearisation(gemma3_toy_ioi):
    """Every stage (path patching, classes, evaluation, held-out validation) on a random Gemma 3, with
    thresholds that let heads through; the report says how the heads' attributions were read."""
    model = gemma3_toy_ioi
    loose = dict(effect_z=0.0, min_effect=0.0, min_share=0.0, attention_z=0.0, min_attention=0.0)
    finding = find_ioi_circuit(
        model, prompts=_answered(model, "discovery"), heldout=_answered(model, "heldout"), **loose
    )
    result = finding.extras
    assert result.heads and result.evaluation is not None and result.heldout is not None and finding.classes
    heads = [h for heads in result.class_heads.values() for h in heads]
    assert all(math.isfinite(v) for h in heads for v in h.direct_logit_attribution.values())
    text = " ".join(render_markdown(finding_report(finding)).split())
    assert "Direct logit attribution: each head's share of its layer's attention output with the " in text
    assert "post-attention norm (ln1_post) frozen at its scale in the clean run" in text


def test_retrieval_runs_on_a_post_norm_model_and_its_report_states_the_linearisation(gemma3_text) -> None:
    settings = RetrievalSettings(
        n_prompts=8, n_heldout=8, n_exact=4, n_random=1, n_two_hop=4, heldout_facts=(3,)
    )
    result = find_retrieval_circuit(gemma3_text, settings, induction_heads=[(1, 0)])
    assert [c.name for c in result.classes][-1] == "induction" and math.isfinite(
        result.extras.heldout.accuracy
    )
    text = " ".join(render_markdown(finding_report(result)).split())
    assert "post-attention norm (ln1_post) frozen at its scale in the clean run" in text


def test_weight_scores_read_the_post_attention_norm_weight(gemma3) -> None:
    """`interp heads`' copying and K-composition scores are those of the dense circuits with each
    norm's weight in place: ln1_post's between W_O and the residual stream, and the q/k norms' (the
    unembedding centred over the vocabulary)."""
    _, model = gemma3
    d_model = model.cfg.d_model
    post = [block.ln1_post.weight(d_model) for block in model.blocks]
    copying = copying_scores(model)
    W_U = model.W_U.detach() * model.ln_final.weight(d_model)[:, None]
    W_U = W_U - W_U.mean(-1, keepdim=True)  # the logits against their mean over the vocabulary
    for layer, block in enumerate(model.blocks):
        W_V = model.W_V[layer].detach() * block.ln1.weight(d_model)[None, :, None]
        full = (
            model.W_E.detach() @ W_V @ (model.W_O[layer].detach() * post[layer]) @ W_U
        )  # [head, vocab, vocab]
        eig = torch.linalg.eigvals(full.double())
        torch.testing.assert_close(
            copying[layer].double(), eig.sum(-1).real / eig.abs().sum(-1), atol=1e-4, rtol=0
        )
    sources = [(0, 1), (1, 2)]
    k_composition = k_composition_scores(model, sources)
    ln1 = [block.ln1.weight(d_model)[:, None] for block in model.blocks]
    for layer, head in [(1, 0), (2, 3)]:
        attn, kv_head = model.blocks[layer].attn, head // (model.cfg.n_heads // model.cfg.n_kv_heads)
        Q = model.W_Q[layer, head].detach() * ln1[layer] * attn.q_ln.weight(0)[head]  # q/k norms' weights too
        K = model.W_K[layer, head].detach() * ln1[layer] * attn.k_ln.weight(0)[kv_head]
        QK = Q @ K.T
        values = []
        for lp, hp in sources:
            if lp < layer:
                OV = (model.W_V[lp, hp].detach() * ln1[lp]) @ (model.W_O[lp, hp].detach() * post[lp])
                values.append((QK @ OV.T).norm() / (QK.norm() * OV.norm()))
        assert float(k_composition[layer, head]) == pytest.approx(float(max(values)), rel=1e-4)


def test_the_function_vector_sums_what_the_heads_write_to_the_residual_stream(gemma3_text, smollm2) -> None:
    """Every head of a layer in the vector: the mean of that layer's attention output at the last token
    (less its bias, none here), which the post-norm scales per prompt."""
    model = gemma3_text
    pairs = {
        name: split_pairs(single_token_pairs(smollm2, ICL_TASKS[name]))[0]
        for name in ("antonym", "present_past")
    }
    prompts = task_prompts(model, pairs, n_prompts=3, n_shots=3, seed=0)
    means = mean_head_outputs(model, prompts)
    assert all(block.attn.b_O is None for block in model.blocks)
    _, cache = model.run_with_cache(prompts.clean)
    rows = torch.arange(len(prompts.clean))
    for layer in range(model.cfg.n_layers):
        vectors = function_vector(
            means, [(layer, head) for head in range(model.cfg.n_heads)]
        )  # [task, d_model]
        out = cache["attn_out", layer][rows, prompts.clean_last]  # [batch, d_model]
        expected = torch.stack(
            [out[prompts.task_index == task].mean(0) for task in range(len(prompts.tasks))]
        )
        torch.testing.assert_close(vectors, expected, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------
# A 262k vocabulary makes the unembedding the costliest part of a run: logits only where read.


def test_cached_runs_without_logits_cache_the_same_activations(gemma3) -> None:
    _, model = gemma3
    tokens = _tokens(model, 1)
    names = [*start_names(model), "ln_final.hook_scale"]
    logits, with_logits = cached_run(model, tokens, names)
    none, without = cached_run(model, tokens, names, logits=False)
    assert none is None and logits.shape == (*tokens.shape, model.cfg.d_vocab)
    assert with_logits.keys() == without.keys()
    for name, value in with_logits.items():
        torch.testing.assert_close(without[name], value, atol=0, rtol=0)


def test_the_ioi_clean_run_makes_logits_at_end_only(gemma3_toy_ioi) -> None:
    model = gemma3_toy_ioi
    clean, _ = _answered(model, "discovery")
    logits, cache = end_logits_and_cache(model, clean)
    rows, end = torch.arange(len(clean)), clean.positions["END"]
    made = ~logits.isnan().all(-1)  # [batch, pos]
    assert made.sum(-1).eq(1).all() and made[rows, end].all()
    torch.testing.assert_close(logits[rows, end], model(clean.tokens)[rows, end], atol=ATOL, rtol=0)
    assert cache["ln_final.hook_scale"].shape[:2] == clean.tokens.shape  # the final norm at every position


def test_reports_say_when_attributions_are_of_logits_before_a_soft_cap(gemma3) -> None:
    """Gemma 2 soft-caps its logits: the attributions that class heads are of the logits before the cap."""
    gemma2 = interp.load_model(_random_hf_model(HF_CONFIGS["gemma2-softcap-sliding"]()))
    assert "before their soft cap (0.5 * tanh(x / 0.5))" in direct_attribution_linearisation(gemma2.cfg)
    assert "soft cap" not in direct_attribution_linearisation(gemma3[1].cfg)
