"""The simulator's hybrid KV cache (sim/steptime/hybrid.py, memory.py; the scheduler's state
blocks) against vLLM 0.32's own code: `hybrid_kv_driver.py`, in the engine venv, has vLLM align
the block size, group the layers, size the cache for the simulator's budget and admit requests
into it with its KVCacheManager (~25 s, most of it importing vLLM). Same block size, page,
groups and num_blocks; the same number of requests admitted (vLLM keeps one null block, which
these cases leave unused); every block returned once they are freed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from builders import make_requests, require_engine, run_engine_driver

from presched.schedule import POLICIES
from presched.sim.config import EngineConfig
from presched.sim.scheduler import Scheduler
from presched.sim.seq import Seq
from presched.sim.steptime import get_hardware, get_model, kv_cache_blocks
from presched.sim.steptime.hybrid import hybrid_kv_layout
from presched.sim.steptime.memory import DEFAULT_ACTIVATION_RESERVE_BYTES
from presched.sim.steptime.presets import _HF_PRESETS

DRIVER = Path(__file__).with_name("hybrid_kv_driver.py")
CASES = [("nemotron-nano-9b-v2", 1, [1100, 4100]), ("nemotron-nano-9b-v2", 2, [1100]),
         ("nemotron-nano-12b-v2", 1, [1100])]  # fmt: skip


def budget(name: str, tp: int) -> int:
    """The simulator's KV budget per GPU on one H100 at 0.9 (vLLM's available_memory)."""
    m, h = get_model(name), get_hardware("h100-sxm")
    return int(0.9 * h.mem_capacity - m.weight_bytes_per_gpu(tp) - DEFAULT_ACTIVATION_RESERVE_BYTES)


def admitted(name: str, tp: int, length: int) -> int:
    layout = hybrid_kv_layout(get_model(name), tp)
    engine = EngineConfig(block_size=layout.block_size, state_blocks=layout.state_blocks,
                          max_num_seqs=2**20, max_num_batched_tokens=2**30)  # fmt: skip
    sched = Scheduler(engine, kv_cache_blocks(get_model(name), get_hardware("h100-sxm"), tp=tp),
                      POLICIES.create("fcfs"))  # fmt: skip
    for i, r in enumerate(make_requests([(length, 1)] * 2000, [0.0] * 2000)):
        sched.add(Seq(r, i), 0.0)  # a prompt of `length` tokens, as the driver's requests
    sched.schedule(0.0)
    return len(sched.running)


@pytest.fixture(scope="module")
def vllm_results() -> list[dict]:
    require_engine()
    patterns = {n: cfg.get("hybrid_override_pattern") for n, cfg, _ in _HF_PRESETS}
    cases = [dict(pattern=patterns[n], tp=tp, available=budget(n, tp), lengths=lengths)
             for n, tp, lengths in CASES]  # fmt: skip
    return run_engine_driver(DRIVER, json.dumps(cases))


@pytest.mark.parametrize("i", range(len(CASES)))
def test_the_simulators_hybrid_kv_cache_is_vllms(vllm_results, i):
    name, tp, lengths = CASES[i]
    got, m = vllm_results[i], get_model(name)
    layout = hybrid_kv_layout(m, tp)
    assert (got["block_size"], got["page_bytes"]) == (layout.block_size, layout.page_bytes)
    state_groups = [n for kind, n in got["groups"] if kind == "MambaSpec"]
    attention_groups = [n for kind, n in got["groups"] if kind == "FullAttentionSpec"]
    assert (len(state_groups), len(attention_groups)) == (layout.state_groups, 1)
    assert max(state_groups + attention_groups) == layout.group_size
    assert sum(state_groups) == m.num_ssm_layers and attention_groups == [m.attention_layers]
    assert got["num_blocks"] == kv_cache_blocks(m, get_hardware("h100-sxm"), tp=tp)
    for length in lengths:
        expect = admitted(name, tp, length)
        assert got["admitted"][str(length)] == expect
        assert expect == got["num_blocks"] // (layout.state_blocks + math.ceil(length / 1312))
    assert got["returned"]
