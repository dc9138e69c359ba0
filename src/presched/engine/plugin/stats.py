"""The plugin's stats file (plugin config `stats`): its counters as one JSON object, replaced
atomically (written beside it, then renamed) so that a reader never sees half a file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_stats(path: str | Path, stats: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(stats, f)
    os.replace(tmp, path)
