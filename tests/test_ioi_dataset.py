import re

import pytest
import torch
from conftest import assert_ioi_invariants

import interp
from circuits.ioi import BABA_TEMPLATES, NAMES, make_ioi_dataset, single_token_names
from interp import metrics
from interp.interventions import ablation
from interp.model.tokens import recorded_padding
from interp.tasks.ioi import ioi_dataset_for


def _tiny_model(tokenizer, prepend_bos: bool) -> interp.HookedTransformer:
    """A small random model carrying a tokenizer and a BOS policy (no forward pass needed)."""
    cfg = interp.Config(
        n_layers=1, d_model=4, n_heads=1, d_vocab=len(tokenizer), n_ctx=64, default_prepend_bos=prepend_bos
    )
    return interp.HookedTransformer(cfg, tokenizer)


@pytest.fixture(scope="module")
def model(smollm2):
    """SmolLM2-135M: its tokenizer prepends no BOS."""
    assert not smollm2.cfg.default_prepend_bos
    return smollm2


@pytest.fixture(scope="module")
def dataset(model):
    return make_ioi_dataset(model, n_prompts=120, seed=0)


def test_positions_point_at_the_names(model, dataset):
    clean, _, _ = dataset
    assert_ioi_invariants(clean, model.tokenizer.pad_token_id)
    for i in range(len(clean)):
        text = clean.texts[i]
        io_name = model.tokenizer.decode(clean.io_token[i])
        assert model.to_str_tokens(clean.tokens[i])[clean.positions["END"][i]] == " to"
        assert model.to_string(clean.tokens[i, : clean.positions["END"][i] + 1]) == text
        assert io_name.startswith(" ") and io_name.strip() in NAMES


def test_names_are_single_tokens(model, dataset):
    clean, _, _ = dataset
    names = single_token_names(model)
    assert 5 <= len(names) < len(NAMES)  # SmolLM2 splits some of the paper's names
    for name, token in names.items():
        assert model.tokenizer(" " + name, add_special_tokens=False)["input_ids"] == [token]
    assert set(clean.io_token.tolist()) | set(clean.s_token.tolist()) <= set(names.values())


def test_orders_and_templates_of_different_lengths(dataset):
    clean, _, _ = dataset
    assert clean.order.count("ABBA") == clean.order.count("BABA") == 60
    assert len(clean.template.unique()) == len(BABA_TEMPLATES)
    assert len(clean.positions["END"].unique()) >= 5
    assert len(clean.positions["S2"].unique()) >= 5


def test_texts_tokenize_to_the_tokens(model, dataset):
    for prompts in dataset:
        assert torch.equal(model.to_tokens(prompts.texts), prompts.tokens)


def test_bos_policy_is_the_models(model, dataset):
    without_bos, _, _ = dataset
    bos_model = _tiny_model(model.tokenizer, prepend_bos=True)
    with_bos, _, _ = make_ioi_dataset(bos_model, n_prompts=120, seed=0)
    assert_ioi_invariants(with_bos, model.tokenizer.pad_token_id)
    assert (with_bos.tokens[:, 0] == model.tokenizer.bos_token_id).all()
    assert torch.equal(with_bos.tokens[:, 1:], without_bos.tokens)
    assert all(torch.equal(with_bos.positions[k], without_bos.positions[k] + 1) for k in with_bos.positions)
    assert with_bos.texts == without_bos.texts


def test_multi_token_places_and_objects(model):
    places, objects = ("Kuala Lumpur airport",), ("hand-carved wooden xylophone",)
    assert len(model.to_tokens(" " + places[0], prepend_bos=False)[0]) > 1
    clean, abc, swap = make_ioi_dataset(model, n_prompts=40, seed=1, places=places, objects=objects)
    assert_ioi_invariants(clean, model.tokenizer.pad_token_id)
    for prompts in (clean, abc, swap):
        assert torch.equal(model.to_tokens(prompts.texts), prompts.tokens)
    with_place = [
        text for text, t in zip(clean.texts, clean.template, strict=True) if "[PLACE]" in BABA_TEMPLATES[t]
    ]
    assert with_place and all(places[0] in text for text in with_place)


def test_same_seed_same_data_different_seed_different(model, dataset):
    clean, abc, swap = dataset
    again = make_ioi_dataset(model, n_prompts=120, seed=0)
    for first, second in zip((clean, abc, swap), again, strict=True):
        assert torch.equal(first.tokens, second.tokens) and first.texts == second.texts
    other = make_ioi_dataset(model, n_prompts=120, seed=1)[0]
    assert other.texts != clean.texts


def test_corruptions_change_exactly_the_names(model, dataset):
    clean, abc, swap = dataset
    rows = torch.arange(len(clean))
    names = set(single_token_names(model).values())
    for corrupted in (abc, swap):
        assert corrupted.tokens.shape == clean.tokens.shape
        assert all(torch.equal(corrupted.positions[k], clean.positions[k]) for k in clean.positions)
        assert torch.equal(corrupted.io_token, clean.io_token) and torch.equal(
            corrupted.s_token, clean.s_token
        )
        changed = corrupted.tokens != clean.tokens
        for key in ("IO", "S1", "S2"):
            changed[rows, clean.positions[key]] = False
        assert not changed.any()
    abc_names = torch.stack([abc.tokens[rows, clean.positions[k]] for k in ("IO", "S1", "S2")], dim=1)
    assert all(len(set(row)) == 3 and set(row) <= names for row in abc_names.tolist())
    assert (
        not (abc_names == clean.io_token[:, None]).any() and not (abc_names == clean.s_token[:, None]).any()
    )
    assert torch.equal(swap.tokens[rows, clean.positions["IO"]], clean.s_token)
    assert torch.equal(swap.tokens[rows, clean.positions["S1"]], clean.io_token)
    assert (swap.tokens != clean.tokens).sum(1).eq(2).all()


def test_custom_templates(model):
    templates = ["While [B] and [A] were at the [PLACE], [B] handed a [OBJECT] over to [A]"]
    clean, _, _ = make_ioi_dataset(model, n_prompts=10, seed=0, templates=templates)
    assert (clean.template == 0).all() and all(" handed a " in text for text in clean.texts)
    assert_ioi_invariants(clean, model.tokenizer.pad_token_id)


def test_smollm2_prefers_the_indirect_object(model, dataset):
    """The answers are right: the real model puts IO above S on clean prompts, not on ABC ones."""
    clean, abc = dataset[0][:16], dataset[1][:16]  # SmolLM2 on CPU: keep the forward pass small
    with torch.no_grad():
        logits = model(torch.cat([clean.tokens, abc.tokens]))
    clean_diff, abc_diff = clean.logit_diff(logits[:16]), abc.logit_diff(logits[16:])
    assert (clean_diff > 0).float().mean() >= 0.8
    assert clean_diff.mean() > 2.0 and abc_diff.abs().mean() < clean_diff.mean() / 2


def test_bad_input_raises(model):
    with pytest.raises(ValueError, match="single tokens"):
        make_ioi_dataset(model, n_prompts=4, names=["Mary", "John", "Brittany", "Kimberly", "Tiffany"])
    with pytest.raises(ValueError, match="template"):
        make_ioi_dataset(model, n_prompts=4, templates=["[B] and [A] went home."])
    with pytest.raises(ValueError, match="follow a space"):
        make_ioi_dataset(model, n_prompts=4, templates=["[B] and [A] met. [B] said hi to [A]"])
    with pytest.raises(ValueError, match="n_prompts"):
        make_ioi_dataset(model, n_prompts=0)


def test_subsets_keep_the_invariants(model, dataset):
    clean, _, _ = dataset
    abba = clean[torch.tensor([order == "ABBA" for order in clean.order])]
    assert len(abba) == 60 and set(abba.order) == {"ABBA"}
    assert_ioi_invariants(abba, model.tokenizer.pad_token_id)


def test_prompts_are_distinct_texts_when_templates_have_no_place_or_object(model):
    """Prompts that differ only in a place or object their template does not state are one text: the
    redraw keys prompts by what they read, and counts a template without those slots once."""
    from interp.tasks.ioi import make_ioi_dataset
    from interp.tasks.ioi_templates import BABA_TEMPLATES, NAMES

    clean, _, _ = make_ioi_dataset(model, 400, seed=0, names=NAMES[:8])
    assert len(set(clean.texts)) == len(clean)
    no_fillers = [next(t for t in BABA_TEMPLATES if "[PLACE]" not in t and "[OBJECT]" not in t)]
    clean, _, _ = make_ioi_dataset(model, 2 * 8 * 7, seed=0, templates=no_fillers, names=NAMES[:8])
    assert len(set(clean.texts)) == len(clean)  # every ordered pair of names in both orders
    with pytest.raises(ValueError, match="make only 112 distinct prompts"):
        make_ioi_dataset(model, 2 * 8 * 7 + 2, seed=0, templates=no_fillers, names=NAMES[:8])
    # balanced, each prompt keeps its template: one of few fillings among many ran forever redrawing
    templates = [no_fillers[0], next(t for t in BABA_TEMPLATES if "[PLACE]" in t and "[OBJECT]" in t)]
    with pytest.raises(ValueError, match=r"template 0 .* gets 25 ABBA prompts but makes only 20 distinct"):
        make_ioi_dataset(model, 100, seed=0, templates=templates, names=NAMES[:5], balanced=True)


def test_held_out_prompts_cover_every_template_in_both_orders_equally(model):
    from interp.tasks.ioi import ioi_dataset_for
    from interp.tasks.ioi_templates import HELDOUT_TEMPLATES, ioi_prompt_template

    assert len(HELDOUT_TEMPLATES) >= 12
    n_strata = 2 * len(HELDOUT_TEMPLATES)
    clean, _, _ = ioi_dataset_for(model, 3 * n_strata, seed=0, split="heldout")
    counts = {}
    for template, order in zip(clean.template.tolist(), clean.order, strict=True):
        counts[template, order] = counts.get((template, order), 0) + 1
    assert len(counts) == n_strata and set(counts.values()) == {3}
    assert len(set(clean.texts)) == len(clean)  # distinct
    assert_ioi_invariants(clean, model.tokenizer.pad_token_id)
    # the held-out templates' indices follow the discovery ones (each split counted from 0, "T0" named
    # two templates in the report's "what chose and what tested")
    discovery, _, _ = ioi_dataset_for(model, 3 * n_strata, seed=0)
    first = len(BABA_TEMPLATES)
    assert set(clean.template.tolist()) == set(range(first, first + len(HELDOUT_TEMPLATES)))
    assert set(discovery.template.tolist()) <= set(range(first))
    for text, template, order in zip(clean.texts, clean.template.tolist(), clean.order, strict=True):
        pattern = re.escape(ioi_prompt_template(HELDOUT_TEMPLATES[template - first], order))
        pattern = re.sub(r"\\\[(IO|S1|S2|PLACE|OBJECT)\\\]", ".+", pattern)
        assert re.fullmatch(pattern, text), (text, pattern)


def test_ioi_prompts_record_their_padding_so_a_mean_over_them_skips_it():
    """Toy IOI prompts are right-padded with token 0 after END: the tokens of the prompts, of their
    subsets and of their corruptions record it (as `to_tokens` does), so `Ablation("mean",
    reference=abc.tokens)`, the guides' example, averages each position over the prompts real there,
    as the explicit mask does; the same ids without the record mix the padding in."""
    toy = interp.load_model("toy-ioi")
    clean, abc, _ = ioi_dataset_for(toy, n_prompts=32, seed=0)
    end = clean.positions["END"]
    real = (torch.arange(clean.tokens.shape[1]) <= end[:, None]).long()
    assert bool((real == 0).any()), "the prompts are of several lengths"
    for name, prompts, rows in (
        ("clean", clean, slice(None)), ("abc", abc, slice(None)), ("swap", clean.swap(), slice(None)),
        ("subset", abc[5:9], slice(5, 9)), ("on a device", abc.to("cpu"), slice(None)),
    ):  # fmt: skip
        assert torch.equal(recorded_padding(prompts.tokens), real[rows]), name
    metric = metrics.logit_diff_metric(clean.io_token, clean.s_token, pos=end)
    heads = [(1, 0), (1, 1)]

    def ablated(reference: interp.Ablation) -> torch.Tensor:
        with torch.no_grad(), ablation.ablate(toy, heads=heads, ablation=reference):
            return metric(toy(clean.tokens))

    recorded = ablated(interp.Ablation("mean", reference=abc.tokens))
    torch.testing.assert_close(recorded, ablated(interp.Ablation("mean", reference=abc.tokens, mask=real)))
    unrecorded = ablated(interp.Ablation("mean", reference=abc.tokens.clone()))  # the record is lost
    assert (recorded - unrecorded).abs().max() > 0.1
