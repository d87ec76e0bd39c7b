"""outputs.jsonl: what each request generated (one JSON object per request and repeat)."""

from __future__ import annotations

import json
from pathlib import Path

from nanoexp.experiment.driver import RunRecord
from nanoexp.experiment.local_sink import atomic_open
from nanoexp.experiment.schema import NanoexpConfig, WorkloadKind

OUTPUTS_FILE = "outputs.jsonl"


def wants_outputs(spec: NanoexpConfig) -> bool:
    """`save_outputs`, or when unset: on for prompts files (whose text matters), off otherwise."""
    if spec.save_outputs is not None:
        return spec.save_outputs
    return spec.workload.kind is WorkloadKind.prompts_file


def write_outputs(path: Path, records: list[RunRecord], tokenizer=None) -> None:
    """request_id, repeat, prompt_len, output_token_ids, finish_reason, and text with a tokenizer."""
    with atomic_open(path) as f:
        for record in records:
            for o in record.outputs:
                row = {
                    "request_id": o.request_id,
                    "repeat": record.repeat,
                    "prompt_len": len(o.prompt_token_ids),
                    "output_token_ids": list(o.token_ids),
                    "finish_reason": o.finish_reason,
                }
                if tokenizer is not None:
                    row["text"] = tokenizer.decode(o.token_ids, skip_special_tokens=True)
                f.write(json.dumps(row) + "\n")
