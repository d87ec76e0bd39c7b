"""Multi-turn sessions: turn k's prompt is turn k-1's prompt and answer plus a new message, token for token;
a turn arrives after the previous answer plus its think time; per-turn metrics."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from nanoexp.config import SamplingParams
from nanoexp.engine.outputs import RequestOutput
from nanoexp.experiment.job import build, engine_factory
from nanoexp.experiment.measure.driver import EngineDriver, RunRecord
from nanoexp.experiment.measure.sessions import Conversations, multi_turn_workload, turn_metrics
from nanoexp.experiment.schema import WorkloadConfig, WorkloadKind, to_spec

CONF = Path(__file__).resolve().parents[2] / "conf"
PARAMS = lambda m, i: SamplingParams(max_tokens=m, ignore_eos=True, temperature=0.0)


def sessions(**knobs) -> WorkloadConfig:
    base = dict(num_sessions=3, num_turns=3, input_len=12, output_len=6, range_ratio=0.5, think_time_s=0.2)
    return WorkloadConfig(
        name="multi_turn", kind=WorkloadKind.multi_turn, request_rate=10.0, **(base | knobs)
    )


def output(request_id: int, prompt: list[int], tokens: list[int], finish: float) -> RequestOutput:
    return RequestOutput(request_id, prompt, tokens, "length", 0.0, 0.0, 0.1, [0.1], finish, 0, 0)


def test_follow_up_is_the_conversation_so_far_plus_a_new_message_after_the_think_time() -> None:
    talks = Conversations(sessions(prefix_len=5), PARAMS, 1024)
    first = talks.request(1, 1, list(talks.prefix), 0.5)
    assert first.prompt_token_ids == talks.prefix + talks.messages[1][0] and first.turn == 1
    second = talks.follow_up(first, output(0, first.prompt_token_ids, [7, 8, 9], 0.0), finished_s=2.0)
    assert second.prompt_token_ids == first.prompt_token_ids + [7, 8, 9] + talks.messages[1][1]
    assert second.arrival_offset_s == pytest.approx(2.0 + talks.think_s[1][0])
    assert (second.session, second.turn) == (1, 2)
    assert second.sampling_params.max_tokens == talks.out_lens[1][1]
    third = talks.follow_up(second, output(1, second.prompt_token_ids, [1], 0.0), finished_s=3.0)
    assert talks.follow_up(third, output(2, third.prompt_token_ids, [1], 0.0), finished_s=4.0) is None


def test_workload_holds_first_turns_and_counts_every_turn() -> None:
    workload = multi_turn_workload(sessions(), PARAMS, 1024)
    assert [r.turn for r in workload.requests] == [1, 1, 1] and workload.num_requests == 9
    assert workload.longest == 3 * (18 + 9)  # every turn at its longest message and answer
    assert not Conversations(sessions(think_time_s=0.0), PARAMS, 64).think_s.any()


class EchoEngine:
    """Answers each request with two tokens (its length, 1) one step after it arrives."""

    def __init__(self):
        self.queue, self.ids, self.added = [], 0, []

    def add_request(self, prompt, params, arrival_time=None) -> int:
        self.ids += 1
        self.queue.append((self.ids, list(prompt), arrival_time))
        self.added.append((time.perf_counter(), arrival_time))
        return self.ids

    def has_unfinished(self) -> bool:
        return bool(self.queue)

    def step(self):
        time.sleep(0.002)
        rid, prompt, arrival = self.queue.pop(0)
        now = time.perf_counter()
        return [
            RequestOutput(rid, prompt, [len(prompt) % 50, 1], "length", arrival, now, now, [now], now, 0, 0)
        ], None


def test_the_driver_submits_a_turn_only_after_the_answer_and_its_think_time() -> None:
    workload = multi_turn_workload(sessions(think_time_s=0.05), PARAMS, 1024)
    driver, t0 = EngineDriver(EchoEngine()), time.perf_counter()
    outputs = driver.drive(workload.requests, t0, lambda s: None, follow_up=workload.follow_up)
    assert len(outputs) == 9
    by_id = {o.request_id: o for o in outputs}
    for rid, request in driver.submitted.items():
        if request.turn > 1:
            before = next(
                o
                for i, o in by_id.items()
                if driver.submitted[i].session == request.session
                and driver.submitted[i].turn == request.turn - 1
            )
            assert (
                request.prompt_token_ids[: len(before.prompt_token_ids) + 2]
                == before.prompt_token_ids + before.token_ids
            )
            assert t0 + request.arrival_offset_s >= before.finish_time
            assert by_id[rid].arrival_time == pytest.approx(t0 + request.arrival_offset_s)


def test_a_real_engine_conversation_holds_each_turn_token_for_token() -> None:
    overrides = ["model=qwen3_tiny", "cache.cpu_kv_cache_gib=0.05", "cache.block_size=16", "logger=none"]
    overrides += [
        "workload=multi_turn",
        "workload.num_sessions=2",
        "workload.num_turns=3",
        "workload.input_len=20",
    ]
    overrides += [
        "workload.output_len=8",
        "workload.think_time_s=0.01",
        "workload.request_rate=50",
        "sampler=greedy",
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        spec = to_spec(compose("config", overrides=overrides))
    checkpoint = build.resolve_checkpoint(spec.model)
    workload = build.build_workload(spec)
    llm, driver = engine_factory.build_llm(spec, engine_factory.engine_config(spec, checkpoint), checkpoint)
    try:
        t0 = time.perf_counter()
        outputs = driver.drive(workload.requests, t0, lambda s: None, follow_up=workload.follow_up)
    finally:
        llm.close()
    turns = {
        (driver.submitted[o.request_id].session, driver.submitted[o.request_id].turn): o for o in outputs
    }
    assert sorted(turns) == [(s, t) for s in range(2) for t in (1, 2, 3)]
    for (session, turn), out in turns.items():
        if turn > 1:
            before = turns[session, turn - 1]
            history = before.prompt_token_ids + before.token_ids
            assert out.prompt_token_ids[: len(history)] == history
            assert len(out.prompt_token_ids) > len(history)  # and a new message
            computed = len(history) - 1  # the answer's last token was sampled, never run through the model
            assert out.num_cached_tokens == computed // 16 * 16
    record = RunRecord(outputs=outputs, requests=driver.submitted)
    metrics = turn_metrics([record])
    assert metrics["turn1_prefix_hit_rate"] == 0 and metrics["turn3_prefix_hit_rate"] > 0.5
    assert {f"turn{k}_mean_ttft_ms" for k in (1, 2, 3)} <= set(metrics)
