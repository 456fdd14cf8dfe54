from collections import Counter

import pytest
import torch
from conftest import assert_ioi_invariants

from interp.tasks import (
    Batch,
    InductionTask,
    IOIPrompts,
    MarkovChainTask,
    ToyIOITask,
    in_context_bigram_probs,
    ioi_prompt_template,
    repeated_sequence_masks,
    repeated_sequences,
    sample_markov_chains,
    split_generator,
)
from interp.tasks.ioi_templates import IOI_ORDERS, TOY_DISCOVERY_TEMPLATES


def test_split_generator_streams_differ_and_repeat():
    draw = lambda seed, split: torch.rand(4, generator=split_generator(seed, split))  # noqa: E731
    assert torch.equal(draw(0, "train"), draw(0, "train"))
    streams = [draw(0, "train"), draw(0, "eval"), draw(1, "train"), draw(1, "eval")]
    assert all(not torch.equal(a, b) for i, a in enumerate(streams) for b in streams[i + 1 :])
    with pytest.raises(ValueError, match="split"):
        split_generator(0, "test")


def test_repeated_sequences_halves_equal_and_bos():
    tokens = repeated_sequences(d_vocab=7, seq_len=5, batch=64, generator=0, bos=0)
    assert tokens.shape == (64, 11)
    assert (tokens[:, 0] == 0).all()
    assert torch.equal(tokens[:, 1:6], tokens[:, 6:])
    assert tokens[:, 1:].min() >= 1 and tokens[:, 1:].max() <= 6
    assert set(tokens[:, 1:].unique().tolist()) == set(range(1, 7))

    nonzero_bos = repeated_sequences(d_vocab=7, seq_len=5, batch=64, generator=0, bos=3)
    assert (nonzero_bos[:, 0] == 3).all() and (nonzero_bos[:, 1:] != 3).all()

    no_bos = repeated_sequences(d_vocab=7, seq_len=5, batch=3, generator=0, bos=None)
    assert no_bos.shape == (3, 10) and torch.equal(no_bos[:, :5], no_bos[:, 5:])

    avoided = repeated_sequences(d_vocab=7, seq_len=5, batch=64, generator=0, bos=1, avoid=[0, 4])
    assert set(avoided[:, 1:].unique().tolist()) == {2, 3, 5, 6}
    assert torch.equal(avoided, repeated_sequences(7, 5, 64, generator=0, bos=1, avoid=[4, 0, 1]))
    with pytest.raises(ValueError, match="avoid"):
        repeated_sequences(d_vocab=7, seq_len=5, batch=3, avoid=[7])
    with pytest.raises(ValueError, match="left to draw"):
        repeated_sequences(d_vocab=3, seq_len=5, batch=3, bos=0, avoid=[1, 2])
    with pytest.raises(TypeError, match="avoid must be a sequence of token ids"):
        repeated_sequences(d_vocab=7, seq_len=5, batch=3, avoid=4)
    with pytest.raises(TypeError, match="an id of avoid"):
        repeated_sequences(d_vocab=7, seq_len=5, batch=3, avoid=[None])


def test_repeated_sequences_seeded():
    same = [repeated_sequences(50, 8, 4, generator=torch.Generator().manual_seed(1)) for _ in range(2)]
    assert torch.equal(*same)
    assert not torch.equal(same[0], repeated_sequences(50, 8, 4, generator=2))
    with pytest.raises(ValueError, match="seq_len"):
        repeated_sequences(50, 0, 4)
    with pytest.raises(ValueError, match="bos"):
        repeated_sequences(50, 3, 4, bos=50)


@pytest.mark.parametrize("has_bos", [True, False])
def test_repeated_sequence_masks_select_the_right_predictions(has_bos):
    seq_len = 6
    tokens = repeated_sequences(30, seq_len, 8, generator=0, bos=0 if has_bos else None)
    first_half, second_half = repeated_sequence_masks(seq_len, has_bos)
    assert first_half.shape == second_half.shape == (tokens.shape[1] - 1,)
    assert first_half.sum() == second_half.sum() == seq_len - 1
    assert not (first_half & second_half).any()
    offset = int(has_bos)
    for p in second_half.nonzero()[:, 0].tolist():  # current and next token seen one copy earlier
        assert torch.equal(tokens[:, p - seq_len], tokens[:, p])
        assert torch.equal(tokens[:, p + 1 - seq_len], tokens[:, p + 1])
    for p in first_half.nonzero()[:, 0].tolist():  # predicting r_2..r_n of the first copy
        assert offset + 1 <= p + 1 <= offset + seq_len - 1


def _pair_seen_before(row: torch.Tensor, p: int) -> bool:
    return any(row[q] == row[p] and row[q + 1] == row[p + 1] for q in range(p))


def test_induction_task_masks_copied_tokens():
    task = InductionTask(d_vocab=500, n_ctx=40, min_span=3, max_span=10)
    batch = task.eval_batch(32)
    assert batch.tokens.shape == (32, 40) and batch.loss_mask.shape == (32, 39)
    assert (batch.tokens[:, 0] == 0).all() and (batch.tokens[:, 1:] != 0).all()
    masked_per_row = batch.loss_mask.sum(1)
    assert masked_per_row.min() >= 2 and masked_per_row.max() <= 9
    assert len(masked_per_row.unique()) > 3  # span lengths vary
    assert len(batch.loss_mask.float().argmax(1).unique()) > 5  # copy positions vary
    for row, mask in zip(batch.tokens, batch.loss_mask, strict=True):
        assert all(_pair_seen_before(row, p) for p in mask.nonzero()[:, 0].tolist())


def test_induction_task_seeds_and_splits():
    task = InductionTask(d_vocab=100, n_ctx=24)
    first = next(task.batches(8, seed=0))
    assert torch.equal(first.tokens, next(task.batches(8, seed=0)).tokens)
    assert not torch.equal(first.tokens, next(task.batches(8, seed=1)).tokens)
    assert not torch.equal(first.tokens, task.eval_batch(8, seed=0).tokens)
    stream = task.batches(8, seed=0)
    assert not torch.equal(next(stream).tokens, next(stream).tokens)
    all_tokens = InductionTask(d_vocab=100, n_ctx=24, loss_on_all_tokens=True)
    assert all_tokens.eval_batch(8).loss_mask.all()
    assert torch.equal(all_tokens.eval_batch(8).tokens, task.eval_batch(8).tokens)
    with pytest.raises(ValueError, match="max_span"):
        InductionTask(d_vocab=100, n_ctx=10, max_span=5)


def test_markov_chains_follow_their_own_transition_matrix():
    batch, k = 6, 3
    states, transitions = sample_markov_chains(n_states=k, seq_len=4000, batch=batch, generator=0)
    assert states.shape == (batch, 4000) and transitions.shape == (batch, k, k)
    assert torch.allclose(transitions.sum(-1), torch.ones(batch, k))
    pairs = torch.nn.functional.one_hot(states[:, :-1] * k + states[:, 1:], k * k).sum(1).reshape(batch, k, k)
    visits = pairs.sum(-1, keepdim=True).float()  # [batch, from, 1]
    empirical = pairs / visits.clamp(min=1)
    # Each transition frequency is within 5 standard errors of its own matrix's probability.
    std_error = (transitions * (1 - transitions) / visits.clamp(min=1)).sqrt()
    assert ((empirical - transitions).abs() <= 5 * std_error + 1e-3).all()
    # And each sequence is far more likely under its own matrix than under any other sequence's.
    log_likelihood = (pairs[:, None] * transitions[None].log()).sum((-1, -2))  # [sequence, matrix]
    assert (log_likelihood.argmax(1) == torch.arange(batch)).all()


def test_markov_chains_seeded_and_task_shapes():
    a, ta = sample_markov_chains(4, 20, 3, generator=torch.Generator().manual_seed(5))
    b, tb = sample_markov_chains(4, 20, 3, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and torch.equal(ta, tb)
    task = MarkovChainTask(n_states=4, n_ctx=32)
    batch = next(task.batches(5, seed=0))
    assert task.d_vocab == 4 and batch.tokens.shape == (5, 32) and batch.loss_mask.all()
    assert batch.tokens.max() < 4
    assert not torch.equal(batch.tokens, task.eval_batch(5).tokens)
    with pytest.raises(ValueError, match="alpha"):
        MarkovChainTask(n_states=4, n_ctx=32, alpha=0)


def test_in_context_bigram_probs():
    probs = in_context_bigram_probs(torch.tensor([[0, 1, 0, 0]]), n_states=2, alpha=1.0)
    assert torch.allclose(probs.sum(-1), torch.ones(1, 4))
    # At t=2 the state is 0 and 0 -> 1 was seen once: (0 + 1) / 3, (1 + 1) / 3.
    assert torch.allclose(probs[0, 2], torch.tensor([1 / 3, 2 / 3]))
    assert torch.allclose(probs[0, 0], torch.tensor([0.5, 0.5]))
    states, transitions = sample_markov_chains(3, 3000, 2, generator=1)
    final = in_context_bigram_probs(states, 3)[torch.arange(2), -1]  # [batch, k]
    true_rows = transitions[torch.arange(2), states[:, -1]]
    assert (final - true_rows).abs().max() < 0.06


def test_batch_masked_mean_and_validation():
    batch = Batch(
        torch.zeros(2, 4, dtype=torch.long), torch.tensor([[True, False, False], [False, True, True]])
    )
    values = torch.arange(6.0).reshape(2, 3)
    assert batch.masked_mean(values) == (0 + 4 + 5) / 3
    with pytest.raises(ValueError, match="loss_mask"):
        Batch(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool))


# ---------------------------------------------------------------- toy IOI


def test_ioi_prompt_template_orders():
    template = "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]"
    assert (
        ioi_prompt_template(template, "BABA")
        == "Then, [S1] and [IO] went to the [PLACE]. [S2] gave a [OBJECT] to"
    )
    assert (
        ioi_prompt_template(template, "ABBA")
        == "Then, [IO] and [S1] went to the [PLACE]. [S2] gave a [OBJECT] to"
    )
    for bad in [
        "[B] and [A] met. [B] left",
        "[A] and [B] met. [B] said hi to [A]",
        "[B] met [A]. [B] said hi to [A].",
    ]:
        with pytest.raises(ValueError, match="template"):
            ioi_prompt_template(bad, "ABBA")
    with pytest.raises(ValueError, match="order"):
        ioi_prompt_template(template, "AABB")


@pytest.fixture(scope="module")
def toy():
    return ToyIOITask(n_names=12)


def test_toy_ioi_prompts_invariants(toy):
    clean, abc, swap = toy.make_dataset(200, seed=0)
    assert_ioi_invariants(clean, toy.pad)
    assert clean.tokens.shape == (200, toy.n_ctx - 1)
    assert set(clean.order) == {"ABBA", "BABA"}
    assert len(clean.template.unique()) == len(toy.templates["BABA"])
    assert len(clean.positions["END"].unique()) >= 3  # templates of different lengths
    assert (clean.tokens[:, 0] == toy.bos).all()
    assert set(clean.io_token.tolist()) <= set(toy.name_tokens.tolist())
    assert clean.texts[0] == toy.decode(clean.tokens[0, 1 : clean.positions["END"][0] + 1])
    assert clean.tokens.max() < toy.d_vocab


def test_toy_ioi_corruptions(toy):
    clean, abc, swap = toy.make_dataset(200, seed=0)
    rows = torch.arange(len(clean))
    name_positions = torch.zeros_like(clean.tokens, dtype=torch.bool)
    for key in ("IO", "S1", "S2"):
        name_positions[rows, clean.positions[key]] = True
    for corrupted in (abc, swap):
        assert corrupted.tokens.shape == clean.tokens.shape
        assert all(torch.equal(corrupted.positions[k], clean.positions[k]) for k in clean.positions)
        assert torch.equal(corrupted.io_token, clean.io_token) and torch.equal(
            corrupted.s_token, clean.s_token
        )
        assert corrupted.order == clean.order and torch.equal(corrupted.template, clean.template)
        assert torch.equal(corrupted.tokens[~name_positions], clean.tokens[~name_positions])
    abc_names = torch.stack(
        [abc.tokens[rows, clean.positions[k]] for k in ("IO", "S1", "S2")], 1
    )  # [batch, 3]
    assert (abc.tokens != clean.tokens).sum(1).eq(3).all()
    assert all(len(set(names)) == 3 for names in abc_names.tolist())
    assert (
        not (abc_names == clean.io_token[:, None]).any() and not (abc_names == clean.s_token[:, None]).any()
    )
    assert set(abc_names.flatten().tolist()) <= set(toy.name_tokens.tolist())
    assert torch.equal(swap.tokens[rows, clean.positions["IO"]], clean.s_token)
    assert torch.equal(swap.tokens[rows, clean.positions["S1"]], clean.io_token)
    assert (swap.tokens != clean.tokens).sum(1).eq(2).all()
    assert swap.texts[0] != clean.texts[0] and sorted(swap.texts[0].split()) == sorted(clean.texts[0].split())
    with pytest.raises(ValueError, match="5 distinct"):
        clean.abc(toy.name_tokens[:4])


def test_toy_ioi_seeds_and_splits(toy):
    first = toy.make_dataset(50, seed=0)[0]
    assert torch.equal(first.tokens, toy.make_dataset(50, seed=0)[0].tokens)
    assert not torch.equal(first.tokens, toy.make_dataset(50, seed=1)[0].tokens)
    assert not torch.equal(first.tokens, toy.make_dataset(50, seed=0, split="train")[0].tokens)


def _rows(prompts: IOIPrompts) -> set[tuple[int, ...]]:
    return {tuple(row) for row in prompts.tokens.tolist()}


def test_toy_ioi_heldout_split_is_distinct_balanced_and_disjoint_from_discovery():
    import interp
    from interp.tasks.ioi import ioi_dataset_for

    model = interp.load_model("toy-ioi")
    task = ToyIOITask()
    heldout_templates = [t for t in range(len(task.templates["BABA"])) if t not in TOY_DISCOVERY_TEMPLATES]
    strata = {(t, order) for t in heldout_templates for order in IOI_ORDERS}
    heldout_rows = []
    for seed in (0, 1):
        heldout = ioi_dataset_for(model, 20 * len(strata), seed=seed, split="heldout")[0]
        assert len(_rows(heldout)) == len(heldout)  # no prompt twice
        assert not _rows(heldout) & _rows(ioi_dataset_for(model, 300, seed=seed)[0])  # nor a discovery one
        counts = Counter(zip(heldout.template.tolist(), heldout.order, strict=True))
        assert set(counts) == strata and set(counts.values()) == {20}
        assert_ioi_invariants(heldout, task.pad)
        heldout_rows.append(_rows(heldout))
    assert heldout_rows[0] != heldout_rows[1]
    # Template 4 ("[B] and [A] met . [B] said hi to [A]") has no place or object: the 8 held-out
    # names make 8 * 7 prompts per order; it is the second of 2 templates taking turns, so its 57th
    # ABBA prompt would be prompt 2 * (1 + 56 * 2).
    most = 2 * (1 + 56 * 2)
    assert len(_rows(ioi_dataset_for(model, most, seed=0, split="heldout")[0])) == most
    with pytest.raises(ValueError, match=f"only 56 distinct prompts per order .* at most {most} "):
        ioi_dataset_for(model, most + 1, seed=0, split="heldout")


def test_toy_ioi_balanced_prompts_are_distinct_up_to_their_number(toy):
    names = toy.name_tokens[:5]  # 5 * 4 (IO, S) pairs
    # Template 3 has a place and an object (6 each): 20 * 36 prompts per order; template 4 has
    # neither: 20. Taking turns, template 4 (second) runs out first, after prompt 2 * (1 + 20 * 2).
    most = 2 * (1 + 20 * 2)
    clean = toy.make_dataset(most, seed=0, templates=[3, 4], names=names, balanced=True)[0]
    assert len(_rows(clean)) == most
    assert Counter(zip(clean.template.tolist(), clean.order, strict=True))[4, "BABA"] == 20
    assert set(clean.io_token.tolist()) | set(clean.s_token.tolist()) == set(names.tolist())
    with pytest.raises(
        ValueError, match=f"template 4 .* only 20 distinct prompts per order .* at most {most} "
    ):
        toy.make_dataset(most + 1, seed=0, templates=[3, 4], names=names, balanced=True)
    with pytest.raises(ValueError, match="distinct templates"):
        toy.make_dataset(4, templates=[4, 4], balanced=True)
    with pytest.raises(ValueError, match="names must be distinct"):
        toy.make_dataset(4, names=torch.cat([names, names[:1]]))
    # ids that are no names made prompts such as "After and . met . . said hi to"; a template past the
    # last, one name: errors from inside torch
    for bad, message in [
        (dict(names=[2, 3, 4]), "names must be two or more of the task's name token ids"),
        (dict(names=names[:1]), "names must be two or more"),
        (dict(templates=[9]), "templates must be indices of the 5 templates, got \\[9\\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            toy.prompts(4, 0, **bad)


def test_toy_ioi_training_batch_has_answer_and_mask(toy):
    batch = next(toy.batches(64, seed=0))
    assert batch.tokens.shape == (64, toy.n_ctx) and batch.loss_mask.shape == (64, toy.n_ctx - 1)
    assert batch.loss_mask.sum(1).eq(1).all()
    end = batch.loss_mask.float().argmax(1)
    rows = torch.arange(64)
    answer = batch.tokens[rows, end + 1]
    assert set(answer.tolist()) <= set(toy.name_tokens.tolist())
    assert (batch.tokens[rows[:, None], torch.arange(toy.n_ctx)[None]] == toy.pad)[
        torch.arange(toy.n_ctx)[None] > (end + 1)[:, None]
    ].all()
    for row, e in zip(
        batch.tokens, end.tolist(), strict=True
    ):  # the answer is the name that occurs once before it
        counts = {name: (row[: e + 1] == name).sum().item() for name in toy.name_tokens.tolist()}
        assert counts[int(row[e + 1])] == 1 and sorted(counts.values())[-1] == 2


def test_ioi_prompts_subset_device_and_logit_diff(toy):
    clean = toy.make_dataset(10, seed=3)[0]
    subset = clean[torch.tensor([2, 5])]
    assert len(subset) == 2 and subset.order == [clean.order[2], clean.order[5]]
    assert torch.equal(subset.tokens, clean.tokens[[2, 5]]) and subset.texts == [
        clean.texts[2],
        clean.texts[5],
    ]
    assert torch.equal(clean[3].tokens, clean.tokens[3:4]) and len(clean[-1]) == 1 and len(clean[2:7]) == 5
    assert len(clean[clean.template == clean.template[0]]) >= 1
    assert clean.to("cpu").tokens.device.type == "cpu"
    logits = torch.randn(10, clean.tokens.shape[1], toy.d_vocab)
    end = clean.positions["END"]
    expected = [logits[i, end[i], clean.io_token[i]] - logits[i, end[i], clean.s_token[i]] for i in range(10)]
    assert torch.allclose(clean.logit_diff(logits), torch.stack(expected))
    with pytest.raises(ValueError, match="positions"):
        IOIPrompts(clean.tokens, clean.io_token, clean.s_token, {"IO": end}, clean.template, clean.order)
