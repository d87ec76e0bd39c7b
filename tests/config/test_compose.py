"""Every config group composes against the schema (the engine's own config classes) and builds a job."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, compose_cfg, quick_first
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from nanoexp.config import (
    CacheConfig,
    EngineConfig,
    ExecutionConfig,
    ModelConfig,
    ParallelConfig,
    SamplingParams,
    SchedulerConfig,
)
from nanoexp.experiment import schema
from nanoexp.experiment.job import build, engine_factory
from nanoexp.experiment.job.build import Checkpoint, resolve_checkpoint
from nanoexp.experiment.measure.workloads import nanovllm_bench_prompts
from nanoexp.experiment.schema import ConfigError, NanoexpConfig, to_plain, to_spec

CONF = ROOT / "conf"
DUMMY = Checkpoint("dummy", None, "dummy", "none")
GROUPS = [
    *("model", "parallel", "sampler", "cache", "scheduler", "workload", "engine", "logger", "experiment"),
    "profile",
]

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


def prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt_token_ids": [1, 2, 3], "max_tokens": 4}\n{"prompt_token_ids": [5, 6]}\n')
    return path


class WordTokenizer:
    """One token per word: what workload=sharegpt needs from a checkpoint's tokenizer."""

    def encode(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]


def data_files(tmp_path: Path) -> dict[str, list[str]]:
    """The workload.path each file workload needs, by option."""
    trace, sharegpt = tmp_path / "trace.csv", tmp_path / "sharegpt.json"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,30,4\n2023-11-16 18:15:47,9,2\n"
    )
    turns = [{"from": "human", "value": "a b c d e"}, {"from": "gpt", "value": "f g h i"}]
    sharegpt.write_text(json.dumps([{"conversations": turns}] * 300))
    paths = {"prompts_file": prompts_file(tmp_path), "trace": trace, "sharegpt": sharegpt}
    return {option: [f"workload.path={path}"] for option, path in paths.items()}


@pytest.mark.parametrize(*quick_first("group", GROUPS, quick=GROUPS.index("workload")))
def test_every_option_composes_and_builds(group: str, tmp_path: Path) -> None:
    files = data_files(tmp_path)
    for option in options(group):
        extra = files.get(option, []) if group == "workload" else []
        tp_safe = ["model=qwen3_0_6b"] if group == "parallel" else ["model=qwen3_tiny"]
        if group in ("model", "experiment"):
            tp_safe = []
        cfg = compose_cfg(f"{group}={option}", *tp_safe, *extra)
        spec = to_spec(cfg)
        build.check(spec)
        assert isinstance(engine_factory.engine_config(spec, DUMMY), EngineConfig)
        workload = build.build_workload(spec, WordTokenizer())
        assert workload.requests, f"{group}={option} built no requests"
        assert build.build_logger(spec.logger) is not None
        assert to_plain(cfg)["model"]["name"] == spec.model.name


@pytest.mark.parametrize("name", sorted(ARCH))
def test_model_architectures_match_public_configs(name: str) -> None:
    arch = to_spec(compose_cfg(f"model={name}")).model.arch
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
    spec = to_spec(compose_cfg("experiment=nanovllm_bench"))
    workload = build.build_workload(spec)
    assert sum(len(r.prompt_token_ids) for r in workload.requests) == 142_827
    assert sum(r.sampling_params.max_tokens for r in workload.requests) == 133_966
    params = workload.requests[0].sampling_params
    assert params.temperature == 0.6 and params.ignore_eos
    assert spec.model.load_format == "dummy" and spec.model.dtype == "bfloat16"


def test_smoke_workload_sizes() -> None:
    workload = build.build_workload(to_spec(compose_cfg()))
    assert len(workload.requests) == 8
    assert all(32 <= len(r.prompt_token_ids) <= 128 for r in workload.requests)
    assert all(16 <= r.sampling_params.max_tokens <= 32 for r in workload.requests)


def test_poisson_arrivals_and_shared_prefix() -> None:
    overrides = ["workload=shared_prefix", "workload.request_rate=10", "workload.prefix_len=64"]
    spec = to_spec(compose_cfg("model=qwen3_tiny", *overrides))
    workload = build.build_workload(spec)
    offsets = [r.arrival_offset_s for r in workload.requests]
    assert offsets[0] == 0.0 and offsets == sorted(offsets) and offsets[-1] > 0
    firsts = {tuple(r.prompt_token_ids[:64]) for r in workload.requests}
    assert len(firsts) == spec.workload.num_prefixes


@pytest.mark.parametrize(
    ("overrides", "exc"),
    [
        (["model.foo=1"], ConfigCompositionException),
        (["scheduler.max_num_seqs=abc"], ConfigCompositionException),
        (["cache.block_size=abc"], ConfigCompositionException),
    ],
)
def test_schema_rejects_bad_keys_and_types(overrides: list[str], exc: type) -> None:
    with pytest.raises((exc, ValidationError)):
        compose_cfg(*overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cache.block_size=3"], "cache.block_size=3 is invalid: must be a power of two from 1 to 1024"),
        (["model.load_format=pickle"], "model.load_format='pickle' is invalid: must be one of auto,"),
        (["engine.attention_backend=cuda"], "engine.attention_backend='cuda' is invalid"),
        (["sampler.top_p=0"], "sampler.top_p=0.0 is invalid: must be a number in (0, 1]"),
        (["sampler.top_k=0"], "sampler.top_k=0 is invalid"),
        (["+cache.no_such_key=1"], "cache.no_such_key: no such config key"),
        (["+no_such_top=1"], "no_such_top: no such config key"),
        (["+model.arch.foo=1"], "model.arch.foo: no such config key"),
    ],
)
def test_values_a_config_class_rejects_are_one_line_errors_naming_the_key(overrides, message) -> None:
    cfg = compose_cfg(*overrides)
    with pytest.raises(ConfigError) as err:
        to_spec(cfg)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_groups_are_the_engines_config_classes() -> None:
    types = {f.name: f.type for f in dataclasses.fields(NanoexpConfig)}
    spec = to_spec(compose_cfg("model=qwen3_tiny"))
    assert (type(spec.cache), type(spec.scheduler), type(spec.parallel)) == (
        CacheConfig,
        SchedulerConfig,
        ParallelConfig,
    )
    # the model and engine groups hold every knob of the engine class built from them (its defaults, its
    # checks), and the job's own fields beside them
    config = engine_factory.engine_config(spec, DUMMY)
    assert type(config.model) is ModelConfig and type(config.execution) is ExecutionConfig
    for group, cls in (("model", ModelConfig), ("engine", ExecutionConfig)):
        knobs = {f.name for f in dataclasses.fields(cls)}
        assert knobs <= {f.name for f in dataclasses.fields(getattr(spec, group))}, (
            f"{group} lacks an engine knob"
        )
    assert {"model", "engine", "sampler"} <= set(types)
    defaults = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    for f in dataclasses.fields(schema.SamplerConfig):
        if f.name != "name":
            assert f.default == defaults[f.name], f"sampler.{f.name} default differs from SamplingParams"


def test_engine_config_takes_the_sections_as_they_are() -> None:
    spec = to_spec(compose_cfg("model=qwen3_tiny", "engine.attention_backend=torch", "cache.block_size=16"))
    config = engine_factory.engine_config(spec, DUMMY)
    assert config.cache is spec.cache and config.scheduler is spec.scheduler
    assert type(config.model) is ModelConfig and type(config.execution) is ExecutionConfig
    assert config.execution.attention_backend == "torch" and config.cache.block_size == 16
    assert config.model.arch["num_attention_heads"] == 4 and config.model.load_format == "dummy"
    real = engine_factory.engine_config(spec, Checkpoint("safetensors", "/ckpt", "auto", "path"))
    assert real.model.arch is None and real.model.path == "/ckpt"


# engine knob sections: the group's YAML folder and the engine class holding the defaults
KNOB_CLASSES = {
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "parallel": ParallelConfig,
    "engine": ExecutionConfig,
    "model": ModelConfig,
    "sampler": SamplingParams,
}


def literal_defaults(paths: list[Path]) -> Counter:
    """(class, field) -> how many times a dataclass field's default is written as a literal."""
    found = Counter()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            for stmt in node.body if isinstance(node, ast.ClassDef) else []:
                literal = isinstance(getattr(stmt, "value", None), ast.Constant | ast.UnaryOp | ast.Tuple)
                if isinstance(stmt, ast.AnnAssign) and literal:
                    found[(node.name, stmt.target.id)] += 1
    return found


def yaml_values(section: str) -> list[tuple[str, dict]]:
    """Every mapping that sets `section` knobs: the group's options and the experiment presets."""
    out = [(str(p), yaml.safe_load(p.read_text()) or {}) for p in (CONF / section).glob("*.yaml")]
    for p in (CONF / "experiment").glob("*.yaml"):
        out.append((str(p), (yaml.safe_load(p.read_text()) or {}).get(section) or {}))
    return out


@pytest.mark.parametrize("section", sorted(KNOB_CLASSES))
def test_each_engine_knob_has_its_default_in_one_place(section: str) -> None:
    """In its engine class: not in the schema's classes that mirror it, not in a YAML."""
    cls = KNOB_CLASSES[section]
    sources = [*sorted((ROOT / "nanoexp" / "config").glob("*.py"))]
    sources += sorted((ROOT / "nanoexp/experiment/schema").glob("*.py"))
    literals = literal_defaults(sources)
    holders = {cls.__name__, "ModelGroup", "EngineGroup", "SamplerConfig"}
    for f in dataclasses.fields(cls):
        written = {c: n for (c, name), n in literals.items() if name == f.name and c in holders}
        assert written == {cls.__name__: 1}, f"{section}.{f.name}: default written in {written}"
        for where, values in yaml_values(section):
            if f.name in values:
                assert values[f.name] != f.default, f"{where} restates the default {section}.{f.name}"


def test_presets_inherit_their_groups_default() -> None:
    defaults = {
        "cache": "default",
        "scheduler": "default",
        "sampler": "default",
        "parallel": "tp1",
        "engine": "nanoexp",
        "logger": "wandb",
        "profile": "default",
    }
    for group, default in defaults.items():
        for path in (CONF / group).glob("*.yaml"):
            values = yaml.safe_load(path.read_text()) or {}
            if path.stem == default:
                assert values == {}, f"{path} restates defaults: {values}"
            else:
                assert values.get("defaults") == [default], f"{path} does not inherit {default}"


def test_factory_is_config_in_engine_out() -> None:
    tree = ast.parse((ROOT / "nanoexp" / "factory.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m.startswith("nanoexp.experiment") for m in imported), imported


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
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build.check(to_spec(compose_cfg(*overrides)))


def test_checkpoint_resolution(tmp_path: Path) -> None:
    """auto and safetensors mean what they mean in the engine (no checkpoint: an error); only the
    default, dummy_if_missing, falls back to dummy weights."""
    for never in ("safetensors", "auto"):
        spec = to_spec(compose_cfg(f"model.load_format={never}", f"model.path={tmp_path}"))
        with pytest.raises(ConfigError, match=f"model.path.*model.load_format={never} never falls back"):
            resolve_checkpoint(spec.model)
    fallback = to_spec(compose_cfg(f"model.path={tmp_path}"))
    assert fallback.model.load_format == "dummy_if_missing"
    assert resolve_checkpoint(fallback.model).load_format == "dummy"
    (tmp_path / "model.safetensors").write_bytes(b"")
    for spec in (fallback, to_spec(compose_cfg("model.load_format=auto", f"model.path={tmp_path}"))):
        found = resolve_checkpoint(spec.model)
        assert (found.load_format, found.path, found.source) == ("safetensors", str(tmp_path), "path")


def test_engine_knobs_reach_the_engine_config() -> None:
    cfg = compose_cfg("model=qwen3_tiny", "engine.attention_backend=torch", "scheduler.async_scheduling=true")
    config = engine_factory.engine_config(to_spec(cfg), DUMMY)
    assert config.scheduler.async_scheduling and config.execution.attention_backend == "torch"


def test_every_knob_of_the_model_and_engine_groups_reaches_the_engine_config() -> None:
    """The factory builds the engine's ModelConfig and ExecutionConfig field by field: a knob it left out
    would silently run with the engine's default."""
    changed = {
        "engine.device": "cpu",
        "engine.attention_backend": "torch",
        "engine.gemm_backend": "torch",
        "engine.pdl": "off",
        "engine.seed": 7,
        "engine.expert_load_stats": False,
        "model.dtype": "float32",
        "model.quantization": "fp8",
    }
    assert {f"engine.{f.name}" for f in dataclasses.fields(ExecutionConfig)} <= set(changed)
    overrides = [f"{key}={str(value).lower()}" for key, value in changed.items()]
    config = engine_factory.engine_config(to_spec(compose_cfg("model=qwen3_tiny", *overrides)), DUMMY)
    for key, value in changed.items():
        group, name = key.split(".")
        section = config.execution if group == "engine" else config.model
        assert getattr(section, name) == value, key
        assert value != getattr(type(section), name), f"{key}: pick a value other than the default"


def test_async_scheduling_defaults_on_at_every_tp_size_and_can_be_turned_off():
    assert EngineConfig.from_kwargs("m").scheduler.async_scheduling is True
    assert EngineConfig.from_kwargs("m", tensor_parallel_size=2).scheduler.async_scheduling is True
    chosen = EngineConfig.from_kwargs("m", tensor_parallel_size=2, async_scheduling=False)
    assert chosen.scheduler.async_scheduling is False


def help_config() -> dict:
    """The config `python run.py --help` lists."""
    cmd = [sys.executable, "run.py", "--help"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    listing = proc.stdout.split("== Config ==", 1)[1].split("Powered by Hydra", 1)[0]
    return yaml.safe_load(listing.split("\n", 2)[2])  # after the "Override anything" line


@pytest.mark.slow
def test_help_lists_the_defaults_the_presets_run_with() -> None:
    """`--help` shows the default job's config; knobs that only the latency workload reads show the
    values its preset runs with (vllm bench latency's), not others the preset would replace."""
    listed = help_config()
    assert listed == yaml.safe_load(OmegaConf.to_yaml(compose_cfg()))
    latency = to_spec(compose_cfg("workload=latency")).workload
    for knob, value in {"batch_size": 8, "num_iters": 30, "num_iters_warmup": 10}.items():
        assert listed["workload"][knob] == getattr(latency, knob) == value, knob
