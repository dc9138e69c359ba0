"""Bit-identical results: fingerprints of five existing runs, computed before prefix caching
was added (commit 165cfb4). With caching off (the default) every timestamp, count and the
inter-token-latency log must stay exactly what it was; a change here means today's results moved.

Each fingerprint is the SHA-256 of every record column (ids, timestamps, counts, instances) and
the ITL log, in request order, plus the step, run and preemption counts."""

import pytest
from builders import fingerprint

from presched.sim import SimConfig, simulate
from presched.sim.config import DisaggConfig
from presched.workload.config import WorkloadConfig, build_workload


def default(n):
    return build_workload(WorkloadConfig(num_requests=n))


def mooncake(n):
    return build_workload(WorkloadConfig(source="mooncake-conv", num_requests=n))


CASES = {
    "fcfs-1": (lambda: default(600), SimConfig()),
    "srpt-oracle-small-kv": (lambda: default(400), SimConfig(
        policy="srpt-oracle", engine=dict(num_blocks=2000, max_num_seqs=32))),
    "mlfq-4-least-work-oracle": (lambda: default(600), SimConfig(
        policy="mlfq", policy_params=dict(preempt=True), num_instances=4,
        router="least-work-oracle")),
    "mooncake-2-rr-unchunked": (lambda: mooncake(300), SimConfig(
        num_instances=2, router="round-robin",
        engine=dict(enable_chunked_prefill=False, max_num_batched_tokens=16384, num_blocks=8000))),
    "disagg-1p2d": (lambda: default(400), SimConfig(
        disaggregated=DisaggConfig(num_prefill=1, num_decode=2))),
}

GOLDEN = {
    "disagg-1p2d": "8db98044bff6fd64",
    "fcfs-1": "194da0fbd2bc2817",
    "mlfq-4-least-work-oracle": "d4146b6b7b0f0b77",
    "mooncake-2-rr-unchunked": "7f6446d5906241e4",
    "srpt-oracle-small-kv": "8bd2b90fa99c3cda",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_results_are_unchanged(name):
    make, cfg = CASES[name]
    assert fingerprint(simulate(make(), cfg)) == GOLDEN[name]
