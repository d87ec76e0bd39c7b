"""Making load and measuring it: workloads, the driver, baselines, quality probes, profiling, repeats."""
