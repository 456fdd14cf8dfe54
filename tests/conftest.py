"""Shared fixtures. Real models only: SmolLM2-135M from its offline GGUF, and small random ones."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here: fail fast instead of retrying the network

import pytest
import torch

import interp
from interp.runtime.memory import keep_freed_memory
from interp.tasks import IOIPrompts

keep_freed_memory(True)  # the suite runs under the allocator policy the `interp` command uses


def pytest_configure(config: pytest.Config) -> None:
    """Threads: 2 cores, shared by pytest-xdist's workers (`make test`: -n 2, one thread each).

    Set in the environment too, so the notebooks' kernels and other child processes take as many (a
    kernel on 2 threads beside the other worker made a notebook ten times slower). xdist's controller
    runs no tests and sets nothing, so its workers see only what the user set
    (`OMP_NUM_THREADS=1 make test` runs everything on one thread).
    """
    is_controller = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    if is_controller or "OMP_NUM_THREADS" in os.environ:
        return
    threads = max(1, 2 // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


IOI_PROMPT = "When Mary and John went to the store, John gave a drink to"
# The seed of every model a test trains. Trained tests assert what any good run shows, so the suite
# must pass with another seed too: INTERP_TEST_SEED=1 make test.
TRAIN_SEED = int(os.environ.get("INTERP_TEST_SEED", "0"))


# Under pytest-xdist (`make test`: -n 2) each worker has its own session. The files whose tests share
# an expensive session fixture are scheduled as one unit, so that one worker computes it once (and
# starts Ray once); every other test is scheduled alone. (xdist's own --dist loadgroup does not
# group under pytest 9.2: it renames items through an attribute pytest no longer reads.)
SHARED_FIXTURE_FILES = {
    "test_distributed.py": "ray",  # ray_cluster
    "test_sweeps.py": "ray",  # ray_cluster, checkpointed_run
    "test_icl.py": "ray",  # checkpointed_run
    "test_training.py": "induction",  # default_induction_run
    "test_heads.py": "induction",  # default_induction_run
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return SHARED_FIXTURE_FILES.get(nodeid.split("::")[0].rsplit("/", 1)[-1], nodeid)

    return SharedFixtureScheduling(config, log)


@pytest.fixture(scope="session")
def smollm2() -> interp.HookedTransformer:
    """The offline default model (dequantised once, then loaded from the cache)."""
    model = interp.load_model("smollm2-135m")
    model.eval()
    return model


@pytest.fixture(scope="session")
def smollm2_hf():
    """transformers' own model of the same GGUF file, eager attention (the reference)."""
    from transformers import AutoModelForCausalLM

    from interp.io.sources import OFFLINE_MODELS

    path = OFFLINE_MODELS["smollm2-135m"]()
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    )
    return model.to(interp.default_device()).eval()


def tiny_config(**overrides) -> interp.Config:
    values = dict(n_layers=2, d_model=32, n_heads=4, d_vocab=61, n_ctx=32)
    values.update(overrides)
    return interp.Config(**values)


@pytest.fixture
def tiny_model() -> interp.HookedTransformer:
    torch.manual_seed(0)
    return interp.HookedTransformer(tiny_config()).to(interp.default_device())


def assert_same_finding_figures(read, fresh) -> None:
    """An older result file read as a Finding (`read`) holds what a fresh run's Finding does: its
    extras, what chose and what tested, its timings (its classes and settings: each test's own check)."""
    from interp.io.serialize import encode

    assert encode(read.extras) == encode(fresh.extras)
    assert (read.chose, read.tested, read.timings) == (fresh.chose, fresh.tested, fresh.timings)


def assert_ioi_invariants(prompts: IOIPrompts, pad: int) -> None:
    """Names sit at their positions, orders match, and every prompt is right-padded after END."""
    rows = torch.arange(len(prompts))
    pos = prompts.positions
    assert torch.equal(prompts.tokens[rows, pos["IO"]], prompts.io_token)
    assert torch.equal(prompts.tokens[rows, pos["S1"]], prompts.s_token)
    assert torch.equal(prompts.tokens[rows, pos["S2"]], prompts.s_token)
    assert torch.equal(pos["S1+1"], pos["S1"] + 1)
    assert (prompts.io_token != prompts.s_token).all()
    for i, order in enumerate(prompts.order):
        assert (pos["IO"][i] < pos["S1"][i]) == (order == "ABBA")
        assert max(pos["IO"][i], pos["S1"][i]) < pos["S2"][i] < pos["END"][i]
        end = int(pos["END"][i])
        assert (prompts.tokens[i, : end + 1] != pad).all() and (prompts.tokens[i, end + 1 :] == pad).all()


@pytest.fixture(scope="session")
def default_induction_run(tmp_path_factory):
    """default_induction_run(seed) -> (model, log) of `interp train --task induction --seed SEED`
    (the library call with the command's defaults: 2 layers x 4 attention-only heads, 1500 steps),
    trained once per seed in a session and shared (~25 s each): test_training checks what the
    defaults promise, test_heads finds the redundant induction heads of the same model."""
    from interp.training import ToyModelSettings, train_toy_model

    runs = {}

    def run(seed: int):
        if seed not in runs:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # tiny matrices: one thread is fastest
            try:
                out = tmp_path_factory.mktemp(f"induction-seed{seed}") / "run"
                settings = ToyModelSettings(task="induction", n_layers=2, n_heads=4, d_model=64, seed=seed)
                runs[seed] = train_toy_model(settings, out)
            finally:
                torch.set_num_threads(threads)
        return runs[seed]

    return run


@pytest.fixture(scope="session")
def checkpointed_run(tmp_path_factory):
    """A training run's directory: a 2-layer attention-only model, one head per layer, trained on
    induction for 600 steps and saved every 200 (its induction head forms after step 300); shared by
    the checkpoint sweeps (test_sweeps) and the ICL score across training (test_icl)."""
    from interp.training import ToyModelSettings, train_toy_model

    out = tmp_path_factory.mktemp("run")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest
    try:
        settings = ToyModelSettings(
            task="induction", n_layers=2, n_heads=1, d_model=64, steps=600, attn_only=True, seed=0, lr=5e-3,
            d_vocab=64, seq_len=48,
        )  # fmt: skip
        train_toy_model(settings, out, checkpoint_every=200)
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster of 2 workers, shared by the tests that need one."""
    import ray

    from interp.runtime.distributed import connect

    connect("local", num_cpus=2)
    yield
    ray.shutdown()
