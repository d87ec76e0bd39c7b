"""The KV-cache quality probe on a tiny random Qwen3: an exact cache agrees with the plain prefill
everywhere, a lossy one is caught, at TP=1 and TP=2; a job probes only a lossy cache by default."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from checkpoints import build_checkpoint, random_prompts
from helpers import ROOT, compose_cfg, job_env

from nanoexp.config import SamplingParams
from nanoexp.engine.kv_quality import kl_divergence, probe_groups
from nanoexp.engine.llm import LLM
from nanoexp.experiment.measure import kv_quality
from nanoexp.experiment.measure.kv_quality import measure_kv_quality
from nanoexp.experiment.measure.workloads import Request, Workload
from nanoexp.experiment.report.sweep_report import write_report
from nanoexp.experiment.schema import ConfigError, KvQualityConfig, to_spec

ENGINE = dict(
    device="cpu",
    dtype="float32",
    attention_backend="torch",
    kv_block_size=4,
    num_kv_blocks=48,
    max_num_seqs=4,
    max_num_batched_tokens=96,
    max_model_len=96,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """A tiny random checkpoint (the name: what the probe runs on; random weights serve it too)."""
    out = tmp_path_factory.mktemp("kv_tiny")
    build_checkpoint(out, "qwen3", 4, 2, 32, 64, True, vocab=260, seed=3)
    return str(out)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    encoded = random_prompts([6, 9, 3, 8], vocab=256, seed=5)
    return [*encoded, [encoded[0][0]]]  # a one-token prompt too: nothing to prefill into the cache


def test_exact_cache_agrees_with_the_plain_prefill(tiny, prompts):
    with LLM(tiny, **ENGINE) as llm:
        before = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
        result = llm.kv_cache_quality(prompts, 8)
        manager = llm.engine.block_manager
        assert manager.num_used == 0 and not manager.hash_to_block  # no leak, prefix cache left empty
        after = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    assert [o.token_ids for o in after] == [o.token_ids for o in before]
    assert result["num_requests"] == len(prompts) and result["num_positions"] == 8 * len(prompts)
    assert result["greedy_agreement"] == 1.0
    assert abs(result["kl_mean"]) < 1e-6 and result["kl_max"] < 1e-5


def test_fp8_cache_is_detected(tiny, prompts):
    with LLM(tiny, **ENGINE) as llm:
        exact = llm.kv_cache_quality(prompts, 8)
    with LLM(tiny, kv_cache_dtype="fp8_e4m3", **ENGINE) as llm:
        lossy = llm.kv_cache_quality(prompts, 8)
        assert llm.engine.block_manager.num_used == 0
    assert lossy["kl_mean"] > 5 * max(exact["kl_max"], 1e-8), (exact, lossy)
    assert lossy["kl_max"] >= lossy["kl_p99"] >= lossy["kl_mean"] > 0


@pytest.mark.slow  # tensor-parallel worker processes
def test_tp2_matches_tp1(tiny, prompts):
    with LLM(tiny, **ENGINE) as llm:
        tp1 = llm.kv_cache_quality(prompts, 6)
    with LLM(tiny, tensor_parallel_size=2, **ENGINE) as llm:
        tp2 = llm.kv_cache_quality(prompts, 6)
        assert llm.engine.block_manager.num_used == 0
    assert tp2["greedy_agreement"] == tp1["greedy_agreement"] == 1.0
    assert tp2["num_positions"] == tp1["num_positions"]
    assert abs(tp2["kl_mean"]) < 1e-6 and tp2["kl_max"] < 1e-5


def test_groups_fit_the_step_budget_and_the_cache():
    # prompt + 4 tokens: 14, 14, 24, 6 tokens in 4, 4, 6, 2 blocks of 4 (13, 13, 23, 5 cached tokens)
    assert probe_groups([10, 10, 20, 2], 4, 30, 4, 4, 100) == [[0, 1], [2, 3]]  # 30 tokens a step
    assert probe_groups([10, 10, 20, 2], 4, 30, 4, 4, 7) == [[0], [1], [2], [3]]  # and 7 blocks
    assert probe_groups([2, 2, 2], 4, 100, 2, 4, 100) == [[0, 1], [2]]
    # and the reference log-probs a group holds stay bounded (MAX_REFERENCE_ROWS rows)
    assert [len(g) for g in probe_groups([2] * 20, 32, 10**6, 256, 4, 10**6)] == [16, 4]
    assert [len(g) for g in probe_groups([2] * 6, 32, 10**6, 4, 4, 10**6)] == [4, 2]
    assert probe_groups([2, 2], 1000, 10**6, 8, 4, 10**6) == [[0], [1]]


def test_requests_split_into_groups_give_the_same_result(tiny, prompts):
    with LLM(tiny, **ENGINE) as llm:
        together = llm.kv_cache_quality(prompts, 4)
    with LLM(tiny, **{**ENGINE, "max_num_seqs": 1}) as llm:
        one_by_one = llm.kv_cache_quality(prompts, 4)
    assert one_by_one["num_positions"] == together["num_positions"]
    assert one_by_one["greedy_agreement"] == together["greedy_agreement"]


@pytest.mark.parametrize(
    "prompts,num_tokens,message",
    [
        ([[1, 2]], 0, "kv_cache_quality: num_tokens=0 is invalid: must be an int >= 1"),
        ([], 4, "kv_cache_quality: no prompts given"),
        ([[1, 2], []], 4, "kv_cache_quality prompt 1: the prompt is empty"),
        (
            [[1] * 90],
            8,
            "kv_cache_quality prompt 0: prompt (90 tokens) + max_tokens (8) = 98 exceeds max_model_len=96",
        ),
    ],
)
def test_bad_probe_input_is_one_clear_error(tiny, prompts, num_tokens, message):
    with LLM(tiny, **ENGINE) as llm:
        with pytest.raises((ValueError, TypeError)) as err:
            llm.kv_cache_quality(prompts, num_tokens)
        assert str(err.value) == message
        assert llm.engine.block_manager.num_used == 0


def test_prompt_beyond_the_step_budget_is_named(tiny):
    with LLM(tiny, **{**ENGINE, "max_num_batched_tokens": 48, "enable_chunked_prefill": True}) as llm:
        with pytest.raises(
            ValueError,
            match=r"prompt 0: prompt \(44 tokens\) \+ num_tokens \(8\) exceeds "
            r"max_num_batched_tokens=48",
        ):
            llm.kv_cache_quality([[3] * 44], 8)


def test_probe_needs_an_idle_engine(tiny, prompts):
    with LLM(tiny, **ENGINE) as llm:
        llm.engine.add_request(prompts[0], SamplingParams(max_tokens=4))
        with pytest.raises(RuntimeError, match="needs an idle engine"):
            llm.kv_cache_quality(prompts, 4)


def run_job(tmp_path, *overrides: str) -> tuple[dict, str]:
    env = job_env(tmp_path / "home")
    cmd = [
        sys.executable,
        "run.py",
        f"hydra.run.dir={tmp_path / 'job'}",
        "model=qwen3_tiny",
        "logger=none",
        "cache.cpu_kv_cache_gib=0.05",
        "workload.num_requests=4",
        "workload.input_len=24",
        "workload.output_len=4",
        "scheduler.max_model_len=64",
        "metrics.kv_quality.num_requests=3",
        "metrics.kv_quality.num_tokens=6",
        *overrides,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / "job" / "results.json").read_text())["summary"], proc.stdout


@pytest.mark.slow
def test_job_probes_a_lossy_cache(tmp_path):
    summary, stdout = run_job(tmp_path, "cache.kv_cache_dtype=fp8_e4m3")
    assert 0 <= summary["kv_quality/greedy_agreement"] <= 1 and summary["kv_quality/kl_mean"] > 0
    assert summary["kv_quality/num_positions"] == 18 and summary["kv_quality/num_cut_prompts"] == 0
    assert summary["kv_quality_s"] > 0 and summary["kv_cache_dtype"] == "fp8_e4m3"
    assert "KV cache greedy agreement" in stdout


@pytest.mark.slow
def test_job_probes_an_exact_cache_only_when_asked(tmp_path):
    assert not kv_quality.wanted(to_spec(compose_cfg("model=qwen3_tiny")))
    assert kv_quality.wanted(to_spec(compose_cfg("model=qwen3_tiny", "cache.kv_cache_dtype=fp8")))
    assert not kv_quality.wanted(to_spec(compose_cfg("metrics.kv_quality.lossless=true", "engine=hf")))
    summary, stdout = run_job(tmp_path, "metrics.kv_quality.lossless=true")
    assert summary["kv_quality/greedy_agreement"] == 1.0 and abs(summary["kv_quality/kl_mean"]) < 1e-6
    assert summary["kv_cache_dtype"] == "auto"
    assert "KV cache greedy agreement     100.00%" in stdout


def test_sweep_report_lists_kv_quality(tmp_path):
    for num, quality in ((0, {}), (1, {"kv_quality/greedy_agreement": 0.97, "kv_quality/kl_mean": 0.002})):
        job = tmp_path / str(num)
        job.mkdir()
        overrides = [f"cache.block_size={16 * (num + 1)}"]
        results = {
            "status": "ok",
            "job": {"job_num": num, "overrides": overrides},
            "summary": {"output_throughput": 10.0, **quality},
        }
        (job / "results.json").write_text(json.dumps(results))
    write_report(tmp_path)
    with (tmp_path / "sweep_summary.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [row["kv_quality/greedy_agreement"] for row in table] == ["", "0.97"]
    markdown = (tmp_path / "sweep_summary.md").read_text()
    assert "| kv_quality/greedy_agreement | kv_quality/kl_mean (nats) |" in markdown


def test_long_prompts_are_cut_to_the_probe_limit(tiny):
    with LLM(tiny, **ENGINE) as llm:
        workload = Workload("w", [Request([7] * 95, SamplingParams()), Request([3, 4], SamplingParams())])
        metrics = measure_kv_quality(llm, workload, KvQualityConfig(num_requests=8, num_tokens=6))
        assert metrics["kv_quality/num_cut_prompts"] == 1 and metrics["kv_quality/num_requests"] == 2
        with pytest.raises(ConfigError, match=r"metrics.kv_quality.num_tokens=96 is invalid: must leave"):
            measure_kv_quality(llm, workload, KvQualityConfig(num_requests=8, num_tokens=96))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_gpu_kernels_float32_agree_and_bfloat16_stays_close(tiny, prompts, eager):
    """The GPU path: the decode kernel (replayed in a CUDA graph or eager) against the prefill kernel."""
    gpu = {**ENGINE, "device": "cuda", "attention_backend": "auto", "enforce_eager": eager}
    with LLM(tiny, **gpu) as llm:
        exact = llm.kv_cache_quality(prompts, 8)
        assert llm.engine.block_manager.num_used == 0
    with LLM(tiny, **{**gpu, "dtype": "bfloat16"}) as llm:
        bf16 = llm.kv_cache_quality(prompts, 8)
    assert exact["greedy_agreement"] == 1.0 and abs(exact["kl_mean"]) < 1e-5, exact
    assert bf16["greedy_agreement"] >= 0.9 and bf16["kl_mean"] < 1e-2, bf16


def test_kl_is_never_negative_and_zero_for_equal_distributions():
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 1000, generator=gen).log_softmax(-1)
    noisy = (ref + 1e-7 * torch.randn(64, 1000, generator=gen)).log_softmax(-1)  # rounding-level change
    assert (kl_divergence(ref, noisy) >= 0).all() and (kl_divergence(ref, ref) == 0).all()
    other = torch.randn(64, 1000, generator=gen).log_softmax(-1)
    exact = F.kl_div(other.double(), ref.double(), log_target=True, reduction="none").sum(-1)
    torch.testing.assert_close(kl_divergence(ref, other), exact)
