"""Workloads, the runner (warm-up, repeats, cache control), statistics and the result schema."""
