"""Where a job's results go: the local files, Weights & Biases, the printed summary table."""
