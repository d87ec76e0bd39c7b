"""One rank's executor: builds the model, owns its KV cache, runs steps, samples on rank 0."""

from __future__ import annotations

import resource
import time
from collections import deque

import torch
import torch.distributed as dist

from nanoexp.config import EngineConfig
from nanoexp.kernels.select import make_attention_backend, triton_available
from nanoexp.layers.fusion import fused
from nanoexp.layers.sampler import Sampler
from nanoexp.loader import init_dummy, load_hf_config, load_safetensors, resolve_model_dir
from nanoexp.models.registry import model_class
from nanoexp.runner import kv_cache
from nanoexp.runner.cuda_graphs import DecodeGraphs
from nanoexp.runner.inputs import prepare_inputs, prepare_sampling
from nanoexp.runner.pending import PendingStep
from nanoexp.runner.step_input import SamplingRow, StepInput

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def pick_device(choice: str, rank: int) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA device is available; use device=auto or cpu")
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", rank)


def pick_dtype(choice: str, hf_config, device: torch.device) -> torch.dtype:
    if choice != "auto":
        return DTYPES[choice]
    if device.type == "cpu":
        return torch.float32
    native = getattr(hf_config, "torch_dtype", None) or getattr(hf_config, "dtype", None)
    return native if isinstance(native, torch.dtype) else torch.bfloat16


def peak_memory_bytes(device: torch.device) -> int:
    """Peak bytes allocated by torch on a GPU; the process's peak resident set on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def substitute_tokens(input_ids: torch.Tensor, rows: list[int], prev_tokens: torch.Tensor) -> torch.Tensor:
    """input_ids with each row r >= 0 of `rows` taken from prev_tokens[r], on the device."""
    index = torch.tensor(rows, dtype=torch.int64).to(input_ids.device, non_blocking=True)
    return torch.where(index >= 0, prev_tokens[index.clamp(min=0)], input_ids)


class ModelRunner:
    def __init__(self, config: EngineConfig, rank: int = 0, dist_init: str | None = None):
        self.config, self.rank = config, rank
        self.timings: dict[str, float] = {}
        self.device = pick_device(config.execution.device, rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if config.parallel.tensor_parallel_size > 1:
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(
                backend, init_method=dist_init, rank=rank, world_size=config.parallel.tensor_parallel_size
            )
        self.hf_config = load_hf_config(config.model.path, config.model.arch)
        self.dtype = pick_dtype(config.model.dtype, self.hf_config, self.device)
        self.max_model_len = min(config.scheduler.max_model_len, self.hf_config.max_position_embeddings)
        self.model = self.build_model()
        self.backend = make_attention_backend(
            config.execution.attention_backend, self.device, config.cache.block_size
        )
        for layer in kv_cache.attention_layers(self.model):
            layer.backend = self.backend
        self.sampler = Sampler(one_pass=self.uses_sampler_kernel())
        self.last_sampled: torch.Tensor | None = None  # the last launched step's ids, on every rank
        self.pending: deque[PendingStep] = deque()  # launched, not collected (rank 0)
        self.num_blocks = self.setup_kv_cache()
        self.graphs = self.capture_graphs() if self.uses_graphs() else None

    def uses_graphs(self) -> bool:
        return self.device.type == "cuda" and not self.config.scheduler.enforce_eager

    def uses_sampler_kernel(self) -> bool:
        return self.device.type == "cuda" and triton_available()

    def fuses(self, is_prefill: bool) -> bool:
        """Compiled elementwise kernels wherever graphs are used (prefill too: measured faster)."""
        return self.uses_graphs()

    def capture_graphs(self) -> DecodeGraphs:
        start = time.perf_counter()
        block_size = self.config.cache.block_size
        graphs = DecodeGraphs(
            self.model, self.hf_config.hidden_size, self.config.scheduler.max_num_seqs,
            -(-self.max_model_len // block_size), self.dtype, self.device,
        )
        with fused(True):
            graphs.capture()
            if self.rank == 0:  # only rank 0 samples
                self.warm_up_sampler()
        self.timings["graph_capture_s"] = time.perf_counter() - start
        return graphs

    def build_model(self):
        start = time.perf_counter()
        torch.manual_seed(self.config.execution.seed)
        cls = model_class(self.hf_config)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                model = cls(self.hf_config, self.max_model_len).eval()
        finally:
            torch.set_default_dtype(previous)
        if self.config.model.load_format == "dummy":
            init_dummy(model, self.config.execution.seed)
        else:
            load_safetensors(model, resolve_model_dir(self.config.model.path))
        self.timings["load_s"] = time.perf_counter() - start
        return model

    def setup_kv_cache(self) -> int:
        bytes_per_block = kv_cache.block_bytes(self.model, self.config.cache.block_size, self.dtype)
        num_blocks = self.config.cache.num_blocks
        if num_blocks == -1:
            num_blocks = self.blocks_from_memory(bytes_per_block)
        num_blocks = self.agree_on(num_blocks)
        if num_blocks < 1:
            raise ValueError(
                "no memory left for the KV cache: raise gpu_memory_utilization / cpu_kv_cache_gb "
                "or lower max_num_batched_tokens"
            )
        self.kv_cache = kv_cache.allocate_kv_cache(
            self.model, num_blocks, self.config.cache.block_size, self.dtype, self.device
        )
        self.kv_cache_bytes = num_blocks * bytes_per_block
        return num_blocks

    def blocks_from_memory(self, bytes_per_block: int) -> int:
        if self.device.type == "cpu":
            return kv_cache.blocks_for_budget(self.config.cache.cpu_kv_cache_gb * 2**30, bytes_per_block)
        start = time.perf_counter()
        self.warm_up()
        self.timings["warmup_s"] = time.perf_counter() - start
        reserve = 2**30 if self.uses_graphs() else 2**28  # graph pool, logits and sampler buffers
        budget = kv_cache.cuda_kv_budget(self.device, self.config.cache.gpu_memory_utilization, reserve)
        return kv_cache.blocks_for_budget(budget, bytes_per_block)

    def agree_on(self, num_blocks: int) -> int:
        """Every rank must use the same number of blocks: the smallest any rank can afford."""
        if self.config.parallel.tensor_parallel_size == 1:
            return num_blocks
        t = torch.tensor([num_blocks], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    @torch.inference_mode()
    def warm_up(self) -> None:
        """A largest-size prefill (without a KV cache) so peak activation memory is known."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        budget, max_len = self.config.scheduler.max_num_batched_tokens, self.max_model_len
        num_seqs = max(1, min(budget // max_len, self.config.scheduler.max_num_seqs))
        lens = [min(max_len, budget // num_seqs)] * num_seqs
        step = StepInput(
            is_prefill=True, token_ids=[0] * sum(lens), query_lens=lens, context_lens=lens,
            block_tables=[[] for _ in lens], sample_seq_indices=list(range(num_seqs)),
            sampling=[],
        )
        inputs = prepare_inputs(step, self.config.cache.block_size, self.device)
        with fused(self.fuses(is_prefill=True)):
            hidden = self.model(inputs.input_ids, inputs.positions, inputs.md)
        self.model.compute_logits(hidden[inputs.logits_indices])
        torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def warm_up_sampler(self) -> None:
        """Compiles the fused sampler for one row and for many (size 1 is specialized)."""
        vocab = self.hf_config.vocab_size
        for rows in (1, 2):
            step = StepInput(False, [0] * rows, [1] * rows, [1] * rows, [[0]] * rows, list(range(rows)),
                             [SamplingRow(1.0, -1, 1.0, 0.0, None)] * rows)
            logits = torch.randn(rows, vocab, device=self.device, dtype=self.dtype)
            self.sampler(logits, prepare_sampling(step, vocab, self.device))

    @torch.inference_mode()
    def run(self, step: StepInput) -> list[int] | None:
        """Runs one step; rank 0 returns the sampled token per sampling sequence."""
        tokens = self.execute(step)
        return None if tokens is None else tokens.tolist()

    @torch.inference_mode()
    def execute(self, step: StepInput, prev_tokens: torch.Tensor | None = None) -> torch.Tensor | None:
        """Enqueues one step; rank 0 gets the sampled ids as a device tensor (not waited for).
        `prev_tokens` are the previous step's samples, for inputs not known on the host yet."""
        inputs = prepare_inputs(step, self.config.cache.block_size, self.device)
        if step.prev_sample_rows is not None:
            inputs.input_ids = substitute_tokens(inputs.input_ids, step.prev_sample_rows, prev_tokens)
        if self.graphs and not step.is_prefill and step.num_tokens <= self.graphs.max_batch:
            hidden = self.graphs.replay(inputs)
        else:
            with fused(self.fuses(step.is_prefill)):
                hidden = self.model(inputs.input_ids, inputs.positions, inputs.md)
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        if logits is None or not step.sample_seq_indices:
            return None if logits is None else torch.empty(0, dtype=torch.int64, device=self.device)
        sampling = prepare_sampling(step, self.hf_config.vocab_size, self.device)
        with fused(self.graphs is not None):
            return self.sampler(logits, sampling)

    @torch.inference_mode()
    def launch(self, step: StepInput) -> None:
        """Enqueues a step without waiting for it. Inputs marked in `step.prev_sample_rows` come from
        the previous launched step's samples, which every rank holds (rank 0 broadcasts them)."""
        tokens = self.execute(step, self.last_sampled)
        if self.config.parallel.tensor_parallel_size > 1:
            tokens = self.share_sampled(tokens, len(step.sample_seq_indices))
        self.last_sampled = tokens
        if self.rank == 0:
            self.pending.append(PendingStep(tokens))

    def collect(self) -> list[int] | None:
        """Rank 0: the sampled ids of the oldest launched step not collected yet."""
        return self.pending.popleft().result() if self.rank == 0 else None

    def share_sampled(self, tokens: torch.Tensor | None, count: int) -> torch.Tensor:
        if self.rank != 0:
            tokens = torch.empty(count, dtype=torch.int64, device=self.device)
        if count:
            dist.broadcast(tokens, src=0)
        return tokens

    @torch.inference_mode()
    def prefill_logits(self, step: StepInput) -> torch.Tensor | None:
        """Logits of every new token of a prefill step (for correctness tests)."""
        inputs = prepare_inputs(step, self.config.cache.block_size, self.device)
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.md)
        return self.model.compute_logits(hidden)

    def stats(self) -> dict:
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        peak = peak_memory_bytes(self.device)
        return {
            "weights_bytes": weights,
            "kv_cache_bytes": self.kv_cache_bytes,
            "num_kv_blocks": self.num_blocks,
            "kv_block_size": self.config.cache.block_size,
            "peak_memory_bytes": peak,
            "device": self.device.type,
            "dtype": str(self.dtype).removeprefix("torch."),
            "attention_backend": self.backend.name,
            "cuda_graphs": self.graphs is not None,
            "sampler_kernel": self.sampler.one_pass,
            "load_s": 0.0, "warmup_s": 0.0, "graph_capture_s": 0.0,
            **self.timings,
        }

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
