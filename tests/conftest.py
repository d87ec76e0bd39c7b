"""Shared fixtures: tiny checkpoints with their transformers outputs; run.py jobs (tests/e2e/) marked slow."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run in the CPU interpreter; transformers imports triton below, and the
    # language's own jit helpers (tl.zeros, tl.rand) are decorated at that import.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from checkpoints import SHAPES, build_checkpoint, hf_greedy  # noqa: E402  (after TRITON_INTERPRET)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """name -> (directory, transformers model)."""
    out = {}
    for name, shape in SHAPES.items():
        path = tmp_path_factory.mktemp(name)
        out[name] = (str(path), build_checkpoint(path, *shape))
    return out


@pytest.fixture(scope="session")
def reference_outputs(checkpoints):
    """Cache of transformers greedy outputs keyed by (checkpoint, prompt, length)."""
    cache = {}

    def get(name: str, prompt: list[int], max_new_tokens: int) -> list[int]:
        key = (name, tuple(prompt), max_new_tokens)
        if key not in cache:
            cache[key] = hf_greedy(checkpoints[name][1], prompt, max_new_tokens)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def moe_checkpoints(tmp_path_factory):
    """MoE name (tests/moe_checkpoints.py) -> (directory, transformers model), built on first use."""
    from moe_checkpoints import MoeCheckpoints

    return MoeCheckpoints(tmp_path_factory)


@pytest.fixture(autouse=True)
def release_gpu_memory(request):
    """After a GPU test, frees what it left unreferenced, so the next test's engine sizes its KV
    cache from memory that is really free (a failed test's traceback can keep an engine alive)."""
    yield
    if torch.cuda.is_available() and request.node.get_closest_marker("gpu"):
        import gc

        gc.collect()
        torch.cuda.empty_cache()


# tensor-parallel engines and killed processes: each test starts worker processes (seconds apiece)
PROCESS_TESTS = {"test_tp.py", "test_tp_host.py", "test_leftovers.py"}


def pytest_collection_modifyitems(config, items) -> None:
    """Jobs through run.py (tests/e2e/) are `slow`: `pytest -m "not slow"` is the quick loop. GPU tests
    skip without CUDA, also when a `-m` of the caller's replaces the default `-m 'not gpu'`."""
    no_cuda = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "e2e" in item.path.parts or item.path.name in PROCESS_TESTS:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("gpu") and not torch.cuda.is_available():
            item.add_marker(no_cuda)
