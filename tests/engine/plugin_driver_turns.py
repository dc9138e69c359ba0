"""More scenarios for the real `PreschedScheduler`, driven as `plugin_driver.py` drives it (its
helpers; run in the engine venv by tests/engine/test_plugin_turns.py):

    <engine python> tests/engine/plugin_driver_turns.py MODEL_DIR TMP_DIR SCENARIO ...

prints one JSON object {scenario: observations} on its last line.
"""

from __future__ import annotations

import sqlite3
import sys

import plugin_driver as D
from vllm.config import ECTransferConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request, RequestStatus

from presched.schedule import POLICIES


class Hooks(D.Recording):
    """Records every hook with the seq's `generated` and `prompt_tokens` then, and whether the
    batch had a free slot when `admit` was asked; never preempts."""

    name = "test-hooks"
    sched = None  # the scheduler, set by the scenario

    def admit(self, seq, running, now):
        s = self.sched
        self.calls.append(("admit", seq.id, len(s.running) < s.max_num_active_reqs))
        return True

    def preempt_for(self, candidate, running, now):
        return None


def _hook(name):
    def f(self, seq, *args):
        self.calls.append((name, seq.id, seq.generated, seq.prompt_tokens))

    return f


for _name in ("on_arrival", "on_schedule", "on_tokens", "on_preempt", "on_finish", "on_cancel"):
    setattr(Hooks, _name, _hook(_name))
if "test-hooks" not in POLICIES:
    POLICIES.register("test-hooks")(Hooks)


def _hooked(plugin: dict | None = None, **kw):
    s = D.make_sched({"policy": "test-hooks", **(plugin or {})}, **kw)
    s.ps.sched = s
    return s


def admit_with_a_slot() -> dict:
    """One slot: 'long' runs, 'short' waits for three steps. Is `admit` asked about it while
    no slot is free (the simulator and the gateway ask only a head with a slot)?"""
    s = _hooked(max_num_seqs=1)
    s.add_request(D.req("long", prompt=20, max_tokens=6, arrival=1.0))
    D.step(s)
    s.add_request(D.req("short", prompt=5, max_tokens=2, arrival=2.0))
    while s.has_requests():
        D.step(s)
    return {"admits": [c for c in s.ps.calls if c[0] == "admit"],
            "scheduled": [c[1] for c in s.ps.calls if c[0] == "on_schedule"]}  # fmt: skip


def _chunk(prompt: list[int], max_tokens: int, arrival: float, rid: str = "S",
           resumable: bool = True) -> Request:
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                        extra_args={"presched_quantiles": [max_tokens] * 11})  # fmt: skip
    return Request(rid, prompt, sp, None, arrival_time=arrival, resumable=resumable)


def _close(rid: str) -> Request:
    """The end of a session's input (vLLM's finished sentinel: a request that is not resumable)."""
    return Request(rid, [0], SamplingParams(max_tokens=1), None, resumable=False)


def session_turns() -> dict:
    """A streaming-input session S (vLLM's resumable request): turn 1 (10 prompt tokens, 3
    output tokens), a pause (S keeps its blocks), a second chunk (3 tokens, 4 output tokens),
    then the end of input. What does the policy hear of S? And of S2, paused, then aborted?"""
    rec = D.TMP / "session-records.sqlite"
    s = _hooked({"records": str(rec)}, max_num_seqs=3)
    s.add_request(_chunk(list(range(1, 11)), 3, 1.0))
    for _ in range(4):
        D.step(s)
    paused = {"status": s.requests["S"].status.name, "policy_queue": [r.request_id for r in s.waiting],
              "vllm_holders": [r.request_id for r in s.kv_holding_waiting]}  # fmt: skip
    s.add_request(_chunk([50, 51, 52], 4, 2.0))
    for _ in range(6):
        D.step(s)
    s.add_request(_chunk([1, 2], 2, 3.0, rid="S2"))
    for _ in range(3):
        D.step(s)
    s.add_request(_close("S"))  # input closed while S waits for more
    s.finish_requests("S2", RequestStatus.FINISHED_ABORTED)  # its client went away
    s.shutdown()
    calls = [c for c in s.ps.calls if c[1] == "S"]
    con = sqlite3.connect(rec)
    rows = {r[0]: list(r[1:]) for r in con.execute(
        "SELECT id, status, finish_reason, output_tokens FROM requests")}  # fmt: skip
    con.close()
    return {"paused": paused, "calls": calls,
            "tokens_heard": sum(1 for c in calls if c[0] == "on_tokens"),
            "s2_end": [c[0] for c in s.ps.calls if c[1] == "S2"][-1], "records": rows,
            "counts": {k: s.counts[k] for k in ("finished", "aborted")}}  # fmt: skip


def paused_session_holds_kv() -> dict:
    """kv-admission with a 192-token limit: session S (100 prompt tokens, 3 output tokens, 7
    blocks of 16) pauses between turns holding its blocks; R (the same size, 112 tokens
    predicted) arrives. 112 + 112 > 192: R must wait while S holds its KV, and start once S
    ends. (The plugin asked `admit` with the running requests only: S's blocks were not
    counted and R was admitted.)"""
    s = D.make_sched({"policy": "kv-admission", "params": {"kv_tokens": 192}}, max_num_seqs=4)
    s.add_request(_chunk(list(range(1, 101)), 3, 1.0))
    for _ in range(4):
        D.step(s)
    held = len(s.kv_cache_manager.get_blocks("S").get_block_ids()[0])
    s.add_request(_chunk(list(range(200, 300)), 3, 2.0, rid="R", resumable=False))
    waited = [sorted(D.step(s).num_scheduled_tokens) for _ in range(2)]
    s.add_request(_close("S"))
    started = sorted(D.step(s).num_scheduled_tokens)
    return {"held_blocks": held, "while_held": waited,
            "after_close": started, "policy_errors": dict(s.guard.errors)}  # fmt: skip


def holders_fifo() -> dict:
    """Under --scheduling-policy priority (the driver's config), three sessions A, B, C (one
    arrival time: a tie for the default victim) pause in that order, then all get their next
    chunk. In what order do they resume, and is `policy.victim` asked, with no KV pressure?"""
    s = _hooked(max_num_seqs=4)
    asked, victim = [], s.ps.victim
    s.ps.victim = lambda c, now: (asked.append([x.id for x in c]), victim(c, now))[1]
    for i, rid in enumerate("ABC"):
        s.add_request(_chunk(list(range(1, 11)), 2 + i, 1.0, rid=rid))  # A's turn ends first
    for _ in range(6):
        D.step(s)
    paused = [r.request_id for r in s.kv_holding_waiting]
    for rid in "ABC":
        s.add_request(_chunk([7, 8], 2, 5.0, rid=rid))
    resumed = list(s.schedule().num_scheduled_tokens)
    return {"paused": paused, "resumed": resumed, "victim_asked": asked}


def ec_connector_refused() -> dict:
    """An encoder-cache connector (--ec-transfer-config): refused at start, naming the field?"""
    ec = ECTransferConfig(ec_connector="ECExampleConnector", ec_role="ec_consumer",
                          ec_connector_extra_config={"shared_storage_path": str(D.TMP)})
    D.VllmConfig = lambda **kw: VllmConfig(**kw, ec_transfer_config=ec)
    try:
        return {"refused": D._error(lambda: D.make_sched({"policy": "fcfs"}))}
    finally:
        D.VllmConfig = VllmConfig


SCENARIOS = {f.__name__: f for f in (admit_with_a_slot, session_turns, paused_session_holds_kv,
                                     holders_fifo, ec_connector_refused)}  # fmt: skip

if __name__ == "__main__":
    D.SCENARIOS = SCENARIOS
    D.main(sys.argv[1:])
