"""More scenarios for the real `PreschedScheduler`, driven as `plugin_driver.py` drives it (its
helpers; run in the engine venv by tests/engine/test_plugin_turns.py):

    <engine python> tests/engine/plugin_driver_turns.py MODEL_DIR TMP_DIR SCENARIO ...

prints one JSON object {scenario: observations} on its last line.
"""

from __future__ import annotations

import sys

import plugin_driver as D

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


def _hooked(**kw):
    s = D.make_sched({"policy": "test-hooks"}, **kw)
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


SCENARIOS = {f.__name__: f for f in (admit_with_a_slot,)}

if __name__ == "__main__":
    D.SCENARIOS = SCENARIOS
    D.main(sys.argv[1:])
