"""engine/affinity.py: moving a process's threads between CPUs, finding vLLM's engine core.
The first three tests need no engine (this folder's tests carry the `engine` marker anyway); the
last one pins the shared real engine's core and puts it back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from presched.engine import affinity

THREADS = """import threading, time
for _ in range(3):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def child():
    """A child process with four threads, killed afterwards."""
    p = subprocess.Popen([sys.executable, "-c", THREADS], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    yield p
    p.kill()
    p.wait()


def _affinities(pid: int) -> list[set[int]]:
    return [os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")]


def test_pin_moves_every_thread_and_children_lists_the_process(child):
    allowed = os.sched_getaffinity(0)
    one = {min(allowed)}
    assert child.pid in affinity.children(os.getpid())
    affinity.pin(child.pid, one)
    affs = _affinities(child.pid)
    assert len(affs) == 4 and all(a == one for a in affs)  # not only the main thread
    affinity.pin(child.pid, allowed)
    assert all(a == allowed for a in _affinities(child.pid))


def test_split_cpus_gives_the_engine_core_one_cpu_and_the_rest_to_everyone_else():
    allowed = os.sched_getaffinity(0)
    split = affinity.split_cpus()
    if len(allowed) < 2:
        assert split is None
        return
    core, rest = split
    assert len(core) == 1 and core | rest == allowed and not core & rest


def test_a_process_without_an_engine_core_is_refused(child):
    assert affinity.engine_core_pid(child.pid) is None
    with pytest.raises(RuntimeError, match="no VLLM::EngineCore child"):
        affinity.isolate_engine_core(child.pid, {min(os.sched_getaffinity(0))})


def test_the_real_engine_core_is_found_and_pinned(tiny_engine):
    allowed = os.sched_getaffinity(0)
    one = {min(allowed)}
    core = affinity.isolate_engine_core(tiny_engine.proc.pid, one)
    try:
        assert core != tiny_engine.proc.pid and core in affinity.children(tiny_engine.proc.pid)
        assert all(a == one for a in _affinities(core))
        assert all(a == allowed for a in _affinities(tiny_engine.proc.pid))  # the API server stays
    finally:
        affinity.pin(core, allowed)
