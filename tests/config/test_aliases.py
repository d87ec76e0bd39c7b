"""Deprecated spellings (nanoexp/config/aliases.py): the old one works with one warning line, the new one
without, through `LLM(**kwargs)`'s keywords and run.py's Hydra keys alike."""

from __future__ import annotations

import logging

import pytest
from helpers import compose_cfg

from nanoexp.config import aliases
from nanoexp.config.engine import KEYWORDS, EngineConfig
from nanoexp.engine.outputs import StepStats
from nanoexp.experiment.metrics.summarize import step_row
from nanoexp.experiment.schema import to_plain, to_spec

KEYWORD_CASES = [
    ("kvcache_block_size", "kv_block_size", 16, lambda c: c.cache.block_size),
    ("num_kvcache_blocks", "num_kv_blocks", 40, lambda c: c.cache.num_blocks),
    ("cpu_kv_cache_gb", "cpu_kv_cache_gib", 0.5, lambda c: c.cache.cpu_kv_cache_gib),
]


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize(("old", "new", "value", "read"), KEYWORD_CASES, ids=[c[0] for c in KEYWORD_CASES])
def test_an_old_keyword_sets_the_knob_with_one_warning_line(caplog, old, new, value, read) -> None:
    with caplog.at_level(logging.WARNING):
        config = EngineConfig.from_kwargs("m", **{old: value})
    assert read(config) == value
    assert warnings_of(caplog) == [f"nanoexp: warning: {old} is deprecated; use {new}"]


@pytest.mark.parametrize(("old", "new", "value", "read"), KEYWORD_CASES, ids=[c[1] for c in KEYWORD_CASES])
def test_the_new_keyword_sets_the_knob_without_a_warning(caplog, old, new, value, read) -> None:
    with caplog.at_level(logging.WARNING):
        config = EngineConfig.from_kwargs("m", **{new: value})
    assert read(config) == value and warnings_of(caplog) == []


def test_both_spellings_at_once_is_an_error_naming_both() -> None:
    with pytest.raises(TypeError, match="kvcache_block_size and kv_block_size are one argument"):
        EngineConfig.from_kwargs("m", kvcache_block_size=16, kv_block_size=32)


def test_only_new_keywords_are_listed_as_allowed() -> None:
    assert {"kv_block_size", "num_kv_blocks", "cpu_kv_cache_gib"} <= set(KEYWORDS)
    assert not set(aliases.KEYWORDS) & set(KEYWORDS)
    with pytest.raises(TypeError) as info:
        EngineConfig.from_kwargs("m", kv_block_sizes=16)
    assert "kv_block_size" in str(info.value) and "kvcache_block_size" not in str(info.value)


def test_an_old_hydra_key_moves_to_the_new_one_with_one_warning_line(caplog) -> None:
    cfg = compose_cfg("model=qwen3_tiny", "cache.cpu_kv_cache_gb=0.25")
    with caplog.at_level(logging.WARNING):
        spec = to_spec(cfg)
    assert spec.cache.cpu_kv_cache_gib == 0.25 and spec.cache.cpu_kv_cache_gb is None
    assert warnings_of(caplog) == [
        "nanoexp: warning: cache.cpu_kv_cache_gb is deprecated; use cache.cpu_kv_cache_gib"
    ]
    logged = to_plain(cfg)["cache"]  # the logged config holds the value under the new key only
    assert logged["cpu_kv_cache_gib"] == 0.25 and logged["cpu_kv_cache_gb"] is None


def test_the_new_hydra_key_has_no_warning(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        spec = to_spec(compose_cfg("model=qwen3_tiny", "cache.cpu_kv_cache_gib=0.25"))
    assert spec.cache.cpu_kv_cache_gib == 0.25 and warnings_of(caplog) == []


def test_renaming_plain_dicts_leaves_other_keys_alone(caplog) -> None:
    config = {"cache": {"cpu_kv_cache_gb": 1.5, "cpu_kv_cache_gib": 2.0, "block_size": 16}, "model": {}}
    with caplog.at_level(logging.WARNING):
        aliases.rename_keys(config)
    cache = {"cpu_kv_cache_gb": None, "cpu_kv_cache_gib": 1.5, "block_size": 16}
    assert config == {"cache": cache, "model": {}}
    aliases.rename_keys({"model": {}})  # a config without the group: nothing to move
    assert len(warnings_of(caplog)) == 1


def test_the_renamed_step_column_is_written_beside_its_new_name_for_one_release() -> None:
    stats = StepStats("mixed", 3, 40, 3, 0.01, 5, 64, 0, 0, 0, 3, 0)
    row = step_row(0, stats, 0.0)
    assert row["num_kv_blocks"] == row["kv_blocks_total"] == 64 and row["kv_blocks_used"] == 5
    assert row["phase"] == "mixed" and row["is_prefill"] == 0  # deprecated: 1 only for a pure prefill step
