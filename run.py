"""Entry point: `python run.py [group=option ...] [key=value ...]`, `-m` for sweeps.

Returns the job's search objective (see nanoexp/experiment/job/objective.py), which a search sweeper
such as `hparams_search=throughput_slo` optimizes.
"""

import hydra
from omegaconf import DictConfig

import nanoexp.experiment
import nanoexp.experiment.schema  # noqa: F401  (registers the structured-config schema)
from nanoexp.experiment.job.cli import cli
from nanoexp.experiment.job.objective import objective


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    nanoexp.experiment.main(cfg)
    return objective(cfg)


if __name__ == "__main__":
    cli(main)
