"""interp.training: induction heads emerge, ablations break them, resumes are exact, saves are atomic."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal

import pytest
import torch
from conftest import TRAIN_SEED

import interp
from interp.tasks import ToyIOITask, repeated_sequence_masks, repeated_sequences
from interp.training import (
    CHECKPOINTS,
    TASK_DEFAULTS,
    ToyModelSettings,
    TrainConfig,
    TrainingLog,
    evaluate,
    latest_checkpoint,
    load_training_state,
    make_optimizer,
    make_task,
    save_training_checkpoint,
    shipped_checkpoint,
    train,
    train_toy_model,
    training_summary,
)

D_VOCAB, N_CTX, SEQ_LEN = 64, 48, 23  # repeated sequences [BOS] r r fill 1 + 2 * 23 = 47 positions


def repeated_half_losses(model, hooks=()) -> tuple[float, float]:
    """(first-half loss, repeated-half loss) on fresh repeated random sequences, with optional hooks."""
    tokens = repeated_sequences(model.cfg.d_vocab, SEQ_LEN, 64, generator=1234)
    loss = model.run_with_hooks(tokens, return_type="loss", loss_per_token=True, fwd_hooks=list(hooks))
    first, second = repeated_sequence_masks(SEQ_LEN)
    return loss[:, first].mean().item(), loss[:, second].mean().item()


def zero_head(layer: int, head: int):
    def hook(z, hook):  # z: [batch, pos, head, d_head]
        z[:, :, head] = 0.0
        return z

    return (f"blocks.{layer}.attn.hook_z", hook)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: one thread is fastest, and robust to a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-layer attention-only model with one head per layer, trained from scratch (~30 s)."""
    out = tmp_path_factory.mktemp("induction")
    settings = ToyModelSettings(
        task="induction", n_layers=2, n_heads=1, d_model=64, steps=800, attn_only=True, seed=TRAIN_SEED,
        lr=5e-3, d_vocab=D_VOCAB, seq_len=N_CTX,
    )  # fmt: skip
    model, log = train_toy_model(settings, out)
    return model, log, out


def test_training_learns_induction(trained):
    model, log, out = trained
    first, second = repeated_half_losses(model)
    assert second < 1.0, f"repeated-half loss {second:.3f} (first half {first:.3f})"
    assert second < first - 3.0
    final = log.evals[-1]
    prev_scores = torch.tensor(final["prev_token_scores"])  # [layer, head]
    induction = torch.tensor(final["induction_scores"])
    # Uniform causal attention scores ~0.09 (the mean of 1 / (position + 1)); seeds 0-2 gave 0.24-0.26+,
    # 5-6 times the layer-1 head's.
    assert prev_scores[0].max() > 0.2 and prev_scores[0].max() > 3 * prev_scores[1].max()
    assert induction[1].max() > 0.5 > induction[0].max()
    # Emergence: the induction score rose from ~0 and the repeated-half loss fell with it.
    assert log.evals[0]["induction_scores"][1][0] < 0.2
    assert log.evals[0]["repeated_half_loss"] > 3.0
    assert len(log.train_loss) == 800 and log.train_loss[-1] < log.train_loss[0] / 2
    # The written directory loads and gives the same logits.
    loaded = interp.load_model(out)
    tokens = repeated_sequences(D_VOCAB, SEQ_LEN, 4, generator=0)
    torch.testing.assert_close(loaded(tokens), model(tokens))
    assert json.loads((out / "config.json").read_text())["task"] == "induction"
    assert (out / "training_log.csv").read_text().startswith("step,")


def test_ablating_the_circuit_destroys_induction(trained):
    model, log, _ = trained
    final = log.evals[-1]
    prev_head = int(torch.tensor(final["prev_token_scores"][0]).argmax())
    induction_head = int(torch.tensor(final["induction_scores"][1]).argmax())
    # Trained on copies only, the model is overconfident on the random first half (loss above
    # chance), so measure the repeated-half advantage against chance: ln(d_vocab - 1) - loss.
    chance = math.log(D_VOCAB - 1)
    advantage = chance - repeated_half_losses(model)[1]
    assert advantage > 3.0
    for layer, head in [(1, induction_head), (0, prev_head)]:
        ablated = chance - repeated_half_losses(model, [zero_head(layer, head)])[1]
        assert ablated < 0.25 * advantage, (layer, head, ablated, advantage)


def small_run(out, steps, callback=None, **options):
    """A few steps of a tiny full (non-attention-only) model on the Markov task."""
    task = make_task("markov", d_vocab=6, n_ctx=16)
    cfg = interp.Config(n_layers=1, n_heads=2, d_model=16, d_vocab=6, n_ctx=16)
    model = interp.HookedTransformer(cfg)
    model.init_weights(seed=3)
    config = TrainConfig(steps=steps, batch_size=8, lr=3e-3, seed=3, **options)
    log = train(model, task, config, out=out, callback=callback)
    return model, log


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    options = dict(eval_every=5, checkpoint_every=10)
    full_model, full_log = small_run(tmp_path / "full", 30, **options)

    def interrupt(step, log):  # a Ctrl-C in step 17
        if step == 17:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        small_run(tmp_path / "resumed", 30, callback=interrupt, **options)
    checkpoints = sorted(p.name for p in (tmp_path / "resumed" / CHECKPOINTS).iterdir())
    # Ctrl-C saves the last completed step whole; nothing partial, no hidden staging dirs
    assert checkpoints == ["step_000010", "step_000017"]
    assert not (tmp_path / "resumed" / "config.json").exists()
    resumed_model, resumed_log = small_run(tmp_path / "resumed", 30, **options)
    resumed_state = resumed_model.state_dict()
    for name, value in full_model.state_dict().items():
        assert torch.equal(value, resumed_state[name]), name
    assert resumed_log.train_loss == full_log.train_loss
    assert resumed_log.evals == full_log.evals
    assert TrainingLog.read(tmp_path / "resumed") == full_log


def test_train_toy_model_leaves_the_callers_random_numbers_alone(tmp_path):
    """Its weights come from its own seed's generator: torch's global generator is neither reseeded
    (it was set to the settings' seed, so a caller's later torch.randn no longer followed the caller's
    seed) nor drawn from (the constructor's random weights, replaced at once)."""
    settings = ToyModelSettings(
        task="induction", n_layers=1, n_heads=2, d_model=16, steps=2, batch_size=4, seed=3
    )
    torch.manual_seed(1234)
    expected = torch.randn(3)
    torch.manual_seed(1234)
    model, _ = train_toy_model(settings, tmp_path / "a")
    assert torch.equal(torch.randn(3), expected)
    torch.manual_seed(99)  # the caller's seed does not change the model
    again, _ = train_toy_model(settings, tmp_path / "b")
    for name, value in model.state_dict().items():
        assert torch.equal(value, again.state_dict()[name]), name


def test_a_callback_that_edits_the_model_is_in_its_steps_evaluation_and_checkpoint(tmp_path):
    """The callback runs before the step's evaluation and checkpoint: a run resumed from a checkpoint
    of a model whose callback keeps a head disabled equals the uninterrupted run."""
    options = dict(eval_every=5, checkpoint_every=10)

    def disable(model):
        def callback(step, log):
            with torch.no_grad():
                model.blocks[0].attn.W_O[1] = 0.0

        return callback

    def run(out, steps):
        task = make_task("markov", d_vocab=6, n_ctx=16)
        model = interp.HookedTransformer(
            interp.Config(n_layers=1, n_heads=2, d_model=16, d_vocab=6, n_ctx=16)
        )
        model.init_weights(seed=3)
        config = TrainConfig(steps=steps, batch_size=8, lr=3e-3, seed=3, **options)
        return model, train(model, task, config, out=out, callback=disable(model))

    full_model, full_log = run(tmp_path / "full", 20)
    (tmp_path / "resumed" / CHECKPOINTS).mkdir(parents=True)  # interrupted after step 10's checkpoint
    shutil.copytree(
        tmp_path / "full" / CHECKPOINTS / "step_000010", tmp_path / "resumed" / CHECKPOINTS / "step_000010"
    )
    resumed_model, resumed_log = run(tmp_path / "resumed", 20)
    for name, value in full_model.state_dict().items():
        assert torch.equal(value, resumed_model.state_dict()[name]), name
    assert resumed_log.evals == full_log.evals


def test_the_icl_score_is_not_taken_over_the_padding_of_toy_ioi_rows():
    """Toy IOI rows end in padding: a late-minus-early loss there would be of the padding's
    predictions, so the evaluation gives none; rows without padding (Markov chains) give one."""
    task = ToyIOITask()
    model = interp.HookedTransformer(
        interp.Config(n_layers=1, n_heads=2, d_model=16, d_vocab=task.d_vocab, n_ctx=task.n_ctx)
    )
    assert evaluate(model, task, batch_size=8)["icl_score"] is None
    markov = make_task("markov", d_vocab=6, n_ctx=16)
    small = interp.HookedTransformer(interp.Config(n_layers=1, n_heads=2, d_model=16, d_vocab=6, n_ctx=16))
    assert isinstance(evaluate(small, markov, batch_size=8)["icl_score"], float)
    # the hop task's predictions are of k-hop tokens, most early ones not counted (their target BOS): a
    # late-minus-early loss there compared counted with uncounted predictions (-1.65 for a perfect model)
    hop = make_task("hop", hops=2)
    model = interp.HookedTransformer(interp.Config(n_layers=1, n_heads=2, d_model=16, d_vocab=9, n_ctx=32))
    assert evaluate(model, hop, batch_size=8)["icl_score"] is None


def test_the_emergence_probe_speaks_the_tasks_tokens(monkeypatch):
    """The repeated sequences that score previous-token and induction heads during training began with
    token 0 whatever the task: toy IOI's BOS is 1 (0 is its padding), Markov chains have none (state 0
    opened every row and never recurred in it); and they drew toy IOI's padding as a token."""
    seen = []

    def recorded(*args):
        seen.append(repeated_sequences(*args))
        return seen[-1]

    monkeypatch.setattr(interp.training, "repeated_sequences", recorded)
    ioi = ToyIOITask()
    model = interp.HookedTransformer(
        interp.Config(n_layers=1, n_heads=2, d_model=16, d_vocab=ioi.d_vocab, n_ctx=ioi.n_ctx)
    )
    evaluate(model, ioi, batch_size=64)
    markov = make_task("markov", d_vocab=6, n_ctx=16)
    small = interp.HookedTransformer(interp.Config(n_layers=1, n_heads=2, d_model=16, d_vocab=6, n_ctx=16))
    evaluate(small, markov, batch_size=4)
    ioi_probe, markov_probe = seen
    assert (ioi_probe[:, 0] == ioi.bos).all()
    drawn = set(ioi_probe[:, 1:].unique().tolist())
    assert ioi.pad not in drawn and ioi.bos not in drawn and len(drawn) > ioi.d_vocab // 2
    assert markov_probe.shape == (4, 2 * ((16 - 1) // 2)) and (markov_probe[:, 0] == 0).float().mean() < 1


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_within_a_step_saves_that_step_whole_with_its_evaluation(tmp_path, monkeypatch, stop):
    """A real SIGINT (Ctrl-C) or SIGTERM (a scheduler's time limit, `docker stop`; it saved nothing:
    the steps since the last checkpoint were lost) landing in step 15's evaluation: the step, its
    evaluation included, finishes and is saved; the run resumed from it equals the uninterrupted one."""
    options = dict(eval_every=5, checkpoint_every=10)
    full_model, full_log = small_run(tmp_path / "full", 20, **options)
    evaluate, steps = interp.training.evaluate, []

    def interrupted_evaluation(*args, **kwargs):
        if steps[-1] == 15:  # the callback of step 15 ran, before its evaluation
            os.kill(os.getpid(), stop)
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(interp.training, "evaluate", interrupted_evaluation)
    with pytest.raises(KeyboardInterrupt):
        small_run(tmp_path / "resumed", 20, callback=lambda step, log: steps.append(step), **options)
    monkeypatch.undo()
    checkpoints = sorted(p.name for p in (tmp_path / "resumed" / CHECKPOINTS).iterdir())
    assert checkpoints == ["step_000010", "step_000015"]
    resumed_model, resumed_log = small_run(tmp_path / "resumed", 20, **options)
    for name, value in full_model.state_dict().items():
        assert torch.equal(value, resumed_model.state_dict()[name]), name
    assert resumed_log.evals == full_log.evals and resumed_log.train_loss == full_log.train_loss


def test_resume_with_other_settings_is_refused(tmp_path):
    """Another task (a library call of `train` with the same model) resumed the checkpoint, its first
    steps the other task's."""
    model = interp.HookedTransformer(interp.Config(n_layers=1, n_heads=2, d_model=16, d_vocab=16, n_ctx=17))
    config = TrainConfig(steps=3, batch_size=4, checkpoint_every=3, eval_every=3)
    train(model, make_task("induction", d_vocab=16, n_ctx=17), config, out=tmp_path / "task")
    with pytest.raises(
        ValueError, match=r"other settings \(task \{'type': 'InductionTask'.* -> \{'type': 'HopTask'"
    ):
        train(model, make_task("hop", d_vocab=16, n_ctx=17), config, out=tmp_path / "task")
    small_run(tmp_path, 10)
    with pytest.raises(ValueError, match=r"other settings \(steps 10 -> 20; grad_clip 1.0 -> 0.5\)"):
        small_run(tmp_path, 20, grad_clip=0.5)
    wider = interp.HookedTransformer(interp.Config(n_layers=1, n_heads=2, d_model=32, d_vocab=6, n_ctx=16))
    config = TrainConfig(steps=10, batch_size=8, lr=3e-3, seed=3)
    with pytest.raises(ValueError, match=r"other settings \(d_model 16 -> 32; d_head 8 -> 16"):
        train(wider, make_task("markov", d_vocab=6, n_ctx=16), config, out=tmp_path)


def test_failed_checkpoint_save_leaves_nothing(tmp_path):
    model = interp.HookedTransformer(interp.Config(n_layers=1, n_heads=2, d_model=16, d_vocab=6, n_ctx=16))
    config = TrainConfig(steps=1)
    optimizer = torch.optim.AdamW(model.parameters())
    generator = torch.Generator().manual_seed(0)
    log = TrainingLog(evals=[{"step": 1, "bad": object()}])  # not JSON-serialisable: fails mid-save
    target = tmp_path / "step_000001"
    with pytest.raises(TypeError):
        save_training_checkpoint(target, model, optimizer, generator, 1, log, config)
    assert list(tmp_path.iterdir()) == []


def test_bad_settings_raise_clear_errors():
    with pytest.raises(ValueError, match="Unknown task"):
        make_task("sorting")
    with pytest.raises(ValueError, match="steps must be an integer >= 1, got 0"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="warmup_steps=100 is more than the 10 steps"):
        TrainConfig(steps=10, warmup_steps=100)  # the learning rate stayed below a tenth of its peak
    # ToyModelSettings refuses on construction what the task or the training refused later, by option
    for settings, message in [
        (
            dict(task="hop", seq_len=8),
            "the hop task refuses its sizes: n_ctx must be an integer >= 11.*--seq-len",
        ),
        (dict(task="induction", steps=0), r"steps \(--steps\) must be an integer >= 1"),
        (dict(task="induction", lr=float("nan")), r"lr \(--lr\) must be a finite number"),
        (dict(task="induction", batch_size=0), r"batch_size \(--batch-size\)"),
        (dict(task="induction", positional="bogus"), r"positional \(--positional\) must be one of learned"),
    ]:
        with pytest.raises((ValueError, TypeError), match=message):
            ToyModelSettings(n_heads=2, d_model=16, **settings)
    untasked = interp.HookedTransformer(interp.Config(n_layers=1, n_heads=2, d_model=16, d_vocab=6, n_ctx=16))
    log = train(untasked, make_task("markov", d_vocab=6, n_ctx=16), TrainConfig(steps=2, batch_size=4))
    line, advice = training_summary(untasked, log)  # a model `train` trained records no task: KeyError(None)
    assert line.startswith("step 2: task loss") and advice is None
    model = interp.HookedTransformer(interp.Config(n_layers=1, n_heads=1, d_model=8, d_vocab=6, n_ctx=8))
    with pytest.raises(ValueError, match="Enlarge the model"):
        train(model, make_task("induction", d_vocab=64, n_ctx=48), TrainConfig(steps=1))


def test_learning_rate_schedule():
    config = TrainConfig(steps=100, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    rates = [config.lr_at(step) for step in range(100)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(rates[9:], rates[10:], strict=False))
    assert rates[-1] == pytest.approx(1e-4, rel=0.05)


def test_shipped_checkpoint():
    path = shipped_checkpoint()
    assert sum(f.stat().st_size for f in path.iterdir() if f.is_file()) < 2_000_000
    model = interp.load_model("toy-induction")
    assert model.cfg.attn_only and model.cfg.n_layers == 2
    first, second = repeated_half_losses(model)
    assert second < 0.2 and first > 3.0, (first, second)
    log = TrainingLog.read(path)
    assert max(log.evals[-1]["induction_scores"][1]) > 0.5


def test_shipped_toy_ioi_does_ioi():
    model = interp.load_model("toy-ioi")
    assert model.cfg.model_name == "toy-ioi" and model.cfg.attn_only and model.cfg.n_layers == 2
    clean, _, _ = ToyIOITask().make_dataset(64, seed=3)
    diffs = clean.logit_diff(model(clean.tokens))
    assert (diffs > 0).all() and diffs.mean() > 5
    with pytest.raises(ValueError, match="toy-ioi"):
        shipped_checkpoint("toy-gpt")


@pytest.mark.parametrize("task", ["markov", "ioi"])
def test_cli_train_writes_a_loadable_checkpoint(tmp_path, task):
    from typer.testing import CliRunner

    from circuits.cli import app

    out = tmp_path / task
    args = ["train", "--task", task, "--layers", "1", "--heads", "2", "--d-model", "16", "--steps", "4"]
    args += ["--seq-len", "16", "--d-vocab", "6"] if task != "ioi" else []  # ioi: fixed by the task
    args += ["--seed", "1", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    model = interp.load_model(out)
    assert model.cfg.n_layers == 1 and model.cfg.attn_only == TASK_DEFAULTS[task].attn_only
    assert model.cfg.model_name == task and model.cfg.task == task  # named after OUT by default
    assert len(TrainingLog.read(out).train_loss) == 4
    assert (out / CHECKPOINTS / "step_000004" / "optimizer.safetensors").is_file()


def test_cli_train_records_the_name_and_task_and_resumes(tmp_path):
    """The name is the user's (here a misleading one); the IOI prompts follow the recorded task."""
    from typer.testing import CliRunner

    from circuits.cli import app
    from interp.tasks.ioi import ioi_dataset_for

    out = tmp_path / "run"
    args = ["train", "--task", "ioi", "--layers", "1", "--d-model", "16", "--steps", "3"]
    args += ["--out", str(out), "--name", "smollm2-135m"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0 and "resumed from" not in first.output, first.output
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "steps: resumed from" in " ".join(again.output.split()), again.output
    model = interp.load_model(out)
    assert model.cfg.model_name == "smollm2-135m" and model.cfg.task == "ioi"
    for split in ("discovery", "heldout"):
        clean = ioi_dataset_for(model, 8, split=split)[0]
        assert set(" ".join(clean.texts).split()) <= set(ToyIOITask().vocab)  # toy prompts, not text


def test_cli_train_rejects_an_unknown_task(tmp_path):
    from typer.testing import CliRunner

    from circuits.cli import app

    result = CliRunner().invoke(app, ["train", "--task", "sorting", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "'sorting' is not one of" in " ".join(
        result.output.replace("│", " ").split()
    )
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_induction_training_gives_confirmed_induction_heads(default_induction_run, seed):
    """`interp train --task induction --seed S` with no other options produces what its help
    promises: induction heads that `interp heads` types and confirms by ablation (the library calls
    of both commands with their defaults; with MLPs or the old 1000 steps at 1e-3, none form)."""
    from circuits.heads import head_report

    model, log = default_induction_run(seed)
    assert log.evals[-1]["repeated_half_loss"] < 0.5  # it copies the repeated half
    report = head_report(model, n_samples=16, seed=0)
    induction = report.extras.heads_of_type("induction")
    confirmed = report.extras.table.set_index(["layer", "head"])["induction_confirmed"]
    assert induction and all(confirmed.loc[head] for head in induction), (induction, confirmed)
    assert all(layer == 1 for layer, _ in induction)  # K-composition needs an earlier layer


def test_default_markov_training_predicts_like_the_in_context_bigram_predictor(tmp_path):
    """`interp train --task markov` with no options learns the chains' bigram statistics in context:
    its loss closes most of the gap between uniform guessing and the in-context bigram predictor
    (with the old 8 states, or MLPs at 1e-3, it stayed near uniform)."""
    settings = ToyModelSettings(task="markov", n_layers=2, n_heads=4, d_model=64, seed=TRAIN_SEED)
    model, log = train_toy_model(settings, tmp_path / "run")
    last = log.evals[-1]
    uniform = math.log(model.cfg.d_vocab)
    assert last["bigram_loss"] < uniform - 0.1  # the reference is far from uniform on these chains
    assert last["eval_loss"] - last["bigram_loss"] < 0.25 * (uniform - last["bigram_loss"]), last


def test_resume_compares_the_model_not_where_its_weights_are(tmp_path):
    """A run resumed with its model on another device (train_toy_model moves it to CUDA where there is
    one; checkpoints load on the CPU) resumes: the device and dtype follow the weights and are no setting
    (recorded here as moving the weights records them)."""
    from interp.config import place

    small_run(tmp_path, 10)
    moved = interp.HookedTransformer(interp.Config(n_layers=1, n_heads=2, d_model=16, d_vocab=6, n_ctx=16))
    place(moved.cfg, "cuda:0", torch.float32)
    config = TrainConfig(steps=10, batch_size=8, lr=3e-3, seed=3)
    optimizer, generator = make_optimizer(moved, config), torch.Generator()
    step, _ = load_training_state(latest_checkpoint(tmp_path), moved, optimizer, generator, config)
    assert step == 10
