"""Around the jobs of a sweep: the sweep callback, GPU assignment per job, provenance."""
