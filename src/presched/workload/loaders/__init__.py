"""Loaders: one function per input format, each returning `list[Request]`.

    from presched.workload.loaders import LOADERS
    reqs = LOADERS.create("azure-conv")                    # shared Azure conversation trace
    reqs = LOADERS.create("generic", "my_log.jsonl")       # your own log, documented schema

Every loader takes the file (or folder) first and `limit=None` (keep the first N requests) last,
and raises `LoadError` (file, line, field) for a bad row. Names without a path argument
(`azure-conv`, `azure-code`, `mooncake-conv`, `castillo`) default to the shared data folder
(see `presched.workload.paths.data_dir`).
"""

from __future__ import annotations

from presched.registry import Registry
from presched.workload.request import Request

LOADERS: Registry[list[Request]] = Registry("loader")
"""Name -> loader function."""

UNTIMED: frozenset[str] = frozenset({"castillo", "sharegpt"})
"""Loaders whose data has no timestamps (every arrival is 0): they need synthetic arrivals."""

# The modules register themselves on import; LOADERS must exist before these imports.
from presched.workload.loaders.azure import load_azure, load_azure_code, load_azure_conv  # noqa: E402
from presched.workload.loaders.castillo import castillo_models, load_castillo  # noqa: E402
from presched.workload.loaders.errors import LoadError  # noqa: E402
from presched.workload.loaders.generic import load_generic, save_generic  # noqa: E402
from presched.workload.loaders.mooncake import load_mooncake, load_mooncake_conv  # noqa: E402
from presched.workload.loaders.sharegpt import load_sharegpt  # noqa: E402
from presched.workload.loaders.tokens import approx_tokens  # noqa: E402

__all__ = [
    "LOADERS",
    "UNTIMED",
    "LoadError",
    "approx_tokens",
    "load_azure",
    "load_azure_conv",
    "load_azure_code",
    "load_mooncake",
    "load_mooncake_conv",
    "load_castillo",
    "castillo_models",
    "load_sharegpt",
    "load_generic",
    "save_generic",
]
