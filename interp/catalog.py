"""The named choices interp offers, as plain data: the models that load offline, what activation
patching sweeps over, the synthetic training tasks and their defaults.

A leaf that imports nothing (no torch), so the command line lists these choices in `--help`
without loading the library.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MODEL = "smollm2-135m"
OFFLINE_MODEL_NAMES = ("smollm2-135m", "toy-induction", "toy-ioi", "toy-hop")
"""Short names of the models that load offline (`interp.io.sources.OFFLINE_MODELS` says from where)."""

DTYPES = ("float32", "bfloat16", "float16")
"""The dtypes a command can load a model in (`torch.<name>`); float32 is the default everywhere."""

# Components that activation/attribution patching sweep over, and whether they have a head axis.
RESID_COMPONENTS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
HEAD_COMPONENTS = ("z", "result", "q", "k", "v", "pattern")
COMPONENTS = RESID_COMPONENTS + HEAD_COMPONENTS


@dataclass(frozen=True)
class TaskDefaults:
    """What train_toy_model uses when not given: a schedule and an architecture that produce the
    task's phenomenon. Induction: 2 attention-only layers, 1500 steps at 5e-3 give induction heads
    that `interp heads` confirms (seeds 0-2; with MLPs, or 1000 steps at 1e-3, none form). Toy IOI
    plateaus at a coin flip between IO and S (loss ln 2) for hundreds of steps at 1e-3; 3e-3 and
    1500 steps solve it. Markov: 2 attention-only layers on chains over 3 states, 1000 steps at 5e-3,
    predict as well as the in-context bigram predictor (over 8 states, or with MLPs at 1e-3, the
    loss stays near uniform for 1000 steps). Hop (2 hops, 8 symbols, 32 tokens): 3 attention-only
    layers reach ~0.8 accuracy on the answer after 4000 steps at 5e-3 (seed 0; chance 1/6), ~0.3 at
    step 2000; over 16 symbols in 48 tokens, 2000 steps leave them at ~0.15."""

    steps: int
    lr: float
    attn_only: bool


TASK_DEFAULTS = {
    "induction": TaskDefaults(1500, 5e-3, attn_only=True),
    "markov": TaskDefaults(1000, 5e-3, attn_only=True),
    "ioi": TaskDefaults(1500, 3e-3, attn_only=True),
    "hop": TaskDefaults(4000, 5e-3, attn_only=True),
}
TASKS = tuple(TASK_DEFAULTS)
CHECKPOINT_EVERY = 250  # steps between the periodic checkpoints of `interp train`
