"""Trains a tiny Qwen3 on CPU on local text (the Python standard library's sources), byte-level,
and saves it with its tokenizer: a checkpoint whose next-token distributions are peaked, so the
KV-cache quality probe measures something a random model cannot show.

    python experiments/kv_fp8/train_tiny.py --out experiments/kv_fp8/checkpoint   # ~20 s on 2 cores
"""

from __future__ import annotations

import argparse
import json
import math
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # eos (and pad), bos, spare
VOCAB_SIZE = 256 + len(SPECIALS)


@dataclass
class Shape:
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    max_positions: int = 4096


@dataclass
class Schedule:
    steps: int = 300
    batch: int = 16
    seq_len: int = 64
    lr: float = 3e-3
    seed: int = 0
    corpus_bytes: int = 4_000_000


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Each byte of the UTF-8 text is one token (GPT-2's byte-to-unicode alphabet, no merges)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab |= {tok: 256 + i for i, tok in enumerate(SPECIALS)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=SPECIALS[0], pad_token=SPECIALS[0], bos_token=SPECIALS[1]
    )


def corpus_text(max_bytes: int) -> str:
    """The standard library's .py files in sorted order, up to max_bytes."""
    parts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        size += len(text)
        if size >= max_bytes:
            break
    return "".join(parts)[:max_bytes]


def write_prompts(out_dir: str | Path, schedule: Schedule, count: int = 32, length: int = 384) -> Path:
    """prompts.jsonl of `count` held-out pieces of `length` bytes (from the sources right after the
    training corpus), for workload=prompts_file."""
    text = corpus_text(schedule.corpus_bytes + count * length)[schedule.corpus_bytes :]
    path = Path(out_dir) / "prompts.jsonl"
    lines = [json.dumps({"prompt": text[i * length : (i + 1) * length]}) for i in range(count)]
    path.write_text("\n".join(lines) + "\n")
    return path


def build_model(shape: Shape, tokenizer: PreTrainedTokenizerFast) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=shape.hidden,
        intermediate_size=3 * shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return Qwen3ForCausalLM(config)


def learning_rate(schedule: Schedule, step: int) -> float:
    """Linear warm-up over 20 steps, then cosine decay to zero."""
    warm = min(1.0, (step + 1) / 20)
    return schedule.lr * warm * 0.5 * (1 + math.cos(math.pi * step / schedule.steps))


def train(out_dir: str | Path, shape: Shape, schedule: Schedule, log_every: int = 25) -> float:
    """Trains, saves the model (float32 safetensors), its tokenizer and held-out prompts
    (prompts.jsonl) to out_dir; returns the mean loss (nats per byte) of the last ten steps."""
    torch.manual_seed(schedule.seed)
    tokenizer = byte_tokenizer()
    data = torch.tensor(tokenizer.encode(corpus_text(schedule.corpus_bytes)), dtype=torch.int64)
    model = build_model(shape, tokenizer).float().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=schedule.lr, weight_decay=0.01)
    recent, start = [], time.perf_counter()
    for step in range(schedule.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(schedule, step)
        starts = torch.randint(0, len(data) - schedule.seq_len - 1, (schedule.batch,))
        batch = torch.stack([data[s : s + schedule.seq_len] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        recent = (recent + [loss.item()])[-10:]
        if log_every and (step % log_every == 0 or step == schedule.steps - 1):
            elapsed = time.perf_counter() - start
            print(f"step {step:4d}  loss {loss.item():.3f}  ({elapsed:.0f} s)", flush=True)
    final = sum(recent) / len(recent)
    if log_every:
        print(f"final loss {final:.3f} nats/byte; uniform would be {math.log(VOCAB_SIZE):.3f}", flush=True)
    model.eval().save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    write_prompts(out_dir, schedule)
    return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "checkpoint"))
    parser.add_argument("--steps", type=int, default=Schedule.steps)
    # one thread: the model is so small that a second thread mostly waits at each op's barrier, and
    # on a busy 2-core machine it waits for a core (40 steps: 17.6-21.3 s with 1 thread, 42-140 s
    # with 2, at load 4.3-4.6)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train(args.out, Shape(), Schedule(steps=args.steps))
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
