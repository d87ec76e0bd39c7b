"""Bad input gets a one-line error naming the problem, and the engine keeps serving."""

from __future__ import annotations

import json
import os

import pytest

from nanoexp import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(checkpoints):
    path = checkpoints["qwen3_gqa1"][0]
    with LLM(path, kv_block_size=16, num_kv_blocks=64, max_model_len=512) as llm:
        yield llm


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize(
    ("prompt", "params", "needle"),
    [
        ([], GREEDY, "prompt is empty"),
        ([1, 2, 384], GREEDY, "token id 384 is outside the vocabulary [0, 384)"),
        ([1, -3], GREEDY, "token id -3"),
        (list(range(300)), SamplingParams(max_tokens=300), "exceeds max_model_len=512"),
    ],
)
def test_bad_requests_are_rejected_and_the_engine_keeps_serving(llm, prompt, params, needle):
    with pytest.raises(ValueError) as err:
        llm.generate([[5, 6, 7], prompt], params, use_tqdm=False)
    assert needle in one_line(err)
    assert not llm.engine.has_unfinished() and llm.engine.block_manager.num_used == 0
    assert len(llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].token_ids) == 4


def test_request_larger_than_the_whole_cache_is_rejected(checkpoints):
    with LLM(checkpoints["qwen3_gqa1"][0], kv_block_size=16, num_kv_blocks=4) as llm:
        with pytest.raises(ValueError) as err:
            llm.engine.add_request(list(range(60)), SamplingParams(max_tokens=10))
        assert "exceeds the whole KV cache (64 tokens)" in one_line(err)
        assert llm.generate([[1, 2]], GREEDY, use_tqdm=False)[0].token_ids


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"temperature": -1}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": 2.0}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": -1}, "seed"),
        ({"stop_token_ids": [-2]}, "stop_token_ids"),
        ({"max_tokens": 2.5}, "max_tokens"),  # never rounded
        ({"max_tokens": True}, "max_tokens"),
        ({"ignore_eos": "no"}, "ignore_eos"),  # a non-empty string is not True
        ({"seed": 1.5}, "seed"),  # rejected here, not at generate time
        ({"temperature": "0.5"}, "temperature"),  # one line, not a TypeError from a comparison
        ({"top_k": "5"}, "top_k"),
        ({"top_p": float("nan")}, "top_p"),
        ({"stop_token_ids": "12"}, "stop_token_ids"),
    ],
)
def test_invalid_sampling_params(kwargs, needle):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert f"SamplingParams.{needle}=" in one_line(err)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"kv_block_size": 24}, "kv_block_size=24 is invalid: must be a power of two from 1 to"),
        ({"kv_block_size": 2048}, "kv_block_size=2048"),
        ({"dtype": "int8"}, "dtype='int8' is invalid"),
        ({"device": "tpu"}, "device='tpu' is invalid"),
        ({"load_format": "pt"}, "load_format='pt'"),
        ({"max_num_seqs": 0}, "max_num_seqs=0"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization=1.5"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size=0"),
        ({"cpu_kv_cache_gib": float("inf")}, "cpu_kv_cache_gib=inf is invalid: must be a number in (0, "),
        ({"enable_prefix_caching": "yes"}, "enable_prefix_caching='yes' is invalid: must be true or false"),
        ({"all_reduce": "nvls"}, "all_reduce='nvls' is invalid"),
    ],
)
def test_invalid_engine_arguments(checkpoints, kwargs, needle):
    with pytest.raises(ValueError) as err:
        LLM(checkpoints["qwen3_gqa1"][0], **kwargs)
    assert needle in one_line(err)


def test_numpy_values_are_accepted_as_the_numbers_they_hold():
    import numpy as np

    params = SamplingParams(
        max_tokens=np.int64(4), seed=np.int32(3), top_k=np.int64(5), temperature=np.float32(0.5)
    )
    assert (params.max_tokens, params.seed, params.top_k) == (4, 3, 5)
    assert type(params.max_tokens) is int and type(params.temperature) is float


def test_unknown_kwarg_is_rejected(checkpoints):
    with pytest.raises(TypeError) as err:
        LLM(checkpoints["qwen3_gqa1"][0], max_num_seq=4)
    assert "unknown engine argument(s) max_num_seq" in one_line(err)


def test_missing_checkpoint_directory(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        LLM(str(tmp_path / "nope"))
    assert "nope" in one_line(err)


def test_directory_without_weights(tmp_path, checkpoints):
    src = checkpoints["qwen3_gqa1"][0]
    with open(os.path.join(src, "config.json")) as f:
        (tmp_path / "config.json").write_text(f.read())
    with pytest.raises(FileNotFoundError) as err:
        LLM(str(tmp_path), load_format="safetensors")
    assert "no *.safetensors files" in one_line(err)


def test_unsupported_architecture(tmp_path, checkpoints):
    with open(os.path.join(checkpoints["qwen3_gqa1"][0], "config.json")) as f:
        config = json.load(f)
    config["architectures"] = ["LlamaForCausalLM"]
    config["model_type"] = "llama"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as err:
        LLM(str(tmp_path), load_format="dummy")
    assert "unsupported architecture ['LlamaForCausalLM']; supported: Qwen3ForCausalLM" in one_line(err)


def test_wrong_number_of_sampling_params(llm):
    with pytest.raises(ValueError) as err:
        llm.generate([[1], [2]], [GREEDY], use_tqdm=False)
    assert "got 1 sampling_params for 2 prompts" in one_line(err)
