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

if "OMP_NUM_THREADS" not in os.environ:  # OMP_NUM_THREADS=1 make test runs on one thread
    torch.set_num_threads(2)

IOI_PROMPT = "When Mary and John went to the store, John gave a drink to"
# The seed of every model a test trains. Trained tests assert what any good run shows, so the suite
# must pass with another seed too: INTERP_TEST_SEED=1 make test.
TRAIN_SEED = int(os.environ.get("INTERP_TEST_SEED", "0"))


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
    return model.eval()


def tiny_config(**overrides) -> interp.Config:
    values = dict(n_layers=2, d_model=32, n_heads=4, d_vocab=61, n_ctx=32)
    values.update(overrides)
    return interp.Config(**values)


@pytest.fixture
def tiny_model() -> interp.HookedTransformer:
    torch.manual_seed(0)
    return interp.HookedTransformer(tiny_config()).to(interp.default_device())


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
def ray_cluster():
    """A local Ray cluster of 2 workers, shared by the tests that need one."""
    import ray

    from interp.runtime.distributed import connect

    connect("local", num_cpus=2)
    yield
    ray.shutdown()
