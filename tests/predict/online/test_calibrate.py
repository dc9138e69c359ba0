"""Online conformal recalibration: closed forms (split-conformal rank without censoring, a
hand-computed Kaplan-Meier case) and the behaviour that matters (coverage under censoring)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.predict.conformal import conformal_rank_quantile
from presched.predict.estimate import LEVELS
from presched.predict.online import OnlineConformal, km_quantiles


@settings(derandomize=True, deadline=None, max_examples=60)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=60))
def test_without_censoring_it_is_the_split_conformal_rank(xs):
    s = np.repeat(np.asarray(xs)[:, None], len(LEVELS), axis=1)
    got = km_quantiles(s, np.zeros(len(xs), bool), LEVELS)
    want = [conformal_rank_quantile(np.asarray(xs), lv) for lv in LEVELS]
    assert np.allclose(got, want)


def test_kaplan_meier_by_hand():
    # events 1, 2, 3, 6; two scores censored at 2.5. KM: F(1)=1/6, F(2)=2/6, F(3)=4/6, F(6)=1.
    # level 0.5 needs F >= 0.5 * 7/6 = 0.583: the score 3. Counting the censored as events
    # would give 2.5 (F(2.5) = 4/6); level 0.2 (target 0.233) is 2 either way.
    s = np.array([1, 2, 2.5, 2.5, 3, 6], float)[:, None]
    c = np.array([0, 0, 1, 1, 0, 0], bool)
    assert km_quantiles(s, c, [0.5])[0] == 3
    assert km_quantiles(s, np.zeros(6, bool), [0.5])[0] == 2.5
    assert km_quantiles(s, c, [0.2])[0] == 2
    # a level KM cannot reach (top censored) takes the largest score seen
    assert km_quantiles(np.array([[1.0], [2.0], [9.0]]), np.array([0, 0, 1], bool), [0.99])[0] == 9


def test_censored_answers_keep_the_upper_quantile_honest():
    """Lengths log-normal around 4x what the base predicts; each request has its own max_tokens
    (log-normal too) and ~30 % are cut by it. With the cut answers as lower bounds the q90
    covers ~90 % of fresh answers; treating the cut length as the answer under-covers."""
    rng = np.random.default_rng(3)
    base_q = np.exp(np.log(100) + 1.0 * np.array([-1.28, -.84, -.52, -.25, 0, .25, .52, .84, 1.28, 1.64, 2.33]))
    y = 400 * np.exp(rng.normal(0, 1.0, 4000))
    cap = 800 * np.exp(rng.normal(0, 1.0, 2000))
    honest, naive = OnlineConformal(LEVELS, window=2000), OnlineConformal(LEVELS, window=2000)
    for v, c in zip(y[:2000], cap):
        honest.add("m", base_q, min(v, c), censored=v > c)
        naive.add("m", base_q, min(v, c), censored=False)
    i90 = LEVELS.index(0.9)
    fresh = y[2000:]
    cov_h = np.mean(fresh <= honest.apply(base_q[None], ["m"])[0, i90])
    cov_n = np.mean(fresh <= naive.apply(base_q[None], ["m"])[0, i90])
    assert abs(cov_h - 0.9) < 0.03 and cov_n < 0.8


def test_groups_pool_and_forget():
    oc = OnlineConformal(LEVELS, window=100, min_group=10, every=1)
    q = np.full(len(LEVELS), 100.0)
    assert np.array_equal(oc.offsets("a"), np.zeros(len(LEVELS)))  # nothing yet: the base's quantiles
    for _ in range(10):
        oc.add("a", q, 200.0)
    for _ in range(5):
        oc.add("b", q, 50.0)
    assert np.allclose(oc.offsets("a"), np.log(2))
    assert np.allclose(oc.offsets("b"), oc.offsets("unseen"))  # b has too few: the pool's
    assert np.allclose(oc.apply(q[None], ["a"]), 200)
    for _ in range(10):
        oc.add("a", q, 400.0)
    oc.forget("a", keep=10)  # only the last 10 (the change) remain
    assert np.allclose(oc.offsets("a"), np.log(4))
    arrays, values = oc.state()
    back = OnlineConformal.from_state(arrays, values)
    assert np.allclose(back.offsets("a"), oc.offsets("a")) and np.allclose(back.offsets("b"), oc.offsets("b"))


def test_forget_before_keeps_each_groups_rows_since_the_stamp_also_after_a_round_trip():
    oc = OnlineConformal(LEVELS, window=100, min_group=1, every=1)
    q = np.full(len(LEVELS), 100.0)
    for t in range(40):  # a: every stamp; b: every 4th; the change comes at stamp 30
        length = 100.0 if t < 30 else 1000.0
        oc.add("a", q, length, stamp=t)
        if t % 4 == 0:
            oc.add("b", q, length, stamp=t)
    back = OnlineConformal.from_state(*oc.state())
    for c in (oc, back):
        c.forget_before(30, min_keep=2)
        assert c.groups["a"].n == 10 and c.groups["b"].n == 2 and c.pool.n == 10 + 2  # b: 32, 36
        assert np.allclose(c.offsets("a"), np.log(10)) and np.allclose(c.offsets("b"), np.log(10))
    oc.forget_before(39, min_keep=5)
    assert oc.groups["a"].n == 5 and oc.groups["b"].n == 2  # at least min_keep, of what there is
