"""fallback: a predictive policy degrades to a conservative one while predictions are bad."""

from __future__ import annotations

import numpy as np
import pytest
from builders import make_engine, make_estimates, make_requests, queued, run_engine

from presched.predict.estimate import LengthEstimate
from presched.schedule import POLICIES

W = 10  # tracker window and min_samples in these tests


def brute_discordance(pairs):
    c = d = 0
    for i in range(len(pairs)):
        for j in range(i + 1, len(pairs)):
            s = np.sign(pairs[i][0] - pairs[j][0]) * np.sign(pairs[i][1] - pairs[j][1])
            c, d = c + (s > 0), d + (s < 0)
    return d / (c + d) if c + d else float("nan")


def expected_switches(completed, threshold=0.3, hysteresis=0.05):
    """Replay the completions (score, true) through a brute-force window and the hysteresis rule."""
    mode, out = "predictive", []
    for k in range(1, len(completed) + 1):
        if k < W:
            continue
        err = brute_discordance(completed[k - W : k])
        if mode == "predictive" and err > threshold:
            mode = "conservative"
            out.append((k, mode))
        elif mode == "conservative" and err < threshold - hysteresis:
            mode = "predictive"
            out.append((k, mode))
    return out


def phased_workload():
    """Good estimates, then reversed, then good again; each phase ends with a burst of four
    requests queued behind a running one (to see which policy orders them)."""
    rng = np.random.default_rng(5)
    lengths, arrivals, est = [], [], []
    t = 0.0
    for phase, n in (("good", 20), ("reversed", 20), ("good", 30)):
        outs = rng.permutation(np.arange(2, 32))[:n].tolist()
        for o in outs:  # spaced: each finishes before the next arrives
            lengths.append((4, o))
            arrivals.append(t)
            est.append(o if phase == "good" else 33 - o)
            t += 40.0
        burst = [9, 3, 6, 1]
        for j, o in enumerate([20, *burst]):  # a 20-token head, then the burst behind it
            lengths.append((4, o))
            arrivals.append(t + 0.1 * j)
            est.append(o if phase == "good" else 33 - o)
        t += 200.0
    return make_requests(lengths, arrivals=arrivals), make_estimates(est)


def test_falls_back_on_reversed_predictions_and_recovers_at_the_right_completions():
    reqs, est = phased_workload()
    pol = POLICIES.create("fallback", inner="sjf", min_samples=W, window=W)
    seqs = run_engine(make_engine(pol, max_num_seqs=1), reqs, estimates=est)
    done = sorted(seqs, key=lambda s: s.finish)
    completed = [(s.estimate.rank_score, s.generated) for s in done]
    want = expected_switches(completed)
    assert [(k, m) for k, _, m in pol.switches] == want
    assert [m for _, m in want] == ["conservative", "predictive"]
    # the switch to conservative happens among phase-2 completions (25..49), the return in phase 3
    assert 25 < want[0][0] < 50 and 50 < want[1][0] <= len(seqs)
    assert pol.switches[0][1] == done[want[0][0] - 1].finish  # at that completion's time

    def burst_order(first):
        b = sorted(seqs[first + 1 : first + 5], key=lambda s: s.first_scheduled)
        return [s.target for s in b]

    assert burst_order(20) == [1, 3, 6, 9]  # phase 1, predictive (sjf on good estimates)
    assert burst_order(45) == [9, 3, 6, 1]  # phase 2, conservative: arrival order, not 9,6,3,1
    assert burst_order(80) == [1, 3, 6, 9]  # phase 3, predictive again
    plain = run_engine(make_engine("sjf", max_num_seqs=1), reqs, estimates=est)
    assert [s.target for s in sorted(plain[46:50], key=lambda s: s.first_scheduled)] == [9, 6, 3, 1]


def test_switch_bumps_epoch_and_the_waiting_queue_is_rekeyed():
    pol = POLICIES.create("fallback", inner="sjf", min_samples=W, window=W)
    q, seqs = queued(pol, [9, 3, 6], 3.0)
    assert q.peek() is seqs[1]  # predictive: shortest estimate
    epoch = pol.epoch
    pol._switch("conservative", 3.0)
    assert pol.epoch != epoch
    q.update(3.0)
    assert q.peek() is seqs[0]  # conservative (fcfs): earliest arrival
    assert [q.pop().id for _ in range(3)] == ["r0", "r1", "r2"]


def scaled_run(metric, factor, threshold=0.3):
    """Estimates = factor x true length: a perfect order but a scale error."""
    rng = np.random.default_rng(1)
    outs = rng.integers(2, 40, 30).tolist()
    reqs = make_requests([(4, o) for o in outs], arrivals=[40.0 * i for i in range(30)])
    est = make_estimates([factor * o for o in outs], sigma=0.3)
    pol = POLICIES.create("fallback", inner="sjf", metric=metric, threshold=threshold,
                          hysteresis=0.05, min_samples=W, window=W)  # fmt: skip
    run_engine(make_engine(pol, max_num_seqs=1), reqs, estimates=est)
    return pol


def test_metrics_discordance_is_scale_free_rel_mae_and_coverage_are_not():
    assert scaled_run("discordance", 3.0).switches == []  # order perfect: stays predictive
    assert scaled_run("rel_mae", 3.0).switches[0][:1] == (W,)  # rel MAE = 2 > 0.3 at once
    assert scaled_run("rel_mae", 1.0).switches == []
    # q90 of 0.25 x true covers nothing: |0 - 0.9| > 0.3
    assert scaled_run("coverage_error", 0.25).switches[0][:1] == (W,)
    assert scaled_run("coverage_error", 1.0, threshold=0.3).switches == []


def test_requests_without_estimates_do_not_feed_the_tracker():
    pol = POLICIES.create("fallback", min_samples=W, window=W)
    run_engine(make_engine(pol), make_requests(n=30, seed=2))
    assert pol.tracker.n == 0 and pol.mode == "predictive"


def test_bad_config_names_the_field():
    for kwargs, field in [
        ({"metric": "mape"}, "metric"), ({"threshold": 0}, "threshold"),
        ({"hysteresis": 0.5}, "hysteresis"), ({"min_samples": 1}, "min_samples"),
        ({"window": 10, "min_samples": 20}, "window"), ({"level": 1.0}, "level"),
        ({"conservative": "nope"}, "conservative"), ({"conservative_params": {"x": 1}}, r"conservative_params\.x"),
        ({"inner": "vtc"}, "inner"), ({"conservative": "vtc"}, "conservative"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=rf"^{field}: "):
            POLICIES.create("fallback", **kwargs)


def test_both_policies_see_every_notification():
    seen = {"inner": [], "conservative": []}
    pol = POLICIES.create("fallback", inner="kv-admission", inner_params={"inner": "sjf"},
                          min_samples=W, window=W)  # fmt: skip
    reqs = make_requests(n=40, seed=4, rate=20.0)
    est = LengthEstimate.concat([make_estimates([r.output_tokens]) for r in reqs])

    def spy(policy, log):
        orig = policy.on_finish

        def on_finish(seq, now):
            log.append(seq.id)
            orig(seq, now)

        policy.on_finish = on_finish

    spy(pol.inner, seen["inner"])
    spy(pol.conservative, seen["conservative"])
    run_engine(make_engine(pol, max_num_seqs=4, num_blocks=200), reqs, estimates=est)
    assert len(seen["inner"]) == len(seen["conservative"]) == 40
    assert pol.inner.footprint == 0  # the kv-admission inner kept its running sum through it all
