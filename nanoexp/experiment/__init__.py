"""The research layer (code): builds a job from the composed config (checkpoint choice, engine
config, workload, logger, driver, baselines), measures it and reports sweeps.

Not to be confused with `conf/experiment/` (presets that set several groups at once) or
`experiments/` (published studies).
"""

from nanoexp.experiment.main import main

__all__ = ["main"]
