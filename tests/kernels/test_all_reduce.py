"""All-reduce choice on CPU: which implementation each knob resolves to, which path each message
takes, the one-line errors, and gloo TP=2 through nanoexp.distributed.all_reduce."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nanoexp import distributed
from nanoexp.config.checks import KnobError
from nanoexp.config.parallel import ParallelConfig
from nanoexp.kernels.all_reduce import (
    NCCL,
    ONE_SHOT,
    ONE_SHOT_MAX_BYTES,
    SYMM_MEM_MAX_BYTES,
    TWO_SHOT,
    AllReduce,
    check_no_multicast_env,
    resolve_choice,
)

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize(
    ("choice", "device", "world", "usable", "expected"),
    [
        ("auto", CPU, 2, False, "gloo"),
        ("nccl", CPU, 4, False, "gloo"),
        ("auto", GPU, 2, True, "symm_mem"),
        ("auto", GPU, 2, False, "nccl"),
        ("auto", GPU, 1, True, "nccl"),
        ("nccl", GPU, 8, True, "nccl"),
        ("symm_mem", GPU, 4, True, "symm_mem"),
    ],
)
def test_choice_resolves_per_device_and_world_size(choice, device, world, usable, expected):
    assert resolve_choice(choice, device, world, usable) == expected


def test_symm_mem_on_cpu_is_a_one_line_error():
    with pytest.raises(KnobError) as err:
        resolve_choice("symm_mem", CPU, 2, False)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("parallel.all_reduce='symm_mem' is invalid: must be auto or nccl on CPU")


def test_symm_mem_forced_where_unusable_and_unknown_choice_are_errors():
    with pytest.raises(KnobError, match=r"parallel.all_reduce='symm_mem' .* 2 peer-accessible GPUs"):
        resolve_choice("symm_mem", GPU, 2, False)
    with pytest.raises(KnobError, match=r"parallel.all_reduce='nvls' is invalid: must be one of auto, nccl"):
        ParallelConfig(tensor_parallel_size=2, all_reduce="nvls")


def test_multicast_must_be_off_for_symmetric_memory(monkeypatch):
    for key, value in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("NVSHMEM_DISABLE_NVLS", raising=False)
    with pytest.raises(RuntimeError, match="NVSHMEM_DISABLE_NVLS=None"):
        check_no_multicast_env()
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "1")
    check_no_multicast_env()


def symmetric(world: int, buffer_bytes: int, dtype=torch.bfloat16) -> AllReduce:
    """Path selection only: a plain tensor stands in for the symmetric buffer."""
    limit = min(buffer_bytes, SYMM_MEM_MAX_BYTES[world])
    buffer = torch.empty(buffer_bytes // dtype.itemsize, dtype=dtype)
    one_shot = min(limit, ONE_SHOT_MAX_BYTES[world])
    return AllReduce(None, "auto", "symm_mem", world, dtype, buffer, "g", one_shot, limit)


@pytest.mark.parametrize(
    ("world", "rows", "expected"),
    [
        (2, 1, ONE_SHOT),
        (2, 128, ONE_SHOT),
        (2, 129, TWO_SHOT),
        (2, 512, TWO_SHOT),
        (2, 513, NCCL),
        (8, 32, ONE_SHOT),
        (8, 33, NCCL),  # 8 ranks: point to point only up to 256 KiB
    ],
)
def test_path_by_message_size(world, rows, expected):
    ar = symmetric(world, buffer_bytes=512 * 4096 * 2)  # 512 rows x 4096 bf16 = 4 MiB
    assert ar.path_for(torch.empty(rows, 4096, dtype=torch.bfloat16)) == expected


def test_messages_the_buffer_cannot_take_go_to_nccl():
    ar = symmetric(2, buffer_bytes=1 << 20)
    assert ar.path_for(torch.empty(4, 4096, dtype=torch.float32)) == NCCL  # another dtype
    assert ar.path_for(torch.empty(4096, 4, dtype=torch.bfloat16).t()) == NCCL  # not contiguous
    assert ar.path_for(torch.empty(4, 7, dtype=torch.bfloat16)) == NCCL  # 56 bytes: not 16-aligned
    assert ar.path_for(torch.empty(4097, dtype=torch.bfloat16)[1:]) == NCCL  # offset not 16-aligned
    assert ar.path_for(torch.empty(4, 8, dtype=torch.bfloat16)) == ONE_SHOT
    plain = AllReduce(None, "nccl", "nccl", 2)
    assert plain.path_for(torch.empty(1, 8, dtype=torch.bfloat16)) == NCCL


def gloo_rank(rank: int, world: int, init: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        x = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (rank + 1)
        expected = torch.arange(12, dtype=torch.float32).reshape(3, 4) * sum(range(1, world + 1))
        assert torch.equal(distributed.all_reduce(x.clone()), expected)  # nothing installed: dist.all_reduce
        installed = distributed.init_all_reduce("auto", CPU, torch.float32, 1 << 20)
        assert installed is distributed._all_reduce and installed.impl == "gloo"
        assert torch.equal(distributed.all_reduce(x.clone()), expected)
        assert installed.describe()["all_reduce_paths"] == {"48": "gloo"}
        with pytest.raises(KnobError, match="parallel.all_reduce='symm_mem' is invalid"):
            distributed.init_all_reduce("symm_mem", CPU, torch.float32, 1 << 20)
    finally:
        distributed.reset_all_reduce()
        dist.destroy_process_group()


@pytest.mark.slow
def test_gloo_tp2_all_reduce_through_nanoexp_distributed(tmp_path):
    mp.spawn(gloo_rank, args=(2, f"file://{tmp_path / 'rendezvous'}"), nprocs=2, join=True)
