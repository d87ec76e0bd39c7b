"""One table maps each `LLM(...)` keyword to the Hydra key run.py's users type; engine messages (which
name keywords) are phrased with Hydra keys on run.py's error path, and config-class errors (which name
Hydra keys) with keywords at the API."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from nanoexp import LLM
from nanoexp.config import KnobError
from nanoexp.config.engine import KEYWORDS, as_keyword
from nanoexp.experiment import schema  # noqa: F401  (registers the config classes with Hydra)
from nanoexp.experiment.schema.keys import HYDRA_KEYS, in_hydra_keys

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_every_keyword_maps_to_a_key_of_the_composed_config() -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config")
    assert set(HYDRA_KEYS) == set(KEYWORDS)
    missing = [
        key for key in HYDRA_KEYS.values() if OmegaConf.select(cfg, key, default="<absent>") == "<absent>"
    ]
    assert not missing


@pytest.mark.parametrize(
    ("engine_message", "run_py_message"),
    [
        (
            "raise num_kv_blocks, or gpu_memory_utilization",
            "raise cache.num_blocks, or cache.gpu_memory_utilization",
        ),
        ("device='cuda' needs a CUDA device", "engine.device='cuda' needs a CUDA device"),
        ("exceeds max_model_len=4096", "exceeds scheduler.max_model_len=4096"),
        ("tensor_parallel_size=3 is invalid", "parallel.tensor_parallel_size=3 is invalid"),
        # already Hydra keys, other objects' fields, plain words and paths stay as they are
        ("engine.device='cuda' is invalid", "engine.device='cuda' is invalid"),
        ("SamplingParams.seed=3", "SamplingParams.seed=3"),
        (
            "no CUDA device is available; the seed of the run",
            "no CUDA device is available; the seed of the run",
        ),
        ("/data/max_num_seqs=4/x.jsonl:2: not valid JSON", "/data/max_num_seqs=4/x.jsonl:2: not valid JSON"),
        ("notes=seed=3 is a value", "notes=seed=3 is a value"),
    ],
)
def test_engine_messages_are_phrased_with_hydra_keys(engine_message: str, run_py_message: str) -> None:
    assert in_hydra_keys(engine_message) == run_py_message


def test_config_errors_are_phrased_with_keywords_at_the_api() -> None:
    error = as_keyword(KnobError("cache.block_size", 3, "a power of two from 1 to 1024"))
    assert str(error) == "kv_block_size=3 is invalid: must be a power of two from 1 to 1024"
    reasoned = as_keyword(KnobError("engine.device", "cuda", "auto or cpu", "needs a CUDA device"))
    assert str(reasoned) == "device='cuda' needs a CUDA device"


def test_a_limit_found_while_starting_names_the_keyword(checkpoints) -> None:
    with pytest.raises(KnobError) as info:
        LLM(checkpoints["qwen3_gqa1"][0], max_model_len=5000)  # the model's limit: 1024
    assert str(info.value).startswith("max_model_len=5000 is invalid")


def test_run_pys_logs_phrase_engine_warnings_with_hydra_keys() -> None:
    import io
    import logging

    from nanoexp.experiment.job.engine_logs import phrase_engine_logs

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        phrase_engine_logs()
        phrase_engine_logs()  # idempotent
        logging.getLogger("nanoexp.kernels.select").warning("attention_backend=auto: not using %s", "triton")
        logging.getLogger("nanoexp.experiment.job.build").warning("model.arch differs: vocab_size=3")
    finally:
        root.removeHandler(handler)
    assert len(handler.filters) == 1
    assert stream.getvalue().splitlines() == [
        "engine.attention_backend=auto: not using triton",
        "model.arch differs: vocab_size=3",  # the experiment layer names Hydra keys itself
    ]


def test_a_kv_cache_too_small_names_the_keyword_in_the_api(checkpoints) -> None:
    with LLM(checkpoints["qwen3_gqa1"][0], kv_block_size=16, num_kv_blocks=1) as llm:
        with pytest.raises(ValueError) as info:
            llm.generate([[1] * 20], use_tqdm=False)
    message = str(info.value)
    assert message.startswith("prompt 0: ") and "raise num_kv_blocks" in message and "cache." not in message
