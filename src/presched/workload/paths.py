"""Where the shared data sets live.

The real traces and data sets are never copied into the repository; they sit in a `shared/data`
folder beside the checkout (`<repo root>/../shared/data`, which is also how CI lays it out). This
module finds that folder so loaders can default their paths to it.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "PRESCHED_DATA_DIR"


def data_dir() -> Path:
    """The shared data folder.

    Looked up in this order:

    1. the environment variable `PRESCHED_DATA_DIR` (must name an existing folder);
    2. `<repo root>/../shared/data`, the repo root found from this source file;
    3. `shared/data` in the current directory or any of its parents.

    Raises `FileNotFoundError` saying what was tried and to set `PRESCHED_DATA_DIR`.
    """
    env = os.environ.get(ENV_VAR)
    if env:
        p = Path(env).expanduser()
        if not p.is_dir():
            raise FileNotFoundError(
                f"{ENV_VAR}={env!r} is not a folder; point it at the shared data folder "
                "(the one holding azure-llm-2023/, castillo/, ...)"
            )
        return p
    tried = []
    # src/presched/workload/paths.py -> parents[3] is the repository root (src layout).
    here = Path(__file__).resolve()
    if len(here.parents) > 3:
        candidate = here.parents[3].parent / "shared" / "data"
        tried.append(candidate)
        if candidate.is_dir():
            return candidate
    cwd = Path.cwd().resolve()
    for folder in (cwd, *cwd.parents):
        candidate = folder / "shared" / "data"
        if candidate.is_dir():
            return candidate
    tried.append(cwd / "shared" / "data")
    raise FileNotFoundError(
        "cannot find the shared data folder (tried "
        + ", ".join(str(t) for t in tried)
        + " and the parents of the current directory); set the environment variable "
        f"{ENV_VAR} to the folder holding azure-llm-2023/, mooncake-fast25/, castillo/, ..."
    )
