"""Training toy transformers on `interp.tasks`, with resumable checkpoints and emergence tracking.

    model = interp.HookedTransformer(interp.Config(n_layers=2, n_heads=4, d_model=64, d_vocab=64,
                                                   n_ctx=64, attn_only=True))
    log = train(model, make_task("induction", d_vocab=64, n_ctx=64), TrainConfig(steps=1000), out="run")

Optimisation: AdamW, linear warm-up then cosine decay to `min_lr_ratio * lr`, gradient clipping,
loss only on the predictions a task's `loss_mask` marks. Runs are deterministic for a given seed
(the data come from their own torch.Generator, whose state is checkpointed).

Layout of `out`:
    config.json, model.safetensors          the final model: interp.load_model(out) loads it
    training_log.json, training_log.csv     loss curve and per-head scores at each eval step
    checkpoints/step_000500/                resumable checkpoints: the model, optimizer.safetensors,
                                            trainer_state.json (step, data RNG state) and the log so far
Every checkpoint directory is written to a hidden sibling and renamed into place, so an
interrupted save leaves no partial checkpoint; an interrupted run resumes from the last one.

Emergence tracking (Olsson et al. 2022): at each eval step, every head's previous-token score and
induction (prefix-matching) score on repeated random sequences, and the in-context learning
score (loss on late tokens minus loss on early tokens), next to the loss on each half of the
repeated sequences, so that the phase change can be plotted against the loss curve.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, get_args

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from interp.catalog import DEFAULT_HOPS, TASK_DEFAULTS, TASKS, default_layers
from interp.checks import check_count, check_number
from interp.config import Config, Positional
from interp.interventions.metrics import next_token_loss
from interp.io.checkpoint import (
    save_checkpoint,
    shipped_checkpoint,  # noqa: F401  (public here: notebooks, tests)
)
from interp.io.files import atomic_dir
from interp.model import HookedTransformer
from interp.model.loading import load_checkpoint
from interp.tasks import (
    HopTask,
    InductionTask,
    MarkovChainTask,
    Task,
    ToyIOITask,
    in_context_bigram_probs,
    repeated_sequence_masks,
    repeated_sequences,
    split_generator,
)
from interp.types import Progress

CHECKPOINTS = "checkpoints"
TRAIN_STAGE = "Training steps"  # the stage `train` reports to its progress callback
logger = logging.getLogger("interp")


def make_task(
    name: str, d_vocab: int | None = None, n_ctx: int | None = None, hops: int | None = None
) -> Task:
    """A task by name: "induction" (copied spans of random tokens, loss on the copies; spans of at
    least a quarter of the context make induction heads form within a few hundred steps),
    "markov" (in-context Markov chains over d_vocab states, default 3), "ioi" (toy IOI; fixed vocabulary
    and length) or "hop" (`hops` successive induction lookups, default 2, over an alphabet of
    d_vocab - 1 tokens and BOS, default 9 in all, in sequences of n_ctx = 32 tokens)."""
    if hops is not None and name != "hop":
        raise ValueError(f"hops is the hop task's number of lookups; got hops={hops!r} for the {name!r} task")
    if name == "hop":
        return HopTask(DEFAULT_HOPS if hops is None else hops, 9 if d_vocab is None else d_vocab, n_ctx or 32)
    if name == "induction":
        n_ctx = 48 if n_ctx is None else check_count(n_ctx, "the induction task's n_ctx (seq_len)", 5)
        d_vocab = 64 if d_vocab is None else d_vocab
        return InductionTask(d_vocab=d_vocab, n_ctx=n_ctx, min_span=max(2, (n_ctx - 1) // 4))
    if name == "markov":
        return MarkovChainTask(
            n_states=3 if d_vocab is None else d_vocab, n_ctx=64 if n_ctx is None else n_ctx
        )
    if name == "ioi":
        task = ToyIOITask()
        for what, value, fixed in (
            ("d_vocab", d_vocab, task.d_vocab),
            ("n_ctx (seq_len)", n_ctx, task.n_ctx),
        ):
            if value is not None and value != fixed:
                raise ValueError(
                    f"the toy IOI task has a fixed {what} of {fixed}, got {value!r}; leave it unset (None)"
                )
        return task
    raise ValueError(f"Unknown task {name!r}; choose one of {TASKS}.")


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping settings of a training run.

    Checkpoints are written every `checkpoint_every` steps (0: never), at `checkpoint_steps`, and
    at the last step; evaluations every `eval_every` steps (0: steps // 50) and at the last step.
    Early stopping: with `stop_patience` > 0, training stops (and writes its last step as the final
    model) once the eval accuracy (`evaluate`'s "accuracy") has stayed on a plateau: at least
    `stop_above`, and `stop_patience` evaluations in a row without beating its best by 0.01.
    `stop_above` keeps the plateau before learning starts (accuracy near chance) from counting.
    """

    steps: int
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int | None = None  # default: 5% of the steps
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 0
    eval_batch_size: int = 64
    checkpoint_every: int = 0
    checkpoint_steps: Sequence[int] = ()
    stop_patience: int = 0
    stop_above: float = 0.0

    def __post_init__(self) -> None:  # every setting checked here, before a step runs
        self.steps = check_count(self.steps, "TrainConfig.steps")
        self.batch_size = check_count(self.batch_size, "TrainConfig.batch_size")
        self.lr = check_number(self.lr, "TrainConfig.lr", 0, low_open=True)
        if self.warmup_steps is None:
            self.warmup_steps = max(1, self.steps // 20)
        self.warmup_steps = check_count(self.warmup_steps, "TrainConfig.warmup_steps", 0)
        if self.warmup_steps > self.steps:
            raise ValueError(
                f"TrainConfig.warmup_steps={self.warmup_steps} is more than the {self.steps} steps: the "
                "learning rate would never reach its peak nor decay; pass at most steps (default: 5%)"
            )
        self.min_lr_ratio = check_number(self.min_lr_ratio, "TrainConfig.min_lr_ratio", 0, 1)
        self.weight_decay = check_number(self.weight_decay, "TrainConfig.weight_decay", 0)
        if isinstance(self.betas, str | bytes) or len(self.betas) != 2:
            raise ValueError(
                f"TrainConfig.betas must be a pair (beta1, beta2), got {self.betas!r}; pass (0.9, 0.98)"
            )
        self.betas = tuple(
            check_number(b, "each of TrainConfig.betas", 0, 1, high_open=True) for b in self.betas
        )
        self.grad_clip = check_number(
            self.grad_clip, "TrainConfig.grad_clip", 0, low_open=True, allow_inf=True
        )
        self.seed = check_count(self.seed, "TrainConfig.seed", 0)
        self.eval_every = check_count(self.eval_every, "TrainConfig.eval_every", 0) or max(
            1, self.steps // 50
        )
        self.eval_batch_size = check_count(self.eval_batch_size, "TrainConfig.eval_batch_size")
        self.checkpoint_every = check_count(self.checkpoint_every, "TrainConfig.checkpoint_every", 0)
        steps = sorted(
            {check_count(step, "each of TrainConfig.checkpoint_steps") for step in self.checkpoint_steps}
        )
        if steps and steps[-1] > self.steps:
            raise ValueError(
                f"TrainConfig.checkpoint_steps holds step {steps[-1]}, after the last step {self.steps}; "
                f"pass steps in 1..{self.steps}"
            )
        self.checkpoint_steps = steps
        self.stop_patience = check_count(self.stop_patience, "TrainConfig.stop_patience", 0)
        self.stop_above = check_number(self.stop_above, "TrainConfig.stop_above", 0, 1)

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step `step` (0-based): linear warm-up, then cosine decay."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        decayed = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * min(decayed, 1.0)))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine)

    def is_checkpoint_step(self, step: int) -> bool:
        every = self.checkpoint_every > 0 and step % self.checkpoint_every == 0
        return every or step in self.checkpoint_steps or step == self.steps

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["checkpoint_steps"] = list(self.checkpoint_steps)
        return values


@dataclass
class TrainingLog:
    """train_loss[i], lr[i]: optimizer step i + 1. evals: one record per eval step (see `evaluate`).
    stopped_early: the step at which the eval accuracy's plateau stopped training (None: it ran
    every step)."""

    train_loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    stopped_early: int | None = None

    def on_plateau(self, patience: int, above: float, min_gain: float = 0.01) -> bool:
        """Whether the eval accuracy is on a plateau: its last `patience` evaluations (patience > 0)
        all at least `above` and none beating the best before them by `min_gain`."""
        accuracies = [record["accuracy"] for record in self.evals]
        if patience < 1 or len(accuracies) <= patience:
            return False
        best_before = max(accuracies[:-patience])
        recent = accuracies[-patience:]
        return min(recent) >= above and max(recent) < best_before + min_gain

    def write(self, directory: Path) -> None:
        """training_log.json (everything) and training_log.csv (one flat row per eval step)."""
        (directory / "training_log.json").write_text(json.dumps(asdict(self)))
        rows = [_flat_record(record) for record in self.evals]
        if rows:
            with open(directory / "training_log.csv", "w", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)

    @classmethod
    def read(cls, directory: str | Path) -> TrainingLog:
        log = cls(**json.loads((Path(directory) / "training_log.json").read_text()))
        for record in log.evals:  # logs written before evaluate's "accuracy"
            record.setdefault("accuracy", record.get("answer_accuracy", float("nan")))
        return log


def _flat_record(record: dict[str, Any]) -> dict[str, Any]:
    """Per-head score tables [layer][head] become columns like prev_token_L0H3."""
    flat = {}
    for key, value in record.items():
        if isinstance(value, list):
            for layer, row in enumerate(value):
                flat.update({f"{key.removesuffix('_scores')}_L{layer}H{h}": v for h, v in enumerate(row)})
        else:
            flat[key] = value
    return flat


# ------------------------------------------------------------------ head scores for tracking


def previous_token_scores(patterns: Tensor) -> Tensor:
    """Mean attention from each position to the one before it.

    patterns [layer, batch, head, query_pos, key_pos] -> [layer, head].
    """
    return patterns.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(1, -1))


def prefix_matching_scores(patterns: Tensor, seq_len: int) -> Tensor:
    """Prefix-matching score at one repeat length on `repeated_sequences`: mean attention from each
    token of the second copy to the token after its first occurrence (query p -> key p - seq_len + 1).
    The head report's per-length induction score is the same quantity; its `induction` column is the
    lowest over three lengths (`circuits.heads`). Logged during training as "induction_scores".

    patterns [layer, batch, head, query_pos, key_pos] of [BOS] r r sequences -> [layer, head].
    """
    return patterns.diagonal(offset=1 - seq_len, dim1=-2, dim2=-1)[..., -seq_len:].mean(dim=(1, -1))


def in_context_learning_score(loss_per_token: Tensor, fraction: float = 0.2) -> float:
    """Loss on the last `fraction` of predictions minus loss on the first `fraction` (after the
    first prediction); negative when later tokens are predicted better. loss_per_token [batch, pos-1]."""
    n = loss_per_token.shape[-1]
    width = max(1, int(n * fraction))
    return (loss_per_token[:, -width:].mean() - loss_per_token[:, 1 : 1 + width].mean()).item()


@torch.no_grad()
def evaluate(model: HookedTransformer, task: Task, batch_size: int = 64, seed: int = 0) -> dict[str, Any]:
    """Losses and per-head scores on fixed eval data, drawn from the eval seed stream (other draws than
    training's; where a task has few distinct rows they can repeat training rows: most of toy IOI's
    do, so its eval accuracy is no held-out figure, which the circuit analyses measure on their own
    held-out prompts).

    eval_loss: masked loss on the task's eval batch; accuracy: the accuracy a task's report
    claims (the hop task: its answers; else the counted predictions), the fraction that are the
    model's top prediction; icl_score: its late-minus-early loss (None where the task's rows end in
    padding, toy IOI's: their late predictions would be of the padding, or where predictions are not
    of the next token, the hop task's: most early ones are not counted at all);
    bigram_loss (Markov chains only): the in-context bigram predictor's loss on that batch, what a
    model that has learnt in-context bigram statistics approaches; answer_accuracy (hop task only):
    the fraction of its answers that are the model's top prediction.
    first_half_loss / repeated_half_loss: loss on each copy of repeated random sequences
    ([BOS] r r with r of length (n_ctx - 1) // 2, the task's BOS; r r for a task without one; r never
    holds the task's padding);
    prev_token_scores / induction_scores: [layer][head].
    """
    was_training = model.training
    model.eval()
    batch = task.eval_batch(batch_size, seed).to(model.device)
    task_logits = model(batch.tokens)  # [batch, pos, d_vocab]
    task_loss = batch.loss_per_token(task_logits)  # [batch, pos-1]
    targets = batch.tokens[:, 1:] if batch.targets is None else batch.targets  # [batch, pos-1]
    correct = task_logits[:, :-1].argmax(-1) == targets
    pad = getattr(task, "pad", None)  # toy IOI's padding: never a token its model reads
    padded = pad is not None and bool((targets == pad).any())
    seq_len = (model.cfg.n_ctx - 1) // 2
    bos = getattr(task, "bos", None)  # the task's own BOS (toy IOI's is 1), or none (Markov chains)
    avoid = () if pad is None else (pad,)
    tokens = repeated_sequences(
        model.cfg.d_vocab, seq_len, batch_size, split_generator(seed, "eval"), bos, avoid
    )
    tokens = tokens.to(model.device)
    logits, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    loss = next_token_loss(logits, tokens, per_token=True)  # [batch, pos-1]
    first_half, second_half = repeated_sequence_masks(seq_len, has_bos=bos is not None)
    patterns = torch.stack([cache["pattern", layer] for layer in range(model.cfg.n_layers)])
    model.train(was_training)
    reference = {}
    if isinstance(task, MarkovChainTask):
        states = batch.tokens.cpu()
        probs = in_context_bigram_probs(states, task.d_vocab, task.alpha)[:, :-1]  # [batch, pos-1, k]
        reference["bigram_loss"] = -probs.gather(-1, states[:, 1:, None]).log().mean().item()
    if isinstance(task, HopTask):
        answers = task_logits[:, task.query].argmax(-1) == batch.tokens[:, task.query + 1]
        reference["answer_accuracy"] = answers.float().mean().item()
        reference["answer_loss"] = task_loss[:, task.query].mean().item()
        correct = answers[:, None]
    return {
        "eval_loss": batch.masked_mean(task_loss).item(),
        "accuracy": (
            correct.float().mean() if isinstance(task, HopTask) else batch.masked_mean(correct.float())
        ).item(),
        **reference,
        "icl_score": None if padded or batch.targets is not None else in_context_learning_score(task_loss),
        "first_half_loss": loss[:, first_half].mean().item(),
        "repeated_half_loss": loss[:, second_half].mean().item(),
        "prev_token_scores": previous_token_scores(patterns).tolist(),
        "induction_scores": prefix_matching_scores(patterns, seq_len).tolist(),
    }


# ------------------------------------------------------------------ training


def make_optimizer(model: HookedTransformer, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases and norm weights)."""
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    vectors = [p for p in model.parameters() if p.ndim < 2]
    groups = [
        {"params": matrices, "weight_decay": config.weight_decay},
        {"params": vectors, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas)


def train(
    model: HookedTransformer,
    task: Task,
    config: TrainConfig,
    out: str | Path | None = None,
    resume: bool = True,
    callback: Callable[[int, TrainingLog], None] | None = None,
    extra: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> TrainingLog:
    """Train `model` in place on `task`; returns the training log.

    With `out`, writes checkpoints and the final model there (see the module docstring); with
    resume=True a run whose checkpoints exist in `out` continues from the last one (same result
    as an uninterrupted run). `callback(step, log)` runs after each optimizer step, before that step's
    evaluation and checkpoint (so they hold what it changes, e.g. heads it keeps disabled). `extra` is
    stored in the final config.json (e.g. the task's name). progress(TRAIN_STAGE, step, steps):
    reported after each step; on early stopping (see `TrainConfig`), progress("Training steps:
    stopped early, eval accuracy on a plateau", step, step) and `log.stopped_early`.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(
            f"config must be a TrainConfig, got {type(config).__name__}; pass TrainConfig(steps=...)"
        )
    if not isinstance(task, Task):
        raise TypeError(
            f"task must be an interp.tasks.Task, got {type(task).__name__}; pass e.g. make_task(...)"
        )
    if task.d_vocab > model.cfg.d_vocab or task.n_ctx > model.cfg.n_ctx:
        raise ValueError(
            f"The task needs d_vocab >= {task.d_vocab} and n_ctx >= {task.n_ctx}; the model has "
            f"d_vocab={model.cfg.d_vocab}, n_ctx={model.cfg.n_ctx}. Enlarge the model config."
        )
    out = None if out is None else Path(out)
    generator = split_generator(config.seed, "train")
    optimizer = make_optimizer(model, config)
    log, step = TrainingLog(), 0
    latest = latest_checkpoint(out) if out is not None and resume else None
    if latest is not None:
        step, log = load_training_state(latest, model, optimizer, generator, config, task)
    model.train()
    if progress is not None and latest is not None:
        progress(f"{TRAIN_STAGE}: resumed from {latest} (delete {out} to start afresh)", step, config.steps)
    elif progress is not None:
        progress(TRAIN_STAGE, step, config.steps)
    state = None  # what a checkpoint on Ctrl-C saves: (model, optimizer, generator, step, log, config)
    with deterministic_algorithms(), _checkpoint_on_interrupt(out, lambda: state) as interrupted:
        while step < config.steps and log.stopped_early is None:
            if interrupted():
                raise KeyboardInterrupt
            state = None  # within a step: what a Ctrl-C finds is part-updated, so it saves nothing
            batch = task.sample(config.batch_size, generator).to(model.device)
            lr = config.lr_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = batch.masked_mean(batch.loss_per_token(model(batch.tokens)))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            step += 1
            log.train_loss.append(loss.item())
            log.lr.append(lr)
            if callback is not None:  # before the evaluation and checkpoint, which see what it changes
                callback(step, log)
            if step % config.eval_every == 0 or step == config.steps:
                log.evals.append({"step": step, **evaluate(model, task, config.eval_batch_size, config.seed)})
                if step < config.steps and log.on_plateau(config.stop_patience, config.stop_above):
                    log.stopped_early = step
            if out is not None and (config.is_checkpoint_step(step) or log.stopped_early is not None):
                directory = out / CHECKPOINTS / f"step_{step:06d}"
                save_training_checkpoint(directory, model, optimizer, generator, step, log, config, task)
            state = (model, optimizer, generator, step, log, config, task)  # the step whole, evaluated
            if progress is not None and log.stopped_early is not None:
                progress(f"{TRAIN_STAGE}: stopped early, eval accuracy on a plateau", step, step)
            elif progress is not None:
                progress(TRAIN_STAGE, step, config.steps)
    model.eval()
    if out is not None:
        write_final_model(out, model, log, {"training": config.to_dict(), **(extra or {})})
    return log


@contextlib.contextmanager
def _checkpoint_on_interrupt(
    out: Path | None, state: Callable[[], tuple | None]
) -> Iterator[Callable[[], bool]]:
    """On Ctrl-C (SIGINT) or SIGTERM (a scheduler's time limit), save the last whole step (`state()`,
    None within a step) as a checkpoint, if there is an output directory, so that running the same
    command again resumes from it; then stop. In the main thread a first signal is held until the loop
    asks (yields `interrupted`) between steps, so the step it lands in, its evaluation included,
    finishes and is saved; a second stops at once, saving nothing newer than the last checkpoint."""
    requested: list[bool] = []

    def hold(signum: int, frame: Any) -> None:
        if requested:
            raise KeyboardInterrupt
        requested.append(True)
        logger.warning("Interrupting after this step (Ctrl-C again to stop at once, without saving it).")

    main = threading.current_thread() is threading.main_thread()
    previous = {stop: signal.signal(stop, hold) for stop in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield lambda: bool(requested)
    except KeyboardInterrupt:
        current = state()
        if out is not None and current is not None:
            step = current[3]
            save_training_checkpoint(out / CHECKPOINTS / f"step_{step:06d}", *current)
            logger.warning("Interrupted: saved step %d; run the same command again to resume.", step)
        raise
    finally:
        defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
        for stop, handler in previous.items():
            signal.signal(stop, handler if handler is not None else defaults[stop])


@contextlib.contextmanager
def deterministic_algorithms() -> Iterator[None]:
    """Deterministic kernels while training, so that a seed fixes the run: with several CPU threads
    some backward kernels otherwise sum in thread order, and two runs drift apart (1e-4 after 30
    steps, another IOI circuit after 1500). Ops without a deterministic kernel only warn."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def latest_checkpoint(out: Path) -> Path | None:
    """The checkpoint of the highest step under out/checkpoints, or None."""
    steps = sorted((out / CHECKPOINTS).glob("step_*")) if (out / CHECKPOINTS).is_dir() else []
    return steps[-1] if steps else None


def task_parameters(task: Task) -> dict[str, Any]:
    """The task's type and its plain parameters (numbers, strings, booleans: sizes, BOS, period, hops,
    ...), what a training checkpoint records, so that a run of another task does not resume it."""
    plain = {k: v for k, v in sorted(vars(task).items()) if v is None or isinstance(v, (int, float, str))}
    return {"type": type(task).__name__, **plain}


def save_training_checkpoint(
    directory: Path,
    model: HookedTransformer,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    step: int,
    log: TrainingLog,
    config: TrainConfig,
    task: Task | None = None,
) -> Path:
    """A resumable checkpoint: the model (loadable by interp.load_model), optimizer.safetensors,
    trainer_state.json (step, config, the task's `task_parameters`, optimizer hyper-parameters, data
    RNG state) and the log.
    Written under a hidden name and renamed into place: it exists complete or not at all."""
    with atomic_dir(directory) as staging:
        save_checkpoint(model, staging)
        optimizer_state = optimizer.state_dict()
        tensors = {
            f"{index}.{name}": value.detach().cpu().contiguous()
            for index, state in optimizer_state["state"].items()
            for name, value in state.items()
        }
        tensors["data_rng_state"] = generator.get_state()
        save_file(tensors, staging / "optimizer.safetensors")
        state = {
            "step": step,
            "train_config": config.to_dict(),
            "task": None if task is None else task_parameters(task),
            "param_groups": optimizer_state["param_groups"],
        }
        (staging / "trainer_state.json").write_text(json.dumps(state, indent=2))
        log.write(staging)
    return directory


def load_training_state(
    directory: Path,
    model: HookedTransformer,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    config: TrainConfig,
    task: Task | None = None,
) -> tuple[int, TrainingLog]:
    """Restore model weights, optimizer and data RNG from a checkpoint of the same settings and task
    (where both record one); returns (step, log)."""
    state = json.loads((directory / "trainer_state.json").read_text())
    settings = {k: v for k, v in state["train_config"].items() if k not in ("progress", "show_bar")}
    saved = TrainConfig(**settings).to_dict()  # ("progress", "show_bar": terminal bars of older versions)
    changed = [f"{k} {saved[k]} -> {v}" for k, v in config.to_dict().items() if saved[k] != v]
    saved_task, here = state.get("task"), None if task is None else task_parameters(task)
    if saved_task is not None and here is not None and saved_task != here:
        changed.append(f"task {saved_task} -> {here}")
    saved_model = load_checkpoint(directory)
    changed += [
        f"{f.name} {getattr(saved_model.cfg, f.name)} -> {getattr(model.cfg, f.name)}"
        for f in fields(model.cfg)
        if f.compare and getattr(saved_model.cfg, f.name) != getattr(model.cfg, f.name)  # (not device, dtype)
    ]
    if changed:
        raise ValueError(
            f"{directory} was trained with other settings ({'; '.join(changed)}); resume with the same "
            "settings, or train into a fresh --out directory."
        )
    model.load_state_dict(saved_model.state_dict())
    tensors = load_file(directory / "optimizer.safetensors")
    generator.set_state(tensors.pop("data_rng_state"))
    per_param: dict[int, dict[str, Tensor]] = {}
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        per_param.setdefault(int(index), {})[name] = value.to(model.device) if name != "step" else value
    optimizer.load_state_dict({"state": per_param, "param_groups": state["param_groups"]})
    return state["step"], TrainingLog.read(directory)


def write_final_model(out: Path, model: HookedTransformer, log: TrainingLog, extra: dict[str, Any]) -> None:
    """config.json, model.safetensors and the training log at the top of `out`, each file replaced
    atomically (config.json last, so `out` counts as a checkpoint only once the weights are there)."""
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".final.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        save_checkpoint(model, staging, extra=extra)
        log.write(staging)
        names = sorted(p.name for p in staging.iterdir())
        for name in [n for n in names if n != "config.json"] + ["config.json"]:
            if (out / name).is_dir():
                shutil.rmtree(out / name)
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# ------------------------------------------------------------------ one call for the CLI


@dataclass(kw_only=True)
class ToyModelSettings:
    """What `train_toy_model` builds and trains: a model of `task` ("induction", "markov", "ioi",
    "hop") with n_layers, n_heads, d_model and `positional` encoding, trained for `steps` steps of
    `batch_size` sequences at learning rate `lr` from `seed`.

    seq_len is the task's sequence length (n_ctx), d_vocab its vocabulary (induction, markov, hop),
    hops the hop task's number of lookups (recorded in the checkpoint's Config); the model's d_vocab
    and n_ctx match the task. n_layers, steps, lr, attn_only: None takes the task's defaults
    (`TASK_DEFAULTS`; the hop task's layers follow its hops, `default_layers`). name: the model's
    name in reports (default: the output directory's name). Checked on construction, before anything
    is built or written; each refusal names the `interp train` option too.
    """

    task: str
    n_layers: int | None = None
    n_heads: int
    d_model: int
    steps: int | None = None
    attn_only: bool | None = None
    seed: int = 0
    lr: float | None = None
    batch_size: int = 32
    seq_len: int | None = None
    d_vocab: int | None = None
    positional: str = "learned"
    hops: int | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"Unknown task {self.task!r}; choose one of {TASKS}.")
        if self.n_layers is not None:
            self.n_layers = check_count(self.n_layers, "n_layers")
        self.n_heads = check_count(self.n_heads, "n_heads")
        self.d_model = check_count(self.d_model, "d_model")
        self.seed = check_count(self.seed, "seed", 0)
        if self.steps is not None:
            self.steps = check_count(self.steps, "steps (--steps)")
        self.batch_size = check_count(self.batch_size, "batch_size (--batch-size)")
        if self.lr is not None:
            self.lr = check_number(self.lr, "lr (--lr)", 0, low_open=True)
        if self.positional not in get_args(Positional):
            raise ValueError(
                f"positional (--positional) must be one of {', '.join(get_args(Positional))}, got "
                f"{self.positional!r}"
            )
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}: --d-model is not a "
                f"multiple of --heads (each head gets d_model / n_heads dimensions); pass a d_model such as "
                f"{self.n_heads * max(1, round(self.d_model / self.n_heads))}"
            )
        if self.task == "ioi" and (self.seq_len is not None or self.d_vocab is not None):
            raise ValueError("the ioi task has a fixed vocabulary and length: drop --seq-len and --d-vocab.")
        if self.hops is not None and self.task != "hop":
            raise ValueError(
                f"--hops is the hop task's number of lookups: pass --task hop, or drop --hops "
                f"(task {self.task})."
            )
        try:  # the task's own checks of its sizes, before anything is built
            make_task(self.task, self.d_vocab, self.seq_len, self.hops)
        except ValueError as error:
            raise ValueError(
                f"the {self.task} task refuses its sizes: {error} (n_ctx is --seq-len, d_vocab --d-vocab, "
                "hops --hops)"
            ) from error


def training_summary(model: HookedTransformer, log: TrainingLog) -> tuple[str, str | None]:
    """The last evaluation of `model`'s training in words (its step, task loss and the task's own
    measure), and what to do when its eval accuracy missed the task's `stop_above` (else None)."""
    task, cfg, last = model.cfg.task, model.cfg, log.evals[-1]
    if task == "ioi":
        detail = "loss on the answer; ln 2 = 0.693 is a coin flip between IO and S"
    elif task == "hop":
        chance = HopTask(cfg.hops, cfg.d_vocab, cfg.n_ctx).chance
        detail = (
            f"answer accuracy {last['answer_accuracy']:.3f} after {cfg.hops} lookups, chance {chance:.3f}"
        )
    elif task == "markov":
        detail = (
            f"the in-context bigram predictor {last['bigram_loss']:.3f}, uniform {math.log(cfg.d_vocab):.3f}"
        )
    else:
        detail = (
            f"repeated random tokens: first half {last['first_half_loss']:.3f}, "
            f"repeated half {last['repeated_half_loss']:.3f}"
        )
    stopped = "" if log.stopped_early is None else " (stopped early: eval accuracy on a plateau)"
    line = f"step {last['step']}{stopped}: task loss {last['eval_loss']:.3f} ({detail})."
    target = TASK_DEFAULTS[task].stop_above if task in TASK_DEFAULTS else None  # (None: `train` directly)
    if not (target and last["accuracy"] < target):
        return line, None
    return line, (
        f"The eval accuracy {last['accuracy']:.3f} did not reach {target}: the model has not learned the "
        f"task yet (when it learns depends on the seed and the machine). Train again into a fresh --out "
        f"with more steps (--steps {2 * last['step']}) or another --seed."
    )


def train_toy_model(
    settings: ToyModelSettings,
    out: str | Path,
    *,
    device: str | None = None,
    progress: Progress | None = None,
    **train_options: Any,
) -> tuple[HookedTransformer, TrainingLog]:
    """Build the model `settings` describe, train it on its task and write it to `out`.

    Device: CUDA when available, unless given. train_options: the other `TrainConfig` settings
    (e.g. checkpoint_every, eval_every); the early-stopping settings `stop_patience` and `stop_above`
    take the task's defaults unless given there. progress: see `train`.
    """
    if not isinstance(settings, ToyModelSettings):
        raise TypeError(
            f"train_toy_model takes a ToyModelSettings, got {type(settings).__name__}: pass "
            "ToyModelSettings(task=..., n_heads=..., d_model=..., ...)"
        )
    owned = sorted(set(train_options) & {f.name for f in fields(ToyModelSettings)})
    if owned:
        raise TypeError(f"{', '.join(owned)}: settings of the model and its run, passed in ToyModelSettings")
    task = settings.task
    data = make_task(task, settings.d_vocab, settings.seq_len, settings.hops)
    n_layers = settings.n_layers
    n_layers = default_layers(task, getattr(data, "hops", None)) if n_layers is None else n_layers
    defaults = TASK_DEFAULTS[task]
    steps = defaults.steps if settings.steps is None else settings.steps
    lr = defaults.lr if settings.lr is None else settings.lr
    attn_only = defaults.attn_only if settings.attn_only is None else settings.attn_only
    cfg = Config(
        n_layers=n_layers,
        n_heads=settings.n_heads,
        d_model=settings.d_model,
        d_vocab=data.d_vocab,
        n_ctx=data.n_ctx,
        attn_only=attn_only,
        positional=settings.positional,
        bos_token_id=getattr(data, "bos", None),
        model_name=settings.name or Path(out).name,
        task=task,
        hops=getattr(data, "hops", None),
    )
    with torch.random.fork_rng(devices=[]):  # the constructor's draws, replaced at once: not the caller's
        model = HookedTransformer(cfg)
    model.init_weights(settings.seed)  # seeded on its own generator; torch's global one is left as it was
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    stopping = {"stop_patience": defaults.stop_patience, "stop_above": defaults.stop_above}
    config = TrainConfig(
        steps=steps, batch_size=settings.batch_size, lr=lr, seed=settings.seed, **(stopping | train_options)
    )
    log = train(model, data, config, out=out, extra={"task": task}, progress=progress)
    return model, log
