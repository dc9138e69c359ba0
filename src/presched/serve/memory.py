"""The gateway process's live heap, for /metrics and the soak: what it holds now, as opposed to
what is resident (RSS), which stays at its high-water mark after a backlog drains.

    heap()   # {"python_allocated_blocks": ..., "malloc_in_use_bytes": ..., "malloc_free_bytes": ...}

`python_allocated_blocks`: `sys.getallocatedblocks()`, the memory blocks live Python objects
hold (every allocator; O(1)). A request held in the gateway's queue is ~166 blocks, ~19 KB
(`benchmarks/held_memory.py`). On glibc (Linux, glibc >= 2.33) also `mallinfo2`'s
`malloc_in_use_bytes` (handed out by malloc: objects over 512 bytes, C libraries) and
`malloc_free_bytes` (free, kept by malloc). Python's small objects live in its own 1 MiB arenas
(not counted by malloc); an arena goes back to the OS only when every block in it is free, so
after a backlog the blocks fall back while the arenas, pinned by a few long-lived objects each,
stay resident: see docs/gateway.md (Memory).
"""

from __future__ import annotations

import ctypes
import sys


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


def _mallinfo2():
    """glibc's `mallinfo2`, or None (not Linux, musl, glibc < 2.33)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        info = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    info.restype, info.argtypes = _Mallinfo2, []
    return info


_MALLINFO2 = _mallinfo2()


def heap() -> dict[str, int]:
    """The live heap now (see the module doc)."""
    out = {"python_allocated_blocks": sys.getallocatedblocks()}
    if _MALLINFO2 is not None:
        m = _MALLINFO2()
        out["malloc_in_use_bytes"] = m.uordblks + m.hblkhd
        out["malloc_free_bytes"] = m.fordblks
    return out
