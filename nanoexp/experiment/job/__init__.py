"""Running one job: build its parts, warm up, time the repeats, record success or failure."""
