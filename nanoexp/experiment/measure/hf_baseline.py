"""The transformers baseline: the same requests through `model.generate`, timed as our engine's."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import AutoConfig, AutoModelForCausalLM

from nanoexp.config.checkpoint_files import CheckpointError
from nanoexp.engine.outputs import RequestOutput, StepStats
from nanoexp.experiment.measure.driver import OnStep, sleep_until
from nanoexp.experiment.measure.workloads import Request
from nanoexp.loader import finite_probe
from nanoexp.runner.model_setup import pick_device, pick_dtype
from nanoexp.runner.peak_memory import peak_memory_bytes, reset_peak_memory


class HFBaseline:
    def __init__(self, arch: dict, path: str | None, dtype: str, device: str, seed: int, max_batch: int):
        """The model from the checkpoint at `path`, or with random weights from `arch`."""
        self.device = pick_device(device, 0)
        config = AutoConfig.from_pretrained(path) if path else AutoConfig.for_model(**arch)
        self.dtype = pick_dtype(dtype, config, self.device)  # auto: as the engine picks it
        eos = config.eos_token_id  # the checkpoint's when there is one
        self.max_batch, self.eos = max_batch, int(eos[0] if isinstance(eos, list) else eos)
        self.load_format = "safetensors" if path else "dummy"
        self.peak_memory_kind = reset_peak_memory(self.device)
        torch.manual_seed(seed)
        start = time.perf_counter()
        options = dict(config=config, dtype=self.dtype, attn_implementation="sdpa")
        if path:
            model = AutoModelForCausalLM.from_pretrained(path, **options)
        else:  # random weights made where they run (a 30B model's init on the CPU takes minutes)
            with torch.device(self.device):
                model = AutoModelForCausalLM.from_config(**options)
        # transformers types its decorated to() as an unbound function
        self.model = model.to(self.device).eval()  # type: ignore[arg-type]
        if path:
            check_finite(self.model, path)
        self.load_s = time.perf_counter() - start

    def reset_prefix_cache(self) -> None: ...  # generate keeps no cache between calls

    def drive(self, requests: Sequence[Request], t0: float, on_step: OnStep) -> list[RequestOutput]:
        outputs, pending = [], list(enumerate(requests))  # (index in `requests`: the output's id, request)
        while pending:
            sleep_until(t0 + pending[0][1].arrival_offset_s)
            now = time.perf_counter() - t0
            arrived = [(i, r) for i, r in pending[: self.max_batch] if r.arrival_offset_s <= now]
            pending = pending[len(arrived) :]
            outputs += self._run_batch(arrived, t0, on_step)
        return outputs

    @torch.inference_mode()
    def _run_batch(
        self, numbered: list[tuple[int, Request]], t0: float, on_step: OnStep
    ) -> list[RequestOutput]:
        batch = [r for _, r in numbered]
        ids, mask = _left_pad(batch, pad_id=self.eos)
        times: list[float] = []

        def clock(input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:  # never stops; times each token
            times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        start = time.perf_counter()
        generated = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            stopping_criteria=[clock],
            pad_token_id=self.eos,
            eos_token_id=self.eos,
            **_generate_kwargs(batch),
        )[:, ids.shape[1] :].cpu()
        outs = [self._output(n, r, generated[i].tolist(), times, t0) for i, (n, r) in enumerate(numbered)]
        for stats in _step_stats(batch, outs, ids.numel(), start, times):
            on_step(stats)
        return outs

    def _output(self, index: int, r: Request, row: list[int], times: list[float], t0: float) -> RequestOutput:
        tokens = row[: r.sampling_params.max_tokens]
        if not r.sampling_params.ignore_eos and self.eos in tokens:
            tokens = tokens[: tokens.index(self.eos) + 1]
        return RequestOutput(
            request_id=index,
            prompt_token_ids=list(r.prompt_token_ids),
            token_ids=tokens,
            finish_reason="length" if len(tokens) == r.sampling_params.max_tokens else "stop",
            arrival_time=t0 + r.arrival_offset_s,
            first_scheduled_time=times[0],
            first_token_time=times[0],
            token_times=times[: len(tokens)],
            finish_time=times[len(tokens) - 1],
            num_cached_tokens=0,
            num_preemptions=0,
        )

    def stats(self) -> dict:
        return {
            "weights_bytes": sum(p.numel() * p.element_size() for p in self.model.parameters()),
            **dict.fromkeys(("kv_cache_bytes", "num_kv_blocks", "kv_block_size"), 0),  # grown per batch
            "peak_memory_bytes": peak_memory_bytes(self.device),
            "peak_memory_kind": self.peak_memory_kind,
            "load_s": self.load_s,
            **dict.fromkeys(("warmup_s", "graph_capture_s"), 0.0),
            "device": self.device.type,
            "dtype": str(self.dtype).removeprefix("torch."),
            "attention_backend": "sdpa",
            "load_format": self.load_format,
        }

    def close(self) -> None:
        self.model = None


def check_finite(model: torch.nn.Module, path: str) -> None:
    """The baseline's weights checked as the engine's loader checks ours (transformers loads NaN as is):
    one probe per parameter, one host sync; an error names the first non-finite tensor."""
    params = [(name, p) for name, p in model.named_parameters() if p.is_floating_point()]
    finite = torch.stack([finite_probe(p.detach()) for _, p in params]).isfinite().tolist()
    bad = [name for (name, _), ok in zip(params, finite) if not ok]
    if bad:
        more = f" ({len(bad) - 1} more tensor(s) too)" if len(bad) > 1 else ""
        raise CheckpointError(
            f"checkpoint tensor {bad[0]} in {path} holds NaN or inf values as transformers loaded it{more}; "
            "the checkpoint is corrupt or was converted wrongly"
        )


def _step_stats(batch, outs, prefill_tokens: int, start: float, times: list[float]) -> list[StepStats]:
    return [
        StepStats(
            phase="prefill" if i == 0 else "decode",
            num_seqs=len(batch),
            num_tokens=prefill_tokens if i == 0 else len(batch),
            num_prefill_tokens=prefill_tokens if i == 0 else 0,
            num_decode_tokens=0 if i == 0 else len(batch),
            num_output_tokens=sum(len(o.token_ids) > i for o in outs),
            step_time_s=t - prev,
            kv_blocks_used=0,
            num_kv_blocks=0,
            num_preemptions=0,
            prefix_cache_queries=0,
            prefix_cache_hits=0,
            num_running=len(batch),
            num_waiting=0,
            num_finished=sum(len(o.token_ids) == i + 1 for o in outs),
        )
        for i, (prev, t) in enumerate(zip([start, *times], times))
    ]


def _generate_kwargs(batch: list[Request]) -> dict:
    sp = batch[0].sampling_params  # a workload shares one sampler
    max_new = max(r.sampling_params.max_tokens for r in batch)
    kwargs = {"max_new_tokens": max_new, "do_sample": not sp.greedy, "num_beams": 1}
    if any(r.sampling_params.ignore_eos for r in batch):
        kwargs["min_new_tokens"] = max_new
    if sp.greedy:
        return kwargs | dict.fromkeys(("temperature", "top_p", "top_k"), None)
    sampled = {"temperature": sp.temperature, "top_p": sp.top_p, "top_k": max(sp.top_k, 0)}
    return kwargs | sampled | {"min_p": sp.min_p or None}


def _left_pad(batch: list[Request], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    prompts = [torch.tensor(r.prompt_token_ids, dtype=torch.long) for r in batch]
    ids = pad_sequence(prompts, batch_first=True, padding_value=pad_id, padding_side="left")
    return ids, pad_sequence([torch.ones_like(p) for p in prompts], batch_first=True, padding_side="left")
