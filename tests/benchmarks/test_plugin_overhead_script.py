"""benchmarks/plugin_overhead.py's figures from rounds (the engine part runs in the benchmark
itself; the own-time meter it reads is checked on a real engine in tests/engine/test_plugin.py)."""

from __future__ import annotations

import pytest
from builders import load_benchmark


def figures(*args, **kwargs):
    # loaded when a test runs, not at collection: the script puts benchmarks/ on sys.path, where
    # benchmarks/epp.py would shadow the tests' own `epp` package for modules collected later
    return load_benchmark("plugin_overhead.py").figures(*args, **kwargs)


def _runs(stock_tok_s, plugin_tok_s, wall=2.0):
    return {"stock": [{"wall_s": wall, "tokens": t * wall} for t in stock_tok_s],
            "plugin": [{"wall_s": wall, "tokens": t * wall} for t in plugin_tok_s]}  # fmt: skip


def test_overhead_is_the_median_of_paired_rounds():
    # round by round: 2 %, 50 % (a noisy round), 4 %; pairing matters: unpaired medians would
    # compare 1000 with 980 and give 2 %
    runs = _runs([1000, 2000, 500], [980, 1000, 480])
    f = figures(runs, own_s=0.06, steps=3000)
    assert f["engine_plugin_overhead_pct"] == pytest.approx(4.0)
    assert f["engine_plugin_own_pct"] == pytest.approx(100 * 0.06 / 6.0)
    assert f["engine_plugin_own_us_per_step"] == pytest.approx(20.0)


def test_a_faster_plugin_is_a_negative_overhead_and_rounds_must_pair():
    assert figures(_runs([1000], [1100]), 0.0, 0)["engine_plugin_overhead_pct"] == pytest.approx(-10.0)
    with pytest.raises(ValueError):
        figures(_runs([1000, 1000], [1000]), 0.0, 1)
