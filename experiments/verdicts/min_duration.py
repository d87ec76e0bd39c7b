"""How long a timed repeat must last for its throughput to repeat from one run to the next: independent
runs (processes) of qwen3_tiny at several workload sizes, interleaved; per size, the between-run
coefficient of variation of the run means (quiet repeats only: not busy by repeats.busy_limit) against the
duration of a repeat.

    python experiments/verdicts/min_duration.py OUT_DIR [--sizes 8,32,128,512] [--trials 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from nanoexp.experiment.measure.repeats import busy_limit
from nanoexp.experiment.runtime import atomic_files
from nanoexp.experiment.schema import BUSY_CORES

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--sizes", default="8,32,128,512")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--overrides", default="model=qwen3_tiny", help="space-separated run.py overrides")
    args = parser.parse_args()
    env = dict(os.environ, WANDB_MODE="disabled", HF_HUB_OFFLINE="1")
    rows = []
    for trial in range(args.trials):
        for size in [int(s) for s in args.sizes.split(",")]:
            out = args.out / f"n{size}_t{trial}"
            overrides = [*args.overrides.split(), "logger=none", f"repeats={args.repeats}"]
            overrides += [f"workload.num_requests={size}", f"trial={trial}", f"hydra.run.dir={out}"]
            subprocess.run(
                [sys.executable, "run.py", *overrides], cwd=ROOT, env=env, check=True, capture_output=True
            )
            summary = json.loads((out / "results.json").read_text())["summary"]
            for r, rep in enumerate(summary["per_repeat"]):
                rows.append(
                    {"size": size, "trial": trial, "repeat": r, "cpu_count": summary.get("cpu_count")} | rep
                )
            print(
                f"n={size} trial {trial}: {summary['output_throughput']:.0f} tok/s, "
                f"{summary['duration_s']:.3f} s a repeat",
                flush=True,
            )
    table = pd.DataFrame(rows)
    atomic_files.write_table(table, args.out / "min_duration.csv")
    limit = table.apply(lambda r: busy_limit([r.to_dict()], r.get("cpu_count", 2) or 2, BUSY_CORES), axis=1)
    quiet = table[table["other_cpu_cores"] <= limit]  # the rule the jobs flag themselves by
    runs = quiet.groupby(["size", "trial"]).agg(
        tput=("output_throughput", "mean"), dur=("duration_s", "mean")
    )
    within = quiet.groupby(["size", "trial"])["output_throughput"].agg(lambda v: v.std(ddof=1) / v.mean())
    out = runs.groupby("size").agg(
        duration_s=("dur", "mean"),
        runs=("tput", "size"),
        between_run_cv=("tput", lambda v: v.std(ddof=1) / v.mean()),
    )
    out["within_run_cv"] = within.groupby("size").mean()
    print(out.to_string(float_format=lambda v: f"{v:.3f}"))
    print(
        "quiet repeats:",
        len(quiet),
        "of",
        len(table),
        "; median other cores",
        np.median(table["other_cpu_cores"]),
    )


if __name__ == "__main__":
    main()
