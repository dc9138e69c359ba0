"""The plugin's stats file (plugin config `stats`): its counters as one JSON object, replaced
atomically (written beside it, then renamed) so that a reader never sees half a file;
`snapshot` builds that object from the scheduler, `write_failed` counts a write that failed."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any


def write_stats(path: str | Path, stats: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(stats, f)
    os.replace(tmp, path)


def snapshot(s) -> dict[str, Any]:
    """The stats object of `PreschedScheduler` `s`: policy, errors, counters, queue and KV use."""
    return {"policy": s.ps.describe(), "policy_errors": dict(s.guard.errors),
            "policy_errors_total": s.guard.total, **s.counts,
            "running": len(s.running), "waiting": len(s.waiting),
            "kv_blocks_free": s.kv_cache_manager.block_pool.get_num_free_blocks(),
            "kv_blocks_usable": s.usable_blocks, "kv_blocks_free_min": s.min_free_blocks,
            "block_size": s.block_size, "plugin_own_s": round(s.own_s, 6), "steps": s.steps}  # fmt: skip


def write_failed(counts: dict[str, int], what: str, e: Exception) -> None:
    """A stats or records write that failed: counted in `write_errors`, the first five logged."""
    counts["write_errors"] += 1
    if counts["write_errors"] <= 5:
        logging.getLogger("presched.engine.plugin").error(
            "presched: writing the %s failed (%d so far; the engine goes on): %s: %s",
            what, counts["write_errors"], type(e).__name__, e)  # fmt: skip
