"""Experiments over the simulator: `presched bench` (tables, JSON, plots)."""

from presched.bench.config import BenchConfig
from presched.bench.runner import BenchResult, run_bench

__all__ = ["BenchConfig", "BenchResult", "run_bench"]
