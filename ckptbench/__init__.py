"""ckptbench: checkpoint I/O benchmarking and tuning for large-scale ML training."""

__version__ = "0.1.0"
