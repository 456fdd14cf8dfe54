"""Padded batches at every entry point that takes prompts and a metric: a short prompt padded to a
long one's length gives the value it gives alone (to 1e-4), or a clear error, never the padding's.

`model.to_tokens([short, long])` pads on the tokenizer's side. Right padding: a metric reading "the
last position" (pos=None, -1) would read the short prompt's padding, so it is refused and
`pos=model.last_positions(tokens)` reads each prompt's last real token. Left padding: the last
position is every prompt's last token, and every run masks the padding.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

import interp
from circuits.edge_circuits.tasks import file_task
from circuits.patch_report import pairs_patching
from interp import Ablation, edges, metrics
from interp.interventions import ablation, engine, patching, path_patching
from interp.interventions.engine import RunOptions
from interp.model.tokens import record_padding

SHORT, LONG = "w2 w3 w4 w5", "w6 w7 w8 w9 w10 w11 w12"
SHORT_CORRUPTED, LONG_CORRUPTED = "w13 w3 w14 w5", "w15 w7 w16 w9 w17 w11 w18"
ANSWERS = ("w20", "w21")
TOL = dict(atol=1e-4, rtol=1e-4)
PADDED_ERROR = "right-padded"


def padded_model(side: str) -> interp.HookedTransformer:
    """A random 2-layer model with rotary positions and a word-level tokenizer ("<s>" BOS, "<pad>" the
    pad and EOS), its weights large enough that the padding's logits differ from the prompt's."""
    vocab = {"<s>": 0, "<pad>": 1, **{f"w{i}": i for i in range(2, 40)}}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_level, bos_token="<s>", eos_token="<pad>", pad_token="<pad>", unk_token="<pad>"
    )
    cfg = interp.Config(
        n_layers=2, d_model=32, n_heads=4, d_vocab=40, n_ctx=16, positional="rotary", bos_token_id=0,
        init_std=0.3,
    )  # fmt: skip
    torch.manual_seed(0)
    model = interp.HookedTransformer(cfg, tokenizer=tokenizer).eval()
    model.default_padding_side = side
    return model


@pytest.fixture(scope="module", params=["right", "left"])
def model(request) -> interp.HookedTransformer:
    return padded_model(request.param)


def answers(model, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    correct, incorrect = (model.to_single_token(a) for a in ANSWERS)
    return torch.full((n,), correct), torch.full((n,), incorrect)


def batch_and_alone(model, side: str | None = None):
    """(clean, corrupted, metric) of [short, long] and of [short] alone, padded on `side` (None: the
    model's default); the metrics read each prompt's last real token."""
    made = []
    for clean_text, corrupted_text in ((
        [SHORT, LONG], [SHORT_CORRUPTED, LONG_CORRUPTED]), ([SHORT], [SHORT_CORRUPTED])
    ):  # fmt: skip
        clean = model.to_tokens(clean_text, padding_side=side)
        corrupted = model.to_tokens(corrupted_text, padding_side=side)
        metric = metrics.logit_diff_metric(*answers(model, len(clean_text)), pos=model.last_positions(clean))
        made.append((clean, corrupted, metric))
    return made


def last_position_metric(model, n: int = 2) -> metrics.AnswerMetric:
    return metrics.logit_diff_metric(*answers(model, n))  # pos=None: the last position


def test_last_positions_of_text_ids_and_masks(model):
    tokens, mask = model.to_tokens_and_mask([SHORT, LONG])
    expected = torch.tensor([4, 7]) if model.default_padding_side == "right" else torch.tensor([7, 7])
    assert model.last_positions([SHORT, LONG]).tolist() == expected.tolist()
    assert model.last_positions(tokens).tolist() == expected.tolist()
    assert model.last_positions(tokens, attention_mask=mask).tolist() == expected.tolist()
    assert model.last_positions(model.to_tokens(SHORT)).tolist() == [4]


def test_the_padding_reads_another_number(model):
    """What the checks guard against: the padding's logits differ from the last real token's (the
    padding is last on the right, first on the left)."""
    tokens = model.to_tokens([SHORT, LONG])
    logits = model(tokens)
    padding = -1 if model.default_padding_side == "right" else 0
    last = int(model.last_positions(tokens)[0])
    assert padding % tokens.shape[1] != last
    assert (logits[0, padding] - logits[0, last]).abs().max() > 0.1


def test_a_metric_of_the_model_logits(model):
    (tokens, _, metric), (alone, _, alone_metric) = batch_and_alone(model)
    logits, alone_logits = model(tokens), model(alone)
    torch.testing.assert_close(metric(logits)[0], alone_metric(alone_logits)[0], **TOL)
    correct, _ = answers(model, 2)
    last = model.last_positions(tokens)
    for value, reference in (
        (
            metrics.logit_diff(logits, *answers(model, 2), pos=last),
            metrics.logit_diff(alone_logits, *answers(model, 1)),
        ),
        (metrics.answer_logprob(logits, correct, last), metrics.answer_logprob(alone_logits, correct[:1])),
        (metrics.answer_prob(logits, correct, last), metrics.answer_prob(alone_logits, correct[:1])),
        (metrics.accuracy_metric(logits[:, -1].argmax(-1), last)(logits),
         metrics.accuracy_metric(logits[:, -1].argmax(-1)[:1])(alone_logits)),
    ):  # fmt: skip
        torch.testing.assert_close(value[0], reference[0], **TOL)
    _, mask = model.to_tokens_and_mask([SHORT, LONG])
    torch.testing.assert_close(
        metrics.loss(logits, tokens, attention_mask=mask)[0], metrics.loss(alone_logits, alone)[0], **TOL
    )
    # ids from to_tokens carry their mask: the loss counts real tokens on either padding side
    torch.testing.assert_close(
        metrics.loss(logits, tokens), metrics.loss(logits, tokens, attention_mask=mask)
    )
    if model.default_padding_side == "right":
        for read in (
            lambda: last_position_metric(model)(logits),
            lambda: metrics.logit_diff_metric(*answers(model, 2), pos=-1)(logits),
            lambda: metrics.accuracy_metric(correct, pos=-1)(logits),
            lambda: metrics.logit_diff(logits, *answers(model, 2)),
            lambda: metrics.answer_prob(logits, correct, pos=-1),
            lambda: metrics.kl_divergence(logits, logits),
            lambda: metrics.loss(logits, tokens.clone()),  # ids without their recorded mask
            lambda: metrics.normalized(last_position_metric(model), logits, model(tokens.flip(0))),
        ):
            with pytest.raises(ValueError, match=PADDED_ERROR):
                read()
    else:  # the last position is each prompt's last token
        torch.testing.assert_close(
            last_position_metric(model)(logits)[0], alone_metric(alone_logits)[0], **TOL
        )


def patched(model, function):
    """function(clean, corrupted, metric) -> per-prompt values [..., batch], on [short, long] and on
    [short] alone: the short prompt's values agree; with pos=None they agree (left padding) or the
    call is refused (right padding)."""
    (clean, corrupted, metric), (alone, alone_corrupted, alone_metric) = batch_and_alone(model)
    values = function(clean, corrupted, metric)
    reference = function(alone, alone_corrupted, alone_metric)
    torch.testing.assert_close(values[..., 0], reference[..., 0], **TOL)
    if model.default_padding_side == "right":
        with pytest.raises(ValueError, match=PADDED_ERROR):
            function(clean, corrupted, last_position_metric(model))
    else:
        torch.testing.assert_close(
            function(clean, corrupted, last_position_metric(model))[..., 0], reference[..., 0], **TOL
        )


HEAD = (1, 2)
ENTRY_POINTS = {
    "interp.patch": lambda model, clean, corrupted, metric: interp.patch(
        model, clean, metric, head=HEAD, source=corrupted
    ),
    "run_site_sets": lambda model, clean, corrupted, metric: engine.run_site_sets(
        model, clean, [[engine.Site("blocks.1.attn.hook_z", head=2)], []], torch.zeros(1), metric
    ),
    "activation_patching": lambda model, clean, corrupted, metric: (
        patching.activation_patching(model, clean, corrupted, metric, "z", layers=[1]).values
    ),
    "activation_patching (logit_pos)": lambda model, clean, corrupted, metric: (
        patching.activation_patching(
            model,
            clean,
            corrupted,
            metric,
            "resid_pre",
            options=RunOptions(logit_pos=metric.pos if metric.pos is not None else -1),
        ).values
    ),
    "attribution_patching": lambda model, clean, corrupted, metric: (
        patching.attribution_patching(model, clean, corrupted, metric, "z", layers=[1]).values
    ),
    "path_patching": lambda model, clean, corrupted, metric: (
        path_patching.path_patching(model, clean, corrupted, metric, senders=[(0, 1), (0, "mlp")]).values
    ),
    "ablated_metrics": lambda model, clean, corrupted, metric: ablation.ablated_metrics(
        model,
        clean,
        metric,
        [[HEAD], [(0, 0), HEAD]],
        ablation.Replacement(model, ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"], "zero"),
    ),  # fmt: skip
    "ablation_sweep": lambda model, clean, corrupted, metric: (
        ablation.ablation_sweep(model, clean, metric, "mlps", ablation="zero").values
    ),
    "edges.faithfulness": lambda model, clean, corrupted, metric: (
        edges.faithfulness(
            model,
            clean,
            corrupted,
            metric,
            edges.top_circuit(edges.random_scores(edges.edge_graph(model)), 30),
            batch_size=1,
        ).values
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_entry_point(model, name):
    function = ENTRY_POINTS[name]
    patched(model, lambda clean, corrupted, metric: function(model, clean, corrupted, metric))


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_entry_point_with_ids_padded_on_the_other_side(model, name):
    """Ids padded on the side the model does not pad on (`to_tokens(padding_side=)`) carry their
    mask: each entry point gives the short prompt its value alone."""
    other = "left" if model.default_padding_side == "right" else "right"
    (clean, corrupted, metric), (alone, alone_corrupted, alone_metric) = batch_and_alone(model, other)
    values = ENTRY_POINTS[name](model, clean, corrupted, metric)
    reference = ENTRY_POINTS[name](model, alone, alone_corrupted, alone_metric)
    torch.testing.assert_close(values[..., 0], reference[..., 0], **TOL)


def test_a_metric_of_logits_only_that_reads_the_padding_is_refused(model):
    """A plain function of the logits: NaN where it would read padding, refused by name."""
    (clean, corrupted, metric), (alone, alone_corrupted, alone_metric) = batch_and_alone(model)
    correct, incorrect = answers(model, 2)
    last = model.last_positions(clean)
    reads_last = lambda logits: logits[:, -1, correct[0]] - logits[:, -1, incorrect[0]]  # noqa: E731
    reads_real = lambda logits: metrics.logit_diff(logits, correct, incorrect, pos=last)  # noqa: E731
    value = interp.patch(model, clean, reads_real, head=HEAD, source=corrupted)
    reference = interp.patch(model, alone, alone_metric, head=HEAD, source=alone_corrupted)
    torch.testing.assert_close(value[0], reference[0], **TOL)
    if model.default_padding_side == "right":
        with pytest.raises(ValueError, match="it reads the padding"):
            interp.patch(model, clean, reads_last, head=HEAD, source=corrupted)
    else:
        torch.testing.assert_close(
            interp.patch(model, clean, reads_last, head=HEAD, source=corrupted)[0], reference[0], **TOL
        )


def test_head_circuit_faithfulness_is_the_mean_of_the_prompts_alone(model):
    (clean, _, metric), (alone, _, alone_metric) = batch_and_alone(model)
    circuit = [HEAD, (0, 1)]
    both = ablation.head_circuit_faithfulness(model, clean, metric, circuit)
    long_tokens = model.to_tokens(LONG)
    long_metric = metrics.logit_diff_metric(*answers(model, 1), pos=model.last_positions(long_tokens))
    short = ablation.head_circuit_faithfulness(model, alone, alone_metric, circuit)
    long = ablation.head_circuit_faithfulness(model, long_tokens, long_metric, circuit)
    for key in ("model", "circuit", "no_heads"):
        assert both[key] == pytest.approx((short[key] + long[key]) / 2, abs=1e-4)
    if model.default_padding_side == "right":
        with pytest.raises(ValueError, match=PADDED_ERROR):
            ablation.head_circuit_faithfulness(model, clean, last_position_metric(model), circuit)


def test_edge_scores_are_the_mean_of_the_prompts_alone(model):
    (clean, corrupted, metric), (alone, alone_corrupted, alone_metric) = batch_and_alone(model)
    long_clean, long_corrupted = model.to_tokens(LONG), model.to_tokens(LONG_CORRUPTED)
    long_metric = metrics.logit_diff_metric(*answers(model, 1), pos=model.last_positions(long_clean))
    for method in ("eap", "exact"):
        both = edges.edge_attribution(model, clean, corrupted, metric, method=method).scores
        short = edges.edge_attribution(model, alone, alone_corrupted, alone_metric, method=method).scores
        long = edges.edge_attribution(model, long_clean, long_corrupted, long_metric, method=method).scores
        torch.testing.assert_close(both, (short + long) / 2, **TOL)
        if model.default_padding_side == "right":
            with pytest.raises(ValueError, match=PADDED_ERROR):
                edges.edge_attribution(model, clean, corrupted, last_position_metric(model), method=method)


def test_prompt_pair_files_read_each_prompt_at_its_last_token(model, tmp_path):
    """`interp patch` and `interp circuit` with a prompt-pair file: each pair's own last token."""
    rows = [(SHORT, SHORT_CORRUPTED), (LONG, LONG_CORRUPTED)]
    lines = ["clean,corrupted,correct,incorrect"] + [f"{c},{k},{ANSWERS[0]},{ANSWERS[1]}" for c, k in rows]
    both_file, short_file = tmp_path / "both.csv", tmp_path / "short.csv"
    both_file.write_text("\n".join(lines) + "\n")
    short_file.write_text("\n".join(lines[:2]) + "\n")
    both, short = file_task(model, both_file), file_task(model, short_file)
    for task_metric, tokens, alone_metric, alone in (
        (both.metric, both.clean, short.metric, short.clean),
        (both.corrupted_metric, both.corrupted, short.corrupted_metric, short.corrupted),
    ):
        torch.testing.assert_close(task_metric(model(tokens))[0], alone_metric(model(alone))[0], **TOL)
    assert both.metric.pos.tolist() == [4, 7]
    report = pairs_patching(model, both_file, component="resid_pre")
    assert torch.isfinite(report.result.values).all()


IOI_PROMPTS = (
    "When Mary and John went to the store, John gave a drink to",
    "After the long and tiring meeting at the office downtown, Tom and Anna walked home, and Anna handed "
    "a letter to",
)
IOI_CORRUPTED = (
    "When Mary and John went to the store, Bob gave a drink to",
    "After the long and tiring meeting at the office downtown, Tom and Anna walked home, and Bob handed "
    "a letter to",
)


def ioi_metric(model, rows: slice = slice(None)) -> metrics.AnswerMetric:
    io = torch.tensor([model.to_single_token(name) for name in (" Mary", " Anna")])[rows]
    s = torch.tensor([model.to_single_token(name) for name in (" John", " Tom")])[rows]
    return metrics.logit_diff_metric(io, s)


@pytest.mark.parametrize("side", ["left", "right"])
def test_smollm2_padded_ids_give_each_prompt_its_value_alone(smollm2, side):
    """Issue 41: SmolLM2 pads on the right, and ids padded on the left by `to_tokens(padding_side=)`
    carry their mask to the forward pass, run_with_cache and patching (the first prompt's logit
    difference was 0.04 in the batch, 6.12 alone)."""
    model = smollm2
    tokens = model.to_tokens(list(IOI_PROMPTS), padding_side=side)
    corrupted = model.to_tokens(list(IOI_CORRUPTED), padding_side=side)
    alone = [model.to_tokens(text) for text in IOI_PROMPTS]
    alone_corrupted = [model.to_tokens(text) for text in IOI_CORRUPTED]
    metric = ioi_metric(model) if side == "left" else metrics.logit_diff_metric(
        ioi_metric(model).correct, ioi_metric(model).incorrect, pos=model.last_positions(tokens)
    )  # fmt: skip
    expected = torch.cat([ioi_metric(model, slice(i, i + 1))(model(ids)) for i, ids in enumerate(alone)])
    torch.testing.assert_close(metric(model(tokens)), expected, **TOL)
    logits, cache = model.run_with_cache(tokens, names_filter="blocks.5.hook_resid_post")
    torch.testing.assert_close(metric(logits), expected, **TOL)
    for i, ids in enumerate(alone):
        _, alone_cache = model.run_with_cache(ids, names_filter="blocks.5.hook_resid_post")
        real = model.to_tokens_and_mask(list(IOI_PROMPTS), padding_side=side)[1][i].bool()
        torch.testing.assert_close(
            cache["blocks.5.hook_resid_post"][i, real], alone_cache["blocks.5.hook_resid_post"][0], **TOL
        )
    patched = interp.patch(model, tokens, metric, head=(9, 1), source=corrupted)
    patched_alone = torch.cat([
        interp.patch(model, ids, ioi_metric(model, slice(i, i + 1)), head=(9, 1), source=bad)
        for i, (ids, bad) in enumerate(zip(alone, alone_corrupted, strict=True))
    ])  # fmt: skip
    torch.testing.assert_close(patched, patched_alone, **TOL)


def test_smollm2_left_padded_ids_without_their_mask_are_refused(smollm2):
    """A copy of left-padded ids carries no mask; on a model that pads on the right they are refused
    with what to pass, at the forward pass, run_with_cache and patching; padding_side= and
    attention_mask= give the prompts' values."""
    model = smollm2
    tokens, mask = model.to_tokens_and_mask(list(IOI_PROMPTS), padding_side="left")
    copied = tokens.clone()
    for run in (
        lambda: model(copied),
        lambda: model(copied[:1]),  # one row: its leading pad ids are padding too
        lambda: model.run_with_cache(copied, names_filter="blocks.0.hook_resid_post"),
        lambda: interp.patch(model, copied, ioi_metric(model), head=(9, 1), source=copied.flip(0)),
    ):
        with pytest.raises(ValueError, match="look padded on the left.*default_padding_side = 'left'"):
            run()
    metric, expected = ioi_metric(model), ioi_metric(model)(model(tokens))
    torch.testing.assert_close(metric(model(copied, padding_side="left")), expected, **TOL)
    torch.testing.assert_close(metric(model(copied, attention_mask=mask)), expected, **TOL)


def test_patching_prompts_padded_differently_on_the_left_is_refused(smollm2):
    """Patching goes position by position: a source prompt whose left padding differs from its
    target's would write its padding into the target's tokens."""
    model = smollm2
    tokens = model.to_tokens([IOI_PROMPTS[0], IOI_PROMPTS[1]], padding_side="left")
    source = model.to_tokens([IOI_PROMPTS[1], IOI_CORRUPTED[0]], padding_side="left")
    with pytest.raises(ValueError, match="left-padded differently"):
        interp.patch(model, tokens, ioi_metric(model), head=(9, 1), source=source)


@pytest.mark.parametrize("prefix_padding", ["left", "right", None])
@pytest.mark.parametrize("continuation_padding", ["left", "right", None])
def test_smollm2_kv_cache_continues_padded_prompts_as_alone(smollm2, prefix_padding, continuation_padding):
    """Issue 49 (11): TransformerLens's `test_multi_token_batch` on a real model, by logits. A right-padded
    prefix is cached with its mask, so the continuation neither attends to its padding nor counts it
    among its positions (the first prompt's probabilities differed by 0.26 from its uncached run)."""
    model = smollm2
    prefixes = ["It's always locked", "I'd rather be burned in Canada"]
    continuations = [" by the magistrate", " than to freeze here in the South"]
    if prefix_padding is None:
        prefixes[1] = "It's always blocked"
    if continuation_padding is None:
        continuations[1] = " by the candidate"
    first = model.to_tokens(continuations[0], prepend_bos=False)
    n_new = first.shape[1]
    expected = model(torch.cat([model.to_tokens(prefixes[0]), first], dim=1))[0, -n_new:]
    prefix = model.to_tokens(prefixes, padding_side=prefix_padding)
    continuation = model.to_tokens(continuations, prepend_bos=False, padding_side=continuation_padding)
    cache = interp.HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, 2)
    model(prefix, past_kv_cache=cache, padding_side=prefix_padding)
    cache.freeze()
    logits = model(continuation, past_kv_cache=cache, padding_side=continuation_padding)
    cached = logits[0, :n_new] if continuation_padding == "right" else logits[0, -n_new:]
    torch.testing.assert_close(cached, expected, **TOL)


# Every read of an ActivationCache at positions: (cache, positions) -> [..., batch, d] (positions
# either pos_slice=... or pos=..., the same for every read).
CACHE_READS = {
    "accumulated_resid": lambda cache, **at: cache.accumulated_resid(apply_ln=True, **at),
    "decompose_resid": lambda cache, **at: cache.decompose_resid(apply_ln=True, **at),
    "stack_head_results": lambda cache, **at: cache.stack_head_results(incl_remainder=True, **at),
    "stack_head_contributions": lambda cache, **at: cache.stack_head_contributions(**at),
    "get_neuron_results": lambda cache, **at: cache.get_neuron_results(1, **at).movedim(-2, 0),
    "stack_neuron_results": lambda cache, **at: cache.stack_neuron_results(2, apply_ln=True, **at),
    "get_full_resid_decomposition": lambda cache, **at: cache.get_full_resid_decomposition(**at),
    "apply_ln_to_stack": lambda cache, **at: cache.apply_ln_to_stack(cache.decompose_resid(**at), **at),
    "logit_attrs": lambda cache, **at: cache.logit_attrs(
        cache.decompose_resid(**at), tokens=torch.tensor([5, 5]), incorrect_tokens=torch.tensor([6, 6]), **at
    )[..., None],
}


def cache_of(model, texts, side=None):
    return model.run_with_cache(model.to_tokens(texts, padding_side=side))[1]


@pytest.mark.parametrize("name", list(CACHE_READS))
def test_cache_reads_each_prompt_at_its_own_position_or_refuses(model, name):
    """Issue 49 (1): a cache of a right-padded batch refuses pos_slice=-1 (it reads the short prompt's
    padding) and reads pos=model.last_positions(tokens) as each prompt alone; on the left, -1 is every
    prompt's last token."""
    read = CACHE_READS[name]
    tokens = model.to_tokens([SHORT, LONG])
    cache, alone = cache_of(model, [SHORT, LONG]), cache_of(model, [SHORT])
    expected = read(alone, pos_slice=-1)[..., 0, :]
    torch.testing.assert_close(read(cache, pos=model.last_positions(tokens))[..., 0, :], expected, **TOL)
    if model.default_padding_side == "right":
        with pytest.raises(ValueError, match="reads position 7 of prompt 0, its padding.*last_positions"):
            read(cache, pos_slice=-1)
        with pytest.raises(ValueError, match="its padding"):
            read(cache, pos_slice=(2, None))
    else:
        torch.testing.assert_close(read(cache, pos_slice=-1)[..., 0, :], expected, **TOL)
        with pytest.raises(ValueError, match="reads position 0 of prompt 0, its padding"):
            read(cache, pos_slice=0)
    long_alone = read(cache_of(model, [LONG]), pos_slice=-1)[..., 0, :]
    torch.testing.assert_close(read(cache, pos=model.last_positions(tokens))[..., 1, :], long_alone, **TOL)


def test_a_cache_sliced_to_one_prompt_keeps_its_padding(model):
    """The prompts a batch_slice or apply_slice_to_batch_dim keeps are the ones checked."""
    cache = cache_of(model, [SHORT, LONG])
    long_only = cache.apply_slice_to_batch_dim(slice(1, 2))
    torch.testing.assert_close(
        long_only.decompose_resid(pos_slice=-1),
        cache.decompose_resid(pos=model.last_positions(model.to_tokens([SHORT, LONG])))[:, 1:],
    )
    stack = cache.decompose_resid()[:, :, -1]
    cache.apply_ln_to_stack(stack, pos_slice=-1, batch_slice=slice(1, 2))  # the long prompt: real
    short_only = cache.apply_slice_to_batch_dim(0)
    if model.default_padding_side == "right":
        with pytest.raises(ValueError, match="its padding"):
            short_only.decompose_resid(pos_slice=-1)
        with pytest.raises(ValueError, match="its padding"):
            cache.apply_ln_to_stack(stack[:, :1], pos_slice=-1, batch_slice=slice(0, 1))


def test_run_with_cache_refuses_to_keep_only_padding(model):
    tokens = model.to_tokens([SHORT, LONG])
    if model.default_padding_side == "right":
        with pytest.raises(
            ValueError, match="run_with_cache of a padded batch: pos_slice=-1 reads position 7"
        ):
            model.run_with_cache(tokens, pos_slice=-1)
    else:
        _, cache = model.run_with_cache(tokens, pos_slice=-1)
        torch.testing.assert_close(
            cache["resid_post", 1][0, 0], cache_of(model, [SHORT])["resid_post", 1][0, -1], **TOL
        )


POSITION_PARAMETERS = {"pos", "pos_slice", "logit_pos"}
# Every public function of interp that takes a position, and the test here that reads padded batches
# through it (metrics: test_a_metric_of_the_model_logits; runs: ENTRY_POINTS; caches: CACHE_READS).
READ_THROUGH = {
    **{f"ActivationCache.{name}": "CACHE_READS" for name in CACHE_READS},
    "HookedTransformer.run_with_cache": "test_run_with_cache_refuses_to_keep_only_padding",
    **{name: "test_a_metric_of_the_model_logits" for name in (
        "metrics.logit_diff", "metrics.logit_diff_metric", "metrics.answer_prob", "metrics.answer_logprob",
        "metrics.prob_metric", "metrics.accuracy_metric", "metrics.kl_divergence", "metrics.logits_at",
    )},
    "patch": "ENTRY_POINTS", "engine.run_site_sets": "ENTRY_POINTS", "patching.patch_sites": "ENTRY_POINTS",
    "patching.activation_patching": "ENTRY_POINTS", "patching.attribution_patching": "ENTRY_POINTS",
    "path_patching.path_patching": "ENTRY_POINTS", "ablation.ablated_metrics": "ENTRY_POINTS",
    "ablation.ablation_sweep": "ENTRY_POINTS",
    **{name: "test_logits_at_an_int_position_refuse_padding" for name in (
        "engine.forward_logits", "engine.forward_logit_copies", "engine.cached_run", "LogitBuffer.copies",
    )},
    "edges.edge_forward": "test_edge_runs_take_one_position_per_prompt",
    "edges.masked_logits": "test_edge_runs_take_one_position_per_prompt",
}  # fmt: skip


def test_logits_at_an_int_position_refuse_padding(model):
    """The engine's logits at logit_pos (and the cached runs and stacked copies built on them): an
    int that lands on a right-padded prompt's padding is refused; per-prompt positions are read."""
    tokens = model.to_tokens([SHORT, LONG])
    last = model.last_positions(tokens)
    alone = model(model.to_tokens([SHORT]))[0, -1]
    buffer = engine.LogitBuffer()
    reads = {
        "forward_logits": lambda pos: engine.forward_logits(model, tokens, pos),
        "cached_run": lambda pos: engine.cached_run(model, tokens, ["blocks.0.hook_resid_post"], pos)[0],
        "forward_logit_copies": lambda pos: next(
            engine.forward_logit_copies(model, torch.cat([tokens, tokens]), 2, pos, None, buffer)
        ),  # fmt: skip
    }
    for name, read in reads.items():
        torch.testing.assert_close(read(last)[0, int(last[0])], alone, **TOL, msg=name)
        if model.default_padding_side == "right":
            with pytest.raises(ValueError, match="logit_pos=-1 reads position 7, its padding"):
                read(-1)
        else:
            torch.testing.assert_close(read(-1)[0, -1], alone, **TOL, msg=name)


def test_an_int_position_on_a_left_padded_prompt_s_padding_is_refused():
    """An int position counts from the padded batch's first column: where it lands before a
    left-padded prompt's first real token, metrics, the engine's logits, patching and plain functions
    of the logits refuse it (as they refuse right padding); where every prompt is real there, the
    short prompt's value is its own at that position from its start."""
    model = padded_model("left")
    clean, corrupted = model.to_tokens([SHORT, LONG]), model.to_tokens([SHORT_CORRUPTED, LONG_CORRUPTED])
    correct, incorrect = answers(model, 2)
    first = int(model.to_tokens([SHORT, LONG]).shape[1] - model.to_tokens([SHORT]).shape[1])  # 3
    with torch.no_grad():
        logits, alone = model(clean), model(model.to_tokens([SHORT]))
    refused = {
        "logit_diff": lambda: metrics.logit_diff(logits, correct, incorrect, pos=1),
        "patch": lambda: interp.patch(
            model, clean, metrics.logit_diff_metric(correct, incorrect, pos=1), head=HEAD, source=corrupted
        ),
        "forward_logits": lambda: engine.forward_logits(model, clean, 1),
        "plain function": lambda: interp.patch(
            model, clean, lambda logits: logits[:, 1, 5] - logits[:, 1, 6], head=HEAD, source=corrupted
        ),
    }
    for name, read in refused.items():
        with pytest.raises(ValueError, match="left-padded"):
            read()
            pytest.fail(f"{name} read the padding")
    at = first + 1
    value = metrics.logit_diff(logits, correct, incorrect, pos=at)[0]
    expected = alone[0, 1, correct[0]] - alone[0, 1, incorrect[0]]
    torch.testing.assert_close(value, expected, **TOL)


def test_edge_runs_take_one_position_per_prompt(model):
    """Edge-level runs read the logits at one position per prompt, given: each prompt's own."""
    graph = edges.edge_graph(model)
    tokens = model.to_tokens([SHORT, LONG])
    last = model.last_positions(tokens)
    logits = edges.edge_forward(model, graph, tokens, logit_pos=last)  # [batch, 1, d_vocab]: made there only
    assert logits.shape == (2, 1, model.cfg.d_vocab_out)
    torch.testing.assert_close(logits[0, 0], model(model.to_tokens([SHORT]))[0, -1], **TOL)
    torch.testing.assert_close(logits[1, 0], model(model.to_tokens([LONG]))[0, -1], **TOL)
    with pytest.raises(ValueError, match="one position per prompt"):
        edges.edge_forward(model, graph, tokens, logit_pos=-1)


def public_functions_taking_a_position() -> dict[str, object]:
    """Every public function and method of interp's modules with a position parameter, by one name
    (re-exports counted once); validators of positions (check_*, positions_read) aside."""
    import inspect

    from interp import ablation as ablation_module
    from interp import engine as engine_module
    from interp import patching as patching_module
    from interp import path_patching as path_patching_module

    found: dict[object, str] = {}
    modules = {
        "metrics": metrics, "engine": engine_module, "patching": patching_module,
        "path_patching": path_patching_module, "ablation": ablation_module, "edges": edges,
    }  # fmt: skip
    candidates = [("patch", interp.patch), ("ActivationCache", interp.ActivationCache),
                  ("HookedTransformer", interp.HookedTransformer)]  # fmt: skip
    for module_name, module in modules.items():
        candidates += [(f"{module_name}.{name}", getattr(module, name)) for name in dir(module)]
    for label, obj in candidates:
        if label.rsplit(".", 1)[-1].startswith(("_", "check_", "positions_read")):
            continue
        members = [(label, obj)]
        if inspect.isclass(obj) and obj.__module__.startswith("interp"):
            members = [
                (f"{obj.__name__}.{name}", f) for name, f in vars(obj).items() if not name.startswith("_")
            ]
        for name, function in members:
            if not (inspect.isfunction(function) and function.__module__.startswith("interp")):
                continue
            if POSITION_PARAMETERS & set(inspect.signature(function).parameters) and function not in found:
                found[function] = name
    return {name: function for function, name in found.items()}


def test_every_public_function_taking_a_position_is_read_on_padded_batches():
    """A new function with a position parameter must join one of the padded-batch tests above."""
    untested = {name for name in public_functions_taking_a_position()} - set(READ_THROUGH)
    assert not untested, f"add these to a padded-batch test and to READ_THROUGH: {sorted(untested)}"


def test_smollm2_readme_recipe_on_a_padded_batch(smollm2):
    """Issue 49 (1): the README's direct logit attribution on three IOI prompts of different lengths
    (right-padded) sums to each prompt's value alone with pos=model.last_positions(tokens), and
    refuses pos_slice=-1 (it read the padding: [1.85, 6.40, -3.88] against [6.12, 6.40, 6.46])."""
    model = smollm2
    prompts = [
        "When Mary and John went to the store, John gave a drink to",
        "When Tom and Anna went to the big old park, Anna gave a ball to",
        "Then, Kate and Jack had a long argument. Afterwards Jack said to",
    ]
    io = model.to_tokens([" Mary", " Tom", " Kate"], prepend_bos=False)[:, 0]
    s = model.to_tokens([" John", " Anna", " Jack"], prepend_bos=False)[:, 0]
    tokens = model.to_tokens(prompts)
    _, cache = model.run_with_cache(tokens)
    with pytest.raises(ValueError, match="pos=model.last_positions"):
        cache.decompose_resid(pos_slice=-1)
    last = model.last_positions(tokens)
    attributions = cache.logit_attrs(cache.decompose_resid(pos=last), tokens=io, incorrect_tokens=s, pos=last)
    alone = []
    for i, prompt in enumerate(prompts):
        _, one = model.run_with_cache(model.to_tokens(prompt))
        alone.append(
            one.logit_attrs(one.decompose_resid(pos_slice=-1), io[i : i + 1], s[i : i + 1], pos_slice=-1)
        )
    torch.testing.assert_close(attributions, torch.cat(alone, dim=1), **TOL)


def test_mean_ablation_has_no_mean_where_no_reference_prompt_is_real(model):
    """Per-group means of padded references: a position where none of a group's references is real
    has no mean. A prompt padded there equals the prompt alone (before: NaN, reaching its real tokens
    through attention, 0 x NaN); a prompt real there is refused, for heads and for edges."""
    names = model.layer_hook_names("z")
    tokens = model.to_tokens([SHORT, LONG])
    correct, incorrect = answers(model, 2)
    metric = metrics.logit_diff_metric(correct, incorrect, model.last_positions(tokens))
    heads = [[(0, 1), (1, 2)]]
    by_length = Ablation("mean", reference=[SHORT_CORRUPTED, LONG_CORRUPTED], groups=torch.tensor([0, 1]))
    replacement = ablation.Replacement(model, names, by_length)
    both = ablation.ablated_metrics(model, tokens, metric, heads, replacement, groups=torch.tensor([0, 1]))[0]
    for k, (text, reference) in enumerate([(SHORT, SHORT_CORRUPTED), (LONG, LONG_CORRUPTED)]):
        alone = model.to_tokens([text])
        alone_metric = metrics.logit_diff_metric(correct[:1], incorrect[:1], model.last_positions(alone))
        own = ablation.Replacement(model, names, Ablation("mean", reference=[reference]))
        by_itself = ablation.ablated_metrics(model, alone, alone_metric, heads, own)[0, 0]
        torch.testing.assert_close(both[k], by_itself)
    with pytest.raises(ValueError, match="input prompt 1 is real at position .*, where none of the refer"):
        ablation.ablated_metrics(model, tokens, metric, heads, replacement, groups=torch.tensor([1, 0]))
    corrupted = model.to_tokens([SHORT_CORRUPTED, LONG_CORRUPTED])
    short_only = model.to_tokens([SHORT_CORRUPTED, SHORT_CORRUPTED, LONG])[:2] != model.tokenizer.pad_token_id
    with pytest.raises(ValueError, match="edges' mean ablation: input prompt 1 is real at position"):
        edges.ablated_outputs(model, tokens, corrupted, edges.Ablation("mean", mask=short_only.long()))


def test_mean_ablation_reads_the_mask_that_ids_from_to_tokens_carry(model):
    """Padded reference ids from `to_tokens` give the means of the same texts: the padding they carry
    is left out as the texts' is; a copy of the ids, which carries no mask, averages the padding in, with
    a warning naming the rows that look padded."""
    names = model.layer_hook_names("z")
    tokens = model.to_tokens([LONG, LONG])
    correct, incorrect = answers(model, 2)
    metric = metrics.logit_diff_metric(correct, incorrect, model.last_positions(tokens))
    heads = [[(0, 1), (1, 2)]]
    texts = [SHORT_CORRUPTED, LONG_CORRUPTED]

    def ablated(reference) -> torch.Tensor:
        replacement = ablation.Replacement(model, names, Ablation("mean", reference=reference))
        return ablation.ablated_metrics(model, tokens, metric, heads, replacement)[0]

    from_texts = ablated(texts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the ids carry their mask: nothing to warn of
        torch.testing.assert_close(ablated(model.to_tokens(texts)), from_texts)
        ablated(model.to_tokens([LONG_CORRUPTED, LONG]).clone())  # of one length: no padding
    with pytest.warns(UserWarning, match=r"reference rows \[0\] .* the pad id 1 .* carry no padding mask"):
        copied = ablated(model.to_tokens(texts).clone())  # said, not silent
    assert not torch.allclose(copied, from_texts)


def test_mean_ablation_of_left_padded_prompts_averages_each_position_from_the_prompts_start(model):
    """Means are per position from each prompt's start: ids padded on the left (inputs and references,
    of other lengths) give what the same ids padded on the right give."""
    names = model.layer_hook_names("z")
    texts, references = [SHORT, LONG], [LONG_CORRUPTED, SHORT_CORRUPTED, LONG_CORRUPTED + " w19 w20"]
    correct, incorrect = answers(model, 2)
    figures = {}
    for side in ("right", "left"):
        tokens = model.to_tokens(texts, padding_side=side)
        metric = metrics.logit_diff_metric(correct, incorrect, model.last_positions(tokens))
        reference = model.to_tokens(references, padding_side=side)
        replacement = ablation.Replacement(model, names, Ablation("mean", reference=reference))
        figures[side] = ablation.ablated_metrics(model, tokens, metric, [[(0, 1), (1, 2)]], replacement)[0]
    torch.testing.assert_close(figures["left"], figures["right"], **TOL)


def test_edge_mean_ablation_of_left_padded_prompts_averages_each_position_from_the_prompts_start(model):
    """Edges' mean ablation counts positions from each prompt's start as the heads' does: a circuit's
    figures on prompts padded on the left equal those on the same prompts padded on the right."""
    circuit = edges.top_circuit(edges.random_scores(edges.edge_graph(model)), 30)
    correct, incorrect = answers(model, 2)
    figures = {}
    for side in ("right", "left"):
        clean = model.to_tokens([SHORT, LONG], padding_side=side)
        corrupted = model.to_tokens([SHORT_CORRUPTED, LONG_CORRUPTED], padding_side=side)
        metric = metrics.logit_diff_metric(correct, incorrect, model.last_positions(clean))
        figures[side] = edges.faithfulness(model, clean, corrupted, metric, circuit, ablation="mean").values
    torch.testing.assert_close(figures["left"], figures["right"], **TOL)


@pytest.mark.parametrize("case", ["right-padded first chunk", "left-padded second chunk"])
def test_a_sliding_window_counts_real_tokens_across_a_kv_cache_s_padding(case):
    """A KV cache may hold padding between a prompt's real tokens (a right-padded first chunk, or a
    left-padded later one); a local layer's window counts real tokens, so each prompt continues as it
    runs alone (the window counted in cache slots dropped real keys: logits up to 0.8 off)."""
    cfg = interp.Config(
        n_layers=2, d_model=32, n_heads=4, d_vocab=40, n_ctx=32, positional="rotary",
        attn_types=["local", "global"], window_size=3, init_std=0.3,
    )  # fmt: skip
    torch.manual_seed(0)
    model = interp.HookedTransformer(cfg).eval()
    generator = torch.Generator().manual_seed(1)
    if case == "right-padded first chunk":
        firsts = [torch.randint(1, 40, (n,), generator=generator).tolist() for n in (8, 3)]
        seconds = [torch.randint(1, 40, (3,), generator=generator).tolist() for _ in range(2)]
        mask = torch.tensor([[1] * len(row) + [0] * (8 - len(row)) for row in firsts])
        first = torch.tensor([row + [0] * (8 - len(row)) for row in firsts])
        second, second_mask = torch.tensor(seconds), None
    else:
        firsts = [torch.randint(1, 40, (3,), generator=generator).tolist() for _ in range(2)]
        seconds = [torch.randint(1, 40, (n,), generator=generator).tolist() for n in (6, 1)]
        first, mask = torch.tensor(firsts), None
        second_mask = torch.tensor([[0] * (6 - len(row)) + [1] * len(row) for row in seconds])
        second = torch.tensor([[0] * (6 - len(row)) + row for row in seconds])
    cache = interp.HookedTransformerKeyValueCache.init_cache(cfg, "cpu", 2)
    with torch.no_grad():
        model(first, attention_mask=mask, past_kv_cache=cache)
        continued = model(second, attention_mask=second_mask, past_kv_cache=cache)[:, -1]
        alone = [model(torch.tensor([a + b]))[0, -1] for a, b in zip(firsts, seconds, strict=True)]
    torch.testing.assert_close(continued, torch.stack(alone), **TOL)


def test_patching_a_token_from_its_other_prompt_s_padding_is_refused():
    """Right-padded pairs of different lengths: the longer prompt's last tokens face the shorter one's
    padding, whose activations depend on the pad id. Patching every position of the longer prompt's
    run from the shorter one is refused (patching the clean run: noising, interp.patch, path patching,
    counterfactual edges; patching the corrupted run: denoising); patching the shorter prompt's run
    (its padding takes the other's values), named positions and a mean ablation are not, unless the
    metric reads a position that is padding in a run it scores (activation and attribution patching
    score both runs; `interp.patch` the patched run only)."""
    model = padded_model("right")
    tokens, mask = model.to_tokens_and_mask([LONG, SHORT, SHORT_CORRUPTED, SHORT_CORRUPTED])  # one width
    clean, corrupted = record_padding(tokens[:2], mask[:2]), record_padding(tokens[2:], mask[2:])
    # pair 0: the clean prompt 8 real tokens, the corrupted 5; pair 1: 5 and 5
    correct, incorrect = answers(model, 2)
    metric = metrics.logit_diff_metric(correct, incorrect, pos=model.last_positions(clean))
    circuit = torch.ones(
        edges.edge_graph(model).n_writers, edges.edge_graph(model).n_readers, dtype=torch.bool
    )
    refused = {
        "patch": lambda: interp.patch(model, clean, metric, head=HEAD, source=corrupted),
        "noising": lambda: patching.activation_patching(
            model, clean, corrupted, metric, "z", direction="noise"
        ),
        "denoising": lambda: patching.activation_patching(model, corrupted, clean, metric, "z"),
        "path_patching": lambda: path_patching.path_patching(model, clean, corrupted, metric),
        "edge faithfulness": lambda: edges.faithfulness(model, clean, corrupted, metric, circuit),
    }
    for name, run in refused.items():
        with pytest.raises(ValueError, match=r"pair 0: 8 real tokens in the run patched, 5 in its source"):
            run()
            pytest.fail(f"{name} patched padding in")
    interp.patch(model, clean, metric, head=HEAD, source=corrupted, pos=2)  # the source run is not scored
    edges.faithfulness(model, clean, corrupted, metric, circuit, ablation=Ablation("mean", reference=clean))
    scored_both = {  # the metric reads pair 0 at position 7, the corrupted prompt's padding
        "denoising": lambda: patching.activation_patching(model, clean, corrupted, metric, "z"),
        "attribution patching": lambda: patching.attribution_patching(model, clean, corrupted, metric, "z"),
        "logit_pos": lambda: patching.activation_patching(
            model, clean, corrupted, metric, "z", options=RunOptions(logit_pos=model.last_positions(clean))
        ),
    }
    for name, run in scored_both.items():
        with pytest.raises(ValueError, match=r"pair 0: .* position 7, but one of its prompts ends at 4"):
            run()
            pytest.fail(f"{name} read the padding")
    both_real = metrics.logit_diff_metric(correct, incorrect, pos=torch.tensor([4, 4]))
    patching.activation_patching(model, clean, corrupted, both_real, "z")  # denoising the 5-token prompt
    patching.attribution_patching(model, clean, corrupted, both_real, "z")
    with pytest.raises(
        ValueError, match=r"source prompt 0 is padding at position 6 \(its real tokens: 0\.\.4"
    ):
        interp.patch(model, clean, both_real, head=HEAD, source=corrupted, pos=6)
    with pytest.raises(ValueError, match=r"prompt 1 is right-padded .* position 6, its padding"):
        interp.patch(model, clean, metrics.logit_diff_metric(correct, incorrect, pos=torch.tensor([4, 6])),
                     head=HEAD, source=corrupted, pos=2)  # fmt: skip


def test_a_plain_metric_masking_the_padding_with_the_library_s_loss_reads_left_padded_prompts():
    """next_token_loss with the prompts' mask leaves the padding out by selection, so a plain metric
    built on it works on the NaN logits the checks put at a left-padded prompt's padding, and the
    short prompt's value is its own alone."""
    model = padded_model("left")
    clean, corrupted = model.to_tokens([SHORT, LONG]), model.to_tokens([SHORT_CORRUPTED, LONG_CORRUPTED])
    mask = model.attention_mask_of(clean)

    def summed_loss(logits):
        return interp.next_token_loss(logits, clean, per_token=True, attention_mask=mask).sum(1)

    patched = interp.patch(model, clean, summed_loss, head=HEAD, source=corrupted)
    short, short_corrupted = model.to_tokens([SHORT]), model.to_tokens([SHORT_CORRUPTED])
    alone = interp.patch(
        model, short, lambda logits: interp.next_token_loss(logits, short, per_token=True).sum(1),
        head=HEAD, source=short_corrupted,
    )  # fmt: skip
    torch.testing.assert_close(patched[0], alone[0], **TOL)
