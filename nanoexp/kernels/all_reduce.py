"""Tensor-parallel all-reduce: NCCL (gloo on CPU), or symmetric memory for small messages.

Symmetric memory (buffers peers read and write over NVLink): one-shot for decode-sized messages,
two-shot (reduce-scatter, all-gather) for larger ones, NCCL above the buffer. Point-to-point only:
NVLink multicast (NVLS, `multimem` ops) can take a shared host's GPUs out of service, so it is never
called and the environment must keep it off. Buffers are allocated once, before CUDA-graph capture."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from nanoexp.config.checks import KnobError

KiB, MiB = 1024, 1024 * 1024

# 2 ranks: measured on 2 H200s in CUDA graphs (experiments/tp_scaling/runs/all_reduce.md): one-shot
# wins up to 1 MiB, then two-shot (19 vs 23 us at 2 MiB); NCCL catches two-shot only at 32 MiB.
# More ranks (not measured here): vLLM's point-to-point custom all-reduce cut-offs on Hopper.
ONE_SHOT_MAX_BYTES = {2: 1 * MiB, 4: 512 * KiB, 6: 256 * KiB, 8: 256 * KiB}
SYMM_MEM_MAX_BYTES = {2: 64 * MiB, 4: 32 * MiB, 6: 512 * KiB, 8: 256 * KiB}
DEFAULT_MAX_BYTES = 256 * KiB  # both limits at other world sizes: the most conservative entries above

SYMM_MEM_DTYPES = (torch.bfloat16, torch.float32)  # what torch's symm_mem reduction kernels support
TWO_SHOT_OUT_WORLD_SIZES = (2, 4, 8)  # two_shot_all_reduce_out has kernels only for these

# Read by NCCL and torch's symmetric-memory allocator; symmetric memory is refused without them.
NO_MULTICAST_ENV = dict(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")

NCCL, ONE_SHOT, TWO_SHOT = "nccl", "one_shot", "two_shot"  # each path's name is its AllReduce method


def check_no_multicast_env() -> None:
    wrong = [f"{k}={os.environ.get(k)}" for k, v in NO_MULTICAST_ENV.items() if os.environ.get(k) != v]
    if wrong:
        need = " ".join(f"{k}={v}" for k, v in NO_MULTICAST_ENV.items())
        raise RuntimeError(
            f"parallel.all_reduce=symm_mem needs NVLink multicast off ({need}); got {' '.join(wrong)}"
        )


def symm_mem_module():
    """torch's symmetric-memory module, or None where this build lacks it."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        torch.ops.symm_mem.one_shot_all_reduce_out  # noqa: B018  (raises where the ops are missing)
        torch.ops.symm_mem.two_shot_all_reduce_  # noqa: B018
    except (ImportError, AttributeError, RuntimeError):
        return None
    return symm_mem


def symm_mem_usable(device: torch.device, world_size: int) -> bool:
    """A torch build with symmetric memory, and every rank's GPU (cuda:0..N-1 on one host, as the
    runner places them) peer-accessible from this one."""
    if not (1 < world_size <= torch.cuda.device_count()) or symm_mem_module() is None:
        return False
    me = device.index if device.index is not None else torch.cuda.current_device()
    return all(torch.cuda.can_device_access_peer(me, other) for other in range(world_size) if other != me)


def resolve_choice(choice: str, device: torch.device, world_size: int, usable: bool) -> str:
    """gloo on CPU (symm_mem forced there is an error), symm_mem where usable under `auto`, else NCCL;
    `choice` passed ParallelConfig's check."""
    if device.type != "cuda":
        if choice == "symm_mem":
            raise KnobError("parallel.all_reduce", choice, "auto or nccl on CPU (symm_mem needs CUDA GPUs)")
        return "gloo"
    if choice == "symm_mem" and not usable:
        need = f"{world_size} peer-accessible GPUs on one host and a torch build with symmetric memory"
        raise KnobError("parallel.all_reduce", choice, f"auto or nccl here (symm_mem needs {need})")
    if choice == "auto":
        return "symm_mem" if usable and world_size > 1 else "nccl"
    return choice


@dataclass
class AllReduce:
    """Sums a tensor across the group's ranks; `__call__` picks the path by message size."""

    group: dist.ProcessGroup | None
    choice: str  # the knob
    impl: str  # what it resolved to: gloo, nccl or symm_mem
    world_size: int
    dtype: torch.dtype | None = None  # the symmetric buffer's dtype
    buffer: torch.Tensor | None = None  # flat symmetric buffer, fixed address for CUDA graphs
    group_name: str = ""
    one_shot_max_bytes: int = 0
    symm_mem_max_bytes: int = 0  # min(the buffer, the per-world-size limit)
    paths: dict[int, str] = field(default_factory=dict)  # message bytes -> path taken (eager or capture)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        path = self.path_for(x)
        self.paths.setdefault(x.numel() * x.element_size(), "gloo" if self.impl == "gloo" else path)
        return getattr(self, path)(x)

    def path_for(self, x: torch.Tensor) -> str:
        nbytes = x.numel() * x.element_size()
        aligned = nbytes % 16 == 0 and x.storage_offset() * x.element_size() % 16 == 0
        if self.buffer is None or x.dtype != self.dtype or not x.is_contiguous() or not aligned:
            return NCCL
        if nbytes <= self.one_shot_max_bytes:
            return ONE_SHOT
        return TWO_SHOT if nbytes <= self.symm_mem_max_bytes else NCCL

    def nccl(self, x: torch.Tensor) -> torch.Tensor:
        """In place through the process group's backend (NCCL, or gloo on CPU)."""
        dist.all_reduce(x, group=self.group)
        return x

    def one_shot(self, x: torch.Tensor) -> torch.Tensor:
        """Each rank copies its input into its buffer, then reads every peer's and sums."""
        assert self.buffer is not None  # the caller took this path because the buffer exists
        symm, out = self.buffer[: x.numel()], torch.empty_like(x)
        ops = torch.ops.symm_mem
        if hasattr(ops, "one_shot_all_reduce_copy_out"):  # the copy happens inside the kernel
            ops.one_shot_all_reduce_copy_out(symm, x.view(-1), "sum", self.group_name, out.view(-1))
        else:
            symm.copy_(x.view(-1))
            ops.one_shot_all_reduce_out(symm, "sum", self.group_name, out.view(-1))
        return out

    def two_shot(self, x: torch.Tensor) -> torch.Tensor:
        """Each rank sums its 1/N slice from all peers, then gathers the others' sums; in place in x."""
        assert self.buffer is not None
        symm = self.buffer[: x.numel()]
        symm.copy_(x.view(-1))
        if self.world_size in TWO_SHOT_OUT_WORLD_SIZES:
            torch.ops.symm_mem.two_shot_all_reduce_out(symm, "sum", self.group_name, x.view(-1))
        else:
            torch.ops.symm_mem.two_shot_all_reduce_(symm, "sum", self.group_name)
            x.view(-1).copy_(symm)
        return x

    def describe(self) -> dict:
        """What results and W&B record: the knob, what it resolved to, thresholds, paths taken."""
        return {
            "all_reduce": self.choice,
            "all_reduce_impl": self.impl,
            "all_reduce_one_shot_max_bytes": self.one_shot_max_bytes,
            "all_reduce_symm_mem_max_bytes": self.symm_mem_max_bytes,
            "all_reduce_paths": {str(n): p for n, p in sorted(self.paths.items())},
        }


def allocate_symmetric(group: dist.ProcessGroup, device: torch.device, dtype: torch.dtype, numel: int):
    """A flat symmetric buffer shared with the group's ranks (a collective call)."""
    check_no_multicast_env()
    symm_mem = symm_mem_module()
    group_name = group.group_name
    enable = symm_mem.enable_symm_mem_for_group
    if not hasattr(enable, "__deprecated__") and not symm_mem.is_symm_mem_enabled_for_group(group_name):
        enable(group_name)  # older torch needs it before rendezvous; newer torch deprecates it
    buffer = symm_mem.empty(numel, dtype=dtype, device=device)
    symm_mem.rendezvous(buffer, group_name)
    return buffer, group_name


def agree(flag: bool, group: dist.ProcessGroup | None, device: torch.device) -> bool:
    """True only where every rank says True, so all ranks take the same collective path."""
    t = torch.tensor([int(flag)], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return bool(t.item())


def setup_all_reduce(
    choice: str, group: dist.ProcessGroup | None, device: torch.device, dtype: torch.dtype, max_bytes: int
) -> AllReduce:
    """This rank's all-reduce (collective, before CUDA-graph capture); max_bytes: the symmetric buffer's."""
    group = group or dist.group.WORLD
    assert group is not None, "the process group is initialised before the all-reduce is set up"
    world_size = dist.get_world_size(group)
    usable = device.type == "cuda" and agree(symm_mem_usable(device, world_size), group, device)
    impl = resolve_choice(choice, device, world_size, usable)
    if choice == "symm_mem" and dtype not in SYMM_MEM_DTYPES:
        raise KnobError(
            "parallel.all_reduce", choice, f"auto or nccl for dtype {dtype} (symm_mem: bfloat16, float32)"
        )
    if impl != "symm_mem" or dtype not in SYMM_MEM_DTYPES:
        return AllReduce(group, choice, "nccl" if impl == "symm_mem" else impl, world_size)
    limit = min(max_bytes, SYMM_MEM_MAX_BYTES.get(world_size, DEFAULT_MAX_BYTES))
    limit = max_bytes if choice == "symm_mem" else limit  # forced: symmetric memory up to the whole buffer
    numel = -(-max(limit, 16) // 16) * 16 // dtype.itemsize
    buffer, group_name = allocate_symmetric(group, device, dtype, numel)
    one_shot = min(limit, ONE_SHOT_MAX_BYTES.get(world_size, DEFAULT_MAX_BYTES))
    return AllReduce(group, choice, impl, world_size, dtype, buffer, group_name, one_shot, limit)
