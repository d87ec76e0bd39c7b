"""Push all-reduce for decode-sized messages: every rank stores its input, tagged, straight into
every rank's buffer, then sums what has arrived in its own buffer. No barrier, no signal: the
flag travels inside the data (Lamport style).

Words. Each rank's buffer holds words laid out [2 phases][world_size][max_elems]: for bf16/fp16
a 32-bit word, (tag << 16) | the value's 16 bits; for float32 a 64-bit word, (tag << 32) | the
value's 32 bits. A word that carries the tag of the current call is the value itself, whole: an
aligned store of one word is never seen half done, and no other ordering is needed.

Calls. Each rank keeps [epoch, arrivals, timeouts] in a device tensor of its own. Call `epoch` uses
phase epoch % 2 and tag epoch % 65535 + 1 (never 0). Its programs first push all their blocks of
x into row `rank` of that phase in every rank's buffer, then, rank by rank in rank order, spin on
their own buffer until every word of a block carries the tag, sum in float32 (bit-identical on
every rank), store the output, and set the words they read back to 0. The program that arrives
last advances the epoch. Buffers start zeroed and every call leaves them zeroed: a word with the
current tag is always this call's, even where an earlier call of the same phase and tag (131070
calls back) wrote further than this one.

Why two phases: a peer can start call i+1 once it has everyone's data for call i, before this
rank has read all of call i; its call i+1 words land in the other phase. It cannot start call
i+2 before this rank has pushed call i+1, which this rank does only after finishing call i.

Why the grid bound: programs spin on data pushed by the peers' programs, so every program pushes
all its blocks before it spins, and a launch never has more programs than can be resident at
once (one per SM), each looping over its blocks: a program that never started could not push.
A spin that outlasts `max_spins` polls gives up and counts a timeout (a wrong sum, not a hung
GPU).

In the CPU interpreter programs run one after another, so a spin would never end: `launch` takes
`push` and `reduce` flags, and a test runs the push of every simulated rank, then the reduce of
every rank. On CUDA one launch does both.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from nanoexp.kernels.base import num_sms
from nanoexp.kernels.pdl import launch_options
from nanoexp.kernels.triton_pdl import wait_for_previous

NARROW_DTYPES = (torch.bfloat16, torch.float16)  # in 32-bit words
WORD_DTYPES = {torch.bfloat16: torch.int32, torch.float16: torch.int32, torch.float32: torch.int64}
EPOCHS = 2 * 65535  # the epoch wraps here, keeping phase and tag in step and the int32 small
BLOCK = 1024
CPU_MAX_PROGRAMS = 4
# Polls before a spin gives up: tens of seconds at ~1 us a poll, longer than ranks drift apart
# (a first call compiling the kernel on one rank), short enough not to leave a GPU hung.
MAX_SPINS = 1 << 25


@triton.jit
def _push(x_ptr, slot, peers_ptr, n, rank, max_elems, tag, WORLD: tl.constexpr, BLOCK: tl.constexpr,
          WIDE: tl.constexpr):
    """This program's blocks of x, tagged, into row `rank` of the phase in every rank's buffer."""
    row = rank * max_elems
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        if WIDE:
            word = (x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF) | (tag.to(tl.int64) << 32)
        else:
            word = (x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) | (tag << 16)
        for r in tl.static_range(WORLD):
            peer = tl.multiple_of(tl.load(peers_ptr + r), 16)  # rank r's buffer, in words from this one
            tl.store(slot + peer + row + offs, word, mask=mask)


@triton.jit
def _arrived(ptrs, mask, tag, max_spins, state_ptr, TAG_SHIFT: tl.constexpr):
    """The words at ptrs once every one carries `tag` (volatile loads: peers write them)."""
    word = tl.load(ptrs, mask=mask, other=0, volatile=True)
    waiting = tl.max(((((word >> TAG_SHIFT) & 0xFFFF) != tag) & mask).to(tl.int32), axis=0)
    spins = 0
    while (waiting > 0) & (spins < max_spins):
        word = tl.load(ptrs, mask=mask, other=0, volatile=True)
        waiting = tl.max(((((word >> TAG_SHIFT) & 0xFFFF) != tag) & mask).to(tl.int32), axis=0)
        spins += 1
    if waiting > 0:
        tl.atomic_add(state_ptr + 2, 1)  # timeouts
    return word


@triton.jit
def _reduce(out_ptr, slot, state_ptr, n, max_elems, tag, max_spins, WORLD: tl.constexpr, BLOCK: tl.constexpr,
            WIDE: tl.constexpr):
    """This program's blocks of the sum, from every rank's row of the phase in this rank's buffer,
    in rank order; the words read are set back to 0."""
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for r in tl.static_range(WORLD):
            ptrs = slot + r * max_elems + offs
            word = _arrived(ptrs, mask, tag, max_spins, state_ptr, 32 if WIDE else 16)
            tl.store(ptrs, tl.zeros_like(word), mask=mask)
            if WIDE:
                bits = (word & 0xFFFFFFFF).to(tl.int32)
            else:
                bits = (word & 0xFFFF).to(tl.int16)
            acc += bits.to(out_ptr.dtype.element_ty, bitcast=True).to(tl.float32)
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


# One compiled variant for every rank: a rank compiling its own while a peer spins would stall it.
@triton.jit(do_not_specialize=["rank", "max_spins"])
def _push_all_reduce_kernel(
    x_ptr,
    out_ptr,
    buf_ptr,
    peers_ptr,
    state_ptr,
    n,
    rank,
    max_elems,
    max_spins,
    WORLD: tl.constexpr,
    BLOCK: tl.constexpr,
    DO_PUSH: tl.constexpr,
    DO_REDUCE: tl.constexpr,
    EPOCHS: tl.constexpr,
    WIDE: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    wait_for_previous(PDL)
    epoch = tl.load(state_ptr, volatile=True)
    tag = epoch % 65535 + 1
    slot = buf_ptr + (epoch % 2) * WORLD * max_elems  # this call's phase
    if DO_PUSH:
        _push(x_ptr, slot, peers_ptr, n, rank, max_elems, tag, WORLD, BLOCK, WIDE)
    if DO_REDUCE:
        _reduce(out_ptr, slot, state_ptr, n, max_elems, tag, max_spins, WORLD, BLOCK, WIDE)
        # Every program read the epoch before arriving, so the last one may advance it.
        tl.debug_barrier()
        if tl.atomic_add(state_ptr + 1, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
            tl.store(state_ptr + 1, 0)
            tl.store(state_ptr, (epoch + 1) % EPOCHS)


@dataclass
class PushAllReduce:
    """One rank's push all-reduce. `__call__` returns the sum in a new tensor (x is not written)."""

    # [2 * world_size * max_elems] words, zeroed: int32 for bf16/fp16 values, int64 for float32; its
    # address is fixed (CUDA graphs)
    buffer: torch.Tensor
    peers: torch.Tensor  # int64 [world_size]: each rank's buffer address minus this one's, in words
    state: torch.Tensor  # int32 [3]: epoch, arrivals, timeouts; this rank's alone
    rank: int
    world_size: int
    max_elems: int
    max_programs: int  # resident at once on every rank's device
    block: int = BLOCK
    max_spins: int = MAX_SPINS

    @staticmethod
    def buffer_numel(world_size: int, max_elems: int) -> int:
        return 2 * world_size * max_elems

    @classmethod
    def from_symmetric(
        cls, buffer: torch.Tensor, group_name: str, max_elems: int, **options
    ) -> PushAllReduce:
        """From a zeroed symmetric buffer of buffer_numel words (all_reduce.allocate_symmetric):
        peers' addresses from the rendezvous handle (a collective call on first use)."""
        import torch.distributed._symmetric_memory as symm_mem

        handle = symm_mem.rendezvous(buffer, group_name)
        # buffer_ptrs are the allocations' bases; the tensor may start further in, at the same
        # offset on every rank.
        bases = list(handle.buffer_ptrs)
        addresses = [base + buffer.data_ptr() - bases[handle.rank] for base in bases]
        return cls.from_addresses(buffer, addresses, handle.rank, max_elems, **options)

    @classmethod
    def from_addresses(
        cls, buffer: torch.Tensor, addresses: list[int], rank: int, max_elems: int, **options
    ) -> PushAllReduce:
        world_size = len(addresses)
        words = cls.buffer_numel(world_size, max_elems)
        if buffer.dtype not in (torch.int32, torch.int64) or buffer.numel() < words or words >= 2**31:
            raise ValueError(f"push all-reduce needs {words} int32 or int64 words (fewer than 2^31)")
        # The kernel tells the compiler the distances are whole multiples of 16 words (vector stores).
        word_bytes = buffer.element_size()
        apart = 16 * word_bytes
        if addresses[rank] != buffer.data_ptr() or any((a - buffer.data_ptr()) % apart for a in addresses):
            raise ValueError(f"push all-reduce: buffers must be {apart} bytes apart, this rank's at its own")
        peers = torch.tensor([(a - buffer.data_ptr()) // word_bytes for a in addresses], dtype=torch.int64)
        state = torch.zeros(3, dtype=torch.int32, device=buffer.device)
        options.setdefault("max_programs", default_max_programs(buffer.device))
        return cls(buffer, peers.to(buffer.device), state, rank, world_size, max_elems, **options)

    @classmethod
    def simulated(
        cls, world_size: int, max_elems: int, device: torch.device, dtype: torch.dtype = torch.bfloat16,
        **options,
    ) -> list[PushAllReduce]:
        """`world_size` ranks in one process, one buffer each on `device`, for `dtype` messages (tests)."""
        words = -(-cls.buffer_numel(world_size, max_elems) // 16) * 16  # buffers 16 words apart
        pool = torch.zeros(world_size, words, dtype=WORD_DTYPES[dtype], device=device)
        buffers = list(pool.unbind())
        addresses = [b.data_ptr() for b in buffers]
        return [cls.from_addresses(b, addresses, r, max_elems, **options) for r, b in enumerate(buffers)]

    @property
    def wide(self) -> bool:
        """64-bit words: float32 values."""
        return self.buffer.dtype == torch.int64

    @property
    def max_bytes(self) -> int:
        return self.max_elems * (4 if self.wide else 2)

    def fits(self, x: torch.Tensor) -> bool:
        dtype_fits = x.dtype == torch.float32 if self.wide else x.dtype in NARROW_DTYPES
        fits_buffer = x.device == self.buffer.device and 0 < x.numel() <= self.max_elems
        return dtype_fits and fits_buffer and x.is_contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        self.launch(x, out)
        return out

    def launch(self, x: torch.Tensor, out: torch.Tensor, push: bool = True, reduce: bool = True) -> None:
        """Sums x over the ranks into out. push / reduce: that half only (the CPU interpreter's
        simulated ranks; both halves of one call must see the same epoch, so only reduce advances it)."""
        if not self.fits(x) or out.dtype != x.dtype or not out.is_contiguous() or out.numel() != x.numel():
            raise ValueError(f"push all-reduce of {tuple(x.shape)} {x.dtype} does not fit its buffer")
        n = x.numel()
        grid = (min(triton.cdiv(n, self.block), self.max_programs),)
        _push_all_reduce_kernel[grid](
            x, out, self.buffer, self.peers, self.state, n, self.rank, self.max_elems, self.max_spins,
            WORLD=self.world_size, BLOCK=self.block, DO_PUSH=push, DO_REDUCE=reduce, EPOCHS=EPOCHS,
            WIDE=self.wide, num_warps=4, **launch_options(),
        )  # fmt: skip

    def epoch(self) -> int:
        return int(self.state[0])

    def timeouts(self) -> int:
        """Spins that gave up (each a block summed from words that had not all arrived)."""
        return int(self.state[2])


def default_max_programs(device: torch.device) -> int:
    return num_sms(device) if device.type == "cuda" else CPU_MAX_PROGRAMS


@contextmanager
def forked(streams: list[torch.cuda.Stream]) -> Iterator[None]:
    """For simulated ranks on one GPU, each on a stream of its own: work enqueued on `streams` in
    the block starts after the current stream's and is joined back into it (a graph capture takes
    it in)."""
    origin = torch.cuda.current_stream()
    for stream in streams:
        stream.wait_stream(origin)
    yield
    for stream in streams:
        origin.wait_stream(stream)
