"""Discrete-event simulator of continuous-batching engines with a paged KV cache."""

from presched.sim.cluster import Cluster
from presched.sim.config import DisaggConfig, EngineConfig
from presched.sim.disagg import DisaggCluster
from presched.sim.result import SimResult
from presched.sim.setup import SimConfig, build_cluster, simulate

__all__ = ["Cluster", "DisaggCluster", "DisaggConfig", "EngineConfig", "SimConfig", "SimResult",
           "build_cluster", "simulate"]  # fmt: skip
