"""Every config group composes against the schema and builds through the factory."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

import nanoexp.experiment.schema  # noqa: F401  (registers the schema)
from nanoexp import factory
from nanoexp.config import EngineConfig
from nanoexp.experiment.workloads import nanovllm_bench_prompts

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = ["model", "parallel", "sampler", "cache", "scheduler", "workload", "engine", "logger", "experiment"]

# Architecture of the public checkpoints' config.json files.
ARCH = {
    "qwen3_0_6b": (1024, 3072, 28, 16, 8, True),
    "qwen3_1_7b": (2048, 6144, 28, 16, 8, True),
    "qwen3_4b": (2560, 9728, 36, 32, 8, True),
    "qwen3_8b": (4096, 12288, 36, 32, 8, False),
    "qwen3_14b": (5120, 17408, 40, 40, 8, False),
    "qwen3_32b": (5120, 25600, 64, 64, 8, False),
    "qwen2_5_0_5b": (896, 4864, 24, 14, 2, True),
}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt_token_ids": [1, 2, 3], "max_tokens": 4}\n{"prompt_token_ids": [5, 6]}\n')
    return path


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_composes_and_builds(group: str, tmp_path: Path) -> None:
    for option in options(group):
        extra = [f"workload.path={prompts_file(tmp_path)}"] if option == "prompts_file" else []
        tp_safe = ["model=qwen3_0_6b"] if group == "parallel" else ["model=qwen3_tiny"]
        if group in ("model", "experiment"):
            tp_safe = []
        cfg = compose_cfg(f"{group}={option}", *tp_safe, *extra)
        spec = factory.to_spec(cfg)
        factory.check(spec)
        kwargs = factory.engine_kwargs(spec, factory.Checkpoint("dummy", None, "dummy", "none"))
        assert isinstance(EngineConfig.from_kwargs(spec.model.name, **kwargs), EngineConfig)
        workload = factory.build_workload(spec)
        assert workload.requests, f"{group}={option} built no requests"
        assert factory.build_logger(spec) is not None
        assert factory.to_plain(cfg)["model"]["name"] == spec.model.name


@pytest.mark.parametrize("name", sorted(ARCH))
def test_model_architectures_match_public_configs(name: str) -> None:
    arch = factory.to_spec(compose_cfg(f"model={name}")).model.arch
    got = (
        arch.hidden_size,
        arch.intermediate_size,
        arch.num_hidden_layers,
        arch.num_attention_heads,
        arch.num_key_value_heads,
        arch.tie_word_embeddings,
    )
    assert got == ARCH[name]
    assert arch.vocab_size == 151936 and arch.rope_theta == 1e6 and arch.rms_norm_eps == 1e-6
    assert arch.attention_bias == (name == "qwen2_5_0_5b")
    assert arch.head_dim == (64 if name == "qwen2_5_0_5b" else 128)


def test_nanovllm_bench_workload_matches_bench_py() -> None:
    prompts, max_tokens = nanovllm_bench_prompts()
    assert len(prompts) == 256
    assert sum(map(len, prompts)) == 142_827
    assert sum(max_tokens) == 133_966
    spec = factory.to_spec(compose_cfg("experiment=nanovllm_bench"))
    workload = factory.build_workload(spec)
    assert workload.num_prompt_tokens == 142_827 and workload.max_output_tokens == 133_966
    params = workload.requests[0].sampling_params
    assert params.temperature == 0.6 and params.ignore_eos
    assert spec.model.load_format.value == "dummy" and spec.model.dtype.value == "bfloat16"


def test_smoke_workload_sizes() -> None:
    workload = factory.build_workload(factory.to_spec(compose_cfg()))
    assert len(workload.requests) == 8
    assert all(32 <= len(r.prompt_token_ids) <= 128 for r in workload.requests)
    assert all(16 <= r.sampling_params.max_tokens <= 32 for r in workload.requests)


def test_poisson_arrivals_and_shared_prefix() -> None:
    overrides = ["workload=shared_prefix", "workload.request_rate=10", "workload.prefix_len=64"]
    spec = factory.to_spec(compose_cfg("model=qwen3_tiny", *overrides))
    workload = factory.build_workload(spec)
    offsets = [r.arrival_offset_s for r in workload.requests]
    assert offsets[0] == 0.0 and offsets == sorted(offsets) and offsets[-1] > 0
    firsts = {tuple(r.prompt_token_ids[:64]) for r in workload.requests}
    assert len(firsts) == spec.workload.num_prefixes


@pytest.mark.parametrize(
    ("overrides", "exc"),
    [
        (["model.foo=1"], ConfigCompositionException),
        (["scheduler.max_num_seqs=abc"], ConfigCompositionException),
        (["model.load_format=pickle"], ConfigCompositionException),
    ],
)
def test_schema_rejects_bad_keys_and_types(overrides: list[str], exc: type) -> None:
    with pytest.raises((exc, ValidationError)):
        compose_cfg(*overrides)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["model=qwen2_5_0_5b", "parallel=tp4"], "parallel.tensor_parallel_size"),
        (["cache.block_size=48"], "cache.block_size"),
        (["scheduler.max_model_len=100000"], "scheduler.max_model_len"),
        (["workload=prompts_file", "workload.path=/nonexistent.jsonl"], "workload.path"),
    ],
)
def test_check_names_the_key(overrides: list[str], key: str) -> None:
    with pytest.raises(factory.ConfigError, match=key.replace(".", r"\.")):
        factory.check(factory.to_spec(compose_cfg(*overrides)))


def test_checkpoint_resolution(tmp_path: Path) -> None:
    spec = factory.to_spec(compose_cfg("model.load_format=safetensors", f"model.path={tmp_path}"))
    with pytest.raises(factory.ConfigError, match="model.path"):
        factory.resolve_checkpoint(spec)
    auto = factory.to_spec(compose_cfg("model.load_format=auto", f"model.path={tmp_path}"))
    assert factory.resolve_checkpoint(auto).load_format == "dummy"
    (tmp_path / "model.safetensors").write_bytes(b"")
    found = factory.resolve_checkpoint(auto)
    assert (found.load_format, found.path, found.source) == ("safetensors", str(tmp_path), "path")


def test_engine_knobs_reach_the_engine_config() -> None:
    cfg = compose_cfg(
        "model=qwen3_tiny", "engine.attention_backend=torch",
        "scheduler.async_scheduling=true",
    )
    spec = factory.to_spec(cfg)
    kwargs = factory.engine_kwargs(spec, factory.Checkpoint("dummy", None, "dummy", "none"))
    config = EngineConfig.from_kwargs(spec.model.name, **kwargs)
    assert config.async_scheduling and config.execution.attention_backend == "torch"


def test_async_scheduling_defaults_on_with_one_rank_and_can_be_asked_for_with_more():
    assert EngineConfig.from_kwargs("m").async_scheduling is True
    assert EngineConfig.from_kwargs("m", tensor_parallel_size=2).async_scheduling is False
    chosen = EngineConfig.from_kwargs("m", tensor_parallel_size=2, async_scheduling=True)
    assert chosen.async_scheduling is True
