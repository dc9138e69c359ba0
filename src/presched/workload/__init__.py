"""Requests and the streams that make them: loaders, arrival processes, composition, the default.

    from presched.workload import WorkloadConfig, build_workload
    reqs = build_workload(WorkloadConfig(source="azure-conv", rate=8.0))

See docs/workloads.md for the formats, the generic schema and the default workload's figures.
"""

from presched.workload.arrivals import apply_arrivals, gamma, mean_rate, poisson, rescale, trace
from presched.workload.compose import compose
from presched.workload.config import WorkloadConfig, build_workload
from presched.workload.default import default_workload
from presched.workload.loaders import (
    LOADERS,
    LoadError,
    approx_tokens,
    castillo_models,
    load_azure,
    load_castillo,
    load_generic,
    load_mooncake,
    load_sharegpt,
    save_generic,
)
from presched.workload.paths import data_dir
from presched.workload.request import InvalidRequestError, Request

__all__ = [
    "Request",
    "InvalidRequestError",
    "LoadError",
    "LOADERS",
    "load_azure",
    "load_mooncake",
    "load_castillo",
    "castillo_models",
    "load_sharegpt",
    "load_generic",
    "save_generic",
    "approx_tokens",
    "poisson",
    "gamma",
    "rescale",
    "trace",
    "apply_arrivals",
    "mean_rate",
    "compose",
    "default_workload",
    "WorkloadConfig",
    "build_workload",
    "data_dir",
]
