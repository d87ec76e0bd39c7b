"""Reading finished jobs back: the sweep report, its plots, the comparison of two sweeps."""
