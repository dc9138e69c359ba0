"""Differential check of the simulator's scheduler against vLLM 0.32's own `Scheduler`.

Seeded random FCFS workloads (a few dozen requests each; small KV caches, so requests are
preempted; chunked prefill on or off, a long-prefill cap or none; with prefix caching, prompts
that share prefixes and later turns that hold an earlier answer) run through vLLM's scheduler
with no model (`vllm_schedule_driver.py`, in the engine venv: every step lasts 1 s, a request
whose prefill is done samples its next output token) and through presched's simulator with
constant 1 s steps and the same knobs. Every request's first-scheduled, first-token and finish
times and preemption count must be equal.

Count the workloads that differ (any N, seed offset) without pytest:

    .venv/bin/python tests/engine/test_sim_vs_vllm.py --n 500 [--caching] [--show 3]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # builders

from builders import constant_steps, make_engine, run_engine, run_engine_driver

from presched.workload.prefix import chain_hashes
from presched.workload.request import Request

DRIVER = Path(__file__).with_name("vllm_schedule_driver.py")
N_PLAIN, N_CACHING = 100, 100  # workloads per test


def workload(seed: int, caching: bool) -> dict:
    """One random workload in the driver's format (its module doc)."""
    rng = np.random.default_rng([seed, int(caching)])
    bs = int(rng.choice([4, 8, 16]))
    n = int(rng.integers(8, 33))
    chunked = bool(rng.random() < 0.8)
    seqs = int(rng.choice([2, 3, 4, 8, 16]))
    next_tok = iter(range(1000, 10**9))

    def fresh(k: int) -> list[int]:
        return [next(next_tok) for _ in range(k)]

    prefixes = [fresh(int(rng.integers(1, 12 * bs))) for _ in range(int(rng.integers(1, 4)))]
    reqs, t = [], 0.0
    for j in range(n):
        roll = rng.random()
        if caching and reqs and roll < 0.25:  # a later turn: an earlier prompt and its answer
            prev = reqs[int(rng.integers(len(reqs)))]
            prompt = prev["prompt"] + prev["output"] + fresh(int(rng.integers(1, 4 * bs)))
        elif caching and roll < 0.8:
            prefix = prefixes[int(rng.integers(len(prefixes)))]
            prompt = prefix + fresh(int(rng.integers(1, 6 * bs)))
        else:
            prompt = fresh(int(rng.integers(1, 200)))
        t += float(rng.choice([0, 0, 0, 0.25, 0.5, 1, 2, 5, 20]))  # bursts: equal arrivals
        output = fresh(int(rng.integers(1, 40)))
        reqs.append({"id": f"r{j}", "arrival": t, "prompt": prompt, "output": output})
    longest = max(len(r["prompt"]) + len(r["output"]) for r in reqs)
    budget = int(rng.choice([16, 32, 64, 128, 256, 512]))
    budget = max(budget, seqs) if chunked else max(budget, longest + 1)
    threshold = int(rng.choice([0, 0, bs * int(rng.integers(1, 6))])) if chunked else 0
    need = -(-(longest - 1) // bs)  # blocks of the largest request
    blocks = need + int(rng.integers(0, 3 * need))
    engine = {"block_size": bs, "num_blocks": blocks, "max_num_seqs": seqs,
              "max_num_batched_tokens": budget, "enable_chunked_prefill": chunked,
              "long_prefill_token_threshold": threshold, "enable_prefix_caching": caching}  # fmt: skip
    return {"engine": engine, "step": 1.0, "requests": reqs}


def simulate(wl: dict) -> dict:
    """presched's schedule: {id: [first_scheduled, first_token, finish, preemptions]}."""
    e = dict(wl["engine"])
    blocks, bs = e.pop("num_blocks"), e["block_size"]
    reqs = []
    for r in wl["requests"]:
        hashes = chain_hashes(r["prompt"] + r["output"], bs) if e["enable_prefix_caching"] else ()
        reqs.append(Request(id=r["id"], prompt_tokens=len(r["prompt"]),
                            output_tokens=len(r["output"]), arrival=r["arrival"],
                            block_hashes=hashes, hash_block_tokens=bs if hashes else 0))  # fmt: skip
    inst = make_engine("fcfs", num_blocks=blocks, step_model=constant_steps(wl["step"]), **e)
    seqs = run_engine(inst, reqs)
    return {s.id: [s.first_scheduled, s.first_token, s.finish, s.preemptions] for s in seqs}


def vllm_schedules(model: Path, workloads: list[dict]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "workloads.json"
        path.write_text(json.dumps(workloads))
        return run_engine_driver(DRIVER, str(model), str(path), timeout=900)


def differences(workloads: list[dict], schedules: list[dict]) -> list[tuple[int, dict]]:
    """(index, {id: (vLLM's, presched's)} for the requests that differ) per differing workload."""
    out = []
    for j, (wl, got) in enumerate(zip(workloads, schedules)):
        assert "error" not in got, (j, got["error"])
        sim = simulate(wl)
        diff = {rid: (v, sim[rid]) for rid, v in got.items() if v != sim[rid]}
        if diff:
            out.append((j, diff))
    return out


@pytest.fixture(scope="module")
def runs(tiny_model) -> dict:
    """Both sets of workloads and vLLM's schedules of them (one driver process: most of its
    time is importing vLLM)."""
    workloads = {caching: [workload(s, caching) for s in range(n)]
                 for caching, n in ((False, N_PLAIN), (True, N_CACHING))}  # fmt: skip
    got = vllm_schedules(tiny_model, workloads[False] + workloads[True])
    return {False: (workloads[False], got[:N_PLAIN]), True: (workloads[True], got[N_PLAIN:])}


def test_sim_schedules_as_vllm_without_prefix_caching(runs):
    assert differences(*runs[False]) == []


def test_sim_schedules_as_vllm_with_prefix_caching(runs):
    assert differences(*runs[True]) == []


def main(argv: list[str]) -> None:
    import argparse

    from presched.engine import models

    p = argparse.ArgumentParser(description="Count the random workloads whose schedules differ "
                                            "from vLLM's.")  # fmt: skip
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--start", type=int, default=0, help="first seed")
    p.add_argument("--caching", action="store_true", help="with prefix caching")
    p.add_argument("--show", type=int, default=0, help="show this many differing workloads")
    a = p.parse_args(argv)
    seeds = list(range(a.start, a.start + a.n))
    workloads = [workload(s, a.caching) for s in seeds]
    got = vllm_schedules(models.ensure_tiny_llama(), workloads)
    diff = [(seeds[j], d) for j, d in differences(workloads, got)]
    for seed, d in diff[: a.show]:
        print(f"seed {seed}: {len(d)} requests differ, e.g. " + ", ".join(
            f"{rid}: vllm {v} sim {s}" for rid, (v, s) in list(d.items())[:3]))  # fmt: skip
    print(f"{len(diff)} of {a.n} {'caching' if a.caching else 'plain'} workloads differ"
          f" (seeds {a.start}-{a.start + a.n - 1}): {[s for s, _ in diff]}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
