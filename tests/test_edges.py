"""Edge circuits: the graph, the edge-level forward pass, EAP / EAP-IG / exact edge scores, faithfulness.

References: hand-built path patching with our hooks, TransformerLens 4.3's edge-level
`attribution_patch` on a TransformerBridge with the same weights, and models with a planted circuit.
"""

from __future__ import annotations

import pytest
import torch
import transformers

import interp
from interp import edges
from interp.edges import attribution
from interp.interventions.ablation import Replacement, ablation_interventions
from interp.interventions.engine import Intervention, Site, cached_run, site_mask
from interp.model.tokens import record_padding

ATOL = 1e-4


def _random_model(seed: int = 0, **overrides) -> interp.HookedTransformer:
    """A small random model with weights large enough that edges matter."""
    values = dict(n_layers=2, d_model=32, n_heads=4, d_vocab=29, n_ctx=16, init_std=0.15)
    values.update(overrides)
    model = interp.HookedTransformer(interp.Config(**values))
    model.init_weights(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # non-trivial norms and biases, so a wrong wiring cannot hide
        for name, param in model.named_parameters():
            last = name.split(".")[-1]
            if last in ("w", "b") or last.startswith("b_"):
                param.add_(torch.randn(param.shape, generator=generator) * 0.1)
    return model.eval()


ARCHITECTURES = {
    "gpt2": {},
    "llama-gqa": dict(
        n_kv_heads=2, normalization="rmsnorm", positional="rotary", gated_mlp=True, activation="silu",
        qkv_bias=False, attn_out_bias=False, mlp_bias=False,
    ),
    "parallel": dict(parallel_residual=True, positional="rotary"),
    "attn-only": dict(attn_only=True),
    # Post-norms: a head writes its share of the normalised attention output.
    "gemma2-like": dict(post_norm=True, normalization="rmsnorm", positional="rotary", n_kv_heads=2),
    "olmo2-like": dict(
        pre_norm=False, post_norm=True, normalization="rmsnorm", positional="rotary", qk_norm="all_heads"
    ),
    "one-head": dict(n_heads=1),  # a layer's heads are one writer group of one head
    # Positions added to the queries' and keys' inputs only: no writer of the residual stream.
    "shortformer": dict(positional="shortformer"),
    "bidirectional": dict(causal=False),
}  # fmt: skip


def _pairs(vocab: int, lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clean and corrupted prompts of different lengths, right-padded; each prompt's last position."""
    generator = torch.Generator().manual_seed(seed)
    clean = [torch.randint(1, vocab, (n,), generator=generator).tolist() for n in lengths]
    corrupted = [
        row[:1] + torch.randint(1, vocab, (len(row) - 1,), generator=generator).tolist() for row in clean
    ]
    corrupted[0] = corrupted[0][:-1]  # one corrupted prompt shorter than its clean prompt
    clean_tokens, corrupted_tokens = edges.pad_pair(clean, corrupted)
    return clean_tokens, corrupted_tokens, torch.tensor(lengths) - 1


def _metric(n_prompts: int, vocab: int, pos: torch.Tensor) -> edges.PromptMetric:
    generator = torch.Generator().manual_seed(7)
    correct = torch.randint(vocab, (n_prompts,), generator=generator)
    incorrect = (correct + 1 + torch.randint(vocab - 1, (n_prompts,), generator=generator)) % vocab
    return edges.logit_diff_metric(correct, incorrect, pos)


# --- the graph --------------------------------------------------------------------------------


def test_edge_counts_follow_eap_ig_convention() -> None:
    gpt2_small = interp.Config(n_layers=12, d_model=768, n_heads=12, d_vocab=50257, n_ctx=1024)
    assert edges.edge_graph(gpt2_small).n_edges == 32491  # EAP-IG's and MIB's count
    # Grouped-query attention: keys and values are read once per key/value head.
    smollm2 = interp.Config(n_layers=30, d_model=576, n_heads=9, n_kv_heads=3, d_vocab=49152, n_ctx=8192)
    graph = edges.edge_graph(smollm2)
    per_layer_readers = 9 + 2 * 3
    expected = sum(per_layer_readers * (1 + 10 * layer) + (1 + 10 * layer + 9) for layer in range(30)) + 301
    assert graph.n_edges == expected == 70651
    assert "a0.kv2<v>" in graph.readers and "a0.h8<q>" in graph.readers
    assert int(graph.valid.sum()) == graph.n_edges


def test_parallel_mlp_does_not_read_its_own_layers_heads() -> None:
    graph = edges.edge_graph(
        interp.Config(n_layers=2, d_model=32, n_heads=4, d_vocab=9, n_ctx=8, parallel_residual=True)
    )
    sequential = edges.edge_graph(interp.Config(n_layers=2, d_model=32, n_heads=4, d_vocab=9, n_ctx=8))
    assert sequential.n_edges - graph.n_edges == 2 * 4
    assert not graph.valid[graph.writers.index("a1.h0"), graph.readers.index("m1")]
    assert graph.valid[graph.writers.index("a0.h0"), graph.readers.index("m1")]


# --- the edge-level forward pass ---------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_all_edges_kept_is_the_model_and_none_kept_is_the_corrupted_run(arch: str) -> None:
    model = _random_model(**ARCHITECTURES[arch])
    clean, corrupted, pos = _pairs(model.cfg.d_vocab, [7, 5, 6])
    metric = _metric(3, model.cfg.d_vocab, pos)
    graph = edges.edge_graph(model)
    ablated = edges.ablated_outputs(model, clean, corrupted)
    keep = torch.stack(
        [torch.ones(graph.n_writers, graph.n_readers), torch.zeros(graph.n_writers, graph.n_readers)]
    )
    values = edges.run_circuits(model, clean, keep, ablated, metric)
    ids = torch.arange(3)
    with torch.no_grad():
        torch.testing.assert_close(values[0], metric(model(clean), ids), atol=ATOL, rtol=0)
        torch.testing.assert_close(values[1], metric(model(corrupted), ids), atol=ATOL, rtol=0)


def test_mean_and_zero_ablation_of_every_edge_forget_the_prompt() -> None:
    model = _random_model()
    clean, corrupted, _ = _pairs(model.cfg.d_vocab, [6, 6, 6, 6])
    graph = edges.edge_graph(model)
    first_logit = lambda logits, ids: logits[:, -1, 0]  # noqa: E731
    for ablation in ("mean", "zero"):
        ablated = edges.ablated_outputs(model, clean, corrupted, ablation)
        empty = torch.zeros(1, graph.n_writers, graph.n_readers)
        out = edges.run_circuits(model, clean, empty, ablated, first_logit)[0]
        assert out.std() < 1e-5, ablation  # every prompt sees the same inputs
        full = edges.run_circuits(model, clean, empty + 1, ablated, first_logit)[0]
        assert full.std() > 1e-2


def test_mean_ablation_of_padded_prompts_averages_their_real_tokens_only() -> None:
    """With the corrupted prompts' mask, each position's mean is over the prompts real there, so what
    the padding holds changes nothing; without it, it does."""
    model = _random_model()
    lengths = [7, 4, 6, 3]
    generator = torch.Generator().manual_seed(3)
    rows = [torch.randint(1, model.cfg.d_vocab, (n,), generator=generator).tolist() for n in lengths]
    mask = (torch.arange(7) < torch.tensor(lengths)[:, None]).long()
    circuit = torch.rand(edges.edge_graph(model).n_writers, edges.edge_graph(model).n_readers) < 0.5
    metric = _metric(4, model.cfg.d_vocab, torch.tensor(lengths) - 1)
    means, faithful = {}, {}
    for pad in (0, 5):
        clean, corrupted = edges.pad_pair(rows, [row[::-1] for row in rows], pad)
        outputs = edges.writer_outputs(model, corrupted)  # [writer, batch, pos, d_model]
        means[pad] = edges.ablated_outputs(model, clean, corrupted, edges.Ablation("mean", mask=mask))
        expected = torch.stack([outputs[:, mask[:, p].bool(), p].mean(1) for p in range(7)], 1)[:, None]
        torch.testing.assert_close(means[pad], expected)
        faithful[pad] = edges.faithfulness(
            model, clean, corrupted, metric, circuit, ablation=edges.Ablation("mean", mask=mask)
        )
    torch.testing.assert_close(means[0], means[5])  # the padding's tokens do not matter
    torch.testing.assert_close(faithful[0].values, faithful[5].values)
    unmasked = edges.ablated_outputs(model, clean, corrupted, "mean")  # the pad = 5 prompts
    recorded = record_padding(corrupted.clone(), mask)  # ids as model.to_tokens returns them
    torch.testing.assert_close(edges.ablated_outputs(model, clean, recorded, "mean"), means[5])
    assert not torch.allclose(unmasked[:, :, 3:], means[5][:, :, 3:])  # without the mask, they would
    with pytest.raises(ValueError, match=r"Ablation.mask is \(4, 6\)"):
        edges.ablated_outputs(model, clean, corrupted, edges.Ablation("mean", mask=mask[:, :6]))
    with pytest.raises(ValueError, match="edge ablations take no groups"):
        edges.ablated_outputs(
            model,
            clean,
            corrupted,
            edges.Ablation("mean", reference=corrupted, groups=torch.zeros(4, dtype=torch.long)),
        )
    with pytest.raises(ValueError, match=r"without a reference"):
        edges.ablated_outputs(model, clean, corrupted, edges.Ablation("counterfactual", reference=corrupted))
    with pytest.raises(ValueError, match=r"reference tokens \[n, pos\] .* not a cache"):
        edges.ablated_outputs(model, clean, corrupted, edges.Ablation("mean", reference={"x": corrupted}))
    with_reference = edges.Ablation("mean", reference=corrupted)  # per prompt and pruning: the corrupted
    with pytest.raises(ValueError, match="without a reference"):
        edges.prompt_scores(model, clean, corrupted, metric, "eap", ablation=with_reference)
    with pytest.raises(ValueError, match="without a reference"):
        edges.prune_edges(model, clean, corrupted, metric, ablation=with_reference)
    with pytest.raises(TypeError, match="reference_mask"):  # the loose keyword of old code
        edges.faithfulness(model, clean, corrupted, metric, circuit, ablation="mean", reference_mask=mask)


# --- exact edge patching = path patching built by hand ------------------------------------------


def _hand_path_patch(model, clean, corrupted, metric, writer: str, reader: str) -> float:
    """Patch the corrupted writer's output into one reader's input only, with our own hooks."""
    cfg = model.cfg
    ids = torch.arange(clean.shape[0])
    kinds = ("hook_result", "hook_mlp_out", "hook_embed", "hook_pos_embed", "ln1_post.hook_scale")
    names = lambda n: n.endswith(kinds)  # noqa: E731
    with torch.no_grad(), model.settings(use_attn_result=True, use_split_qkv_input=True):
        _, clean_cache = model.run_with_cache(clean, names_filter=names)
        _, corrupted_cache = model.run_with_cache(corrupted, names_filter=names)

        def output(cache, name: str) -> torch.Tensor:
            if name == "input":
                return cache["hook_embed"] + (cache["hook_pos_embed"] if cfg.positional == "learned" else 0)
            if name.startswith("m"):
                return cache[f"blocks.{name[1:]}.hook_mlp_out"]
            layer, head = name[1:].split(".h")
            result = cache[f"blocks.{layer}.attn.hook_result"][:, :, int(head)]
            if not cfg.post_norm:
                return result
            post_norm = model.blocks[int(layer)].ln1_post  # RMSNorm at this run's scale
            return result / cache[f"blocks.{layer}.ln1_post.hook_scale"] * post_norm.w

        delta = output(corrupted_cache, writer) - output(clean_cache, writer)
        if reader == "logits":
            hook_name, index = f"blocks.{cfg.n_layers - 1}.hook_resid_post", None
        else:
            node, kind = reader[:-3], reader[-2]
            layer, index = node[1:].split(".h") if ".h" in node else node[1:].split(".kv")
            hook_name, index = f"blocks.{layer}.hook_{kind}_input", int(index)

        def patch(x: torch.Tensor, hook) -> torch.Tensor:
            x = x.clone()
            if index is None:
                x += delta
            else:
                x[:, :, index] += delta
            return x

        patched = model.run_with_hooks(clean, fwd_hooks=[(hook_name, patch)])
        return float((metric(patched, ids) - metric(model(clean), ids)).mean())


@pytest.mark.parametrize("arch", ["gpt2", "llama-gqa", "gemma2-like"])
def test_exact_edge_patching_equals_hand_built_path_patching(arch: str) -> None:
    model = _random_model(**ARCHITECTURES[arch])
    clean, corrupted, pos = _pairs(model.cfg.d_vocab, [7, 5, 6])
    metric = _metric(3, model.cfg.d_vocab, pos)
    exact = edges.edge_attribution(model, clean, corrupted, metric, method="exact")
    graph = exact.graph
    kv = "kv" if model.cfg.n_kv_heads < model.cfg.n_heads else "h"
    checked = [
        ("input", "a0.h2<q>"),
        ("a0.h1", "a1.h2<q>"),
        ("a0.h3", f"a1.{kv}1<k>"),
        ("m0", f"a1.{kv}0<v>"),
        ("a0.h0", "logits"),
        ("m1", "logits"),
        ("input", "logits"),
    ]
    for writer, reader in checked:
        expected = _hand_path_patch(model, clean, corrupted, metric, writer, reader)
        got = float(exact.scores[graph.writers.index(writer), graph.readers.index(reader)])
        assert abs(got - expected) < ATOL, (writer, reader, got, expected)
    assert exact.scores.abs().max() > 0.05  # the edges matter, so the comparison means something


# --- EAP = TransformerLens's edge attribution ---------------------------------------------------


def test_eap_equals_transformer_lens_edge_attribution_patch() -> None:
    """TL scores (a_clean - a_corrupt) . grad at the corrupt run, per position; ours (a_ablated - a_clean)
    . grad at the clean run, summed over positions: swapping the roles of the prompts makes them equal."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.tools.analysis import attribution_patching as tl_ap

    torch.manual_seed(0)
    vocab = 61
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=vocab, n_positions=32, initializer_range=0.2
    )
    hf_model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if "ln" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    ours = interp.from_hf(hf_model)  # before the bridge wraps hf_model's modules
    word_level = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_level, unk_token="t0", pad_token="t0"
    )
    bridge = TransformerBridge.boot_transformers("gpt2", hf_model=hf_model, tokenizer=tokenizer).eval()

    generator = torch.Generator().manual_seed(1)
    clean = torch.randint(vocab, (3, 6), generator=generator)
    corrupted = clean.clone()
    corrupted[:, 1] = torch.randint(vocab, (3,), generator=generator)
    tl_config = tl_ap.EdgeAttributionConfig(granularity="edge")
    tl = tl_ap.attribution_patch(bridge, clean, corrupted, lambda lg: lg[0, -1, 5] - lg[0, -1, 7], tl_config)
    metric = lambda logits, ids: logits[:, -1, 5] - logits[:, -1, 7]  # noqa: E731
    mine = edges.edge_attribution(ours, corrupted, clean, metric, method="eap")

    graph = mine.graph
    writer_names = {"embed": "input", "attn_head_out": "a{layer}.h{head}", "mlp_out": "m{layer}"}
    reader_names = {"mlp_in": "m{layer}", "logits": "logits"}
    reader_names.update({f"{x}_input": f"a{{layer}}.h{{head}}<{x}>" for x in "qkv"})

    def writer(node) -> str:
        return writer_names[node.kind].format(layer=node.layer, head=node.head)

    def reader(node) -> str:
        return reader_names[node.kind].format(layer=node.layer, head=node.head)

    expected = torch.zeros_like(mine.scores)
    for (w, r), score in tl.edge_scores.items():  # per position: sum them
        expected[graph.writers.index(writer(w)), graph.readers.index(reader(r))] += score
    assert len({(writer(w), reader(r)) for w, r in tl.edge_scores}) == graph.n_edges
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(mine.scores, expected, atol=ATOL, rtol=0)


# --- integrated gradients ---------------------------------------------------------------------


def test_eap_ig_inputs_is_complete_over_the_input_edges() -> None:
    """Integrated gradients along the input: the input's edges sum to m(corrupted) - m(clean)."""
    model = _random_model(**ARCHITECTURES["llama-gqa"])
    clean, corrupted, pos = _pairs(model.cfg.d_vocab, [6, 6, 6])
    metric = _metric(3, model.cfg.d_vocab, pos)
    ids = torch.arange(3)
    with torch.no_grad():
        gap = float((metric(model(corrupted), ids) - metric(model(clean), ids)).mean())
    ig = edges.edge_attribution(model, clean, corrupted, metric, method="eap-ig", steps=100)
    total = float(ig.scores[0].sum())
    assert abs(gap) > 0.5
    assert abs(total - gap) < 0.02 * abs(gap) + 1e-3, (total, gap)
    eap = edges.edge_attribution(model, clean, corrupted, metric, method="eap")
    assert abs(float(eap.scores[0].sum()) - gap) > abs(total - gap)  # one step is a worse estimate


# --- planted circuits -------------------------------------------------------------------------

TOK, POS, COPY, OUT = 0, 8, 16, 24  # subspaces of the planted model's residual stream (8 dims each)


def _planted_model(seed: int = 0) -> interp.HookedTransformer:
    """Two layers, two heads: a0.h0 moves token 0 to every position (keys: position 0's feature),
    a1.h0 reads that copy everywhere (uniform attention) and writes the answer direction the unembedding
    reads. Heads h1 are random. Planted edges: input -> a0.h0<v>, a0.h0 -> a1.h0<v>, a1.h0 -> logits."""
    cfg = interp.Config(
        n_layers=2, d_model=64, n_heads=2, d_head=32, d_vocab=8, n_ctx=8, attn_only=True,
        normalization="rmsnorm", attn_out_bias=False,
    )  # fmt: skip
    model = interp.HookedTransformer(cfg)
    model.init_weights(seed=seed)
    eye = torch.eye(8)
    with torch.no_grad():
        model.W_E.zero_()
        model.W_E[:, TOK : TOK + 8] = eye
        model.W_pos.zero_()
        model.W_pos[:, POS : POS + 8] = eye
        model.W_U.zero_()
        model.W_U[OUT : OUT + 8] = 2 * eye
        first, second = model.blocks[0].attn, model.blocks[1].attn
        for attn in (first, second):
            for param in (attn.W_Q, attn.W_K, attn.W_V, attn.W_O, attn.b_Q, attn.b_K, attn.b_V):
                param[0].zero_()
            for param in (attn.W_Q, attn.W_K, attn.W_V, attn.W_O):
                param[1].mul_(5)  # random heads, strong enough to be noticed
        first.b_Q[0, 0] = 10.0  # every query looks for position 0's key feature
        first.W_K[0, POS, 0] = 3.0
        first.W_V[0, TOK : TOK + 8, :8] = eye
        first.W_O[0, :8, COPY : COPY + 8] = eye
        second.W_V[0, COPY : COPY + 8, :8] = eye
        second.W_O[0, :8, OUT : OUT + 8] = eye
    return model.eval()


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_reader_gradients_from_one_backward_pass_equal_the_edge_level_forward(arch: str) -> None:
    """Without interventions EAP takes readers' gradients from an ordinary backward pass and each
    input norm's VJP; they must equal the gradients of the reader-by-reader edge-level forward."""
    model = _random_model(seed=2, **ARCHITECTURES[arch])
    clean, _, last = _pairs(model.cfg.d_vocab, [7, 9, 8])
    metric, ids, graph = _metric(3, model.cfg.d_vocab, last), torch.arange(3), edges.edge_graph(model)
    fast = torch.zeros(graph.n_readers, *clean.shape, model.cfg.d_model)
    edge_level = torch.zeros_like(fast)
    attribution._add_reader_grads(model, graph, clean, metric, ids, fast)
    attribution._add_reader_grads(model, graph, clean, metric, ids, edge_level, edges.EdgeRun())
    assert float(edge_level.abs().amax(dim=(1, 2, 3)).min()) > 0  # every reader has a gradient
    torch.testing.assert_close(fast, edge_level, atol=ATOL * max(1.0, float(edge_level.abs().max())), rtol=0)


@pytest.mark.parametrize("method", ["eap", "eap-ig", "eap-ig-activations", "exact"])
def test_base_interventions_are_made_in_every_run(method: str) -> None:
    """Scores under base interventions (here a head set to another prompt's z, per prompt, and an MLP
    zeroed at one position per prompt) equal the scores of one batch under the same interventions
    written as hooks, the base's per-prompt values taken row by row in batches of two prompts."""
    model = _random_model(seed=2)
    clean, corrupted, pos = _pairs(model.cfg.d_vocab, [6, 5, 6, 4, 6])
    metric = _metric(5, model.cfg.d_vocab, pos)
    z0, mlp0 = interp.act_name("z", 0), interp.act_name("mlp_out", 0)
    _, other = cached_run(model, clean.roll(1, 0), [z0])
    base = [Intervention(Site(z0, head=1), other), Intervention(Site(mlp0, pos=pos - 1), torch.zeros(()))]
    batch_size = 2
    if method == "exact":  # K circuits run at once on stacked copies of the prompts: values for all
        base, batch_size = [Intervention(Site(z0, head=1), other[z0].mean(0))], 64
    hooks = [(iv.site.name, lambda act, hook, iv=iv: torch.where(
        site_mask(iv.site, act.shape), iv.values(act), act)) for iv in base]  # fmt: skip
    kwargs = dict(method=method, steps=2)
    scores = edges.edge_attribution(
        model, clean, corrupted, metric, batch_size=batch_size, base=base, **kwargs
    )
    kwargs |= dict(batch_size=64, base=())
    with model.hooks(fwd_hooks=hooks):
        expected = edges.edge_attribution(model, clean, corrupted, metric, **kwargs)
    torch.testing.assert_close(scores.scores, expected.scores, atol=1e-5, rtol=1e-4)
    if method == "eap":
        plain = edges.edge_attribution(model, clean, corrupted, metric, **kwargs)
        assert not torch.allclose(scores.scores, plain.scores, atol=1e-4)


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_scores_by_reader_position_equal_one_run_per_position(method: str) -> None:
    """One backward pass scored at several reader positions equals a run per position, and the
    positions add up: scores at every position are the sum of the scores at each position."""
    model = _random_model(seed=3, **ARCHITECTURES["llama-gqa"])
    clean, corrupted, last = _pairs(model.cfg.d_vocab, [7, 9, 8])
    metric = _metric(3, model.cfg.d_vocab, last)
    first, middle = torch.zeros(3, dtype=torch.long), torch.tensor([3, 4, 2])
    positions = {"all": None, "first": first, "middle": middle, "last": last}
    by_position = edges.edge_attribution_by_position(
        model, clean, corrupted, metric, positions, method, steps=3, batch_size=2
    )
    for name, pos in positions.items():
        alone = edges.edge_attribution(
            model, clean, corrupted, metric, method, 3, batch_size=2, reader_pos=pos
        )
        torch.testing.assert_close(by_position[name].scores, alone.scores, atol=1e-6, rtol=0)
    every = sum(
        edges.edge_attribution(
            model, clean, corrupted, metric, method, 3, reader_pos=torch.full((3,), p)
        ).scores
        for p in range(clean.shape[1])
    )
    torch.testing.assert_close(every, by_position["all"].scores, atol=1e-5, rtol=0)
    assert by_position["middle"].scores.abs().sum() > 0


def test_eap_ig_finds_a_planted_circuit() -> None:
    model = _planted_model()
    generator = torch.Generator().manual_seed(3)
    n = 16
    answer = torch.randint(4, (n,), generator=generator)
    other = (answer + 1 + torch.randint(3, (n,), generator=generator)) % 4
    filler = torch.randint(4, 8, (n, 5), generator=generator)
    clean = torch.cat([answer[:, None], filler], 1)
    corrupted = torch.cat([other[:, None], filler], 1)
    metric = edges.logit_diff_metric(answer, other)
    with torch.no_grad():
        assert float(metric(model(clean), torch.arange(n)).mean()) > 1.0  # the model does the task

    scores = edges.edge_attribution(model, clean, corrupted, metric, method="eap-ig", steps=5)
    graph = scores.graph
    planted = torch.zeros(graph.n_writers, graph.n_readers, dtype=torch.bool)
    for writer, reader in [("input", "a0.h0<v>"), ("a0.h0", "a1.h0<v>"), ("a1.h0", "logits")]:
        planted[graph.writers.index(writer), graph.readers.index(reader)] = True
    assert edges.auroc(scores.scores.abs()[graph.valid], planted[graph.valid]) >= 0.95

    circuit = edges.top_circuit(scores, 3)
    assert torch.equal(circuit, planted)
    assert edges.node_circuit(graph, circuit) == ["input", "a0.h0", "a1.h0", "logits"]
    result = edges.faithfulness(model, clean, corrupted, metric, circuit)
    assert float(result.faithfulness[0]) >= 0.9
    low, high = result.ci()
    assert low[0] <= result.faithfulness[0] <= high[0]
    random = edges.faithfulness(
        model, clean, corrupted, metric, edges.top_circuit(edges.random_scores(graph), 3)
    )
    assert float(random.faithfulness[0]) < 0.5


def test_faithfulness_curve_and_mib_summaries() -> None:
    model = _planted_model()
    generator = torch.Generator().manual_seed(4)
    answer = torch.randint(4, (8,), generator=generator)
    other = (answer + 1) % 4
    filler = torch.randint(4, 8, (8, 5), generator=generator)
    clean, corrupted = torch.cat([answer[:, None], filler], 1), torch.cat([other[:, None], filler], 1)
    metric = edges.logit_diff_metric(answer, other)
    scores = edges.edge_attribution(model, clean, corrupted, metric, method="eap-ig")
    fractions = (0.02, 0.05, 0.1, 0.5, 1.0)
    curve = edges.faithfulness_curve(model, clean, corrupted, metric, scores, fractions)
    f = curve.faithfulness
    assert abs(float(f[-1]) - 1) < 1e-4  # every edge kept: the model itself
    assert curve.n_edges == sorted(curve.n_edges) and curve.n_edges[-1] == scores.graph.n_edges
    assert curve.cpr_abs == pytest.approx(edges.area_under(fractions, f.tolist()))
    # MIB's leaderboard: CPR over circuits of the edges that help most (signed), CMD over |score|.
    signed = curve.signed_result.faithfulness
    assert curve.cpr == pytest.approx(edges.area_under(fractions, signed.tolist()))
    distance = [abs(1 - x) for x in signed.tolist()]
    assert curve.cmd_signed == pytest.approx(edges.area_under(fractions, distance))
    helpful = edges.top_circuit(scores, 3, connected=False, signed=True)
    kept = scores.scores[helpful]
    assert kept.max() <= scores.scores[scores.graph.valid & ~helpful].min()  # the 3 most negative scores
    assert curve.cpr > curve.random_cpr and curve.cmd < curve.random_cmd
    mib = edges.mib_json(scores, edges.top_circuit(scores, 3), model.cfg)
    assert len(mib["edges"]) == scores.graph.n_edges
    assert mib["edges"]["a1.h0->logits"]["in_graph"] and not mib["edges"]["a1.h1->logits"]["in_graph"]


def test_the_curve_evaluated_in_shared_runs_equals_each_circuit_alone() -> None:
    """The curve runs each distinct circuit once with the ablated outputs, the model's values and the
    empty circuit shared; every value equals the circuit's own edge-level run to 1e-5."""
    model = _random_model(seed=5)
    clean, corrupted, last = _pairs(model.cfg.d_vocab, [7, 9, 8, 6])
    metric = _metric(4, model.cfg.d_vocab, last)
    scores = edges.edge_attribution(model, clean, corrupted, metric, method="eap")
    fractions = (0.01, 0.05, 0.2, 0.5, 1.0)
    calls = []
    curve = edges.faithfulness_curve(
        model, clean, corrupted, metric, scores, fractions, batch_size=3,
        progress=lambda stage, done, total: calls.append((stage, done, total)),
    )  # fmt: skip
    ablated = edges.ablated_outputs(model, clean, corrupted)
    graph = scores.graph
    for result, ranking in [(curve.result, scores), (curve.signed_result, scores),
                            (curve.random, edges.random_scores(graph))]:  # fmt: skip
        signed = result is curve.signed_result
        for k, fraction in enumerate(fractions):
            circuit = edges.top_circuit(ranking, int(fraction * graph.n_edges), signed=signed)
            alone = edges.run_circuits(model, clean, circuit[None].float(), ablated, metric)[0]
            torch.testing.assert_close(result.values[k], alone, atol=1e-5, rtol=0)
    empty = edges.run_circuits(
        model, clean, torch.zeros(1, graph.n_writers, graph.n_readers), ablated, metric
    )
    torch.testing.assert_close(curve.result.empty, empty[0], atol=1e-5, rtol=0)
    assert float(curve.faithfulness[-1]) == 1.0  # every edge kept is the model itself
    runs = calls[-1][2]
    assert runs < 3 * len(fractions) + 1 and calls[-1][1] == runs  # the 3 circuits of all edges: none
    soft = 0.5 * edges.top_circuit(scores, 10).float()  # a soft mask is no circuit: refused, not rounded
    with pytest.raises(ValueError, match="0 and 1 only"):
        edges.faithfulness(model, clean, corrupted, metric, soft)


# --- bad input ---------------------------------------------------------------------------------


def test_bad_input_gets_a_clear_error() -> None:
    model = _random_model()
    metric = lambda logits, ids: logits[:, -1, 0]  # noqa: E731
    with pytest.raises(ValueError, match="pad_pair"):
        edges.edge_attribution(
            model, torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long), metric
        )
    with pytest.raises(ValueError, match="method"):
        edges.edge_attribution(
            model,
            torch.zeros(2, 5, dtype=torch.long),
            torch.zeros(2, 5, dtype=torch.long),
            metric,
            method="acdc",
        )
    with pytest.raises(ValueError, match="pair them"):
        edges.pad_pair([[1, 2]], [[1], [2]])


@pytest.mark.parametrize("ig_points", ["mib", "paper"])
def test_eap_ig_points_reproduce_the_reference_definition(ig_points: str) -> None:
    """EAP-IG over inputs as the reference code defines it, written out here by hand for the edge
    input -> logits: the input is interpolated from the corrupted to the clean run's embeddings at
    alpha = k/m, with k = 0..m-1 (MIB and the reference code since Feb 2025) or k = 1..m (the paper),
    and the score is (corrupted - clean input) . the mean gradient of the metric at the final residual."""
    model = _random_model()
    generator = torch.Generator().manual_seed(3)
    clean = torch.randint(1, model.cfg.d_vocab, (3, 6), generator=generator)
    corrupted = torch.cat([clean[:, :1], torch.randint(1, model.cfg.d_vocab, (3, 5), generator=generator)], 1)
    pos = torch.full((3,), 5)
    metric = _metric(3, model.cfg.d_vocab, pos)
    steps, ids = 4, torch.arange(3)
    start, final = "blocks.0.hook_resid_pre", f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    with torch.no_grad():
        clean_in = model.run_with_cache(clean, names_filter=start)[1][start]
        corrupted_in = model.run_with_cache(corrupted, names_filter=start)[1][start]
    alphas = [k / steps for k in (range(steps) if ig_points == "mib" else range(1, steps + 1))]
    gradient = torch.zeros_like(clean_in)
    for alpha in alphas:
        captured = {}

        def interpolate(act, hook, alpha=alpha):
            return corrupted_in + alpha * (clean_in - corrupted_in)

        def keep(act, hook, captured=captured):
            act.retain_grad()
            captured["final"] = act

        with model.hooks(fwd_hooks=[(start, interpolate), (final, keep)]):
            metric(model(clean), ids).sum().backward()
        gradient += captured["final"].grad / steps
    reference = float(((corrupted_in - clean_in) * gradient).sum() / 3)
    scores = edges.edge_attribution(
        model, clean, corrupted, metric, method="eap-ig", steps=steps, ig_points=ig_points
    )
    graph = scores.graph
    ours = float(scores.scores[graph.writers.index("input"), graph.readers.index("logits")])
    assert ours == pytest.approx(reference, rel=1e-4, abs=1e-6)
    other = edges.edge_attribution(
        model, clean, corrupted, metric, method="eap-ig", steps=steps,
        ig_points="paper" if ig_points == "mib" else "mib",
    )  # fmt: skip
    assert not torch.allclose(other.scores, scores.scores)  # the two conventions differ


def test_scores_do_not_depend_on_the_batch_size() -> None:
    """Counterfactual outputs are read per batch: each prompt must still meet its own corrupted run."""
    model = _random_model()
    clean, corrupted, pos = _pairs(model.cfg.d_vocab, [6, 5, 6, 4, 6])
    metric = _metric(5, model.cfg.d_vocab, pos)
    whole = edges.edge_attribution(model, clean, corrupted, metric, method="eap-ig", steps=3, batch_size=5)
    split = edges.edge_attribution(model, clean, corrupted, metric, method="eap-ig", steps=3, batch_size=2)
    assert torch.allclose(whole.scores, split.scores, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method", ["eap", "exact"])
def test_a_resample_base_gives_each_prompt_one_reference_whatever_the_batching(method: str) -> None:
    """Under a base of heads resample-ablated, each prompt reads one reference prompt's z in every run:
    the scores do not depend on how the prompts are batched (eap) nor on how many circuits' copies share
    a pass (exact: one edge per pass, batch_size=1, against the default)."""
    model = _random_model(seed=2)
    clean, corrupted, pos = _pairs(model.cfg.d_vocab, [6, 5, 6, 4, 6, 5, 6, 6])
    metric, reference = _metric(8, model.cfg.d_vocab, pos), _pairs(model.cfg.d_vocab, [6] * 6, seed=5)[0]
    resample = interp.Ablation("resample", reference=reference, seed=1)
    base = ablation_interventions(model, heads=[(0, 1), (1, 0)], ablation=resample)
    sizes = (8, 3) if method == "eap" else (64, 1)
    one, other = (edges.edge_attribution(model, clean, corrupted, metric, method=method, batch_size=size,
                                         base=base).scores for size in sizes)  # fmt: skip
    torch.testing.assert_close(one, other, atol=1e-5, rtol=1e-4)
    plain = edges.edge_attribution(model, clean, corrupted, metric, method=method, batch_size=sizes[0])
    assert not torch.allclose(one, plain.scores, atol=1e-4)  # the base changes the scores


@pytest.mark.parametrize("arch", ["gpt2", "llama-gqa", "one-head", "shortformer"])
def test_eap_ig_activations_reproduce_the_reference_definition(arch: str) -> None:
    """EAP-IG over activations as the reference code (hannamw/EAP-IG, `get_scores_ig_activations`)
    defines it, written out with hooks on the full model: for each writer group (the input, a layer's
    heads, an MLP) and k = 1..m, one run with the group's outputs set to the constant corrupted +
    k/m (clean - corrupted); gradients of the metric at every reader's input (q/k/v inputs, MLP input,
    final residual). "eap-ig-activations": every edge scores (corrupted - clean writer output) . the
    gradient summed over all runs / (runs x prompts); "-grouped": over its own writer group's runs."""
    model = _random_model(seed=4, **ARCHITECTURES[arch])
    cfg, graph = model.cfg, edges.edge_graph(model)
    clean, corrupted, pos = _pairs(cfg.d_vocab, [6, 5, 6])
    metric, ids, steps = _metric(3, cfg.d_vocab, pos), torch.arange(3), 3
    groups = ["blocks.0.hook_resid_pre"] + [
        f"blocks.{layer}.{name}"
        for layer in range(cfg.n_layers)
        for name in ("attn.hook_result", "hook_mlp_out")
    ]
    reads = [f"blocks.{layer}.hook_{x}_input" for layer in range(cfg.n_layers) for x in "qkv"]
    reads += [f"blocks.{layer}.hook_mlp_in" for layer in range(cfg.n_layers)]
    reads.append(f"blocks.{cfg.n_layers - 1}.hook_resid_post")
    settings = dict(use_attn_result=True, use_split_qkv_input=True, use_hook_mlp_in=True)
    with model.settings(**settings):
        with torch.no_grad():
            clean_acts = model.run_with_cache(clean, names_filter=groups)[1]
            corrupted_acts = model.run_with_cache(corrupted, names_filter=groups)[1]
        by_group = {}  # group -> read hook -> gradient summed over k
        for group in groups:
            by_group[group] = {}
            for k in range(1, steps + 1):
                seen = {}

                def interpolate(act, hook, k=k):
                    start, end = corrupted_acts[hook.name], clean_acts[hook.name]
                    return (start + k / steps * (end - start)).requires_grad_(True)  # a constant

                def keep(act, hook, seen=seen):
                    seen[hook.name] = act

                with model.hooks(fwd_hooks=[(group, interpolate)] + [(name, keep) for name in reads]):
                    loss = metric(model(clean), ids).sum()
                    found = torch.autograd.grad(loss, [seen[name] for name in reads], allow_unused=True)
                for name, grad in zip(reads, found, strict=True):
                    grad = torch.zeros_like(seen[name]) if grad is None else grad
                    by_group[group][name] = by_group[group].get(name, 0) + grad

    def writer_delta(w: int) -> tuple[str, torch.Tensor]:
        name = graph.writers[w]
        if name == "input":
            hook, index = groups[0], None
        elif name.startswith("m"):
            hook, index = f"blocks.{name[1:]}.hook_mlp_out", None
        else:
            layer, head = name[1:].split(".h")
            hook, index = f"blocks.{layer}.attn.hook_result", int(head)
        delta = corrupted_acts[hook] - clean_acts[hook]
        return hook, delta if index is None else delta[:, :, index]

    def reader_grad(grads: dict, r: int) -> torch.Tensor:
        name = graph.readers[r]
        if name == "logits":
            return grads[reads[-1]]
        if "<" not in name:
            return grads[f"blocks.{name[1:]}.hook_mlp_in"]
        node, kind = name[:-1].split("<")
        layer, head = node[1:].split(".")
        return grads[f"blocks.{layer}.hook_{kind}_input"][:, :, int(head.lstrip("hkv"))]

    total = {name: sum(by_group[group][name] for group in groups) for name in reads}
    reference, grouped = (
        torch.zeros(graph.n_writers, graph.n_readers),
        torch.zeros(graph.n_writers, graph.n_readers),
    )
    for w, r in graph.edges():
        hook, delta = writer_delta(w)
        reference[w, r] = (delta * reader_grad(total, r)).sum() / (3 * steps * len(groups))
        grouped[w, r] = (delta * reader_grad(by_group[hook], r)).sum() / (3 * steps)
    for method, expected in [("eap-ig-activations", reference), ("eap-ig-activations-grouped", grouped)]:
        ours = edges.edge_attribution(
            model, clean, corrupted, metric, method=method, steps=steps, batch_size=2
        )
        assert float(expected.abs().max()) > 0.05
        torch.testing.assert_close(ours.scores, expected, atol=ATOL * float(expected.abs().max()), rtol=0)
    assert not torch.allclose(reference, grouped, atol=1e-3)  # the two definitions differ
    with pytest.raises(ValueError, match="ig_points"):
        edges.edge_attribution(model, clean, corrupted, metric, method="eap-ig-activations", ig_points="mib")


@pytest.mark.parametrize("arch", ["gpt2", "llama-gqa"])
def test_max_memory_picks_the_batch_size_and_keeps_the_scores(arch: str) -> None:
    """The memory estimate covers what the backward pass really saves; a budget of two prompts runs
    batches of two (seen by the progress callback) with the scores of one batch of all prompts."""
    model = _random_model(**ARCHITECTURES[arch])
    clean, corrupted, pos = _pairs(model.cfg.d_vocab, [6, 5, 6, 4, 6])
    metric, graph, n_pos = _metric(5, model.cfg.d_vocab, pos), edges.edge_graph(model), clean.shape[1]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = max(saved.get(storage.data_ptr(), 0), storage.nbytes())
        return tensor

    into = torch.zeros(graph.n_readers, *clean.shape, model.cfg.d_model)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        attribution._add_reader_grads(model, graph, clean, metric, torch.arange(5), into)
    assert sum(saved.values()) <= attribution._saved_bytes_per_token(model, n_pos) * clean.numel()

    per_prompt = attribution._bytes_per_prompt(model, graph, n_pos, "eap-ig")
    calls: list[tuple[str, int, int]] = []
    budget = edges.edge_attribution(
        model, clean, corrupted, metric, steps=3, max_memory=2 * per_prompt + 1,
        progress=lambda stage, done, total: calls.append((stage, done, total)),
    )  # fmt: skip
    assert calls[-1] == ("Edge scores", 9, 9)  # batches of 2, 2 and 1 prompts, 3 steps each
    whole = edges.edge_attribution(model, clean, corrupted, metric, steps=3, batch_size=5)
    scale = float(whole.scores.abs().max())
    torch.testing.assert_close(budget.scores, whole.scores, rtol=1e-5, atol=1e-6 * scale)
    calls.clear()
    edges.edge_attribution(
        model, clean, corrupted, metric, steps=3, max_memory=f"{100 * per_prompt}B",
        progress=lambda stage, done, total: calls.append((stage, done, total)),
    )  # fmt: skip
    assert calls[-1] == ("Edge scores", 3, 3)  # every prompt fits: one batch
    with pytest.raises(ValueError, match="less than one prompt"):
        edges.edge_attribution(model, clean, corrupted, metric, max_memory=per_prompt - 1)
    with pytest.raises(ValueError, match="not a size"):
        edges.edge_attribution(model, clean, corrupted, metric, max_memory="lots")


def test_every_edge_method_prune_and_faithfulness_run_on_one_head_layers() -> None:
    """A layer of one head is a writer group of one head ([batch, pos, 1, d] at hook_result), not a
    single writer like the input or an MLP: every method scores it, pruning and the faithfulness
    curve run on it, and the circuit of every edge is the model itself."""
    model = _random_model(seed=3, **ARCHITECTURES["one-head"])
    clean, corrupted, pos = _pairs(model.cfg.d_vocab, [6, 5, 6])
    metric = _metric(3, model.cfg.d_vocab, pos)
    graph = edges.edge_graph(model)
    found = {}
    for method in edges.METHODS:
        found[method] = edges.edge_attribution(model, clean, corrupted, metric, method=method, steps=2)
        scores = found[method].scores
        assert scores.shape == (graph.n_writers, graph.n_readers) and bool(scores.isfinite().all()), method
        assert float(scores.abs().max()) > 1e-3, method
    # EAP over the input alone is the first step of EAP-IG over the input: one step at alpha = 1.
    eap_ig_one_step = edges.edge_attribution(model, clean, corrupted, metric, method="eap-ig", steps=1)
    torch.testing.assert_close(eap_ig_one_step.scores, found["eap"].scores, atol=ATOL, rtol=0)
    pruned = edges.prune_edges(
        model, clean, corrupted, metric, edges.PruneSettings(density=0.3, steps=4, batch_size=3)
    )
    assert pruned.scores.shape == (graph.n_writers, graph.n_readers)
    curve = edges.faithfulness_curve(
        model, clean, corrupted, metric, found["eap-ig"], fractions=(0.1, 0.5, 1.0)
    )
    assert bool(curve.faithfulness.isfinite().all())
    torch.testing.assert_close(curve.faithfulness[-1], torch.tensor(1.0), atol=ATOL, rtol=0)


def test_left_padded_ids_carrying_their_mask_give_each_prompt_its_own_figures() -> None:
    """Ids padded on the left that carry their attention mask (as model.to_tokens(...,
    padding_side='left') returns them) keep it in every sub-batch the edge functions run: with every
    edge kept the metric is the model's on each prompt alone, and EAP is the mean of each prompt's."""
    model = _random_model()
    vocab, lengths = model.cfg.d_vocab, [5, 7, 6]
    generator = torch.Generator().manual_seed(3)
    rows = [torch.randint(1, vocab, (n,), generator=generator).tolist() for n in lengths]
    corrupted_rows = [
        row[:1] + torch.randint(1, vocab, (len(row) - 1,), generator=generator).tolist() for row in rows
    ]
    mask = (torch.arange(7) >= 7 - torch.tensor(lengths)[:, None]).long()

    def left_padded(prompts: list[list[int]]) -> torch.Tensor:
        return record_padding(torch.tensor([[0] * (7 - len(row)) + row for row in prompts]), mask)

    clean, corrupted = left_padded(rows), left_padded(corrupted_rows)
    correct, incorrect = torch.tensor([3, 9, 14]), torch.tensor([20, 8, 2])
    metric = edges.logit_diff_metric(correct, incorrect, -1)
    graph = edges.edge_graph(model)
    alone, per_prompt = [], []
    for i, (row, corrupted_row) in enumerate(zip(rows, corrupted_rows, strict=True)):
        one = edges.logit_diff_metric(correct[i : i + 1], incorrect[i : i + 1], -1)
        with torch.no_grad():
            alone.append(one(model(torch.tensor([row])), torch.arange(1)))
        per_prompt.append(
            edges.edge_attribution(
                model, torch.tensor([row]), torch.tensor([corrupted_row]), one, "eap"
            ).scores
        )
    kept = edges.run_circuits(
        model,
        clean,
        torch.ones(1, graph.n_writers, graph.n_readers),
        edges.ablated_outputs(model, clean, corrupted),
        metric,
        batch_size=2,
    )
    torch.testing.assert_close(kept[0], torch.cat(alone), atol=ATOL, rtol=0)
    scores = edges.edge_attribution(model, clean, corrupted, metric, "eap", batch_size=2).scores
    torch.testing.assert_close(scores, torch.stack(per_prompt).mean(0), atol=ATOL, rtol=0)


def test_resampled_edges_of_left_padded_prompts_count_positions_from_their_first_real_token() -> None:
    """With every edge resampled from one unpadded reference prompt, every reader reads that prompt's
    writers, so the metric is the reference's own logits at each clean prompt's last real position,
    counted from its start; a reference with padding is refused (its padding would be drawn)."""
    model = _random_model()
    vocab, lengths = model.cfg.d_vocab, [7, 4, 6]
    generator = torch.Generator().manual_seed(5)
    rows = [torch.randint(1, vocab, (n,), generator=generator).tolist() for n in lengths]
    mask = (torch.arange(7) >= 7 - torch.tensor(lengths)[:, None]).long()
    clean = record_padding(torch.tensor([[0] * (7 - len(row)) + row for row in rows]), mask)
    reference = torch.randint(1, vocab, (1, 7), generator=generator)
    correct, incorrect = torch.tensor([3, 9, 14]), torch.tensor([20, 8, 2])
    graph = edges.edge_graph(model)
    resampled = edges.run_circuits(
        model,
        clean,
        torch.zeros(1, graph.n_writers, graph.n_readers),
        edges.ablated_outputs(model, clean, clean, interp.Ablation("resample", reference=reference)),
        edges.logit_diff_metric(correct, incorrect, -1),
    )[0]
    with torch.no_grad():
        logits = model(reference)[0, torch.tensor(lengths) - 1]  # [prompt, d_vocab]
    expected = logits[torch.arange(3), correct] - logits[torch.arange(3), incorrect]
    torch.testing.assert_close(resampled, expected, atol=ATOL, rtol=0)
    padded = record_padding(reference.repeat(2, 1), torch.tensor([[1] * 7, [1] * 3 + [0] * 4]))
    with pytest.raises(ValueError, match="resample ablation draws whole reference prompts"):
        edges.ablated_outputs(model, clean, clean, interp.Ablation("resample", reference=padded))


def test_edges_and_heads_resample_the_same_reference_prompt_for_a_seed() -> None:
    """One seed, one draw: resample ablation of edges gives each clean prompt the reference prompt
    resample ablation of heads gives it (their writers' outputs, and the heads' z, from that prompt)."""
    model = _random_model()
    clean, _, _ = _pairs(model.cfg.d_vocab, [6] * 5)
    reference = _pairs(model.cfg.d_vocab, [6] * 7, seed=3)[0]
    resample = interp.Ablation("resample", reference=reference, seed=4)
    z_name = interp.act_name("z", 0)
    with torch.no_grad():
        heads_values = Replacement(model, [z_name], resample).values(z_name, len(clean))  # [batch, pos, ...]
        reference_z = model.run_with_cache(reference, names_filter=[z_name])[1][z_name]
    drawn = [int((reference_z - row).abs().flatten(1).amax(1).argmin()) for row in heads_values]
    assert len(set(drawn)) > 1  # a draw, not one prompt for all
    outputs = edges.ablated_outputs(model, clean, clean, resample)  # [writer, batch, pos, d_model]
    torch.testing.assert_close(outputs, edges.writer_outputs(model, reference)[:, drawn], atol=1e-6, rtol=0)


@pytest.mark.parametrize("method", ["eap", "eap-ig", "exact"])
def test_edge_scores_of_a_grouped_query_model_do_not_depend_on_ungrouping(method):
    """TransformerLens's `ungroup_grouped_query_attention` (a key/value copy per query head) changes the
    hooks' shapes, not the model: the edges, whose key/value readers are per key/value head, score the
    same with it on (EAP and EAP-IG raised torch's einsum error)."""
    model = _random_model(**ARCHITECTURES["llama-gqa"])
    clean, corrupted, pos = _pairs(model.cfg.d_vocab, [7, 6, 7, 5])
    metric = _metric(4, model.cfg.d_vocab, pos)
    grouped = edges.edge_attribution(model, clean, corrupted, metric, method, steps=3)
    with model.settings(ungroup_grouped_query_attention=True):
        ungrouped = edges.edge_attribution(model, clean, corrupted, metric, method, steps=3)
    torch.testing.assert_close(ungrouped.scores, grouped.scores, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["llama-gqa", "gemma2-like", "olmo2-like", "gemma3-like"])
def test_an_ungrouped_model_computes_the_same_logits_with_a_key_and_value_head_per_query_head(name):
    """`interp.ungrouped` copies every weight held per key/value head (W_K, W_V, their biases, a key norm
    per head or over all heads) to the query heads of its group: Gemma 3's key norm was left per key/value
    head at first, and the copy refused to load."""
    values = ARCHITECTURES.get(name, dict(post_norm=True, normalization="rmsnorm", positional="rotary",
                                          qk_norm="head", qkv_bias=True))  # fmt: skip
    model = _random_model(seed=4, **{**values, "n_kv_heads": 2})
    copy = interp.ungrouped(model)
    tokens = torch.randint(1, model.cfg.d_vocab, (3, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(copy(tokens), model(tokens), rtol=0, atol=1e-5)
    assert copy.cfg.n_kv_heads == copy.cfg.n_heads == 4 and interp.ungrouped(copy) is copy
    assert edges.edge_graph(copy.cfg).readers[4] == "a0.h0<k>"  # MIB's names: per query head
    assert interp.parameter_count(copy) == interp.parameter_count(model)  # the copies count once
    assert interp.provenance(copy).split(", ")[-2] == interp.provenance(model).split(", ")[-2]
