"""Conversation datasets as `vllm bench serve --dataset-name sharegpt`: a conversation's first human turn is
the prompt, the model turn after it sets the output length (its token count, with the checkpoint's
tokenizer); conversations are drawn in a seeded order and kept when both lengths pass the filters."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from nanoexp.experiment.schema import ConfigError, WorkloadConfig

Tokenize = Callable[[str], list[int]]
HUMAN = ("human", "user")
MODEL = ("gpt", "assistant", "model", "chatgpt", "bard", "bing")


def sharegpt_prompts(w: WorkloadConfig, tokenize: Tokenize | None) -> tuple[list, list[int], list[str]]:
    """(prompt token ids, output lengths, origins `<file>#<conversation index>`) of `num_requests`
    conversations that pass min_len, max_input_len and max_total_len, in the order `seed` shuffles them."""
    assert w.path is not None  # workload=sharegpt's check requires it
    path = Path(w.path)
    if tokenize is None:
        raise ConfigError(
            f"workload=sharegpt counts tokens with the checkpoint's tokenizer, and this model has none "
            f"(dummy weights or no tokenizer files): set model.path to a checkpoint with one ({path.name})"
        )
    exchanges = list(first_exchanges(load_conversations(path)))
    prompts, out_lens, origins = [], [], []
    for index in np.random.default_rng(w.seed).permutation(len(exchanges)):
        number, prompt, answer = exchanges[index]
        ids, out_len = tokenize(prompt), len(tokenize(answer))
        if passes(len(ids), out_len, w):
            prompts.append(ids)
            out_lens.append(out_len)
            origins.append(f"{path.name}#{number}")
            if len(prompts) == w.num_requests:
                return prompts, out_lens, origins
    raise ConfigError(
        f"workload.num_requests={w.num_requests}: only {len(prompts)} of the {len(exchanges)} conversations "
        f"of {path} pass the length filters (workload.min_len={w.min_len}, max_input_len={w.max_input_len}, "
        f"max_total_len={w.max_total_len})"
    )


def passes(prompt_len: int, output_len: int, w: WorkloadConfig) -> bool:
    """vLLM's filter: both at least min_len, the prompt at most max_input_len, both at most max_total_len."""
    short = prompt_len < w.min_len or output_len < max(w.min_len, 1)
    return not short and prompt_len <= w.max_input_len and prompt_len + output_len <= w.max_total_len


def load_conversations(path: Path) -> list:
    """A JSON list of conversations, or JSONL with one conversation per line."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as err:
            raise ConfigError(
                f"workload.path={path}: not ShareGPT JSON ({err.msg} at line {err.lineno}); "
                'expected [{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}, ...]'
            ) from None
    if not isinstance(data, list):
        raise ConfigError(f"workload.path={path}: a ShareGPT file is a JSON list of conversations")
    return data


def first_exchanges(conversations: list) -> Iterator[tuple[int, str, str]]:
    """(index, first human turn, the model turn that follows it) of each conversation that has both."""
    for number, item in enumerate(conversations):
        turns = item.get("conversations") if isinstance(item, dict) else None
        turns = [t for t in turns if isinstance(t, dict)] if isinstance(turns, list) else []
        roles = [str(t.get("from", t.get("role", ""))).lower() for t in turns]
        texts = [t.get("value", t.get("content")) for t in turns]
        for i in range(len(turns) - 1):
            if roles[i] in HUMAN and roles[i + 1] in MODEL:
                if isinstance(texts[i], str) and isinstance(texts[i + 1], str):
                    yield number, texts[i], texts[i + 1]
                break
