"""CPU affinity for benchmarks on a small machine: give the engine core its own CPU.

On a 2-core box the engine core (vLLM's busy stepping loop), its API server, the gateway and the
load generator all compete for the same two CPUs, and the engine's speed then depends on how
busy the others are (measured: ~7 % slower per token with the gateway in the path, which at
saturation moved mean E2E by 30-60 %). In a deployment the gateway and the clients run
elsewhere. `isolate_engine_core` recreates that: the engine-core process on one CPU, everything
else (API server, gateway, load generator: whoever calls `pin` first) on the others.

Linux only (`os.sched_setaffinity`); every thread of a process is moved (the call itself moves one
thread: threads started later inherit from the thread that starts them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path


def pin(pid: int, cpus: set[int]) -> None:
    """Move every thread of process `pid` onto `cpus` (children started later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass  # the thread ended meanwhile


def stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (0: state, 1: ppid, 2: pgrp, 11/12:
    utime/stime in clock ticks), or None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def processes() -> Iterator[tuple[int, list[str]]]:
    """(pid, `stat` fields) of every live process."""
    for d in os.listdir("/proc"):
        if d.isdigit() and (f := stat(int(d))) is not None:
            yield int(d), f


def children(pid: int) -> list[int]:
    """Live child processes of `pid`."""
    return [c for c, f in processes() if int(f[1]) == pid]


def engine_core_pid(server_pid: int) -> int | None:
    """The vLLM engine-core process started by the API server `server_pid` (its process title
    is `VLLM::EngineCore`), or None."""
    for c in children(server_pid):
        try:
            cmd = Path(f"/proc/{c}/cmdline").read_bytes()
        except OSError:
            continue
        if b"EngineCore" in cmd:
            return c
    return None


def split_cpus() -> tuple[set[int], set[int]] | None:
    """(engine core's CPU, everyone else's CPUs) from this process's allowed CPUs, or None when
    fewer than two are allowed (nothing to isolate)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return {cpus[0]}, set(cpus[1:])


def isolate_engine_core(server_pid: int, core_cpus: set[int]) -> int:
    """Pin the engine core of the API server `server_pid` onto `core_cpus`; returns its pid.
    Raises RuntimeError when there is no engine-core process (vLLM's offline mode)."""
    core = engine_core_pid(server_pid)
    if core is None:
        raise RuntimeError(f"no VLLM::EngineCore child of process {server_pid}")
    pin(core, core_cpus)
    return core
