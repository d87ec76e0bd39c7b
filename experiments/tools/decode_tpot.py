"""One line per job of the sweep dirs given: its weight format, mean TPOT and median decode step (steps.csv).

python experiments/tools/decode_tpot.py /tmp/sweep_a /tmp/sweep_b"""

from __future__ import annotations

import csv
import json
import pathlib
import statistics
import sys


def job_line(results: pathlib.Path) -> str:
    res = json.loads(results.read_text())
    quantization = res.get("config", {}).get("model", {}).get("quantization", "?")
    with (results.parent / "steps.csv").open() as f:
        decode = [float(r["step_time_ms"]) for r in csv.DictReader(f) if float(r["num_prefill_tokens"]) == 0]
    median = statistics.median(decode) if decode else float("nan")
    tpot = res.get("summary", {}).get("mean_tpot_ms", float("nan"))
    steps = f"decode step median {median:.3f} ms (n={len(decode)})"
    return f"{results.parent}: quantization={quantization} mean TPOT {tpot:.3f} ms, {steps}"


if __name__ == "__main__":
    for root in sys.argv[1:]:
        for path in sorted(pathlib.Path(root).glob("*/results.json")):
            print(job_line(path))
