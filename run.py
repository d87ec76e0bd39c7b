"""Entry point: `python run.py [group=option ...] [key=value ...]`, `-m` for sweeps."""

import hydra
from omegaconf import DictConfig

import nanoexp.experiment
import nanoexp.experiment.schema  # noqa: F401  (registers the structured-config schema)
from nanoexp.experiment.main import cli


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> int:
    return nanoexp.experiment.main(cfg)


if __name__ == "__main__":
    cli(main)
