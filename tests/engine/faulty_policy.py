"""A test-only policy for tests/engine/test_plugin.py, loaded into the engine through the plugin
config's `imports`: `sjf` that raises on purpose in the hook a request names in its vllm_xargs
(`test_fault`: "priority", "on_tokens", "admit" or "on_arrival"); on every other request it is
`sjf`, hook for hook, so one engine serves the order tests and the fault test. It stands in
for a buggy policy (the real policies do not raise on valid input)."""

from presched.engine.plugin.seq import xargs_of
from presched.schedule import POLICIES
from presched.schedule.sjf import SJF


def _fault(seq) -> str | None:
    vreq = getattr(seq, "vreq", None)
    return xargs_of(vreq).get("test_fault") if vreq is not None else None


class FaultySJF(SJF):
    name = "test-faulty"

    def priority(self, seq, now):
        if _fault(seq) == "priority":
            raise RuntimeError("injected fault in priority")
        return super().priority(seq, now)

    def admit(self, seq, running, now):
        if _fault(seq) == "admit":
            raise RuntimeError("injected fault in admit")
        return super().admit(seq, running, now)

    def on_arrival(self, seq, now):
        if _fault(seq) == "on_arrival":
            raise RuntimeError("injected fault in on_arrival")
        super().on_arrival(seq, now)

    def on_tokens(self, seq, num_tokens, now):
        if _fault(seq) == "on_tokens":
            raise RuntimeError("injected fault in on_tokens")
        super().on_tokens(seq, num_tokens, now)


if "test-faulty" not in POLICIES:
    POLICIES.register("test-faulty")(FaultySJF)
