"""What the running process knows and guards: the job Hydra runs (dirs, overrides, sweep), its signals."""
