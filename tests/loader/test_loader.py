"""Checkpoint loading: sharded files with an index, dtype conversion, tied weights, dummy weights,
text prompts through the checkpoint's tokenizer."""

from __future__ import annotations

import json
import os

import torch
from checkpoints import SHAPES, build_checkpoint, hf_greedy, random_prompts
from safetensors import safe_open
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from nanoexp import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def test_sharded_checkpoint_with_index(tmp_path):
    model = build_checkpoint(tmp_path, *SHAPES["qwen3_gqa4"])
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert os.path.isfile(tmp_path / "model.safetensors.index.json")
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 2
    os.remove(tmp_path / "model.safetensors")  # only the shards remain
    prompt = random_prompts([33])[0]
    with LLM(str(tmp_path), kv_block_size=16) as llm:
        assert llm.generate([prompt], GREEDY, use_tqdm=False)[0].token_ids == hf_greedy(model, prompt, 8)


def test_tied_checkpoint_has_no_lm_head_key(checkpoints):
    path, model = checkpoints["qwen3_gqa2_tied"]
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()
    with LLM(path, kv_block_size=16) as llm:
        runner = llm.engine.executor.runner
        assert runner.model.lm_head.weight.data_ptr() == runner.model.model.embed_tokens.weight.data_ptr()


def test_bfloat16_checkpoint_loads_into_float32_and_bfloat16(tmp_path):
    model = build_checkpoint(tmp_path, *SHAPES["qwen3_gqa1"]).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    reference = model.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    for dtype, expected in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        with LLM(str(tmp_path), dtype=dtype, kv_block_size=16) as llm:
            qkv = llm.engine.executor.runner.model.model.layers[0].self_attn.qkv_proj.weight
            assert qkv.dtype == expected
            assert torch.equal(qkv[: reference.shape[0]].to(torch.bfloat16), reference)
            assert len(llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].token_ids) == 8


def test_dummy_weights_need_only_the_config(tmp_path, checkpoints):
    with open(os.path.join(checkpoints["qwen3_gqa4"][0], "config.json")) as f:
        config = json.load(f)
    with LLM("qwen3-dummy", hf_config=config, load_format="dummy", kv_block_size=16) as llm:
        out = llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0]
        assert len(out.token_ids) == 8
        assert llm.stats()["weights_bytes"] > 0


def test_text_prompts_use_the_checkpoint_tokenizer(tmp_path):
    model = build_checkpoint(tmp_path, *SHAPES["qwen3_gqa1"])
    vocab = {f"w{i}": i for i in range(384)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=raw).save_pretrained(tmp_path)
    with LLM(str(tmp_path), kv_block_size=16) as llm:
        out = llm.generate("w5 w17 w3", GREEDY, use_tqdm=False)[0]
    expected = hf_greedy(model, [5, 17, 3], 8)
    assert out["token_ids"] == expected
    assert out["text"].split() == [f"w{i}" for i in expected]
