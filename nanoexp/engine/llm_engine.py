"""The control plane: requests in, scheduled steps through the executor, finished outputs out."""

from __future__ import annotations

import gc
import itertools
import operator
import time
import weakref

from nanoexp.config import EngineConfig, SamplingParams
from nanoexp.engine.block_manager import BlockManager
from nanoexp.engine.expert_load import step_expert_load
from nanoexp.engine.outputs import RequestOutput, StepStats
from nanoexp.engine.scheduler import ScheduledBatch, Scheduler
from nanoexp.engine.sequence import PLACEHOLDER, Sequence, Status
from nanoexp.layers.sampler import NON_FINITE
from nanoexp.runner.executor import make_executor
from nanoexp.runner.step_hooks import ENGINE_PHASES, RUNNER_PHASES, PhaseHooks, StepHooks
from nanoexp.runner.step_input import RunnerInfo

PROMPT_KINDS = "a prompt is a str or a sequence of int token ids"
_open_engines: weakref.WeakSet = weakref.WeakSet()  # their start-up objects stay frozen
StepResult = tuple[list[RequestOutput], StepStats]


class LLMEngine:
    def __init__(self, config: EngineConfig, executor=None):
        self.config = config
        self.executor = executor or make_executor(config)
        info: RunnerInfo = self.executor.info
        self.vocab_size = info.vocab_size
        self.max_model_len = info.max_model_len
        self.eos_token_ids = set(info.eos_token_ids)
        self.block_manager = BlockManager(info.num_kv_blocks, config.cache)
        self.scheduler = Scheduler(self.block_manager, config.scheduler, info.max_mixed_step_tokens)
        self.ids = itertools.count()
        self.in_flight: tuple[ScheduledBatch, float] | None = None  # a launched step, when it was scheduled
        self.last_step_end = 0.0  # overlapped steps are timed from the later of this and their start
        self.step_hooks: StepHooks | None = None  # set_hooks
        self.phase_hooks: PhaseHooks | None = None
        self.num_steps = 0  # steps completed, counted from the engine's start: errors name them
        self._closed = False
        # Freezes what start-up built (model, block lists of up to ~1M blocks) so no full garbage collection
        # walks it inside a step (one paused a tiny fp8 step by 41 ms on an H200). close() unfreezes, or the
        # finalizer does when the engine is dropped unclosed (its cycles stay collectable).
        _open_engines.add(self)
        gc.freeze()
        self.unfreeze = weakref.finalize(self, gc.unfreeze)

    @property
    def closed(self) -> bool:
        """Closed by close(), or because its executor stopped itself (a worker died)."""
        return self._closed or self.executor.closed

    def check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the engine is closed")

    def add_request(
        self, prompt_token_ids: list[int], params: SamplingParams, arrival_time: float | None = None
    ) -> int:
        """Queues one request; raises ValueError (and queues nothing) if it can never run."""
        self.check_open()
        seq_id = next(self.ids)
        prompt = self.check_request(f"request {seq_id}", prompt_token_ids, params)
        self.scheduler.add(Sequence(seq_id, prompt, params, arrival_time))
        return seq_id

    def check_request(self, name: str, prompt_token_ids, params: SamplingParams) -> list[int]:
        """The prompt as a list of Python ints, or a one-line error naming the request (`name`)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"{name}: sampling_params must be a SamplingParams")
        prompt = [_token_id(name, t) for t in prompt_token_ids]
        if not prompt:
            raise ValueError(f"{name}: the prompt is empty")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"{name}: token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        never = [t for t in params.stop_token_ids if t >= self.vocab_size]  # >= 0: SamplingParams checks
        if never:
            raise ValueError(
                f"{name}: SamplingParams.stop_token_ids holds {never[0]}, outside the vocabulary "
                f"[0, {self.vocab_size}): it could never be sampled, so never stop the request"
            )
        total = len(prompt) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"{name}: prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) "
                f"= {total} exceeds max_model_len={self.max_model_len}"
            )
        capacity = self.block_manager.num_blocks * self.block_manager.block_size
        if total > capacity:
            raise ValueError(
                f"{name}: prompt + max_tokens = {total} tokens exceeds the whole KV cache "
                f"({capacity} tokens); raise num_kv_blocks, or leave it unset and raise "
                "gpu_memory_utilization (cpu_kv_cache_gib on a CPU)"
            )
        return prompt

    def set_hooks(self, step: StepHooks | None = None, phases: PhaseHooks | None = None) -> tuple[str, ...]:
        """Observers of the step path (a profiler), replacing any set before; None removes one. Returns the
        phases `phases` hears of: ENGINE_PHASES, and RUNNER_PHASES where the runner is in this process."""
        self.step_hooks, self.phase_hooks = step, phases
        runner_reports = self.executor.set_phase_hooks(phases)
        if phases is None:
            return ()
        return ENGINE_PHASES + RUNNER_PHASES if runner_reports else ENGINE_PHASES

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self.in_flight is not None

    def step(self) -> StepResult:
        """With async scheduling, step n+1 is scheduled and enqueued before step n's tokens are read back, so
        the host's bookkeeping overlaps the device's work, under either batching policy. The hooks (set_hooks)
        hear of its begin, its end (in complete) and its ENGINE_PHASES; unset, each costs one None check."""
        if self.step_hooks is not None:
            self.step_hooks.step_begin()
        self.check_open()
        phases = self.phase_hooks
        if self.in_flight is None:
            start = time.perf_counter()
            if phases is not None:
                phases.phase_begin("schedule")
            batch = self.scheduler.schedule()
            if phases is not None:
                phases.phase_end("schedule")
            if not (batch.seqs and self.config.scheduler.async_scheduling):
                step = batch.step_input() if batch.seqs else None
                if phases is not None:
                    phases.phase_begin("launch")
                sampled = self.executor.run(step) if step is not None else []
                if phases is not None:
                    phases.phase_end("launch")
                return self.complete(batch, self.advance(batch, start), sampled, start)
            step = batch.step_input()
            if phases is not None:
                phases.phase_begin("launch")
            self.executor.launch(step)
            if phases is not None:
                phases.phase_end("launch")
            self.in_flight = (batch, start)
        (batch, start), self.in_flight = self.in_flight, None
        samplers = self.advance(batch, start)
        following_start = time.perf_counter()
        following = self.schedule_following(batch)
        if following.seqs:
            rows = {seq.seq_id: row for row, seq in enumerate(samplers) if seq is not None}
            step = following.step_input(rows)
            if phases is not None:
                phases.phase_begin("launch")
            self.executor.launch(step)
            if phases is not None:
                phases.phase_end("launch")
            self.in_flight = (following, following_start)
        if phases is not None:
            phases.phase_begin("collect")
        sampled = self.executor.collect()
        if phases is not None:
            phases.phase_end("collect")
        return self.complete(batch, samplers, sampled, start)

    def schedule_following(self, batch: ScheduledBatch) -> ScheduledBatch:
        """The next step, scheduled while `batch` runs: its sequences that end with this token get none."""
        running = [s for s in batch.seqs if s.status is Status.RUNNING]
        skip = frozenset(s.seq_id for s in running if self.length_reached(s))
        phases = self.phase_hooks
        if phases is not None:
            phases.phase_begin("schedule")
        following = self.scheduler.schedule(skip=skip)
        if phases is not None:
            phases.phase_end("schedule")
        return following

    def advance(self, batch: ScheduledBatch, scheduled_at: float) -> list[Sequence | None]:
        """Counts the batch's computed tokens and gives each sampling sequence a placeholder for
        its new token. Returns the sequence of each sample row (None: finished meanwhile)."""
        if self.phase_hooks is not None:
            self.phase_hooks.phase_begin("bookkeeping")
        samplers: list[Sequence | None] = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            if seq.status is Status.FINISHED:  # ended by a token read after this step was enqueued
                samplers.append(None)
                continue
            seq.num_computed_tokens += n
            seq.first_scheduled_time = seq.first_scheduled_time or scheduled_at
            if seq.num_computed_tokens == len(seq):
                seq.token_ids.append(PLACEHOLDER)
                samplers.append(seq)
        if self.phase_hooks is not None:
            self.phase_hooks.phase_end("bookkeeping")
        return samplers

    def complete(
        self, batch: ScheduledBatch, samplers: list[Sequence | None], sampled: list[int], start: float
    ) -> StepResult:
        """Fills the placeholders with the sampled tokens and finishes what ended; the step's last act."""
        if self.phase_hooks is not None:
            self.phase_hooks.phase_begin("bookkeeping")
        now = time.perf_counter()
        self.num_steps += 1
        for running in batch.seqs:
            if running.status is Status.RUNNING:  # before finishing, so ended requests' blocks are reusable
                self.block_manager.register_full_blocks(running)
        finished = []
        for seq, token in zip(samplers, sampled, strict=True):
            if seq is None:
                continue
            if token == NON_FINITE:
                finished.append(self.fail_non_finite(seq, now))
                continue
            seq.token_ids[-1] = token
            seq.token_times.append(now)
            reason = self.finish_reason(seq)
            if reason:
                seq.finish_reason, seq.finish_time = reason, now
                self.scheduler.finish(seq)
                finished.append(self.output_of(seq))
        elapsed = now - max(start, self.last_step_end)
        self.last_step_end = now
        load = getattr(sampled, "expert_load", None)
        stats = self.step_stats(batch, finished, elapsed, len(sampled), load)
        if self.phase_hooks is not None:
            self.phase_hooks.phase_end("bookkeeping")
        if self.step_hooks is not None:
            self.step_hooks.step_end()
        return finished, stats

    def fail_non_finite(self, seq: Sequence, now: float) -> RequestOutput:
        """Ends a request whose logits held NaN or inf with finish_reason "error", keeping the tokens before;
        its K/V may hold the NaN, so no later prompt reuses its blocks. The other requests go on."""
        seq.token_ids.pop()  # the placeholder: nothing was sampled
        where = f"engine step {self.num_steps}, output token {seq.num_output_tokens + 1}"
        seq.finish_reason, seq.finish_time = "error", now
        seq.error = f"non-finite logits (NaN or inf) at {where}; the model's output is not usable"
        self.block_manager.unpublish(seq)
        self.scheduler.finish(seq)
        return self.output_of(seq)

    def finish_reason(self, seq: Sequence) -> str:
        last = seq.token_ids[-1]
        if last in seq.params.stop_token_ids or (not seq.params.ignore_eos and last in self.eos_token_ids):
            return "stop"
        return "length" if self.length_reached(seq) else ""

    def length_reached(self, seq: Sequence) -> bool:
        return seq.num_output_tokens >= seq.params.max_tokens or len(seq) >= self.max_model_len

    def output_of(self, seq: Sequence) -> RequestOutput:
        return RequestOutput(
            request_id=seq.seq_id,
            prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
            token_ids=seq.token_ids[seq.num_prompt_tokens :],
            finish_reason=seq.finish_reason,
            arrival_time=seq.arrival_time,
            first_scheduled_time=seq.first_scheduled_time,
            first_token_time=seq.token_times[0] if seq.token_times else seq.finish_time,
            token_times=list(seq.token_times),
            finish_time=seq.finish_time,
            num_cached_tokens=seq.num_cached_tokens,
            num_preemptions=seq.num_preemptions,
            error=seq.error,
        )

    def step_stats(self, batch, finished, elapsed, num_sampled, expert_load=None) -> StepStats:
        manager, parallel = self.block_manager, self.config.parallel
        phase = ("mixed" if batch.num_decodes else "prefill") if batch.has_prefill else "decode"
        ep_ranks = parallel.tensor_parallel_size if parallel.expert_parallel else 1
        return StepStats(
            phase=phase,
            num_seqs=len(batch.seqs),
            num_tokens=batch.num_tokens,
            num_decode_tokens=batch.num_decodes,
            num_prefill_tokens=batch.num_tokens - batch.num_decodes,
            num_output_tokens=num_sampled,
            step_time_s=elapsed,
            kv_blocks_used=manager.num_used,
            num_kv_blocks=manager.num_blocks,
            prefix_cache_queries=batch.prefix_cache_queries,
            prefix_cache_hits=batch.prefix_cache_hits,
            num_preemptions=batch.num_preemptions,
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            num_finished=len(finished),
            expert_load=expert_load,
            **step_expert_load(expert_load, ep_ranks),
        )

    def stats(self) -> dict:
        return self.executor.stats()

    def reset_prefix_cache(self) -> None:
        """Empties the prefix cache (as vLLM's reset_prefix_cache); only between requests."""
        if self.has_unfinished():
            raise RuntimeError("reset_prefix_cache needs an idle engine: requests are still running")
        self.block_manager.reset_prefix_cache()

    def reset_for_next_job(self) -> None:
        """Empties the prefix cache and restarts request ids at 0: as fresh, for a sweep's next job."""
        self.reset_prefix_cache()
        self.ids = itertools.count()
        self.last_step_end = 0.0

    def abort_all(self) -> None:
        """Drops every queued, running or in-flight request and their blocks. A launched step's tokens are
        waited for and dropped, so the next step's are its own; if that fails (a dead worker), it closes."""
        self.in_flight = None
        self.scheduler.abort_all()
        if self.closed or not self.config.scheduler.async_scheduling:
            return
        try:
            self.executor.call("discard_launched")
        except Exception:  # noqa: BLE001 - the caller's own error is the one to see; later calls say closed
            self.close()

    def close(self) -> None:
        """Stops the executor; every later add_request or step raises. Closing twice is a no-op."""
        if not self._closed:
            self._closed = True
            _open_engines.discard(self)
            self.unfreeze()  # first: the executor collects the model's reference cycles as it closes
            self.executor.close()
            if _open_engines:  # what the engines still open built, frozen again
                gc.freeze()


def _token_id(name: str, token) -> int:
    """A token id as a Python int: ints and numpy/torch integers pass; bool, float, str are errors."""
    if type(token) is int:
        return token
    try:
        if isinstance(token, bool) or str(getattr(token, "dtype", "")) in ("bool", "torch.bool"):
            raise TypeError
        return operator.index(token)
    except TypeError:
        kind = type(token).__name__
        raise TypeError(f"{name}: token id {token!r} ({kind}) is not an integer; {PROMPT_KINDS}") from None
