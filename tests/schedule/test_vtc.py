"""vtc: Virtual Token Counter fair share, driven through a real engine (1 s per step).

The bound checked here. VTC's Theorem (OSDI'24): two tenants f, g backlogged over an interval get
service that differs by at most 2 * max(w_in * L_in, w_out * M), L_in the longest prompt, M the
tokens the running batch holds (S-LoRA reserves memory for the whole output, so M also bounds
what the running requests still generate). Under presched's vLLM-style batching the same argument
gives, for counters c = service / weight of two tenants backlogged since the start:

    c_f - c_g <= (w_in * P_max + w_out * N * L_max) / weight_f

Let tau be the last event with c_f <= c_g. After it f is never picked (g is backlogged and
lower), so c_f grows only by the event at tau (at most one prompt) and by the tokens f's running
requests still generate: at most N (max_num_seqs) requests of at most L_max tokens. That is
the paper's form with M = N * L_max, and <= its 2 * max(...). FCFS violates it on the same input.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import assert_fast_forward_exact, make_engine, make_estimates, make_requests, run_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.predict.noisy_oracle import noisy_oracle
from presched.schedule import POLICIES
from presched.schedule.queue import WaitingQueue
from presched.schedule.vtc import VTC
from presched.sim.seq import Seq
from presched.workload.request import Request


class MeteredFCFS(VTC):
    """VTC's accounting with a plain FCFS queue: how FCFS would share service."""

    name = "vtc-metered-fcfs"

    def new_queue(self):
        return WaitingQueue(self)


def drive(policy, requests, check=None, estimates=None, **engine):
    """Run to completion one step at a time (no fast-forward); `check(inst, t)` after each step."""
    inst = make_engine(policy, fast_forward=False, **engine)
    seqs = [Seq(r, i) for i, r in enumerate(requests)]
    for s in seqs:
        s.estimate = estimates[s.index] if estimates is not None else None
    pending = sorted(seqs, key=lambda s: (s.arrival, s.index))
    t = 0.0
    while pending or inst.sched.has_work():
        t += 0.5
        while pending and pending[0].arrival < t:
            s = pending.pop(0)
            inst.advance(s.arrival)
            inst.add(s, s.arrival)
        inst.advance(t)
        if check is not None:
            check(inst, t)
    return seqs, inst


def backlogged(inst):
    return {s.request.tenant for s in inst.sched.waiting}


# A: big prompts, B: tiny requests, C: long outputs; all arrive at t=0, in rounds A, B, C
SIZES = {"A": (32, 8), "B": (4, 2), "C": (8, 16)}
N = 4


def three_tenants(rounds=40):
    lengths = [SIZES[t] for _ in range(rounds) for t in "ABC"]
    return make_requests(lengths, arrivals=[0.0] * len(lengths), tenants=("A", "B", "C"))


def max_gap_while_backlogged(policy, requests, weights=None):
    gaps = []

    def check(inst, t):
        b = backlogged(inst)
        if len(b) >= 2:
            c = [policy.counters.get(x, 0.0) for x in b]
            gaps.append(max(c) - min(c))

    seqs, inst = drive(policy, requests, check, max_num_seqs=N)
    assert inst.sched.num_preemptions == 0 and all(s.generated == s.target for s in seqs)
    return max(gaps), len(gaps)


def test_vtc_keeps_backlogged_tenants_within_the_bound_and_fcfs_does_not():
    p_max = max(p for p, _ in SIZES.values())
    l_max = max(o for _, o in SIZES.values())
    bound = 1.0 * p_max + 2.0 * N * l_max  # = 160; the paper's 2 * max(...) form is 256
    gap, checks = max_gap_while_backlogged(POLICIES.create("vtc"), three_tenants())
    assert checks >= 30  # the tenants stay backlogged together for a long stretch
    assert gap <= bound
    fcfs_gap, _ = max_gap_while_backlogged(MeteredFCFS(), three_tenants())
    assert fcfs_gap > 2 * bound  # FCFS: A gains 40 more than B every round


def test_weighted_tenants_get_service_in_proportion_to_weights():
    lengths = [(8, 8)] * 240
    reqs = make_requests(lengths, arrivals=[0.0] * 240, tenants=("gold", "free"))
    pol = POLICIES.create("vtc", weights={"gold": 2.0, "free": 1.0})
    ratios = []

    def check(inst, t):
        if backlogged(inst) == {"gold", "free"}:
            ratios.append(pol.service["gold"] / pol.service["free"])
            # service / weight within the bound: |S_gold / 2 - S_free| <= P + 2 N L
            assert abs(pol.counters["gold"] - pol.counters["free"]) <= (8 + 2 * N * 8) / 1.0

    drive(pol, reqs, check, max_num_seqs=N)
    assert len(ratios) > 100
    assert ratios[-1] == pytest.approx(2.0, abs=0.05)  # the gap is bounded, the service grows
    # FCFS on the same input: one request each in turn, ratio ~1
    fcfs = MeteredFCFS(weights={"gold": 2.0, "free": 1.0})
    drive(fcfs, reqs, max_num_seqs=N)
    assert fcfs.service["gold"] == fcfs.service["free"]


def start_order(seqs):
    return [s.id for s in sorted(seqs, key=lambda s: (s.first_scheduled, s.index))]


# r0 (A) runs alone from t=0; at t=0.1 A and B queue up: A: r1 (9), r3 (3), r5 (1); B: r2 (3), r4 (1)
INNER_CASE = {
    "lengths": [(4, 2), (4, 9), (4, 3), (4, 3), (4, 1), (4, 1)],
    "arrivals": [0.0, 0.1, 0.1, 0.1, 0.1, 0.1],
    "tenants": ("A", "A", "B", "A", "B", "A"),
}


@pytest.mark.parametrize("inner", ["sjf-oracle", "sjf"])
def test_vtc_with_inner_sjf_orders_within_a_tenant(inner):
    reqs = make_requests(**INNER_CASE)
    est = make_estimates([r.output_tokens for r in reqs])
    seqs, _ = drive(POLICIES.create("vtc", inner=inner), reqs, estimates=est, max_num_seqs=1)
    # t=2: c_A = 4 + 2*2 = 8, c_B lifted to 4 at t=0.1 -> B's shortest r4 (c_B 10); t=3: A's
    # shortest r5 (c_A 14); t=4: B r2 (c_B 20); t=7: A r3 (c_A 24); t=10: r1
    assert start_order(seqs) == ["r0", "r4", "r5", "r2", "r3", "r1"]
    fcfs_inner, _ = drive(POLICIES.create("vtc"), reqs, max_num_seqs=1)
    assert start_order(fcfs_inner) == ["r0", "r2", "r1", "r4", "r3", "r5"]


def test_counter_lift_to_the_backlogged_minimum_and_to_the_last_tenant_to_leave():
    # A is backlogged from t=0 (one slot, 10 requests); B's first request arrives at t=20.5
    lengths = [(4, 4)] * 10 + [(4, 4)]
    reqs = make_requests(lengths, arrivals=[0.0] * 10 + [20.5], tenants=("A",) * 10 + ("B",))
    pol = POLICIES.create("vtc")
    seen = {}

    def check(inst, t):
        if t == 21.0:
            seen["B"], seen["A"] = pol.counters["B"], pol.counters["A"]

    drive(pol, reqs, check, max_num_seqs=1)
    # lifted to c_A when B is added: 5 requests done (12 each), the 6th admitted at t=20 (4) and
    # its token of the step 20 -> 21 (2; the step had started, B joins after it)
    assert seen["B"] == 5 * 12 + 4 + 2
    assert seen["A"] == seen["B"]
    # no other tenant backlogged: lift to the tenant that left the queue last
    reqs = make_requests([(4, 2), (4, 2)], arrivals=[0.0, 10.0], tenants=("A", "B"))
    pol = POLICIES.create("vtc")
    drive(pol, reqs, max_num_seqs=1)
    assert pol.counters["B"] == pytest.approx(8.0 + 8.0)  # lifted to c_A = 4 + 2*2, then served 8


def test_a_late_tenant_cannot_starve_the_others_after_the_lift():
    # A busy from t=0; B arrives at t=30 with many requests: it alternates with A instead of
    # running alone until its counter catches up (which it would without the lift)
    lengths = [(4, 4)] * 40 + [(4, 4)] * 20
    reqs = make_requests(
        lengths, arrivals=[0.0] * 40 + [30.0] * 20, tenants=("A",) * 40 + ("B",) * 20
    )
    seqs, _ = drive(POLICIES.create("vtc"), reqs, max_num_seqs=1)
    after = [s.request.tenant for s in sorted(seqs, key=lambda s: s.first_scheduled)
             if s.first_scheduled > 30.0][:10]  # fmt: skip
    assert after.count("A") >= 4 and after.count("B") >= 4


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 40), st.integers(1, 20), st.sampled_from("XYZ")),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from([None, "moving-average", "mean"]),
)
def test_service_adds_up_to_the_tokens_served_whatever_the_advance_charge(data, charge):
    reqs = make_requests(
        [(p, o) for p, o, _ in data], tenants=tuple(t for _, _, t in data), rate=2.0, seed=1
    )
    est = make_estimates([max(1, o + 3) for _, o, _ in data])  # predictions off by 3 tokens
    pol = POLICIES.create("vtc", charge_predicted=charge, w_in=1.0, w_out=2.0)
    seqs, _ = drive(pol, reqs, estimates=est, max_num_seqs=3, num_blocks=30, block_size=4)
    want = {}
    for s in seqs:
        want[s.request.tenant] = want.get(s.request.tenant, 0) + s.prompt_tokens + 2 * s.generated
    assert pol.service == pytest.approx(want)


def test_the_head_tenant_changes_only_at_events_so_fast_forward_is_exact():
    # a0 (A) runs from t=0; a1 (A, 95-token prompt: no room beside a0) waits from 0.5, b0 (B,
    # fits) from 0.6, lifted to c_A. a0's tokens raised c_A above c_B at every decode step, so
    # stepping started b0 at t=2 while a fast-forwarded run (no event until a0 ends) kept a1 as
    # the head until t=60. Tokens are now charged at events: both modes keep A at the head
    reqs = [
        Request(id="a0", prompt_tokens=10, output_tokens=60, arrival=0.0, tenant="A"),
        Request(id="a1", prompt_tokens=95, output_tokens=5, arrival=0.5, tenant="A"),
        Request(id="b0", prompt_tokens=5, output_tokens=5, arrival=0.6, tenant="B"),
    ]
    runs = []
    for ff in (True, False):
        inst = make_engine("vtc", num_blocks=100, fast_forward=ff, max_num_seqs=4, block_size=1)
        runs.append([(s.first_scheduled, s.finish) for s in run_engine(inst, reqs)])
    assert runs[0] == runs[1] == [(0.0, 60.0), (60.0, 65.0), (60.0, 69.0)]


def test_tokens_reach_the_counters_at_the_next_event():
    pol = POLICIES.create("vtc")
    a, b = (Seq(r, i) for i, r in enumerate(make_requests([(10, 50), (4, 5)], tenants=("A", "B"))))
    q = pol.new_queue()
    for s in (a, b):
        pol.on_arrival(s, 0.0)
        q.push(s, 0.0)
    q.update(0.0)
    assert q.pop() is a
    pol.on_schedule(a, 0.0)
    for g in range(1, 4):  # decode steps: no event, the counter stays
        a.generated = g
        pol.on_tokens(a, 1, float(g))
        q.update(float(g))
        assert pol.counters["A"] == 10.0 and q.peek() is b
    pol.on_preempt(a, 4.0)  # an event: A is charged its 3 tokens
    assert pol.counters["A"] == 10.0 + 2 * 3
    a.generated = 5
    pol.on_tokens(a, 2, 5.0)
    pol.on_finish(a, 5.0)  # a completion settles too (and the next decision once more)
    assert pol.counters["A"] == 10.0 + 2 * 5 and pol.service["A"] == 20.0


def test_with_hrrn_inside_a_request_overtaking_its_tenants_head_ends_a_decode_run():
    # 1 s steps, KV 200. r0 (C) holds the KV from t=0 so that h (A) and g (B, the highest ratio:
    # S = 1) cannot start; c_B > c_A (b0's prompt), so A's head goes first. y (A, fits) overtakes
    # h inside A at t = 6.7 and starts at the next step. hrrn's own wakeup looks only at the
    # overall first (g, which nobody overtakes): fast-forward ran to r0's end and started y at 40
    R = Request
    reqs = [R(id="b0", prompt_tokens=100, output_tokens=2, arrival=0.0, tenant="B"),
            R(id="r0", prompt_tokens=60, output_tokens=40, arrival=0.0, tenant="C"),
            R(id="h", prompt_tokens=160, output_tokens=20, arrival=2.2, tenant="A"),
            R(id="g", prompt_tokens=160, output_tokens=1, arrival=2.3, tenant="B"),
            R(id="y", prompt_tokens=5, output_tokens=16, arrival=3.1, tenant="A")]  # fmt: skip
    est = make_estimates([r.output_tokens for r in reqs])
    runs = []
    for ff in (True, False):
        pol = POLICIES.create("vtc", inner="hrrn", inner_params={"stat": "median"})
        inst = make_engine(pol, num_blocks=200, block_size=1, max_num_seqs=4, fast_forward=ff)
        runs.append({s.id: s.first_scheduled for s in run_engine(inst, reqs, est)})
    assert runs[0] == runs[1] and runs[1]["y"] == 7.0


MULTI_TENANT = [
    {}, {"inner": "sjf"}, {"inner": "srpt", "inner_params": {"recompute_weight": 0.0}},
    {"inner": "hrrn"}, {"inner": "rank", "inner_params": {"starvation_s": 1.0}},
    {"charge_predicted": "mean"}, {"charge_predicted": "moving-average", "weights": {"a": 3.0}},
    {"inner": "mlfq", "inner_params": {"preempt": True, "recompute_weight": 0.0, "base_quantum": 4.0}},
]  # fmt: skip


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.integers(1, 60), st.integers(1, 60), st.sampled_from([0.0, 0.1, 0.5, 2.0]),
                       st.sampled_from("abc")), min_size=2, max_size=18),  # fmt: skip
    st.sampled_from(MULTI_TENANT),
    st.booleans(),
    st.sampled_from([1, 4, 16]),
    st.integers(1, 5),
)
def test_property_fast_forward_is_exact_with_several_tenants(data, params, wrapped, bs, slots):
    """vtc (and kv-admission around it) with several tenants, tight KV, noisy predictions:
    fast-forward on and off give the same timelines and preemptions."""
    t, arrivals = 0.0, []
    for _, _, gap, _ in data:
        t += gap
        arrivals.append(t)
    reqs = make_requests([(p, o) for p, o, _, _ in data], arrivals)
    reqs = [replace(r, tenant=x) for r, (*_, x) in zip(reqs, data)]
    est = noisy_oracle(reqs, 0.7, seed=len(data))
    num_blocks = max(-(-(p + o) // bs) for p, o, _, _ in data) + 3
    def make():
        if wrapped:
            return POLICIES.create("kv-admission", inner="vtc", inner_params=params)
        return POLICIES.create("vtc", **params)

    assert_fast_forward_exact(make, reqs, est, num_blocks=num_blocks, block_size=bs, max_num_seqs=slots,
                              max_num_batched_tokens=64)  # fmt: skip


def cycle(pol, q, tenant, i, now, prompt=4):
    """One request of `tenant` arrives, starts and finishes at `now` (2 tokens)."""
    s = Seq(Request(id=f"r{i}", prompt_tokens=prompt, output_tokens=2, arrival=now, tenant=tenant), i)
    pol.on_arrival(s, now)
    q.push(s, now)
    q.update(now)
    x = q.pop()
    pol.on_schedule(x, now)
    x.generated = 2
    pol.on_tokens(x, 2, now)
    pol.on_finish(x, now)


def test_tenant_churn_keeps_no_empty_queue_and_a_bounded_number_of_idle_tenants():
    # one tenant per user: the queue kept an empty WaitingQueue for every tenant ever seen and
    # scanned them all at each decision; the policy kept every counter
    pol = POLICIES.create("vtc", max_idle_tenants=20)
    q = pol.new_queue()
    for i in range(500):
        cycle(pol, q, f"user{i}", i, float(i))
    s = Seq(Request(id="w", prompt_tokens=4, output_tokens=2, arrival=600.0, tenant="x"), 600)
    pol.on_arrival(s, 600.0)  # an event: the last idle tenant is counted
    q.push(s, 600.0)
    assert list(q.queues) == ["x"]  # backlogged tenants only
    kept = set(pol.counters)
    assert len(kept) <= 22 and {"x", "user499"} <= kept  # 20 idle, the last to leave, x
    for d in (pol.service, pol._first):
        assert set(d) <= kept
    assert len(pol._idle) <= 21 and len(pol._idle_heap) <= 2 * 21 + 64 and not pol._live.keys() - {"x"}


def test_idle_tenants_past_the_bound_are_forgotten_smallest_counter_first():
    pol = POLICIES.create("vtc", max_idle_tenants=1)
    q = pol.new_queue()
    cycle(pol, q, "big", 0, 0.0, prompt=100)  # c = 104
    cycle(pol, q, "small", 1, 1.0, prompt=1)  # lifted to 104, then 109
    cycle(pol, q, "last", 2, 2.0, prompt=1)  # lifted to 109: the last to leave, always kept
    s = Seq(Request(id="a", prompt_tokens=1, output_tokens=2, arrival=3.0, tenant="new"), 3)
    pol.on_arrival(s, 3.0)  # three idle tenants, one allowed: big goes (the smallest), then small
    assert set(pol.counters) == {"last"} and pol.counters["last"] == 114.0
    q.push(s, 3.0)  # a new tenant is lifted to the last to leave
    assert pol.counters["new"] == 114.0
    # a forgotten tenant comes back as a new one: lifted to the backlogged minimum
    b = Seq(Request(id="b", prompt_tokens=1, output_tokens=2, arrival=4.0, tenant="big"), 4)
    pol.on_arrival(b, 4.0)
    q.push(b, 4.0)
    assert pol.counters["big"] == 114.0 and pol._first["big"] > pol._first["new"]
    assert q.pop() is s  # equal counters: the earlier head arrival


def test_bad_config_names_the_field():
    for kwargs, field in [
        ({"w_in": -1}, "w_in"), ({"w_out": "x"}, "w_out"), ({"weights": {"a": 0}}, r"weights\.a"),
        ({"charge_predicted": "rank"}, "charge_predicted"), ({"inner": "vtc"}, "inner"),
        ({"inner_params": {"bogus": 1}}, r"inner_params\.bogus"),
        ({"max_idle_tenants": -1}, "max_idle_tenants"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=rf"^{field}: "):
            POLICIES.create("vtc", **kwargs)
