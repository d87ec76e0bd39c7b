"""One rank's step execution: inputs to the device, eager or graph forward, sampling on rank 0,
the queue of enqueued steps, and sharing the sampled ids with the other ranks."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch
import torch.distributed as dist

from nanoexp.config import EngineConfig
from nanoexp.distributed import all_gather_stacked, init_all_reduce, reset_all_reduce
from nanoexp.kernels import pdl
from nanoexp.kernels.select import triton_available
from nanoexp.layers.attention import attention_layers
from nanoexp.layers.compiled import use_compiled
from nanoexp.layers.quantization import weight_quantization
from nanoexp.layers.sampler import Sampler, SamplingTensors, flag_non_finite, pick_shard_winner
from nanoexp.runner.cuda_graphs import MAX_GRAPH_BATCH, MAX_STEP_GRAPH_TOKENS, DecodeGraphs, StepGraphs
from nanoexp.runner.expert_load import ExpertLoadCounter
from nanoexp.runner.inputs import ModelInputs, counter_seeds, prepare_inputs, prepare_step
from nanoexp.runner.kv_cache import create_kv_cache
from nanoexp.runner.kv_scales import calibrate_kv_scales, calibration_tokens, scales_summary
from nanoexp.runner.model_setup import eos_token_ids, set_up_model
from nanoexp.runner.peak_memory import peak_memory_bytes, reset_peak_memory, resident_bytes
from nanoexp.runner.step_hooks import PhaseHooks
from nanoexp.runner.step_input import RunnerInfo, SampledTokens, StepInput, blockless_prefill

MIN_READBACK_IDS = 256  # ids per pinned buffer; a larger step gets a buffer of its own size


def substitute_tokens(
    input_ids: torch.Tensor, rows: torch.Tensor, prev_tokens: torch.Tensor, every_row: bool = False
) -> torch.Tensor:
    """Each row of input_ids whose entry r in `rows` is >= 0 set to prev_tokens[r], in place (a captured
    graph reads input_ids where they are); every_row: all r >= 0 (one gather instead of four ops)."""
    if every_row:
        return torch.index_select(prev_tokens, 0, rows, out=input_ids)
    return torch.where(rows >= 0, prev_tokens[rows.clamp(min=0)], input_ids, out=input_ids)


def exchange_winners(scores: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """One all-gather of every rank's per-row (score, token id as float32: exact below 2^24); the best."""
    winners = all_gather_stacked(torch.stack([scores, tokens.float()]))
    return pick_shard_winner(winners[:, 0], winners[:, 1]).long()


class Readback:
    """Launched steps' sampled ids (int64), oldest first, copied without blocking to pinned host memory. The
    pinned buffers and their CUDA events are reused: allocating them every step costs tens of microseconds
    a batch-1 decode step cannot spare (experiments/nanovllm_bench/runs/host_phases_53dfc1e.md)."""

    def __init__(self) -> None:
        self.free: list[tuple[torch.Tensor, torch.cuda.Event]] = []
        # (ids or their host copy, slot, how many ids, the expert-load counts' shape)
        self.pending: deque[tuple[torch.Tensor, tuple | None, int, tuple[int, ...] | None]] = deque()

    def take(self, count: int) -> tuple[torch.Tensor, torch.cuda.Event]:
        for i, slot in enumerate(self.free):
            if slot[0].numel() >= count:
                return self.free.pop(i)
        host = torch.empty(max(count, MIN_READBACK_IDS), dtype=torch.int64, pin_memory=True)
        return host, torch.cuda.Event()

    def push(self, tokens: torch.Tensor, expert_load: torch.Tensor | None = None) -> None:
        """Copies the step's ids, and its expert-load counts after them in the same buffer."""
        slot, count = None, tokens.numel()
        shape = None if expert_load is None else tuple(expert_load.shape)
        if expert_load is not None:
            tokens = torch.cat([tokens.reshape(-1), expert_load.reshape(-1).to(torch.int64)])
        if tokens.is_cuda:
            slot = self.take(tokens.numel())
            host = slot[0][: tokens.numel()]
            host.copy_(tokens, non_blocking=True)
            slot[1].record()
            tokens = host
        self.pending.append((tokens, slot, count, shape))

    def pop(self) -> SampledTokens:
        """The oldest pushed step's ids (and expert load), once copied."""
        tokens, slot, count, shape = self.pending.popleft()
        if slot is not None:
            slot[1].synchronize()
            self.free.append(slot)  # free again once read below, before any push can take it
        load = None if shape is None else tokens[count:].numpy().reshape(shape).copy()
        return SampledTokens.of(tokens[:count].tolist(), load)


class ModelRunner:
    def __init__(self, config: EngineConfig, rank: int = 0, dist_init: str | None = None):
        self.config, self.rank = config, rank
        self.block_size = config.cache.block_size
        self.phase_hooks: PhaseHooks | None = None  # told of each step's prepare and forward (a profiler)
        self.peak_memory_kind = reset_peak_memory(torch.device("cpu"))  # the resident peak counts loading
        loaded = set_up_model(config, rank, dist_init)
        self.model, self.hf_config, self.backend = loaded.model, loaded.hf_config, loaded.backend
        self.device, self.dtype = loaded.device, loaded.dtype
        if self.device.type == "cuda":
            self.peak_memory_kind = reset_peak_memory(self.device)
        self.skinny_gemm, self.swiglu_kernel = loaded.skinny_gemm, loaded.swiglu_kernel
        self.max_model_len = loaded.max_model_len
        self.moe_kernel = loaded.moe_kernel
        counting = config.execution.expert_load_stats and rank == 0  # routing is replicated: rank 0 counts
        self.expert_load = ExpertLoadCounter.for_model(self.model, self.device, counting)
        # sized for the largest all-reduce of a captured decode step: one hidden row per sequence
        message_bytes = min(config.scheduler.max_num_seqs, MAX_GRAPH_BATCH) * self.hf_config.hidden_size
        self.all_reduce = init_all_reduce(
            config.parallel.all_reduce, self.device, self.dtype, message_bytes * self.dtype.itemsize
        )
        self.timings: dict[str, float] = {"load_s": loaded.load_s}
        self.sampler = Sampler(one_pass=self.device.type == "cuda" and triton_available())
        self.last_sampled: torch.Tensor | None = None  # the last launched step's ids, on every rank
        self.tp = config.parallel.tensor_parallel_size
        self.steps_sampled = 0  # every rank counts the same steps: the key of TP's fresh seeds
        exact = self.hf_config.vocab_size < 2**24  # the ranks exchange token ids as float32, exact below 2^24
        self.shards_sampling = self.tp > 1 and config.parallel.sharded_sampling and exact
        self.readback = Readback()  # launched, not collected (rank 0)
        if config.cache.lossy:
            self.calibrate_kv_scales()
        self.uses_graphs = self.device.type == "cuda" and not config.scheduler.enforce_eager
        reserve = 2**30 if self.uses_graphs else 2**28  # graph pool, logits and sampler buffers
        cache = create_kv_cache(config, self.model, self.dtype, self.device, self.profile_memory, reserve)
        self.kv_cache, self.num_blocks = cache, cache.shape[2]  # [layers, 2, blocks, block_size, heads, dim]
        if self.device.type == "cuda":
            self.warm_up_prefill_kernels()
        self.step_graphs: StepGraphs | None = None
        self.graphs = self.capture_graphs() if self.uses_graphs else None

    def graphs_for(self, step: StepInput) -> DecodeGraphs | StepGraphs | None:
        """The captured graphs that run `step`, or None (an eager step)."""
        graphs = self.step_graphs if step.has_prefill else self.graphs
        return graphs if graphs is not None and step.num_tokens <= graphs.max_tokens else None

    def weight_format(self) -> dict:
        """weight_quantization ('fp8' or 'none'; a MoE model's experts included) and the fp8 GEMM bound."""
        fmt, gemm = weight_quantization(self.model)
        return {"weight_quantization": fmt, "fp8_gemm": gemm}

    def info(self) -> RunnerInfo:
        return RunnerInfo(
            vocab_size=self.hf_config.vocab_size,
            max_model_len=self.max_model_len,
            eos_token_ids=eos_token_ids(self.hf_config, self.config.model),
            num_kv_blocks=self.num_blocks,
            max_mixed_step_tokens=self.step_graphs.max_tokens if self.step_graphs is not None else None,
        )

    # ---- start-up runs ------------------------------------------------------------------------

    def capture_graphs(self) -> DecodeGraphs:
        """Decode graphs, and step graphs where the attention backend runs prefills on a fixed grid."""
        start = time.perf_counter()
        max_blocks = -(-self.max_model_len // self.block_size)
        scheduler, hidden = self.config.scheduler, self.hf_config.hidden_size
        graphs = DecodeGraphs(self.model, hidden, scheduler.max_num_seqs, max_blocks, self.dtype, self.device)
        if self.backend.captures_mixed_steps:
            layer = attention_layers(self.model)[0]
            self.step_graphs = StepGraphs(
                self.model,
                hidden,
                layer.head_dim,
                layer.num_heads,
                layer.num_kv_heads,
                scheduler.max_num_seqs,
                scheduler.max_num_batched_tokens,
                max_blocks,
                self.dtype,
                self.device,
                mixed=scheduler.batching == "mixed",
            )
        with use_compiled(True):
            if self.step_graphs is not None:
                self.step_graphs.capture()
            graphs.capture()
            self.warm_up_sampler()
        self.timings["graph_capture_s"] = time.perf_counter() - start
        return graphs

    @torch.inference_mode()
    def calibrate_kv_scales(self) -> None:
        """The fp8 cache's per-layer scales, from one eager prefill before any cache or graph exists."""
        start = time.perf_counter()
        budget = min(self.max_model_len, self.config.scheduler.max_num_batched_tokens)
        step = blockless_prefill([calibration_tokens(self.hf_config.vocab_size, budget)])
        inputs = prepare_inputs(step, self.block_size, self.device)
        with use_compiled(False):
            calibrate_kv_scales(self.model, lambda: self.model(inputs.input_ids, inputs.positions, inputs.md))
        self.timings["kv_calibration_s"] = time.perf_counter() - start

    def blockless_prefill(self, tokens: int) -> StepInput:
        """A prefill of about `tokens` tokens in as few sequences as allowed, without blocks: none stored."""
        max_len = self.max_model_len
        num_seqs = max(1, min(-(-tokens // max_len), self.config.scheduler.max_num_seqs))
        length = min(max_len, max(1, tokens // num_seqs))
        return blockless_prefill([[0] * length for _ in range(num_seqs)])

    @torch.inference_mode()
    def run_prefill(self, step: StepInput, lossy_cache: bool = False) -> None:
        """A start-up prefill, its logits unread, waited for."""
        self.forward_logits(
            step, prepare_step(step, self.block_size, 0, self.device, lossy_cache=lossy_cache)[0]
        )
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run_blockless_prefill(self, tokens: int) -> None:
        self.run_prefill(self.blockless_prefill(tokens))

    def run_prefill_through_cache(self, tokens: int, cached_prefix: bool = False) -> None:
        """run_blockless_prefill's step stored into the cache's first blocks and attending to them, as every
        prefill with a lossy cache does; cached_prefix: each sequence's first block taken as cached (a
        prefix-cache hit: K/V of earlier steps read from the cache). Free blocks, which each later request
        overwrites before reading."""
        step = self.blockless_prefill(tokens)
        prefix = self.block_size if cached_prefix else 0
        queries = [min(n, self.max_model_len - prefix) for n in step.query_lens]
        blocks = [-(-(prefix + query) // self.block_size) for query in queries]
        if min(queries) < 1 or sum(blocks) > self.num_blocks:  # no such step can run here
            return
        starts = np.cumsum([0, *blocks])
        tables = [list(range(start, start + count)) for start, count in zip(starts, blocks)]
        contexts = [prefix + q for q in queries]
        step = replace(
            step, token_ids=[0] * sum(queries), query_lens=queries, context_lens=contexts, block_tables=tables
        )
        self.run_prefill(step, lossy_cache=self.config.cache.lossy)

    def profile_memory(self) -> None:
        """A largest-size prefill (without a KV cache) so peak activation memory is known."""
        start = time.perf_counter()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self.run_blockless_prefill(self.config.scheduler.max_num_batched_tokens)
        self.timings["warmup_s"] = time.perf_counter() - start

    def warm_up_prefill_kernels(self) -> None:
        """Prefills at the sizes where kernels bound to a KV cache (the fused q/k norm + RoPE + store tiles by
        token count) or the prefill attention's tiles (small or large) change variant, so no timed step
        compiles one; nothing is stored but with a lossy (fp8) cache, whose prefills read K/V back from it,
        and for prefix-cache hits, whose prefills read their cached prefix (other kernel variants): those run
        through the cache's first blocks. (On an H100, a Mooncake trace's first hit compiled for 1.0 s inside
        a timed prefill step before this: experiments/serving/README.md.)"""
        start = time.perf_counter()
        budget = self.config.scheduler.max_num_batched_tokens
        captured = MAX_STEP_GRAPH_TOKENS if self.uses_graphs and self.backend.captures_mixed_steps else 0
        first_eager = [captured + 1] if 0 < captured < budget else []  # may run small tiles, budget large
        # budget - 1: a size that is no multiple of 16, which Triton would otherwise compile apart for any
        # integer argument that follows the token count; 1: a MoE model's eager steps of a few tokens take
        # the MoE decode path (kernels/triton_moe_decode.py), which the prefills from 16 tokens on do not
        sizes = {1, min(16, budget), min(64, budget), *first_eager, max(budget - 1, 1), budget}
        for tokens in sorted(sizes):
            if tokens <= captured:  # smaller steps run in step graphs, whose capture compiles their kernels
                continue
            if self.config.cache.lossy:
                self.run_prefill_through_cache(tokens)
            else:
                self.run_blockless_prefill(tokens)
            if self.config.cache.enable_prefix_caching:  # a prefix-cache hit's prefill reads the cache
                self.run_prefill_through_cache(tokens, cached_prefix=True)
        self.timings["warmup_s"] = self.timings.get("warmup_s", 0.0) + time.perf_counter() - start

    @torch.inference_mode()
    def warm_up_sampler(self) -> None:
        """Compiles the sampler for 1 row and for 2 (size 1 is specialized), on rank 0 and per TP shard; the
        greedy path's non-finite flag too (the temperature draws below take other paths)."""
        vocab = self.hf_config.vocab_size
        for rows in (1, 2):
            step = StepInput(
                False,
                [0] * rows,
                [1] * rows,
                [1] * rows,
                [[0]] * rows,
                list(range(rows)),
                temperatures=[1.0] * rows,
                top_k=[-1] * rows,
                top_p=[1.0] * rows,
                min_p=[0.0] * rows,
                seeds=[None] * rows,
            )
            _, sampling = prepare_step(step, self.block_size, vocab, self.device)
            assert sampling is not None  # temperature 1: the rows sample
            if self.rank == 0:
                self.sampler(torch.randn(rows, vocab, device=self.device, dtype=self.dtype), sampling)
            if self.rank == 0 or self.shards_sampling:
                values = torch.zeros(rows, device=self.device, dtype=self.dtype)
                flag_non_finite(values, torch.zeros(rows, device=self.device, dtype=torch.int64))
            if self.shards_sampling and self.sampler.can_shard(sampling):
                hidden = torch.zeros(rows, self.hf_config.hidden_size, device=self.device, dtype=self.dtype)
                logits, offset = self.model.compute_local_logits(hidden)
                self.sampler.shard_winners(logits, sampling, offset)

    # ---- steps --------------------------------------------------------------------------------

    @torch.inference_mode()
    def run(self, step: StepInput) -> list[int] | None:
        """Runs one step; rank 0 returns the sampled token per sampling sequence."""
        tokens, _ = self.forward_step(step)
        if tokens is None or self.rank != 0:
            return None
        load = None if self.expert_load is None else self.expert_load.counts.cpu().numpy().astype(np.int64)
        return SampledTokens.of(tokens.tolist(), load)

    @torch.inference_mode()
    def forward_step(
        self, step: StepInput, prev_tokens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, bool]:
        """Enqueues one step's forward pass and sampling: the sampled ids (not waited for) on rank 0, or on
        every rank when drawn shard by shard (the bool). `prev_tokens`: the previous step's samples."""
        phases = self.phase_hooks
        if phases is not None:
            phases.phase_begin("prepare")
        inputs, sampling = self.prepare(step)
        if phases is not None:
            phases.phase_end("prepare")
        if step.prev_sample_rows is not None:
            every_row = all(row >= 0 for row in step.prev_sample_rows)
            assert inputs.prev_sample_rows is not None and prev_tokens is not None
            substitute_tokens(inputs.input_ids, inputs.prev_sample_rows, prev_tokens, every_row)
        if phases is not None:
            phases.phase_begin("forward")
        if self.expert_load is not None:
            self.expert_load.start_step()
        hidden = self.forward_hidden(step, inputs)
        if phases is not None:
            phases.phase_end("forward")
        if sampling is None:
            return torch.empty(0, dtype=torch.int64, device=self.device), True
        if not inputs.all_rows:
            hidden = hidden[inputs.logits_indices]
        with use_compiled(self.graphs is not None):
            if self.shards_sampling and self.sampler.can_shard(sampling):  # each rank draws from its shard
                local, vocab_offset = self.model.compute_local_logits(hidden)
                return exchange_winners(*self.sampler.shard_winners(local, sampling, vocab_offset)), True
            logits = self.model.compute_logits(hidden)
            return (None if logits is None else self.sampler(logits, sampling)), False

    def prepare(self, step: StepInput) -> tuple[ModelInputs, SamplingTensors | None]:
        """Inputs and (if it samples) sampling tensors in one upload, into its graph's buffers if any."""
        fresh = self.fresh_seeds() if step.sample_seq_indices else None
        vocab, graphs = self.hf_config.vocab_size, self.graphs_for(step)
        if graphs is not None:
            return graphs.prepare(step, self.block_size, vocab, fresh)
        return prepare_step(step, self.block_size, vocab, self.device, fresh, self.config.cache.lossy)

    def fresh_seeds(self) -> Callable[[int], np.ndarray] | None:
        """Unseeded rows' seeds: under TP keyed by the step count (the same on every rank, so shard-by-shard
        draws agree), else None (torch's host generator)."""
        if self.tp == 1:
            return None
        serial = self.steps_sampled
        self.steps_sampled += 1
        return lambda n: counter_seeds(self.config.execution.seed, serial, n)

    def forward_hidden(self, step: StepInput, inputs: ModelInputs) -> torch.Tensor:
        """The last layer's hidden states, through a captured graph where the step fits one."""
        graphs = self.graphs_for(step) if inputs.graph_key is not None else None
        if graphs is not None:
            return graphs.replay(inputs)
        with use_compiled(self.uses_graphs):
            return self.model(inputs.input_ids, inputs.positions, inputs.md)

    def forward_logits(self, step: StepInput, inputs: ModelInputs) -> torch.Tensor | None:
        """The logits at inputs.logits_indices (rank 0; None on the others)."""
        return self.model.compute_logits(self.forward_hidden(step, inputs)[inputs.logits_indices])

    @torch.inference_mode()
    def launch(self, step: StepInput) -> None:
        """Enqueues a step without waiting. Inputs marked in `step.prev_sample_rows` come from the previous
        launched step's samples, which every rank holds (drawn shard by shard, or broadcast by rank 0)."""
        tokens, on_every_rank = self.forward_step(step, self.last_sampled)
        if self.tp > 1 and not on_every_rank:
            tokens = self.share_sampled(tokens, len(step.sample_seq_indices))
        self.last_sampled = tokens
        if self.rank == 0:
            assert tokens is not None  # rank 0 always samples
            self.readback.push(tokens, None if self.expert_load is None else self.expert_load.counts)

    def collect(self) -> SampledTokens | None:
        """Rank 0: the sampled ids of the oldest launched step not collected yet."""
        return self.readback.pop() if self.rank == 0 else None

    def discard_launched(self) -> None:
        """Waits for and drops every launched, uncollected step (an abort mid-step)."""
        while self.readback.pending:
            self.readback.pop()
        self.last_sampled = None

    def share_sampled(self, tokens: torch.Tensor | None, count: int) -> torch.Tensor:
        if self.rank != 0:
            tokens = torch.empty(count, dtype=torch.int64, device=self.device)
        assert tokens is not None  # rank 0 sampled them
        if count:
            dist.broadcast(tokens, src=0)
        return tokens

    def stats(self) -> dict:
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return {
            "weights_bytes": weights,
            "kv_cache_bytes": self.kv_cache.nbytes,  # allocated
            "kv_cache_resident_bytes": resident_bytes(self.kv_cache),  # CPU: the touched part; GPU: None
            "kv_cache_dtype": str(self.kv_cache.dtype).removeprefix("torch."),
            **scales_summary(self.model),
            "num_kv_blocks": self.num_blocks,
            "kv_block_size": self.block_size,
            "peak_memory_bytes": peak_memory_bytes(self.device),
            "peak_memory_kind": self.peak_memory_kind,
            "device": self.device.type,
            "dtype": str(self.dtype).removeprefix("torch."),
            "attention_backend": self.backend.name,
            "attention_backend_selection": self.backend.selection,
            "gemm_backend": self.skinny_gemm.describe() if self.skinny_gemm else "torch",
            "swiglu_kernel": self.swiglu_kernel,
            "moe_kernel": self.moe_kernel,
            "expert_load_stats": self.expert_load is not None,
            **self.weight_format(),
            "pdl": pdl.enabled(),
            "cuda_graphs": self.graphs is not None,
            "sampler_kernel": self.sampler.one_pass,
            "sharded_sampling": self.shards_sampling,
            "load_s": 0.0,
            "warmup_s": 0.0,
            "graph_capture_s": 0.0,
            "kv_calibration_s": 0.0,
            **(self.all_reduce.describe() if self.all_reduce else {}),
            **self.timings,
        }

    def close(self) -> None:
        reset_all_reduce()
        if dist.is_initialized():
            dist.destroy_process_group()
