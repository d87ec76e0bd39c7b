"""The research layer: workloads, driver, metrics, loggers, sweep report, baselines."""

from nanoexp.experiment.main import main

__all__ = ["main"]
