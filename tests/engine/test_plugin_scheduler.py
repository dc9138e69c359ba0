"""The real `PreschedScheduler` (vLLM 0.32's Scheduler subclass) driven step by step without a
model: vLLM's own schedule(), update_from_output(), preemption and admission run; only the
workers' outputs are made up (`plugin_driver.py`, run in the engine venv, since vLLM is not
importable here). One driver process runs every scenario (~15 s, most of it importing vLLM).

- a request that stops while preempted (vLLM's batch-queue order: schedule() again before the
  previous step's output) leaves the policy's queue; it stayed there and the next schedule()
  crashed the engine (RuntimeError: Invalid request status: FINISHED_LENGTH_CAPPED);
- async scheduling and pipeline parallelism (a batch queue) are refused at start, naming
  --no-async-scheduling;
- no preemption for a head vLLM skips (its structured-output grammar still compiling): the
  victim was preempted (recomputed) every step and re-admitted; once the grammar is ready the
  head gets its preemption; nor does `admit` gate such a head (kv-admission's refusal of it
  ended admission, so the request behind it that fits did not start);
- FINISHED_ERROR is recorded as status 500 with an error and finish_reason 'error', left out
  of training data by the log reader, and the policy hears on_cancel (it heard on_finish, and
  the row was a 200 whose cut-short length became a label);
- `slo` reads each request's SLOs from vllm_xargs (presched_slo_e2e / presched_slo_ttft): every
  priority() raised and every request went through the FCFS fallback;
- preempting for the head is all or nothing: a victim whose blocks alone leave the head short
  is not preempted (the greedy loop preempted it, and it waited behind a head that could not
  start); it is once they are enough, in the step the head starts; "enough" as vLLM counts it
  (the whole prompt under vLLM 0.32's scheduler_reserve_full_isl, the blocks the running
  requests take first in the step), and the head is popped first in that step only.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from builders import run_engine_driver

from presched.serve.log_read import load_log_requests

DRIVER = Path(__file__).with_name("plugin_driver.py")
SCENARIOS = ("stopped_while_preempted", "batch_queue_refused", "grammar_head_preempt_for",
             "grammar_head_admit", "error_finish", "slo_from_xargs", "preempt_for_all_or_nothing",
             "preempt_for_counts_as_vllm", "fits_edge_cases", "head_cache_hit", "refused_once",
             "write_failures", "paused_no_preempt_for")  # fmt: skip


@pytest.fixture(scope="module")
def driven(tiny_model, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("driver")
    return run_engine_driver(DRIVER, str(tiny_model), str(tmp), *SCENARIOS)


def _ok(driven, name: str) -> dict:
    got = driven[name]
    assert "error" not in got, got["error"]
    return got


def test_a_request_that_stops_while_preempted_leaves_the_policy_queue(driven):
    got = _ok(driven, "stopped_while_preempted")
    assert got["r0_after_second_schedule"] == "PREEMPTED"  # the path is taken
    assert got["waiting_after_r0_stopped"] == []
    assert got["crash"] is None
    assert got["unfinished"] == 0
    assert [c for c in got["calls"] if c[0] == "on_finish"] == [["on_finish", "r0"], ["on_finish", "r1"]]


def test_async_scheduling_and_pipeline_parallelism_are_refused(driven):
    got = _ok(driven, "batch_queue_refused")
    for key in ("async", "pipeline"):
        assert got[key].startswith("PluginConfigError:") and "--no-async-scheduling" in got[key]
    assert "pipeline_parallel_size=2" in got["pipeline"]
    assert got["sync"] is None


def test_no_preemption_for_a_head_whose_grammar_is_compiling(driven):
    got = _ok(driven, "grammar_head_preempt_for")
    assert got["while_compiling"] == [{"scheduled": ["long"], "long_preemptions": 0}] * 3
    # compiled (status still WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR until vLLM's loop reaches it,
    # which a full batch never lets it): now the policy's preemption is taken, once
    assert got["ready"] == {"scheduled": ["json-short"], "long_preemptions": 1}
    assert got["preempt_for_count"] == 1


def test_admit_does_not_gate_a_head_vllm_skips(driven):
    got = _ok(driven, "grammar_head_admit")
    assert got["scheduled"] == ["long", "small"]
    assert got["policy_errors"] == {}


def test_an_engine_error_is_a_500_not_a_label_and_a_cancel(driven):
    got = _ok(driven, "error_finish")
    assert got["calls"] == [["on_finish", "ok"], ["on_cancel", "e1"]]
    assert (got["errors"], got["finished"]) == (1, 1)
    con = sqlite3.connect(got["records"])
    rows = {r[0]: r[1:] for r in con.execute(
        "SELECT id, status, error, finish_reason, output_tokens FROM requests")}  # fmt: skip
    status, error, reason, tokens = rows["e1"]
    assert (status, reason, tokens) == (500, "error", 4)
    assert "FINISHED_ERROR" in error
    assert rows["ok"] == (200, None, "length", 2)
    log = load_log_requests(got["records"], keep_censored=True)  # `presched train --from-log`
    assert [r.id for r in log.requests] == ["ok"]
    assert log.dropped["status"] == 1


def test_slo_reads_each_requests_slos_from_vllm_xargs(driven):
    got = _ok(driven, "slo_from_xargs")
    assert got["slos"] == {"first": [60.0, None], "long": [60.0, None], "mid": [None, 30.0],
                           "short": [60.0, None], "bad": [None, None]}  # fmt: skip
    # feasible ones by predicted service; `bad` (an unusable SLO, counted) has none: the policy
    # raises for it alone and the Guard serves it first, FCFS
    assert got["order"] == ["first", "bad", "short", "mid", "long"]
    assert got["policy_errors"] == {"priority": 1}
    assert got["bad_xargs"] == 1


def test_preempting_for_the_head_is_all_or_nothing(driven):
    got = _ok(driven, "preempt_for_all_or_nothing")
    steps = got["steps"]
    assert "mid" in steps[-1]["scheduled"] and steps[-1]["short_done"], steps
    # long kept its KV until the step mid started (the greedy loop preempted it at the first)
    assert all(st["long_preemptions"] == 0 for st in steps[:-1]), steps
    assert steps[-1]["long_preemptions"] == 1 and "long" not in steps[-1]["scheduled"]
    assert got["preempt_for_count"] == 1


@pytest.mark.parametrize("case", ["full_isl", "growth"])
def test_a_victim_is_preempted_only_in_a_step_vllm_starts_the_head(driven, case):
    got = _ok(driven, "preempt_for_counts_as_vllm")[case]
    steps = got["steps"]
    assert steps[-1][1], f"mid never started: {steps[-5:]}"
    wasted = [i for i, (preempted, started) in enumerate(steps) if preempted and not started]
    assert wasted == [], f"long preempted in steps {wasted} where mid did not start"
    assert not got["pinned_after"]


@pytest.mark.parametrize("case", ["chunked_off", "lookahead", "shared_victims", "long_threshold"])
def test_what_vllm_counts_beyond_the_first_chunk(driven, case):
    """Each case the review found: a wasted preemption (chunked prefill off, lookahead), none
    where one was needed (victims sharing blocks), one where none was needed (a capped prefill)."""
    steps = _ok(driven, "fits_edge_cases")[case]
    assert steps[-1][1], f"{case}: the head never started: {steps}"
    assert not any(p and not started for p, started in steps), f"{case}: a wasted preemption: {steps}"
    if case == "long_threshold":
        assert not any(p for p, _ in steps)  # vLLM gives the running prefill 64 tokens, the head the rest
    else:
        assert steps[-1][0] and len(steps) == 1  # preempted for, and started, at once


def test_the_heads_prefix_cache_hit_counts_as_vllm_counts_it(driven):
    """held: the hit's blocks are held by a running request, so the head needs 2 new blocks of
    its 12 and vLLM starts it at once: no preemption (counting the whole prompt preempted two).
    revive: the hit's blocks are cached but free, and taking them empties the free pool: the
    head starts only with a victim (counting them as held, nobody was preempted and the head
    waited)."""
    got = _ok(driven, "head_cache_hit")
    assert (got["held_free"], got["revive_free"]) == (3, 10), got  # the setup the doc describes
    assert got["held"] == [[False, True]], got
    assert got["revive"] == [[True, True]], got


def test_a_preemption_vllm_did_not_use_is_not_repeated_while_the_batch_stays(driven):
    got = _ok(driven, "refused_once")
    assert (got["preempt_for"], got["refused"]) == (1, 1), got
    assert [p for p, _ in got["steps"]] == [True] + [False] * (len(got["steps"]) - 1)


def test_failing_writes_are_counted_and_policy_errors_do_not_rewrite_the_stats_each_time(driven):
    """A records database locked by another writer and a removed stats folder raised out of
    vLLM's update_from_output (the engine died); each policy error rewrote the stats file (a
    policy failing on every comparison of vLLM's victim `max` made 85 ms steps of 1.5 ms ones)."""
    got = _ok(driven, "write_failures")
    assert got["errors_at_arrival"] == 20
    assert got["writes_at_arrival"] <= 2  # the start's and the first error's, not one per error
    assert got["finished"] == 21
    assert got["write_errors"] >= 2  # at least one locked records write and the stats write
    assert got["locked_s"] < 5.0  # sqlite's 5 s busy wait per write is cut to 0.1 s


def test_no_preemption_for_a_head_while_vllm_is_paused(driven):
    got = _ok(driven, "paused_no_preempt_for")
    assert got["preempt_for"] == 0 and got["waiting"] == ["short0", "short1"]
