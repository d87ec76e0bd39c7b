"""Each all-reduce path on 2 GPUs equals NCCL's sum, eagerly and replayed from a CUDA graph, at sizes
from one row to above the symmetric buffer (where it falls back to NCCL)."""

from __future__ import annotations

import os

import pytest
import torch

from nanoexp.kernels.all_reduce import NO_MULTICAST_ENV

WORLD = 2
BUFFER_ROWS = 256  # the symmetric buffer holds 256 rows; larger messages take NCCL
SHAPES = [
    (1, 4096),
    (2, 4096),
    (16, 4096),
    (64, 4096),
    (65, 4096),
    (256, 4096),
    (257, 4096),
    (1024, 4096),
    (1, 1024),
    (48, 1024),
    (3, 6),
]
DTYPES = (torch.float32, torch.bfloat16)
PATHS = ("auto", "one_shot", "two_shot", "nccl")


def fits(path: str, shape: tuple[int, int]) -> bool:
    """Forced symmetric paths only for messages the buffer holds, 16-byte aligned (3 x 6 is not)."""
    return path in ("auto", "nccl") or shape[0] <= BUFFER_ROWS and shape[1] % 8 == 0


def run_path(ar, path: str, x: torch.Tensor) -> torch.Tensor:
    fn = {"auto": ar, "one_shot": ar.one_shot, "two_shot": ar.two_shot, "nccl": ar.nccl}[path]
    return fn(x)


def rank_main(rank: int, init: str, out_dir: str) -> None:
    os.environ.update(NO_MULTICAST_ENV)
    import torch.distributed as dist

    from nanoexp import distributed

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=WORLD, device_id=device)
    errors: dict[str, float] = {}
    try:
        for dtype in DTYPES:
            hidden = 4096
            ar = distributed.init_all_reduce("auto", device, dtype, BUFFER_ROWS * hidden * dtype.itemsize)
            assert ar.impl == "symm_mem", ar.describe()
            gen = torch.Generator(device).manual_seed(1234 + rank)
            for shape in SHAPES:
                for path in (p for p in PATHS if fits(p, shape)):
                    tag = f"{dtype} {shape} {path}"
                    x = torch.randn(shape, generator=gen, device=device, dtype=dtype)
                    expected = x.clone()
                    dist.all_reduce(expected)
                    errors[f"{tag} eager"] = max_error(run_path(ar, path, x.clone()), expected)
                    errors[f"{tag} graph"] = graph_error(ar, path, shape, dtype, gen, device)
                    if path == "auto":
                        errors[f"{tag} through nanoexp.distributed"] = max_error(
                            distributed.all_reduce(x.clone()), expected
                        )
            errors[f"{dtype} paths"] = ar.describe()["all_reduce_paths"]
        torch.cuda.synchronize()
    finally:
        torch.save(errors, os.path.join(out_dir, f"rank{rank}.pt"))
        distributed.reset_all_reduce()
        dist.destroy_process_group()


def graph_error(ar, path, shape, dtype, gen, device) -> float:
    """Captures the path on a static input, refills the input, replays, compares with NCCL eager."""
    import torch.distributed as dist

    static = torch.zeros(shape, device=device, dtype=dtype)
    scratch = static.clone()
    run_path(ar, path, scratch)  # warm-up outside the graph (NCCL and kernels initialized)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work = static.clone()
        result = run_path(ar, path, work)
    fresh = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    static.copy_(fresh)
    graph.replay()
    expected = fresh.clone()
    dist.all_reduce(expected)
    torch.cuda.synchronize()
    return max_error(result, expected)


def max_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    if got.dtype == torch.float32:  # two ranks: a + b in either order is the same float
        return 0.0 if torch.equal(got, expected) else float((got - expected).abs().max())
    try:
        torch.testing.assert_close(got, expected)  # bf16 tolerance
        return 0.0
    except AssertionError:
        return float((got.float() - expected.float()).abs().max())


@pytest.mark.gpu
def test_every_path_equals_nccl_sum(tmp_path, monkeypatch):
    if torch.cuda.device_count() < WORLD:
        pytest.skip(f"needs {WORLD} GPUs")
    import torch.multiprocessing as mp

    for key, value in NO_MULTICAST_ENV.items():
        monkeypatch.setenv(key, value)
    mp.spawn(rank_main, args=(f"file://{tmp_path / 'rendezvous'}", str(tmp_path)), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        errors = torch.load(tmp_path / f"rank{rank}.pt")
        paths = {k: errors.pop(k) for k in [k for k in errors if k.endswith(" paths")]}
        bf16 = paths["torch.bfloat16 paths"]
        assert bf16[str(4096 * 2)] == "one_shot" and bf16[str(256 * 4096 * 2)] == "two_shot", bf16
        assert bf16[str(257 * 4096 * 2)] == "nccl" and bf16[str(3 * 6 * 2)] == "nccl", bf16
        cases = len(DTYPES) * sum(fits(p, s) for s in SHAPES for p in PATHS)
        assert len(errors) == 2 * cases + len(DTYPES) * len(SHAPES), sorted(errors)  # every case ran
        bad = {k: v for k, v in errors.items() if v != 0.0}
        assert not bad, f"rank {rank}: max abs error against NCCL's sum: {bad}"
