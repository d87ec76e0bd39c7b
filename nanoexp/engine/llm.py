"""The offline API: `LLM(model, **kwargs).generate(prompts, sampling_params)`."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Sequence as Seq
from contextlib import AbstractContextManager, contextmanager

from tqdm.auto import tqdm

from nanoexp import loader
from nanoexp.config import EngineConfig, KnobError, SamplingParams
from nanoexp.config.engine import as_keyword
from nanoexp.engine import kv_quality, weight_quality
from nanoexp.engine.llm_engine import PROMPT_KINDS, LLMEngine
from nanoexp.engine.outputs import RequestOutput

log = logging.getLogger(__name__)


class EngineBusyError(RuntimeError):
    """A call that needs the engine to itself while another caller is using it."""


def check_use_tqdm(value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"use_tqdm={value!r}: must be True or False")
    return value


class LLM(AbstractContextManager):
    def __init__(self, model: str, use_tqdm: bool = True, **kwargs):
        """vLLM's edge: a checkpoint and flat keywords (`kv_block_size=16`, ...); generate's use_tqdm."""
        self._start(EngineConfig.from_kwargs(model, **kwargs), use_tqdm)

    @classmethod
    def from_config(cls, config: EngineConfig, use_tqdm: bool = True) -> LLM:
        """An engine from a config already built (and checked), e.g. by the experiment layer."""
        llm = cls.__new__(cls)
        llm._start(config, use_tqdm)
        return llm

    def _start(self, config: EngineConfig, use_tqdm: bool) -> None:
        self.use_tqdm = check_use_tqdm(use_tqdm)
        model = config.model.path  # set unless the config gives `arch` (ModelConfig's check)
        if model is not None and config.model.arch is None and not os.path.isdir(model) and "/" not in model:
            raise FileNotFoundError(f"model={model!r}: no such checkpoint directory")
        self.lock = threading.Lock()  # one caller at a time, as vLLM's LLM
        try:
            self.engine = LLMEngine(config)
        except KnobError as e:  # a limit found while starting (the model's length, the memory): a keyword
            raise as_keyword(e) from None
        self.tokenizer = (
            loader.load_tokenizer(model) if model is not None and config.model.arch is None else None
        )

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(
        self,
        prompts: Seq[str] | Seq[list[int]] | str,
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool | None = None,
    ) -> list[RequestOutput]:
        """Runs all prompts to completion; outputs in prompt order. The engine must be idle (requests queued
        with `engine.add_request` would lose their outputs); `use_tqdm` None: the constructor's."""
        with self.alone("generate"):
            self.engine.check_open()
            pending = self.engine.scheduler.num_waiting + self.engine.scheduler.num_running
            if pending or self.engine.has_unfinished():
                raise EngineBusyError(
                    f"generate: {pending} request(s) queued with engine.add_request are still unfinished; "
                    "step them to completion (engine.step()) or drop them (engine.abort_all()) first"
                )
            use_tqdm = self.use_tqdm if use_tqdm is None else check_use_tqdm(use_tqdm)
            prompts = as_prompt_list(prompts)
            params = sampling_params or SamplingParams()
            params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
            if len(params) != len(prompts):
                raise ValueError(
                    f"got {len(params)} sampling_params for {len(prompts)} prompts; "
                    "give one or one per prompt"
                )
            token_lists = [self.prompt_tokens(i, p) for i, p in enumerate(prompts)]
            for i, (tokens, sp) in enumerate(zip(token_lists, params)):
                self.engine.check_request(f"prompt {i}", tokens, sp)  # all checked before any is queued
            try:
                ids = [self.engine.add_request(tokens, sp) for tokens, sp in zip(token_lists, params)]
                outputs = self.run_to_completion(use_tqdm, len(ids))
            except BaseException:
                self.engine.abort_all()
                raise
            if self.tokenizer is not None:
                for i in ids:
                    outputs[i].text = self.tokenizer.decode(outputs[i].token_ids)
            for index, i in enumerate(ids):
                if outputs[i].finish_reason == "error":
                    log.warning("prompt %d: %s", index, outputs[i].error)
            return [outputs[i] for i in ids]

    @contextmanager
    def alone(self, what: str) -> Iterator[None]:
        """A second thread calling in gets EngineBusyError at once instead of corrupting the first's batch."""
        if not self.lock.acquire(blocking=False):
            raise EngineBusyError(
                f"{what}: the engine is busy with another call (LLM serves one caller at a time; "
                "use one LLM per thread, or wait for the other call to return)"
            )
        try:
            yield
        finally:
            self.lock.release()

    def prompt_tokens(self, index: int, prompt: str | Seq[int]) -> list[int]:
        """A text prompt's token ids (via the tokenizer), or token ids (list, tuple, 1-D array) as a list;
        errors name the prompt's index."""
        name = f"prompt {index}"
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"{name}: text prompts need a tokenizer in the checkpoint; pass token ids")
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, Mapping | bytes | bytearray) or not isinstance(prompt, Iterable):
            text = repr(prompt)
            short = text if len(text) <= 40 else text[:37] + "..."
            raise TypeError(f"{name}: got {type(prompt).__name__} {short}; {PROMPT_KINDS}")
        ndim = getattr(prompt, "ndim", 1)
        if ndim != 1:
            raise TypeError(f"{name}: got a {ndim}-D array; {PROMPT_KINDS}")
        return list(prompt)

    def run_to_completion(self, use_tqdm: bool, total: int) -> dict[int, RequestOutput]:
        outputs: dict[int, RequestOutput] = {}
        rates = {"prefill": 0.0, "decode": 0.0}
        with tqdm(total=total, desc="Generating", dynamic_ncols=True, disable=not use_tqdm) as bar:
            while self.engine.has_unfinished():
                finished, stats = self.engine.step()
                phase = "prefill" if stats.phase == "prefill" else "decode"
                rates[phase] = stats.num_tokens / max(stats.step_time_s, 1e-9)
                bar.set_postfix({k: f"{v:.0f}tok/s" for k, v in rates.items()})
                for out in finished:
                    outputs[out.request_id] = out
                bar.update(len(finished))
        return outputs

    def kv_cache_quality(self, prompts: Seq[str] | Seq[list[int]], num_tokens: int = 32) -> dict:
        """The KV cache's accuracy cost on these prompts, on an idle engine (engine/kv_quality.py)."""
        with self.alone("kv_cache_quality"):
            token_lists = [self.prompt_tokens(i, p) for i, p in enumerate(as_prompt_list(prompts))]
            return kv_quality.measure(self.engine, token_lists, num_tokens)

    def greedy_log_probs(self, prompts: Seq[str] | Seq[list[int]], num_tokens: int = 32):
        """(each prompt's greedy continuation, the float32 log-probs [requests, num_tokens, vocab] of the
        decode steps that chose it), on an idle engine; with `prefill_log_probs` of another engine (e.g.
        bf16 weights against fp8), `weight_quality.compare` scores one model against another."""
        with self.alone("greedy_log_probs"):
            token_lists = [self.prompt_tokens(i, p) for i, p in enumerate(as_prompt_list(prompts))]
            return weight_quality.greedy_log_probs(self.engine, token_lists, num_tokens)

    def prefill_log_probs(self, prompts: Seq[str] | Seq[list[int]], continuations: Seq[list[int]]):
        """Log-probs [requests, positions, vocab] of each continuation token, from one plain prefill."""
        with self.alone("prefill_log_probs"):
            token_lists = [self.prompt_tokens(i, p) for i, p in enumerate(as_prompt_list(prompts))]
            return weight_quality.prefill_log_probs(
                self.engine, token_lists, [list(c) for c in continuations]
            )

    def stats(self) -> dict:
        return self.engine.stats()

    @property
    def closed(self) -> bool:
        return self.engine.closed

    def close(self) -> None:
        """Stops the engine and its workers; later calls raise "the engine is closed". Idempotent."""
        self.engine.close()


def as_prompt_list(prompts) -> list:
    """One str, or a sequence of prompts (not a dict or a set, whose order would be guessed), as a list."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, Mapping | set | frozenset | bytes) or not isinstance(prompts, Iterable):
        kind = type(prompts).__name__
        raise TypeError(f"prompts: got {kind}; pass a str or a list of prompts ({PROMPT_KINDS})")
    return list(prompts)
