"""Bit-identical results: fingerprints of five existing runs, computed before prefix caching
was added (commit 165cfb4) and recomputed once on purpose (2026-12-07: the step-time model stopped
reading the untied input embedding every step, and its two overheads were refit). With caching off
(the default) every timestamp, count and the inter-token-latency log must stay exactly what it
was; a change here means today's results moved.

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
    "disagg-1p2d": "744857e4cdc6179f",
    "fcfs-1": "66af75f9506e6fdd",
    "mlfq-4-least-work-oracle": "b86dafe660af40a7",
    "mooncake-2-rr-unchunked": "faeeef045f3e8923",
    "srpt-oracle-small-kv": "bfe237739d5ded63",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_results_are_unchanged(name):
    make, cfg = CASES[name]
    assert fingerprint(simulate(make(), cfg)) == GOLDEN[name]
