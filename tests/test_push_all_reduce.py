"""The push all-reduce (kernels/triton_push_all_reduce.py): simulated ranks in one process, and the
`parallel.all_reduce=push` knob.

Without CUDA the kernel runs in the Triton interpreter, whose programs run one after another: every
rank's push half runs before any rank's reduce half. The interpreter rounds float32 to bf16 toward
zero, so there bf16 sums are checked exactly only where they need no rounding (fp16 rounds as on a
GPU). The `gpu` test runs two ranks' whole kernels at once on two streams of one GPU, spinning on
each other's pushes, eagerly and in a CUDA graph.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from nanoexp.config import KnobError  # noqa: E402
from nanoexp.config.parallel import ParallelConfig  # noqa: E402
from nanoexp.kernels import pdl  # noqa: E402
from nanoexp.kernels.all_reduce import NCCL, ONE_SHOT, PUSH, AllReduce, resolve_choice  # noqa: E402
from nanoexp.kernels.triton_push_all_reduce import EPOCHS, PushAllReduce, forked  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)
SMALL = {"block": 64, "max_programs": 3}  # several blocks per program at a few hundred elements


def inputs(world: int, n: int, dtype: torch.dtype, gen: torch.Generator) -> list[torch.Tensor]:
    """fp16: random. bf16: eighths in [-4, 4), whose sums over <= 8 ranks bf16 holds exactly, unless
    on a GPU, which rounds as torch does."""
    if dtype == torch.bfloat16 and DEVICE.type == "cpu":
        return [(torch.randint(-32, 32, (n,), generator=gen) / 8).to(DEVICE, dtype) for _ in range(world)]
    return [torch.randn(n, generator=gen).to(DEVICE, dtype) for _ in range(world)]


def rank_ordered_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    acc = torch.zeros_like(xs[0], dtype=torch.float32)
    for x in xs:
        acc += x.float()
    return acc.to(xs[0].dtype)


def simulate_call(ranks: list[PushAllReduce], xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """One call on every rank: every push half, then every reduce half."""
    outs = [torch.empty_like(x) for x in xs]
    for rank, x, out in zip(ranks, xs, outs):
        rank.launch(x, out, push=True, reduce=False)
    for rank, x, out in zip(ranks, xs, outs):
        rank.launch(x, out, push=False, reduce=True)
    return outs


def check_call(ranks: list[PushAllReduce], xs: list[torch.Tensor], epoch: int) -> None:
    outs = simulate_call(ranks, xs)
    expected = rank_ordered_sum(xs)
    for out in outs:
        assert torch.equal(out, outs[0])  # bit-identical on every rank
        assert torch.equal(out, expected)
    for rank in ranks:
        assert rank.state.tolist() == [epoch, 0, 0]  # epoch advanced, arrivals reset, no timeout
        assert not rank.buffer.any()  # every word read was cleared


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_simulated_ranks_sum_in_rank_order_call_after_call(world, dtype):
    ranks = PushAllReduce.simulated(world, 320, DEVICE, dtype, **SMALL)
    gen = torch.Generator().manual_seed(world)
    # Not multiples of the block; both phases; a smaller call between larger ones.
    for epoch, n in enumerate([300, 77, 320, 1, 300], start=1):
        check_call(ranks, inputs(world, n, dtype, gen), epoch)


def test_epoch_wraps_with_phase_and_tag_in_step():
    ranks = PushAllReduce.simulated(2, 128, DEVICE, **SMALL)
    for rank in ranks:
        rank.state[0] = EPOCHS - 2  # tags 65534 and 65535, then epoch 0: tag 1, phase 0
    gen = torch.Generator().manual_seed(7)
    for epoch in [EPOCHS - 1, 0, 1]:
        check_call(ranks, inputs(2, 100, torch.float16, gen), epoch)


def test_a_spin_without_the_peers_push_gives_up_and_counts():
    ranks = PushAllReduce.simulated(2, 128, DEVICE, block=64, max_programs=2, max_spins=3)
    x = torch.ones(100, dtype=torch.float16, device=DEVICE)
    ranks[0].launch(x, torch.empty_like(x), push=True, reduce=True)  # rank 1 never pushes
    assert ranks[0].timeouts() == 2  # one per block that waited on rank 1
    assert ranks[0].epoch() == 1


def test_fits_only_contiguous_messages_of_its_word_size_up_to_its_buffer():
    push = PushAllReduce.simulated(2, 256, DEVICE)[0]
    assert push.fits(torch.empty(16, 16, dtype=torch.bfloat16, device=DEVICE))
    assert push.fits(torch.empty(3, dtype=torch.float16, device=DEVICE))
    assert not push.fits(torch.empty(16, 16, dtype=torch.float32, device=DEVICE))
    assert not push.fits(torch.empty(32, 4, dtype=torch.bfloat16, device=DEVICE).t())
    assert not push.fits(torch.empty(257, dtype=torch.bfloat16, device=DEVICE))
    assert not push.fits(torch.empty(0, dtype=torch.bfloat16, device=DEVICE))
    assert push.max_bytes == 512
    with pytest.raises(ValueError, match="does not fit its buffer"):
        push(torch.empty(257, dtype=torch.bfloat16, device=DEVICE))
    wide = PushAllReduce.simulated(2, 256, DEVICE, torch.float32)[0]  # 64-bit words
    assert wide.buffer.dtype == torch.int64 and wide.max_bytes == 1024
    assert wide.fits(torch.empty(256, dtype=torch.float32, device=DEVICE))
    assert not wide.fits(torch.empty(16, dtype=torch.bfloat16, device=DEVICE))


def test_peer_addresses_from_the_rendezvous_handle(monkeypatch):
    """buffer_ptrs are the allocations' bases; a pooled tensor starts at the same offset inside each."""
    import torch.distributed._symmetric_memory as symm_mem

    pool = torch.zeros(2, 4096, dtype=torch.int32)
    buffer = pool[1, 1024:]  # rank 1's tensor, 4 KiB into its allocation
    handle = SimpleNamespace(rank=1, world_size=2, buffer_ptrs=[pool[0].data_ptr(), pool[1].data_ptr()])
    monkeypatch.setattr(symm_mem, "rendezvous", lambda tensor, group: handle)
    push = PushAllReduce.from_symmetric(buffer, "g", 512)
    assert push.rank == 1 and push.world_size == 2
    assert push.peers.tolist() == [-4096, 0]  # rank 0's tensor: pool[0, 1024:], 4096 words before


def test_all_reduce_takes_the_push_path_for_what_it_fits():
    buffer = torch.empty(1 << 20, dtype=torch.bfloat16)
    ar = AllReduce(None, PUSH, PUSH, 2, torch.bfloat16, buffer, "g", 1 << 20, 1 << 21)
    ar.push = PushAllReduce.simulated(2, 1024, CPU)[0]
    assert ar.path_for(torch.empty(4, 256, dtype=torch.bfloat16)) == PUSH
    assert ar.path_for(torch.empty(4, 264, dtype=torch.bfloat16)) == ONE_SHOT  # above the push buffer
    assert ar.path_for(torch.empty(4, 8, dtype=torch.float32)) == NCCL  # neither buffer's dtype
    assert ar.describe()["all_reduce_push_max_bytes"] == 2048
    assert ar.describe()["all_reduce_push_timeouts"] == 0
    assert AllReduce(None, "nccl", "nccl", 2).describe()["all_reduce_push_max_bytes"] == 0


def test_push_knob_is_accepted_and_refused_on_cpu_in_one_line():
    assert ParallelConfig(all_reduce="push").all_reduce == "push"
    with pytest.raises(KnobError) as err:
        resolve_choice("push", CPU, 2, False)
    message = str(err.value)
    assert "\n" not in message
    assert message == (
        "parallel.all_reduce='push' is invalid: must be auto or nccl on CPU (push needs CUDA GPUs)"
    )
    with pytest.raises(KnobError, match=r"parallel.all_reduce='push' .* 2 peer-accessible GPUs"):
        resolve_choice("push", GPU, 2, False)
    with pytest.raises(KnobError, match=r"must be one of auto, nccl, symm_mem, push$"):
        ParallelConfig(all_reduce="nvls")
    assert resolve_choice("push", GPU, 2, True) == PUSH
    assert resolve_choice("auto", GPU, 2, True) == "symm_mem"  # auto never picks push


@pytest.fixture
def pdl_off_afterwards():
    yield
    pdl.configure("off", CPU, has_triton=False)


def launch_concurrently(ranks, xs, outs, streams) -> None:
    """One call: each rank's whole kernel on its own stream, so they spin on each other's pushes."""
    for rank, x, out, stream in zip(ranks, xs, outs, streams):
        with torch.cuda.stream(stream):
            rank.launch(x, out)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "mode, dtype", [("off", torch.bfloat16), ("on", torch.bfloat16), ("on", torch.float32)]
)
def test_two_ranks_on_two_streams_of_one_gpu_eager_and_in_a_graph(mode, dtype, pdl_off_afterwards):
    if mode == "on" and not pdl.supported(GPU):
        pytest.skip("PDL needs compute capability 9.0+")
    pdl.configure(mode, GPU, has_triton=True)
    world, max_elems, calls, captured, replays = 2, 1 << 19, 200, 16, 4  # 1 MiB of bf16
    # Both ranks' grids share one GPU here: bounded well below its SMs so both are resident at once;
    # a spin that still found no peer gives up within about a second and is counted.
    ranks = PushAllReduce.simulated(world, max_elems, GPU, dtype, max_programs=32, max_spins=1 << 20)
    streams = [torch.cuda.Stream() for _ in ranks]
    sizes = [1, 1024, 4096, 4097, 65536 + 3, max_elems]
    gen = torch.Generator(GPU).manual_seed(0)

    def fresh(n):
        return [torch.randn(n, generator=gen, device=GPU).to(dtype) for _ in ranks]

    def cases(count):
        inputs = [fresh(sizes[i % len(sizes)]) for i in range(count)]
        return [(xs, [torch.empty_like(x) for x in xs]) for xs in inputs]

    # Eager: calls interleaved across ranks so neither stream's launch queue blocks the other's.
    eager = cases(calls)
    with forked(streams):
        for xs, outs in eager:
            launch_concurrently(ranks, xs, outs, streams)
    torch.cuda.synchronize()
    for i, (xs, outs) in enumerate(eager):
        expected = rank_ordered_sum(xs)
        assert all(torch.equal(out, expected) for out in outs), f"eager call {i}, {xs[0].numel()} elements"
    assert [r.timeouts() for r in ranks] == [0, 0] and [r.epoch() for r in ranks] == [calls, calls]

    # A graph of `captured` calls per rank, each rank's on its own stream, replayed with new inputs.
    static = cases(captured)
    with pdl.graph_launches():
        with forked(streams):
            for xs, outs in static:  # PDL variants compiled outside the capture
                launch_concurrently(ranks, xs, outs, streams)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), forked(streams):
            for xs, outs in static:
                launch_concurrently(ranks, xs, outs, streams)
    for replay in range(replays):
        for xs, _ in static:
            for x, new in zip(xs, fresh(xs[0].numel())):
                x.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        for i, (xs, outs) in enumerate(static):
            expected = rank_ordered_sum(xs)
            assert all(torch.equal(out, expected) for out in outs), f"replay {replay}, call {i}"
    assert [r.timeouts() for r in ranks] == [0, 0]
    assert [r.epoch() for r in ranks] == [calls + captured * (1 + replays)] * world
    assert not any(r.buffer.any() for r in ranks)
