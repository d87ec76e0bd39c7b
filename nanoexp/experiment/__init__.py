"""The research layer: builds a job from the composed config, measures it and reports sweeps."""

from nanoexp.experiment.job.main import main

__all__ = ["main"]
