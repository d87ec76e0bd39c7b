"""The research layer: builds a job from the composed config, measures it and reports sweeps (not
`conf/experiment/`, presets, nor `experiments/`, published studies)."""

from nanoexp.experiment.main import main

__all__ = ["main"]
