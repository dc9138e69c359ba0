from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from presched.metrics import GoodputSLO, RecordTable, jain_index, summarize, weighted_percentile
from presched.sim.itl import ItlLog
from presched.workload.request import Request


def rec(i, arrival, sched, first, finish, out, tenant="a", **slo):
    r = Request(id=f"r{i}", prompt_tokens=10, output_tokens=out, arrival=arrival, tenant=tenant, **slo)
    return SimpleNamespace(id=r.id, tenant=tenant, arrival=arrival, first_scheduled=sched,
                           first_token=first, finish=finish, max_itl=0.0, prompt_tokens=10,
                           generated=out, preemptions=0, recomputed_tokens=0, instance=0,
                           request=r)  # fmt: skip


def table(rows):
    return RecordTable.from_seqs(rows)


def test_per_request_formulas():
    t = table([rec(0, 1.0, 1.5, 2.0, 6.0, out=5), rec(1, 2.0, 2.0, 2.5, 2.5, out=1)])
    assert t.queue_wait.tolist() == [0.5, 0.0]
    assert t.ttft.tolist() == [1.0, 0.5]
    assert t.e2el.tolist() == [5.0, 0.5]
    assert t.tpot[0] == pytest.approx(1.0)  # (6 - 2) / (5 - 1): first token excluded
    assert math.isnan(t.tpot[1])
    assert t.normalized.tolist() == [1.0, 0.5]


def test_summary_names_and_values():
    rows = [rec(i, float(i), float(i), i + 0.1, i + 1.0, out=10 * (i + 1)) for i in range(10)]
    s = summarize(table(rows))
    assert s["completed"] == 10
    assert s["duration_s"] == pytest.approx(10.0)  # first arrival 0 -> last finish 10
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["total_output_tokens"] == 550 and s["output_throughput"] == pytest.approx(55.0)
    assert s["mean_ttft_ms"] == pytest.approx(100.0)
    assert s["mean_e2el_ms"] == pytest.approx(1000.0) and s["p99_e2el_ms"] == pytest.approx(1000.0)
    # shortest half by output length: r0..r4
    assert s["short_p99_e2el_ms"] == pytest.approx(1000.0)
    assert s["jain_fairness"] == pytest.approx(1.0) and s["num_tenants"] == 1
    assert "request_goodput" not in s  # no SLO given
    for key in ("mean_tpot_ms", "median_itl_ms", "p90_queue_wait_ms", "p99_normalized_ms_per_token"):
        assert key in s


def test_goodput_counts_requests_meeting_every_slo_and_request_slos_override():
    rows = [rec(0, 0.0, 0.0, 0.1, 1.0, out=10),   # ttft 100 ms, tpot 100 ms
            rec(1, 0.0, 0.0, 0.5, 1.0, out=10),   # ttft 500 ms
            rec(2, 0.0, 0.0, 0.1, 3.0, out=10),   # tpot 322 ms
            rec(3, 0.0, 0.0, 0.5, 1.0, out=10, slo_ttft=1.0)]  # own TTFT SLO: 1 s  # fmt: skip
    s = summarize(table(rows), slo=GoodputSLO(ttft_ms=200, tpot_ms=150))
    assert s["good_requests"] == 2  # r0 and r3
    assert s["request_goodput"] == pytest.approx(2 / 3.0)
    assert s["slo_attainment"] == pytest.approx(0.5)


def test_jain_fairness_over_tenants():
    assert jain_index(np.array([1.0, 1.0, 1.0])) == pytest.approx(1.0)
    assert jain_index(np.array([1.0, 0.0, 0.0, 0.0])) == pytest.approx(0.25)
    rows = [rec(0, 0.0, 0.0, 0.1, 1.0, out=10, tenant="a"), rec(1, 0.0, 0.0, 0.1, 3.0, out=10, tenant="b")]
    s = summarize(table(rows))
    # speeds 10 and 10/3 tokens/s -> (13.33)^2 / (2 * (100 + 11.1)) = 0.8
    assert s["num_tenants"] == 2 and s["jain_fairness"] == pytest.approx(0.8)


def test_unfinished_request_is_an_error():
    r = rec(0, 0.0, 0.0, 0.1, None, out=1)
    with pytest.raises(ValueError, match="never finished"):
        table([r])


@given(st.lists(st.tuples(st.floats(0.001, 10), st.integers(1, 20)), min_size=1, max_size=40),
       st.sampled_from([1, 10, 50, 90, 99, 100]))  # fmt: skip
def test_weighted_percentile_equals_percentile_of_repeated_values(pairs, q):
    v = np.array([p[0] for p in pairs])
    w = np.array([p[1] for p in pairs])
    assert weighted_percentile(v, w, q) == np.percentile(np.repeat(v, w), q, method="inverted_cdf")


def test_itl_log_expands_series():
    log = ItlLog()
    log.add(1.0, 0.5, 3, 2)  # 1.0, 1.5, 2.0, each twice
    log.add(0.1, 0.0, 1, 5)
    v, w = log.values()
    assert v.tolist() == [1.0, 1.5, 2.0, 0.1] and w.tolist() == [2, 2, 2, 5]
    assert log.num_gaps == 11


def test_jain_fairness_uses_each_tenants_mean_not_summed_latency():
    # every request has normalized latency 0.1 s/token; tenant a sends 3 requests, b one: the
    # same slowdown for both, so the index is 1. (On summed latency a would look 3x slower:
    # speeds 1/0.3 and 1/0.1 -> (13.33)^2 / (2 (11.1 + 100)) = 0.8.)
    rows = [rec(i, 0.0, 0.0, 0.1, 1.0, out=10, tenant="a") for i in range(3)]
    rows.append(rec(3, 0.0, 0.0, 0.1, 1.0, out=10, tenant="b"))
    s = summarize(table(rows))
    assert s["num_tenants"] == 2 and s["jain_fairness"] == pytest.approx(1.0)
    # a: mean 0.1 (0.05 and 0.15), b: 0.2 -> speeds 10 and 5 -> 225 / (2 * 125) = 0.9
    rows = [rec(0, 0.0, 0.0, 0.1, 0.5, out=10, tenant="a"),
            rec(1, 0.0, 0.0, 0.1, 1.5, out=10, tenant="a"),
            rec(2, 0.0, 0.0, 0.1, 2.0, out=10, tenant="b")]  # fmt: skip
    assert summarize(table(rows))["jain_fairness"] == pytest.approx(0.9)


def test_itl_figures_weight_each_gap_value_by_its_count():
    # gaps: 1 s three times, 3 s once: mean 1.5 s (not 2), median 1 s, P99 3 s
    rows = [rec(0, 0.0, 0.0, 0.1, 6.1, out=5)]
    s = summarize(table(rows), itl=(np.array([3.0, 1.0]), np.array([1, 3])))
    assert s["mean_itl_ms"] == pytest.approx(1500.0)
    assert s["median_itl_ms"] == pytest.approx(1000.0) and s["p99_itl_ms"] == pytest.approx(3000.0)


def test_weighted_percentile_at_an_exact_cumulative_weight_is_the_lower_value():
    # half the weight at 1, half at 2: the median (inverted CDF) is 1, P50.1 is 2
    v, w = np.array([2.0, 1.0]), np.array([1, 1])
    assert weighted_percentile(v, w, 50) == 1.0 and weighted_percentile(v, w, 50.1) == 2.0
    assert weighted_percentile(v, w, [0, 100]) == [1.0, 2.0]


def test_short_and_long_halves_by_output_length():
    # 4 requests, output 1..4 tokens: the short half is the 2 shortest (e2e 1 s, 2 s: P99 by
    # linear interpolation 1.99 s), the long half the 2 longest (waits 3 s, 4 s: P99 3.99 s)
    rows = [rec(0, 0.0, 0.0, 0.5, 2.0, out=2), rec(1, 0.0, 4.0, 4.5, 10.0, out=4),
            rec(2, 0.0, 0.0, 0.5, 1.0, out=1), rec(3, 0.0, 3.0, 3.5, 6.0, out=3)]  # fmt: skip
    s = summarize(table(rows))
    assert s["short_p99_e2el_ms"] == pytest.approx(1990.0)
    assert s["long_p99_queue_wait_ms"] == pytest.approx(3990.0)
    assert s["max_queue_wait_ms"] == pytest.approx(4000.0)
