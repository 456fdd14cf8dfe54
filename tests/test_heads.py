"""Head-type scores, weight evidence and causal checks (circuits.heads)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TRAIN_SEED, tiny_config

import interp
from circuits.heads import PATTERN_SCORES, Probe, head_report, make_probes, score_heads
from circuits.heads.probes import family_tokens, fresh_tokens, induction_lengths
from circuits.heads.scores import (
    fixed_offset_scores,
    mask_scores,
    pattern_scores,
    probe_patterns,
    score_masks,
    uniform_pattern,
)
from circuits.heads.weights import copying_scores, k_composition_scores
from interp.tasks import PeriodicTask
from interp.training import TrainConfig, train

SEQ = 6  # repeated sequence r_1..r_6 r_1..r_6 with a BOS: 13 positions


def repeated_tokens() -> torch.Tensor:
    half = torch.tensor([[5, 9, 2, 7, 3, 8]])
    return torch.cat([torch.zeros(1, 1, dtype=torch.long), half, half], dim=1)


def one_hot_pattern(keys: list[int]) -> torch.Tensor:
    """[1, 1, q, k] attention from each query q to key keys[q]."""
    n = len(keys)
    pattern = torch.zeros(1, 1, n, n)
    pattern[0, 0, torch.arange(n), torch.tensor(keys)] = 1.0
    return pattern


def scores_of(pattern: torch.Tensor, tokens: torch.Tensor) -> dict[str, float]:
    lengths = torch.tensor([tokens.shape[1]])
    return {
        name: float(value[0, 0])
        for name, value in pattern_scores(pattern, score_masks(tokens, lengths), lengths).items()
    }


def test_ideal_patterns_score_one_on_their_type_only():
    tokens = repeated_tokens()
    n = tokens.shape[1]
    previous = scores_of(one_hot_pattern([0] + list(range(n - 1))), tokens)
    assert previous["previous_token"] == pytest.approx(1.0)
    assert previous["induction"] == pytest.approx(0.0) and previous["current_token"] == pytest.approx(0.0)
    # induction: query 1 + SEQ + i (second r_{i+1}) attends to 2 + i (the token after the first r_{i+1})
    induction_keys = list(range(1 + SEQ)) + [2 + i for i in range(SEQ)]
    induction = scores_of(one_hot_pattern(induction_keys), tokens)
    assert induction["induction"] == pytest.approx(1.0)
    assert induction["duplicate_token"] == pytest.approx(0.0)
    duplicate = scores_of(one_hot_pattern(list(range(1 + SEQ)) + [1 + i for i in range(SEQ)]), tokens)
    assert duplicate["duplicate_token"] == pytest.approx(1.0) and duplicate["induction"] == pytest.approx(0.0)
    sink = scores_of(one_hot_pattern([0] * n), tokens)
    assert sink["first_token"] == pytest.approx(1.0) and sink["broad"] == pytest.approx(0.0)


def test_uniform_attention_gives_the_chance_baseline():
    tokens = repeated_tokens()
    n = tokens.shape[1]
    uniform = scores_of(uniform_pattern(torch.tensor([n]), n), tokens)
    chance = sum(1 / (q + 1) for q in range(1, n)) / (n - 1)  # one key out of q+1, queries 1..n-1
    assert uniform["previous_token"] == pytest.approx(chance)
    assert uniform["current_token"] == pytest.approx(chance)
    assert uniform["induction"] == pytest.approx(sum(1 / (q + 1) for q in range(1 + SEQ, n)) / SEQ)
    assert uniform["broad"] == pytest.approx(1.0)


def test_padding_is_ignored():
    tokens = repeated_tokens()
    padded = torch.cat([tokens, torch.tensor([[5, 9, 0]])], dim=1)  # pad tokens repeat earlier ones
    n = padded.shape[1]
    pattern = uniform_pattern(torch.tensor([n]), n)
    lengths = torch.tensor([tokens.shape[1]])
    with_pad = pattern_scores(pattern, score_masks(padded, lengths), lengths)
    without = scores_of(uniform_pattern(lengths, tokens.shape[1]), tokens)
    for name in ("previous_token", "induction", "duplicate_token", "first_token"):
        assert float(with_pad[name][0, 0]) == pytest.approx(without[name])


def test_random_model_has_no_content_heads():
    """Random initial weights attend near-uniformly: scores sit at the baseline and no head is typed."""
    torch.manual_seed(0)
    model = interp.HookedTransformer(tiny_config(n_ctx=64, attn_only=True))
    report = head_report(model, n_samples=8, seq_len=12)
    table = report.extras.table
    for name in ("previous_token", "induction", "duplicate_token", "current_token", "first_token"):
        margin = report.extras.thresholds[name] - table[name].max()
        assert margin > 0.25, (name, table[name].max())
    for name in ("fixed_offset", "skip_gram"):
        margin = report.extras.thresholds[name] - table[name].max()
        assert margin > 0.2, (name, table[name].max())
    assert not table["types"].apply(lambda types: bool(set(types) - {"broad"})).any()
    assert table["induction_effect"].isna().all()  # no candidates, nothing ablated


def test_a_random_weight_model_confirms_no_head_beyond_random():
    """Random initial weights, every head of the last layer but two put through the induction check:
    each is compared with the two left (its layer's random heads, paired per held-out sequence, with a
    CI), and none is confirmed."""
    from circuits.heads.causal import induction_ablation_effects, random_head_classes

    torch.manual_seed(0)
    model = interp.HookedTransformer(tiny_config(n_ctx=64, attn_only=True))
    probes = make_probes(model, n_samples=8, seq_len=12)
    probe, classes = probes.held_out, random_head_classes(model, [(1, 0), (1, 1)], seed=3)
    candidates = list(classes)
    found = induction_ablation_effects(model, probe, classes, seed=3, reference=probes.reference)
    for head in candidates:
        assert found.verdict(head) != "confirmed"
        judged = found.judged[head]["alone"]
        assert judged.random_sets and all(draw in (["L1H2"], ["L1H3"]) for draw in judged.random_sets)
        low, high = judged.heldout.beyond_ci
        assert low <= judged.heldout.beyond <= high and judged.heldout.n_prompts >= len(probe.tokens) // 2


def test_a_previous_token_head_is_compared_only_with_heads_that_could_move_its_readout():
    """Every layer-0 head of the planted induction model a previous-token head: their layer has no
    random head left, and the random heads came from layer 1, the induction heads' own layer, whose
    ablation cannot move the attention the check reads (a baseline of 0 by construction: L0H0
    "confirmed" on its raw drop). Now no random head stands in, and none is confirmed."""
    from circuits.edge_circuits.ground_truth import planted_induction

    model = planted_induction(n_vocab=32, seq_len=16).model
    with torch.no_grad():
        for head in (1, 2):  # a0.h1, a0.h2 attend as a0.h0 does (to the previous token), writing junk
            model.blocks[0].attn.W_Q[head] = model.blocks[0].attn.W_Q[0]
            model.blocks[0].attn.W_K[head] = model.blocks[0].attn.W_K[0]
    finding = head_report(model, n_samples=8, seed=0, seq_len=12)
    previous = [c for c in finding.classes if c.details["type"] == "previous_token"]
    induction_layer = min(int(c.heads[0][1]) for c in finding.classes if c.details["type"] == "induction")
    assert previous and induction_layer == 1
    for found in previous:
        assert all(int(head[1]) < induction_layer for draw in found.random_sets for head in draw)
        assert found.verdict != "confirmed"


@pytest.mark.parametrize(("n_sequences", "stated", "text"), [(24, 0.0032, "0.32%"), (3, 0.048, "4.8%")])
def test_the_stated_rate_of_stopping_an_effect_at_the_minimum_holds(n_sequences, stated, text):
    """The settings say an effect truly at the minimum is stopped after the first look with the
    probability of a t tail (0.32% at the default 24 sequences, 4.8% at 3); they said "at most 0.13%,
    normal approximation", while the standard error is estimated from those few sequences. Simulated
    with `_Runs.futile`'s rule, within 4 binomial standard errors."""
    from circuits.heads.causal import FUTILITY_SE, MIN_EFFECT, mean_se
    from circuits.heads.pipeline import CHECKS

    assert f"{text} at {n_sequences}" in CHECKS["causal_method"].replace("the default 24", "24")
    generator, trials = torch.Generator().manual_seed(0), 40_000
    minimum = MIN_EFFECT["induction"]
    effects = minimum + 0.05 * torch.randn(trials, n_sequences, generator=generator, dtype=torch.float64)
    stopped = sum(mean + FUTILITY_SE * se < minimum for mean, se in map(mean_se, effects))
    assert abs(stopped / trials - stated) < 4 * math.sqrt(stated * (1 - stated) / trials)


def test_an_ablated_head_keeps_none_of_its_own_output():
    """The causal checks mean-ablate a head to its mean over other sequences of the held-out family laid
    out as the held-out probe (`Probes.reference`), not over the probe's own: where only 4 of those reach
    a position, that mean would leave each ablated head a quarter of its own output there (toy-induction's
    four induction heads ablated together: 4.99 nats, for about 5.3 with a mean over many sequences)."""
    from circuits.heads.causal import clean_run_for_ablations

    model = interp.load_model("toy-induction")
    probes = make_probes(model, n_samples=4, seed=2)
    held_out, reference = probes.held_out, probes.reference
    n = len(held_out.tokens)
    for field in ("lengths", "repeat_len", "repeat_start"):  # the probe's layout, over and over
        assert (getattr(reference, field).view(-1, n) == getattr(held_out, field)).all()
    assert len(reference.tokens) >= 4 * n
    real = torch.arange(reference.tokens.shape[1]) < reference.lengths[:, None]
    family = set(family_tokens(model, "held_out").tolist())
    assert set(reference.tokens[real].tolist()) - family <= {held_out.tokens[0, 0].item()}  # and the BOS

    def sequences(probe: Probe) -> set[tuple[int, ...]]:
        return {tuple(row[:length].tolist()) for row, length in zip(probe.tokens, probe.lengths, strict=True)}

    assert not sequences(reference) & sequences(held_out)
    other = fresh_tokens(model, held_out, seed=99, family="held_out")  # the same layout, other tokens
    means = clean_run_for_ablations(model, held_out, reference, [0, 1]).z_mean
    assert sequences(other) != sequences(held_out)
    for layer, mean in clean_run_for_ablations(model, other, reference, [0, 1]).z_mean.items():
        assert torch.equal(mean, means[layer])  # the probe's own tokens do not enter its heads' means
    with pytest.raises(ValueError, match="reference=probes.reference"):
        clean_run_for_ablations(model, held_out, None, [1])


def test_copying_score_equals_eigenvalues_of_full_ov_circuit():
    """The full OV circuit through the norms: each LayerNorm reads the centred stream (P: the mean over
    d_model taken out) and scales it by its weight; the logits are taken against their mean over the
    vocabulary."""
    torch.manual_seed(1)
    model = interp.HookedTransformer(tiny_config())
    d_model = model.cfg.d_model
    P = torch.eye(d_model) - torch.full((d_model, d_model), 1 / d_model)
    scores = copying_scores(model)
    W_U = P @ (model.W_U.detach() * model.ln_final.w.detach()[:, None])
    W_U = W_U @ (torch.eye(model.cfg.d_vocab) - 1 / model.cfg.d_vocab)
    for layer in range(model.cfg.n_layers):
        W_V = P @ (model.W_V[layer].detach() * model.blocks[layer].ln1.w.detach()[None, :, None])
        full = model.W_E.detach() @ W_V @ model.W_O[layer].detach() @ W_U  # [head, vocab, vocab]
        eig = torch.linalg.eigvals(full.double())
        expected = eig.sum(-1).real / eig.abs().sum(-1)
        torch.testing.assert_close(scores[layer].double(), expected, atol=1e-4, rtol=0)
    with torch.no_grad():
        model.blocks[0].attn.W_O.neg_()
    torch.testing.assert_close(copying_scores(model)[0], -scores[0], atol=1e-5, rtol=0)


def test_k_composition_matches_dense_matrices():
    """Each head reads the LayerNorm's centred stream (P), and sees that of what a head writes; the norms'
    weights are ones here."""
    torch.manual_seed(2)
    model = interp.HookedTransformer(tiny_config(n_layers=3, n_kv_heads=2))
    d_model = model.cfg.d_model
    P = torch.eye(d_model) - torch.full((d_model, d_model), 1 / d_model)
    sources = [(0, 1), (1, 3)]
    scores = k_composition_scores(model, sources)
    assert scores[0].isnan().all()
    for layer in (1, 2):
        for head in range(model.cfg.n_heads):
            QK = P @ model.QK[layer, head].AB.detach() @ P
            values = []
            for lp, hp in sources:
                if lp < layer:
                    OV = P @ model.OV[lp, hp].AB.detach() @ P  # what a LayerNorm reader sees of it
                    values.append((QK @ OV.T).norm() / (QK.norm() * OV.norm()))
            assert float(scores[layer, head]) == pytest.approx(float(max(values)), rel=1e-4)


def test_weight_scores_of_raw_and_transformer_lens_processed_weights_agree():
    """Folding a LayerNorm, centring the writing weights and the unembedding (TransformerLens's
    processing) leave the network's log-probabilities as they are, so its copying and K-composition
    scores too."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=61, n_positions=32, tie_word_embeddings=False
    )
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "ln" in name:
                param.add_(torch.randn_like(param) * 0.3)
        hf.transformer.wte.weight.add_(torch.randn(32) * 0.5)  # a shared offset, which LayerNorm removes
        hf.lm_head.weight.add_(torch.randn(32))  # one shared by every token's logit, which no softmax sees
    raw = interp.load_model(hf)
    processed = interp.HookedTransformer.from_pretrained("gpt2", hf_model=hf, device="cpu")
    torch.testing.assert_close(copying_scores(raw), copying_scores(processed), atol=1e-3, rtol=0)
    sources = [(0, 1), (0, 3)]
    torch.testing.assert_close(
        k_composition_scores(raw, sources)[1], k_composition_scores(processed, sources)[1], atol=1e-3, rtol=0
    )


def test_bad_settings_raise():
    model = interp.HookedTransformer(tiny_config())
    with pytest.raises(ValueError, match="n_samples"):
        head_report(model, n_samples=1)
    with pytest.raises(ValueError, match="tokenizer"):
        head_report(model, natural_text=["hello"])
    from circuits.heads import HeadSettings

    with pytest.raises(ValueError, match="max_candidates"):  # refused before any model runs
        HeadSettings(max_candidates=0)
    with pytest.raises(ValueError, match="n_random"):
        head_report(model, HeadSettings(causal=False), n_random=0)


def test_settings_and_keyword_options_make_the_same_report():
    from circuits.heads import HeadSettings

    model = interp.load_model("toy-induction")
    given = head_report(model, HeadSettings(n_samples=4, seed=2, causal=False))
    keywords = head_report(model, n_samples=4, seed=2, causal=False)
    assert given.settings == keywords.settings and given.settings.n_samples == 4
    assert given.extras.table.equals(keywords.extras.table) and given.classes == keywords.classes == []


def test_attention_scores_agree_with_transformer_lens_head_detector(smollm2):
    """Same weights in a TransformerBridge: TL's "mul" score is ours times (valid queries / rows)."""
    import transformers
    from transformer_lens import head_detector
    from transformer_lens.model_bridge import TransformerBridge

    tokenizer = smollm2.tokenizer
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in hf.model.layers:  # sharper attention than at initialisation, so heads differ
            layer.self_attn.q_proj.weight.mul_(50)
    model = interp.load_model(hf, tokenizer=tokenizer)  # before the bridge, which wraps hf's modules
    bridge = TransformerBridge.boot_transformers(
        "HuggingFaceTB/SmolLM2-135M", hf_model=hf, tokenizer=tokenizer
    )

    text = "The cat sat on the mat and the dog sat on the rug. " * 2
    tokens = bridge.to_tokens(text).cpu()
    n = tokens.shape[1]
    probe = Probe("text", tokens, torch.tensor([n]), [])
    ours, _ = probe_patterns(model, probe, batch_size=1, score=mask_scores)
    masks = score_masks(tokens, torch.tensor([n]))
    for ours_name, tl_name in [
        ("previous_token", "previous_token_head"),
        ("duplicate_token", "duplicate_token_head"),
        ("induction", "induction_head"),
    ]:
        n_valid = int(masks[ours_name][1].sum())
        expected = ours[ours_name][0] * n_valid / n  # [layer, head]
        tl = head_detector.detect_head(bridge, text, tl_name)
        torch.testing.assert_close(tl.float(), expected.float(), atol=2e-4, rtol=0)
        assert tl.std() > 10 * 2e-4  # heads differ well beyond the tolerance


def test_smollm2_induction_heads_confirmed_causally(smollm2):
    report = head_report(smollm2, n_samples=8, seq_len=16, max_candidates=4, natural_text=())
    table = report.extras.full_table(report)
    induction = report.extras.heads_of_type("induction")
    assert induction, "SmolLM2 has induction heads"
    for layer, head in induction:
        row = table[(table["layer"] == layer) & (table["head"] == head)].iloc[0]
        assert (
            min(row[f"induction_len{n}"] for n in report.extras.induction_lengths)
            >= report.extras.thresholds["induction"]
        )
        # Confirmed beyond random heads of its layer not typed induction, alone or with the others ablated.
        suffix = {"alone": "", "with_others_ablated": "_with_others"}[row["induction_confirmed_by"]]
        beyond = row[f"induction_beyond_random{suffix}"]
        assert row[f"induction_beyond_random{suffix}_ci_low"] > 0 and beyond >= 0.02
        assert beyond == pytest.approx(
            row[f"induction_effect{suffix}"] - row[f"induction_random_effect{suffix}"]
        )
        randoms = [tuple(map(int, label[1:].split("H"))) for label in row["induction_random_heads"]]
        assert len(randoms) == 5 and all(r[0] == layer for r in randoms)  # 9 heads a layer: some left
        typed = table.set_index(["layer", "head"]).loc[randoms, "induction"]
        assert (typed < report.extras.thresholds["induction"]).all()
    # Layer 0 has no earlier layer to compose with: induction needs two layers.
    assert all(layer > 0 for layer, _ in induction)
    # The previous-token heads that feed them: ablating one lowers their prefix-matching score.
    confirmed = table[table["previous_token_confirmed"]]
    assert len(confirmed), "a previous-token head feeds SmolLM2's induction heads"
    assert (confirmed["layer"] < max(layer for layer, _ in induction)).all()
    # Weight evidence: induction heads K-compose with previous-token heads more than the other heads do.
    others = table[~table["types"].apply(lambda types: "induction" in types) & table["k_composition"].notna()]
    ind_rows = table[table["types"].apply(lambda types: "induction" in types)]
    assert ind_rows["k_composition"].mean() > others["k_composition"].mean()
    assert all(math.isfinite(v) for v in table[[*PATTERN_SCORES, "fixed_offset"]].to_numpy().ravel())


def test_toy_checkpoint_previous_token_and_induction_heads():
    """The shipped 2-layer model: previous-token heads in layer 0 feed four induction heads in layer 1."""
    model = interp.load_model("toy-induction")
    report = head_report(model, n_samples=32)
    table = report.extras.full_table(report)
    previous = table[table["previous_token_confirmed"]]
    assert len(previous) >= 1 and set(previous["layer"]) == {0}
    assert all("previous_token" in types for types in previous["types"])
    # All four layer-1 heads are induction heads; they back each other up, so those their effect alone
    # does not confirm at every repeat length are confirmed with the other candidates ablated (those it
    # confirms are not run so).
    assert sorted(report.extras.heads_of_type("induction")) == [(1, 0), (1, 1), (1, 2), (1, 3)]
    layer1 = table[table["layer"] == 1]
    tested = layer1[layer1["induction_effect_with_others"].notna()]
    assert (tested["induction_effect_with_others"] > 2 * tested["induction_effect_with_others_se"]).all()
    assert (layer1["induction_verdict"] == "confirmed").all()
    # Each beyond random heads, by its confirming effect (its CI above 0); every layer-1 head is over the
    # induction threshold, so their random heads come from layer 0 (ablated on top of all four, they add
    # next to nothing: the others' stand-ins are gone).
    for row in layer1.to_dict("records"):
        suffix = {"alone": "", "with_others_ablated": "_with_others"}[row["induction_confirmed_by"]]
        assert row[f"induction_beyond_random{suffix}_ci_low"] > 0.02
        assert row["induction_random_heads"] and all(
            label.startswith("L0H") for label in row["induction_random_heads"]
        )
    effect, se = report.extras.group_effects["induction"]
    assert effect > 1.0 and effect > 10 * se  # without its induction heads the model cannot copy
    assert effect > 5 * layer1["induction_effect"].max()
    # The induction heads read the previous-token head through their keys (K-composition).
    assert layer1["k_composition"].min() > 0.2


def test_scores_stage_alone_agrees_with_head_report():
    """The scores stage run on its own (toy-induction) gives the report's scores, thresholds and
    skip-gram pairs; the stage reports its progress per probe."""
    model = interp.load_model("toy-induction")
    report = head_report(model, n_samples=8, seed=3)
    table = report.extras.table
    calls = []
    probes = make_probes(model, n_samples=8, seed=3)
    scores = score_heads(model, probes, seed=3, progress=lambda *call: calls.append(call))
    assert scores.thresholds == report.extras.thresholds
    for column, values in scores.columns.items():
        torch.testing.assert_close(
            torch.from_numpy(report.extras.score_grid(column)).float(), values, equal_nan=True
        )
    assert scores.skip_gram_pairs == list(table["skip_gram_pair"])
    tested = table[table["induction_effect"].notna()]  # the causal stage's candidates
    assert sorted(scores.candidates("induction", 12)) == list(
        zip(tested["layer"], tested["head"], strict=True)
    )
    assert {stage for stage, _, _ in calls} == {
        "Attention scores: repeated probe",
        "Attention scores: random probe",
    }
    assert calls[-1] == ("Attention scores: random probe", 8, 8)
    assert ("Attention scores: repeated probe", 24, 24) in calls  # 8 sequences per repeat length


@pytest.mark.parametrize("model_name", ["toy-induction", "smollm2-135m"])
def test_causal_checks_run_on_a_token_family_the_scores_never_read(model_name, request):
    """The repeated probe, whose scores choose the candidates, and the causal checks' probe share no
    token but the BOS (and neither holds a special token); the causal checks' effects are those
    measured on the held-out probe, at the scores' repeat lengths; the report names both families and
    the seeds."""
    from circuits.finding import finding_report
    from circuits.heads.causal import induction_ablation_effects, random_head_classes
    from circuits.heads.probes import bos_token

    model = (
        request.getfixturevalue("smollm2") if model_name == "smollm2-135m" else interp.load_model(model_name)
    )
    probes = make_probes(model, n_samples=4, seed=5)
    bos = {bos_token(model)} - {None}

    def tokens_of(probe: Probe) -> set[int]:
        return {t for row, n in zip(probe.tokens, probe.lengths, strict=True) for t in row[:n].tolist()}

    chose, tested = tokens_of(probes.repeated), tokens_of(probes.held_out)
    assert chose & tested == bos and len(chose) > 10 and len(tested) > 10
    special = set(getattr(model.tokenizer, "all_special_ids", None) or [])
    assert not (chose | tested) & (special - bos)
    assert probes.held_out.repeat_len.tolist() == probes.repeated.repeat_len.tolist()  # the same strata
    if model_name != "toy-induction":
        return
    report = head_report(model, n_samples=4, seed=5)
    table = report.extras.full_table(report).set_index(["layer", "head"])
    candidates = list(table.index[table["induction_effect"].notna()])
    typed = [tuple(head) for head in table.index[table["induction"] >= report.extras.thresholds["induction"]]]
    classes = random_head_classes(model, candidates, typed, seed=5)
    on_held_out = induction_ablation_effects(
        model, probes.held_out, classes, seed=5, reference=probes.reference
    )
    assert len(candidates) and all(
        table.loc[head, "induction_effect"] == on_held_out.alone[head][0] for head in candidates
    )
    chose = finding_report(report).sections[0]
    assert chose.title == "What chose and what tested"
    assert chose.lines[:2] == ["chose: token family even token ids", "tested: token family odd token ids"]
    assert "random even token ids, seed 5" in chose.lines[2]
    assert "random odd token ids, seed 7" in chose.lines[3]


def test_held_out_scores_are_the_discovery_statistic_on_the_held_out_probe():
    """The scores the causal checks measure again on the held-out probe equal the scores stage's
    columns computed with the held-out probe in the repeated probe's place (toy-induction); every
    candidate's induction and previous-token score is there."""
    import dataclasses

    from circuits.heads.causal import causal_checks

    model = interp.load_model("toy-induction")
    probes = make_probes(model, n_samples=6, seed=4)
    scores = score_heads(model, probes, seed=4)
    effects = causal_checks(model, probes, scores)
    held_out_as_repeated = dataclasses.replace(probes.held_out, name=probes.repeated.name)
    swapped = score_heads(model, dataclasses.replace(probes, repeated=held_out_as_repeated), seed=4)
    for kind in ("induction", "previous_token"):
        candidates = scores.candidates(kind, 12)
        held_out = effects[kind].held_out_scores
        assert sorted(held_out) == sorted(candidates) and candidates
        for layer, head in candidates:
            assert held_out[layer, head] == pytest.approx(float(swapped.columns[kind][layer, head]), abs=1e-6)
            assert held_out[layer, head] != float(scores.columns[kind][layer, head])  # other sequences


def test_a_head_whose_score_does_not_hold_out_is_not_confirmed():
    """A candidate whose attention score on the held-out family falls below its type's threshold gets
    the verdict "score-not-held", whatever its effect, loses the induction type, and the report's
    "What chose and what tested" names it with both scores (toy-induction, its threshold raised
    between its heads' held-out scores)."""
    import dataclasses

    from circuits.finding import finding_report
    from circuits.heads.causal import causal_checks
    from circuits.heads.classify import head_table
    from circuits.heads.results import head_classes
    from circuits.heads.weights import weight_scores

    model = interp.load_model("toy-induction")
    report = head_report(model, n_samples=6, seed=4)
    probes = make_probes(model, n_samples=6, seed=4)
    scores = score_heads(model, probes, seed=4)
    effects = causal_checks(model, probes, scores)
    held_out = effects["induction"].held_out_scores
    assert all(effects["induction"].confirmed(head) for head in held_out)
    low, high = sorted(held_out.values())[:2]
    raised = scores.thresholds | {"induction": (low + high) / 2}
    weakest = min(held_out, key=held_out.get)
    assert float(scores.columns["induction"][weakest]) > raised["induction"]  # chosen by its discovery score
    stricter = dataclasses.replace(effects["induction"], score_threshold=raised["induction"])
    with pytest.raises(ValueError, match="score_threshold"):  # scores with no threshold would fail every head
        dataclasses.replace(effects["induction"], score_threshold=math.nan)
    assert stricter.verdict(weakest) == "score-not-held" and stricter.confirmed_by(weakest)
    assert all(stricter.confirmed(head) for head in held_out if head != weakest)
    weights = weight_scores(model, scores.candidates("previous_token", 12))
    stricter_effects = effects | {"induction": stricter}
    table = head_table(dataclasses.replace(scores, thresholds=raised), weights, stricter_effects)
    row = table[(table["layer"] == weakest[0]) & (table["head"] == weakest[1])].iloc[0]
    assert "induction" not in row["types"] and row["induction_verdict"] == "score-not-held"
    classes = head_classes(stricter_effects)
    label = f"L{weakest[0]}H{weakest[1]}"
    assert {c.verdict for c in classes if c.heads == [label] and c.details["type"] == "induction"} == {
        "score-not-held"
    }
    extras = dataclasses.replace(report.extras, table=table, thresholds=raised)
    stricter_report = dataclasses.replace(report, classes=classes, extras=extras)
    section = next(
        s for s in finding_report(stricter_report).sections if s.title == "What chose and what tested"
    )
    assert f"1 fall below it there, so not confirmed: L{weakest[0]}H{weakest[1]}" in " ".join(section.lines)


def test_induction_lengths_are_not_multiples():
    for longest in (9, 12, 19, 24, 40):
        lengths = induction_lengths(longest)
        assert len(lengths) == 3 and max(lengths) == longest and min(lengths) >= 0.4 * longest
        assert all(a % b for a in lengths for b in lengths if a != b)
    assert induction_lengths(7) == [7, 5, 3] and induction_lengths(5) == [5, 4, 3]
    with pytest.raises(ValueError, match="longer context"):
        induction_lengths(4)


def test_fixed_offset_score_finds_the_offset():
    n = 20
    keys = [0] + [max(q - 7, 0) for q in range(1, n)]  # attend 7 back (to position 0 before that)
    scores = fixed_offset_scores(one_hot_pattern(keys), torch.tensor([n]))[0, 0]
    assert int(scores.nan_to_num(-1).argmax()) == 7 and float(scores[7]) == pytest.approx(1.0)
    assert scores[n - 3 :].isnan().all()  # too few queries reach that far back


# ---------------------------------------------------------------------------------------------
# Models trained or built to have a known kind of head (seed: INTERP_TEST_SEED)

PERIOD = 20  # the longest repeat length head_report probes for n_ctx 48 (induction_lengths)


def _train(cfg: interp.Config, task, steps: int) -> interp.HookedTransformer:
    torch.manual_seed(TRAIN_SEED)
    model = interp.HookedTransformer(cfg)
    model.init_weights(TRAIN_SEED)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest
    try:
        train(model, task, TrainConfig(steps=steps, lr=5e-3, seed=TRAIN_SEED))
    finally:
        torch.set_num_threads(threads)
    return model


@pytest.fixture(scope="module")
def periodic_model() -> interp.HookedTransformer:
    """A 2-layer model with MLPs trained on random tokens repeated with one fixed period."""
    cfg = interp.Config(n_layers=2, n_heads=4, d_model=64, d_vocab=64, n_ctx=48, bos_token_id=0)
    return _train(cfg, PeriodicTask(d_vocab=64, n_ctx=48, period=PERIOD), steps=300)


def test_a_positional_shortcut_is_not_called_induction(periodic_model):
    report = head_report(periodic_model)
    table = report.extras.full_table(report)
    assert PERIOD in report.extras.induction_lengths  # the length the shortcut would fool
    layer0 = table[table["layer"] == 0]
    assert not layer0["types"].apply(lambda types: "induction" in types).any()
    offset_heads = layer0[layer0["types"].apply(lambda types: "fixed_offset" in types)]
    assert len(offset_heads) >= 1
    assert (offset_heads["fixed_offset_distance"] == PERIOD - 1).all()
    # Probed at the training period alone, they would pass for induction heads.
    assert (offset_heads[f"induction_len{PERIOD}"] > report.extras.thresholds["induction"]).all()
    assert (offset_heads["induction"] < report.extras.thresholds["induction"]).all()


@pytest.fixture(scope="module")
def induction_model(default_induction_run) -> interp.HookedTransformer:
    """2 layers x 4 attention-only heads trained on copied spans (InductionTask, spans of at least 11
    tokens in 48; `interp train --task induction`'s defaults): redundant induction heads."""
    return default_induction_run(TRAIN_SEED)[0]


def test_redundant_induction_heads_are_all_found(induction_model):
    report = head_report(induction_model)
    table = report.extras.full_table(report)
    strong = table[(table["layer"] == 1) & (table["induction"] > 0.5)]  # at every repeat length
    assert len(strong) >= 2, "the model learnt several induction heads"
    heads = list(zip(strong["layer"], strong["head"], strict=True))
    assert set(heads) <= set(report.extras.heads_of_type("induction"))  # recall 1
    # They back each other up: all together matter far more than any one alone.
    effect, se = report.extras.group_effects["induction"]
    assert effect > 3 * strong["induction_effect"].max() and effect > 10 * se


QUERY, KEY = 5, 11  # the planted skip-gram: token 5 attends to token 11, wherever it is


def planted_skip_gram_model() -> interp.HookedTransformer:
    """One layer; head 0's query for token QUERY matches only the key of token KEY, at any distance."""
    cfg = interp.Config(
        n_layers=1, d_model=32, n_heads=4, d_vocab=24, n_ctx=64, attn_only=True, positional="none",
        normalization="rmsnorm", bos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = interp.HookedTransformer(cfg)
    model.init_weights(0)
    attn = model.blocks[0].attn
    with torch.no_grad():
        model.W_E.copy_(torch.eye(cfg.d_vocab, cfg.d_model))  # orthogonal token directions
        attn.W_Q[0], attn.W_K[0] = 0.0, 0.0
        attn.W_Q[0, QUERY, 0] = attn.W_K[0, KEY, 0] = 4.0  # rmsnorm makes a one-hot row sqrt(32) long
    return model


def test_planted_skip_gram_head_is_found():
    report = head_report(planted_skip_gram_model())
    table = report.extras.full_table(report).set_index("head")
    assert report.extras.heads_of_type("skip_gram") == [(0, 0)]
    assert table.loc[0, "skip_gram_pair"] == f"t{QUERY} -> t{KEY}"
    assert table.loc[0, "skip_gram"] > report.extras.thresholds["skip_gram"] + 0.3
    assert table.loc[0, "fixed_offset"] < report.extras.thresholds["fixed_offset"]  # it follows content


def test_causal_checks_equal_full_ablated_forward_passes():
    """The causal checks' runs (one clean run, shared first blocks, rows cut per repeat length, two
    looks) give what whole forward passes of the whole probe with the heads mean-ablated give, the
    means taken over the reference's sequences real at each position (padding excluded), and an effect
    stopped at the first look is over that look's sequences."""
    from circuits.heads.causal import (
        INDUCTION_STAGE,
        induction_ablation_effects,
        looks,
        previous_token_ablation_effects,
        random_head_classes,
    )
    from interp.interventions.ablation import ablate

    model = interp.load_model("toy-induction")
    probe = make_probes(model, n_samples=6, seed=1).repeated
    assert len(probe.lengths.unique()) > 1  # rows of different lengths: cut runs are tested
    means_over = fresh_tokens(model, probe, seed=9, family="discovery", copies=2)  # the reference
    tokens = probe.tokens.to(model.device)
    z_names = [interp.act_name("z", layer) for layer in range(model.cfg.n_layers)]
    _, reference = model.run_with_cache(
        means_over.tokens.to(model.device), names_filter=z_names, return_type=None
    )
    second = probe.second_copy_predictions().to(model.device)
    real = (torch.arange(tokens.shape[1]) < means_over.lengths[:, None]).to(model.device)
    mean_ablation = interp.Ablation("mean", reference=reference, mask=real)

    @torch.no_grad()
    def loss(heads) -> torch.Tensor:
        with ablate(model, heads=heads, ablation=mean_ablation):
            logits = model(tokens)
        per_token = torch.nn.functional.cross_entropy(
            logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none"
        )
        return (per_token * second).sum(-1) / second.sum(-1)

    @torch.no_grad()
    def induction_score(heads, targets) -> torch.Tensor:
        names = [interp.act_name("pattern", layer) for layer, _ in targets]
        with ablate(model, heads=heads, ablation=mean_ablation):
            _, cache = model.run_with_cache(tokens, names_filter=names, return_type=None)
        masks = {"induction": score_masks(tokens, probe.lengths)["induction"]}
        scores = [
            pattern_scores(cache["pattern", layer][:, [head]], masks, probe.lengths)["induction"][:, 0]
            for layer, head in targets
        ]
        return torch.stack(scores).mean(0)

    first_look = torch.zeros(len(tokens), dtype=torch.bool)
    first_look[looks(probe)[0]] = True
    assert 0 < first_look.sum() < len(tokens)

    def rows_of(found, head, effect: str) -> torch.Tensor:
        """The sequences behind one of the head's effects (a mask)."""
        return first_look if effect in found.stopped_early.get(head, []) else torch.ones_like(first_look)

    candidates = [(1, 0), (1, 2), (1, 3)]
    calls = []
    classes = random_head_classes(model, candidates)
    found = induction_ablation_effects(
        model, probe, classes, progress=lambda *call: calls.append(call), reference=means_over
    )
    assert {stage for stage, _, _ in calls} == {INDUCTION_STAGE}
    done = [d for _, d, _ in calls]
    assert done == sorted(done) and done[0] == 0 and done[-1] == calls[-1][2] > 0  # starts, advances, ends
    clean = loss([])
    for head in candidates:
        others = [h for h in candidates if h != head]
        expected = float((loss([head]) - clean)[rows_of(found, head, "alone")].mean())
        assert found.alone[head][0] == pytest.approx(expected, abs=1e-5)
        if found.verdict(head) == "confirmed" and head not in found.with_others_ablated:
            continue  # confirmed alone: not run with the others ablated
        rows = rows_of(found, head, "with_others_ablated")
        expected = float((loss(candidates) - loss(others))[rows].mean())
        assert found.with_others_ablated[head][0] == pytest.approx(expected, abs=1e-5)
    assert found.all_candidates[0] == pytest.approx(float((loss(candidates) - clean).mean()), abs=1e-5)
    assert found.all_candidates[0] > 0.1  # the effects tested are not all zero
    # The random heads of the candidates' layer: ablated alone, and on top of the same other candidates
    # as the head they are compared with (a random head in its place).
    for head in candidates:
        judged = found.judged[head]
        draws = [
            [tuple(map(int, label[1:].split("H"))) for label in draw] for draw in judged["alone"].random_sets
        ]
        assert draws and all(h[0] == 1 and h not in candidates for draw in draws for h in draw)
        rows = rows_of(found, head, "alone")
        expected = [float((loss(draw) - clean)[rows].mean()) for draw in draws]
        assert judged["alone"].random_effects == pytest.approx(expected, abs=1e-5)
        if "with_others_ablated" in judged:
            rows = rows_of(found, head, "with_others_ablated")
            others = [h for h in candidates if h != head]
            expected = [float((loss(others + draw) - loss(others))[rows].mean()) for draw in draws]
            assert judged["with_others_ablated"].random_effects == pytest.approx(expected, abs=1e-5)
    # Per repeat length: the same effects on that length's sequences.
    assert sorted(found.by_stratum) == sorted(f"L={n}" for n in probe.repeat_len.unique().tolist())
    for name, per_head in found.by_stratum.items():
        rows = probe.repeat_len == int(name[2:])
        for head in candidates:
            expected = float((loss([head]) - clean)[rows & rows_of(found, head, "alone")].mean())
            assert per_head[head][0][0] == pytest.approx(expected, abs=1e-5)

    sources, targets = [(0, 0), (0, 1), (0, 3)], [(1, 1), (1, 2)]
    found = previous_token_ablation_effects(
        model, probe, random_head_classes(model, sources), targets, reference=means_over
    )
    clean = induction_score([], targets)
    for head in sources:
        expected = float((clean - induction_score([head], targets))[rows_of(found, head, "alone")].mean())
        assert found.alone[head][0] == pytest.approx(expected, abs=1e-5)
        if found.verdict(head) == "confirmed" and head not in found.with_others_ablated:
            continue  # confirmed alone: not run with the others ablated
        others = [h for h in sources if h != head]
        rows = rows_of(found, head, "with_others_ablated")
        expected = float((induction_score(others, targets) - induction_score(sources, targets))[rows].mean())
        assert found.with_others_ablated[head][0] == pytest.approx(expected, abs=1e-5)
    assert found.all_candidates[0] > 0.01


def test_an_effect_at_one_repeat_length_only_is_length_dependent():
    """Planted per-sequence measurements over three repeat lengths, against two random heads of the
    candidates' layer whose ablation raises the measurement by 0.05: a head whose ablation matters at
    one length only is beyond random pooled but reported length-dependent, not confirmed; one that
    matters at every length is confirmed; one that never matters, and one that matters as much as the
    random heads (significant, over 0.02, but not beyond random), are unconfirmed. Only the heads not
    confirmed alone run again with the other candidates ablated, with the random heads on top of all the
    candidates, in a second call; an effect futile beyond random after the first look (half of each
    length's sequences) is not run on the second, nor are random heads no effect still needs."""
    from circuits.evidence import HeadClass
    from circuits.heads.causal import _candidate_effects

    generator = torch.Generator().manual_seed(0)
    n = 16
    strata = {f"L={length}": torch.arange(i * n, (i + 1) * n) for i, length in enumerate((13, 18, 24))}
    looks = [torch.cat([rows[: n // 2] for rows in strata.values()])]
    looks.append(torch.cat([rows[n // 2 :] for rows in strata.values()]))
    at_one_length, everywhere, never, like_random = (1, 0), (1, 1), (1, 2), (1, 5)
    randoms = [(1, 3), (1, 4)]
    planted = {
        at_one_length: torch.cat([torch.full((n,), 0.6), torch.zeros(2 * n)]),
        everywhere: 0.3,
        never: 0,
        like_random: 0.05,
        **dict.fromkeys(randoms, 0.05),
    }
    noise = {}  # per set, fixed per sequence: a set measured in two looks reads one draw
    calls = []

    def measure(head_sets, rows, before, total):
        calls.append((sorted(map(sorted, head_sets)), len(rows), before, total))
        values = []
        for heads in head_sets:
            key = frozenset(heads)
            noise.setdefault(key, 0.005 * torch.randn(3 * n, generator=generator))
            values.append((2.0 + noise[key] + sum(planted[head] for head in heads))[rows])
        return values

    candidates = [at_one_length, everywhere, never, like_random]
    classes = {
        head: HeadClass(name=str(head), heads=[head], draws=[[r] for r in randoms]) for head in candidates
    }
    found = _candidate_effects(classes, measure, 1, 0.02, looks, strata)
    assert found.holds_in(at_one_length) == ["L=13"]
    assert found.verdict(at_one_length) == "length-dependent" and not found.confirmed(at_one_length)
    assert found.verdict(everywhere) == "confirmed" and found.holds_in(everywhere) == list(strata)
    assert found.confirmed_by(everywhere) == "alone"
    assert found.verdict(never) == "unconfirmed" and found.holds_in(never) == []
    # As large as the random heads' effect: over 2 standard errors and 0.02, yet nothing beyond random.
    effect, se = found.alone[like_random]
    assert effect > max(2 * se, 0.02) and found.verdict(like_random) == "unconfirmed"
    judged = found.judged[everywhere]["alone"]
    assert judged.random_sets == [["L1H3"], ["L1H4"]] and judged.heldout.random_drop == pytest.approx(
        0.05, abs=0.01
    )
    assert judged.heldout.beyond == pytest.approx(0.25, abs=0.01) and judged.heldout.beyond_ci[0] > 0.2
    assert found.judged[like_random]["alone"].heldout.beyond == pytest.approx(0, abs=0.01)
    assert found.verdict((0, 0)) == ""  # not a candidate
    assert set(found.with_others_ablated) == {at_one_length, never, like_random}
    assert math.isnan(found.by_stratum["L=13"][everywhere][1][0])  # not measured
    # Calls: the first sets (none, all, each alone, each random head alone) in two looks, "never" and
    # "like_random" alone stopped after the first; then the others of each undecided head and each random
    # head on top of those others (in its place), those of "never" and "like_random" stopped after the
    # first look.
    assert [(len(sets), rows) for sets, rows, _, _ in calls] == [(8, 24), (6, 24), (9, 24), (3, 24)]
    assert [before for _, _, before, _ in calls] == [0, 8, 14, 23]
    assert calls[-1][3] == 26  # the last call's total: every run done
    assert [[r] for r in randoms] == [s for s in calls[1][0] if len(s) == 1 and s[0] in randoms]  # both looks
    in_its_place = sorted([h for h in candidates if h != at_one_length] + [randoms[0]])
    assert in_its_place in calls[3][0]  # a random head on top of the others of the head it is compared with
    assert found.stopped_early == {head: ["alone", "with_others_ablated"] for head in (never, like_random)}
    first_look = noise[frozenset([never])][looks[0]] - noise[frozenset()][looks[0]]
    assert found.alone[never][0] == pytest.approx(float(first_look.mean()), abs=1e-6)
    everywhere_all = 0.3 + noise[frozenset([everywhere])] - noise[frozenset()]
    assert found.alone[everywhere][0] == pytest.approx(float(everywhere_all.mean()), abs=1e-6)


def test_with_two_candidates_the_others_set_stopped_early_is_measured_again_whole():
    """With two candidates, one's effect with the other ablated reads the set {other}, which is the
    other's effect alone: where that one stopped early as futile (half the sequences), the set is run
    on every sequence again, so the effect with the others ablated is over all of them and not marked
    stopped early (it was over half, marked †, and could confirm the head); the other's effect alone
    stays as judged, on the first look."""
    from circuits.evidence import HeadClass
    from circuits.heads.causal import _candidate_effects

    generator = torch.Generator().manual_seed(1)
    n = 16
    strata = {f"L={length}": torch.arange(i * n, (i + 1) * n) for i, length in enumerate((13, 18))}
    looks = [torch.cat([rows[: n // 2] for rows in strata.values()])]
    looks.append(torch.cat([rows[n // 2 :] for rows in strata.values()]))
    futile, needs_other, randoms = (0, 0), (0, 3), [(0, 1), (0, 2)]
    noise = {}

    def measure(head_sets, rows, before, total):
        values = []
        for heads in head_sets:
            key = frozenset(heads)
            noise.setdefault(key, 0.005 * torch.randn(2 * n, generator=generator))
            both = 0.4 if {futile, needs_other} <= key else 0.0  # needs_other matters once futile is gone
            values.append((2.0 + noise[key] + both)[rows])
        return values

    classes = {
        h: HeadClass(name=str(h), heads=[h], draws=[[r] for r in randoms]) for h in (futile, needs_other)
    }
    found = _candidate_effects(classes, measure, 1, 0.02, looks, strata)
    assert found.stopped_early.get(futile) == ["alone"]  # judged on the first look, as it stopped
    assert found.judged[futile]["alone"].heldout.n_prompts == n
    judged = found.judged[needs_other]["with_others_ablated"]
    assert "with_others_ablated" not in found.stopped_early.get(needs_other, [])
    assert judged.heldout.n_prompts == 2 * n and judged.verdict == "confirmed"


def test_a_previous_token_candidate_is_judged_on_the_induction_heads_after_its_own_layer():
    """With candidates in two layers, each one's drop is of the targets after its own layer: a
    target in the candidate's layer (whose score it cannot change) does not dilute it."""
    from circuits.heads.causal import previous_token_ablation_effects, random_head_classes

    model = interp.load_model("toy-hop")
    probes = make_probes(model, n_samples=4)
    probe, reference = probes.held_out, probes.reference
    candidates, targets = [(0, 0), (1, 1)], [(1, 2), (2, 0)]
    classes = random_head_classes(model, candidates, candidates + targets, 2, 0)
    both = previous_token_ablation_effects(model, probe, classes, targets, reference=reference)
    last = previous_token_ablation_effects(
        model, probe, classes, targets[1:], reference=reference
    )  # layer 2's
    assert both.alone[(1, 1)] == pytest.approx(last.alone[(1, 1)], rel=1e-5)  # L1H2 is in its layer
    assert both.alone[(0, 0)][0] != pytest.approx(last.alone[(0, 0)][0], rel=1e-2)  # both are after L0H0


def test_confirmed_induction_draws_the_random_heads_head_report_draws(monkeypatch):
    """The cached path for other analyses (`confirmed_induction`) leaves previous-token heads out of
    its random sets as `head_report` does, so it judges each candidate as the report does."""
    from circuits.heads import pipeline

    drawn = []
    original = pipeline.random_head_classes

    def recording(model, heads, typed, *args):
        drawn.append((list(heads), sorted(typed)))
        return original(model, heads, typed, *args)

    model = interp.load_model("toy-induction")
    monkeypatch.setattr(pipeline, "random_head_classes", recording)
    pipeline.confirmed_induction(model, n_samples=4)
    scores = score_heads(model, make_probes(model, 4, 0, 24, ()), 0)
    previous_token = set(scores.candidates("previous_token"))
    assert previous_token and previous_token <= set(drawn[0][1])


def test_a_head_attending_to_the_first_token_only_has_no_skip_gram_pair_on_it():
    """Where no key is attended to (every median 0: all attention on the first token, a sink), the
    pair's key is a token a query may attend to, never the first token, and the score is not above 0."""
    from circuits.heads.skipgrams import skip_gram_masses, skip_gram_scores

    generator = torch.Generator().manual_seed(0)
    tokens = torch.cat(
        [torch.zeros(16, 1, dtype=torch.long), torch.randint(1, 6, (16, 11), generator=generator)], 1
    )
    lengths = torch.full((16,), 12)
    sink = torch.zeros(16, 1, 12, 12)
    sink[..., 0] = 1.0  # every query attends to the first token only
    types, keys = tokens.unique(return_inverse=True)
    score, query, key = skip_gram_scores(skip_gram_masses(sink, keys, lengths, len(types)), keys, lengths)
    assert types[key[0]] != 0 and query[0] >= 0 and score[0] <= 0


def test_heads_over_the_induction_threshold_never_ablated_are_named():
    """Induction is typed only when confirmed by ablation: without the causal checks (causal=False,
    checkpoint_head_sweep's default) toy-induction's four induction heads (scores 0.93 against 0.39)
    were untyped and the headline said nothing; it now names them."""
    from circuits.heads.pipeline import head_report
    from circuits.heads.results import headline

    found = head_report(interp.load_model("toy-induction"), n_samples=4, seed=0, causal=False)
    line = headline(found.extras.rows(found))
    assert "4 heads over the induction threshold not causally checked" in line and "L1H0" in line


def test_a_score_no_head_could_get_is_said_unscored_not_zero_heads():
    """At --n-samples 2 no query token is in 4 probe sequences, so no head has a skip-gram score: the
    summary said "skip_gram 0.30 0" (no skip-gram heads) instead of saying it was not scored."""
    from circuits.heads.pipeline import head_report
    from circuits.heads.results import head_sections

    found = head_report(interp.load_model("toy-induction"), n_samples=2, seed=0, causal=False)
    rows = {row[0]: row for row in head_sections(found.extras.rows(found))[0].table.rows}
    assert rows["skip_gram"][2] == "not scored" and "--n-samples 4" in rows["skip_gram"][3]
    assert rows["induction"][2] != "not scored"
