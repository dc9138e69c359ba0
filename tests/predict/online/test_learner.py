"""`OnlineLearner` around a real predictor (`model-median`, no optional dependency) on
synthetic streams: recalibration, what is not learned from, caps, refits off the caller's
thread, and atomic save / resume."""

from __future__ import annotations

import dataclasses
import os
import threading

import numpy as np
import pytest

from presched.predict import LEVELS, PREDICTORS
from presched.predict.online import OnlineConfig, OnlineLearner
from presched.workload.request import Request

I90 = LEVELS.index(0.9)


def reqs(n, median, start=0, tenant="default", model="m", seed=0):
    rng = np.random.default_rng(seed)
    y = np.maximum(1, median * np.exp(rng.normal(0, 0.8, n))).astype(int)
    return [Request(id=f"r{start + i}", prompt=f"p{start + i}", prompt_tokens=10, model=model, tenant=tenant,
                    output_tokens=int(v)) for i, v in enumerate(y)]  # fmt: skip


def base(median=100):
    return PREDICTORS.create("model-median").fit(reqs(300, median, start=10**6, seed=9))


def serve(learner, stream, status="ok", now=0.0):
    est = learner.predict(stream)
    for r in stream:
        learner.observe(r, r.output_tokens, status=status, now=now)
    return est


def cfg(**kw):
    return OnlineConfig(**({"enabled": True, "refit_every": 0, "tenant_rate": 1e9, "tenant_burst": 10**9} | kw))


def test_recalibrates_a_shifted_stream_and_ignores_what_teaches_nothing():
    learner = OnlineLearner(base(100), cfg(), background=False)
    first = serve(learner, reqs(400, 400))
    assert np.mean([r.output_tokens for r in reqs(400, 400)] <= first.quantiles[:, I90]) < 0.6
    fresh = reqs(2000, 400, start=10_000, seed=1)
    est = learner.predict(fresh)
    cover = np.mean(np.array([r.output_tokens for r in fresh]) <= est.quantiles[:, I90])
    assert abs(cover - 0.9) < 0.04
    assert learner.counts["learned"] == 400 and len(learner.buffer) == 400
    before = learner.conformal.offsets("m").copy()
    serve(learner, reqs(100, 5, start=20_000), status="failed")
    serve(learner, reqs(100, 5, start=30_000), status="cancelled")
    assert np.array_equal(learner.conformal.offsets("m"), before)
    assert learner.counts["ignored"] == 200 and len(learner.buffer) == 400
    with pytest.raises(ValueError, match="status"):
        learner.observe(fresh[0], 10, status="done")


def test_censored_answers_calibrate_but_are_never_labels():
    # (every answer "cut" at its own length reads as answers longer than predicted: the alarm,
    # off here, would fire and forget rows; test_drift.py checks what censored rows do to it)
    learner = OnlineLearner(base(100), cfg(alarm_h=1e9, alarm_band=0.99), background=False)
    serve(learner, reqs(200, 100), status="length")
    assert learner.counts["censored"] == 200 and len(learner.buffer) == 0
    assert learner.conformal.groups["m"].censored.sum() == 200


def test_a_tenant_over_its_rate_is_dropped():
    learner = OnlineLearner(base(), OnlineConfig(enabled=True, refit_every=0, tenant_rate=1.0, tenant_burst=5),
                            background=False)  # fmt: skip
    serve(learner, reqs(50, 100, tenant="noisy"), now=0.0)
    serve(learner, reqs(3, 100, start=100, tenant="calm"), now=0.0)
    assert learner.counts["learned"] == 5 + 3 and learner.counts["capped"] == 45
    serve(learner, reqs(10, 100, start=200, tenant="noisy"), now=2.0)  # 2 s later: 2 more tokens
    assert learner.counts["learned"] == 10


class RecordingMedian(type(PREDICTORS.create("model-median"))):
    """model-median that records which thread fits it (to check refits leave the caller's)."""

    threads: list[str] = []

    def fit(self, requests, validation=None):
        RecordingMedian.threads.append(threading.current_thread().name)
        return super().fit(requests, validation)


def test_refit_runs_in_the_background_and_swaps_the_version():
    b = RecordingMedian().fit(reqs(300, 100, start=10**6))
    RecordingMedian.threads.clear()
    # the refit starts at the stream's last completion (min_refit = 400): none of the stream's
    # completions can race a refit that finishes while they are still being observed
    learner = OnlineLearner(b, OnlineConfig(enabled=True, refit_every=400, min_refit=400, holdout=100,
                                            tenant_rate=1e9, tenant_burst=10**9, anchor_rows=0))  # fmt: skip
    stream = reqs(400, 1000)
    learner.predict(stream)
    early = reqs(1, 1000, start=9000)
    learner.predict(early)  # predicted by version 1, completes after the swap
    for r in stream:
        learner.observe(r, r.output_tokens, now=0.0)
    learner.wait(60)
    assert learner.version == 2 and learner.counts["refits"] == 1
    assert RecordingMedian.threads and RecordingMedian.threads[0].startswith("presched-learn")
    assert learner.base is not b and 600 < learner.base.predict(stream[:1]).point[0] < 1600
    rows = learner.conformal.groups["m"].n
    learner.observe(early[0], 1000, now=0.0)
    assert learner.counts["stale"] == 1 and learner.conformal.groups["m"].n == rows
    learner.close()


def test_save_and_resume_give_the_same_learner(tmp_path):
    learner = OnlineLearner(base(100), cfg(), background=False)
    serve(learner, reqs(300, 300))
    learner.save(str(tmp_path))
    back = OnlineLearner.resume(str(tmp_path), cfg(), background=False)
    probe = reqs(20, 300, start=50_000)
    assert np.allclose(back.predict(probe).quantiles, learner.predict(probe).quantiles)
    assert back.version == learner.version and len(back.buffer) == 300
    assert back.counts["learned"] == 300 and back.alarm.state() == learner.alarm.state()
    assert OnlineLearner.resume(str(tmp_path / "empty"), cfg()) is None


def test_a_crash_while_saving_leaves_the_last_state(tmp_path, monkeypatch):
    learner = OnlineLearner(base(100), cfg(), background=False)
    serve(learner, reqs(100, 300))
    learner.save(str(tmp_path))
    serve(learner, reqs(100, 300, start=1000))
    real = os.replace

    def crash_on_header(src, dst):
        if str(dst).endswith("online.npz"):
            raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_header)
    with pytest.raises(OSError):
        learner.save(str(tmp_path))
    monkeypatch.setattr(os, "replace", real)
    back = OnlineLearner.resume(str(tmp_path), cfg(), background=False)
    assert back.counts["learned"] == 100 and len(back.buffer) == 100


def test_a_change_from_the_first_completion_is_forgotten_from_there():
    # answers spread far wider than predicted from the very first completion: the coverage band
    # raises the alarm at 100 completions with its change point at 0 (before the first one), so
    # all 100 rows are post-change and the recalibration keeps them all (not only min_group)
    learner = OnlineLearner(base(100), cfg(alarm_window=100, min_group=50), background=False)
    rng = np.random.default_rng(2)
    for i in range(300):
        r = Request(id=f"x{i}", prompt=f"p{i}", prompt_tokens=10, model="m")
        learner.predict([r])
        learner.observe(r, max(1, int(100 * np.exp(rng.normal(0, 3.0)))), now=0.0)
        if learner.alarm.alarms:
            break
    assert list(learner.alarm.alarms) == [100] and list(learner.alarm.changes) == [0]
    assert learner.conformal.pool.n == 100 and learner.conformal.groups["m"].n == 100


class TrainingSetMedian(type(PREDICTORS.create("model-median"))):
    """model-median that records the answers each refit trains on."""

    fits: list[list[int]] = []

    def fit(self, requests, validation=None):
        TrainingSetMedian.fits.append([r.output_tokens for r in requests])
        return super().fit(requests, validation)


def test_the_refit_after_an_alarm_waits_for_min_refit_post_change_rows():
    b = TrainingSetMedian().fit(reqs(300, 100, start=10**6, seed=9))
    TrainingSetMedian.fits.clear()
    learner = OnlineLearner(b, OnlineConfig(enabled=True, tenant_rate=1e9, tenant_burst=10**9, anchor_rows=0),
                            background=False)  # defaults: min_refit 250 (a refit at 250, then 500 later)
    stream = reqs(600, 100, seed=3) + reqs(400, 1000, start=600, seed=4)  # answers 10x longer from 600
    fits_at = []
    for r in stream:
        learner.predict([r])
        before = len(TrainingSetMedian.fits)
        learner.observe(r, r.output_tokens, now=0.0)
        fits_at += [learner.alarm.count] * (len(TrainingSetMedian.fits) - before)
    alarm, change = learner.alarm.alarms[0], learner.alarm.changes[0]
    assert 600 < alarm < 650 and 570 <= change <= 600
    after = [n for n, at in zip(TrainingSetMedian.fits, fits_at) if at >= alarm]
    assert fits_at[1] == change + 250  # the schedule restarted from the change point
    assert len(after[0]) > 150 and np.mean(np.array(after[0]) >= 300) > 0.85  # on what followed it


def test_an_alarm_leaves_each_group_only_its_own_rows_since_the_change():
    # four served models, equal traffic; every answer 10x longer from completion 1200 on: each
    # group keeps its own rows since the change point (min_group 1: no floor), none from before
    models = ("a", "b", "c", "d")
    rng = np.random.default_rng(0)
    b = PREDICTORS.create("model-median").fit([r for m in models for r in reqs(300, 100, start=10**6, model=m)])
    learner = OnlineLearner(b, cfg(min_group=1, alarm_band=0.9), background=False)
    for i in range(2000):
        m = models[i % 4]
        r = Request(id=f"x{i}", prompt_tokens=10, model=m)
        learner.predict([r])
        learner.observe(r, max(1, int((100 if i < 1200 else 1000) * np.exp(rng.normal(0, 0.5)))), now=0.0)
        if learner.alarm.alarms:
            break
    change = learner.alarm.changes[0]  # completions 1..change came before it
    assert 1150 < change <= 1200 < i < 1250
    for k, m in enumerate(models):
        scores, _ = learner.conformal.groups[m].rows()
        since = sum(1 for j in range(change, i + 1) if j % 4 == k)  # row j is completion j + 1
        assert len(scores) == since
        pre = np.arange(change, i + 1)[np.arange(change, i + 1) % 4 == k] < 1200
        assert np.array_equal(scores[:, 5] < np.log(10) / 2, pre)  # only the true pre-change rows look it
    assert learner.conformal.pool.n == i + 1 - change


def test_per_tenant_groups_are_bounded_and_the_least_recent_fall_back_to_the_pool():
    learner = OnlineLearner(base(100), cfg(per_tenant=True, max_groups=50, min_group=10), background=False)
    serve(learner, reqs(30, 1000, tenant="steady"))  # a tenant with 10x longer answers: its own offsets
    for i in range(2000):  # then one-off tenants answered as predicted, the steady one now and then
        serve(learner, reqs(1, 100, start=1000 + i, tenant=f"user-{i}"))
        if i % 40 == 0:
            serve(learner, reqs(1, 1000, start=10**5 + i, tenant="steady"))
    assert len(learner.conformal.groups) == 50  # bounded memory: 2,001 tenants seen
    probe = {t: learner.predict(reqs(1, 100, start=10**6, tenant=t)).quantiles[0] for t in ("steady", "user-0", "new")}
    assert np.allclose(probe["user-0"], probe["new"])  # forgotten: the pooled offsets, as a tenant never seen
    assert probe["steady"][LEVELS.index(0.5)] > 3 * probe["new"][LEVELS.index(0.5)]  # kept: recently completed


class GivenAbove(type(PREDICTORS.create("model-median"))):
    """model-median whose estimates start at 50 tokens (`lower`), as probe-refine's given L > g."""

    def predict(self, requests):
        from presched.predict.estimate import LengthEstimate

        est = super().predict(requests)
        q = np.maximum(est.quantiles, 60.0)
        return LengthEstimate(q, np.maximum(est.point, 60.0), est.rank_score, np.full(len(requests), 50.0))


def test_the_learners_estimate_keeps_the_base_lower_bound_and_scores_its_pit_from_it(monkeypatch):
    learner = OnlineLearner(GivenAbove().fit(reqs(300, 100, start=10**6, seed=9)), cfg(), background=False)
    stream = reqs(50, 100)
    est = learner.predict(stream)
    assert np.array_equal(est.lower, np.full(50, 50.0))
    seen = []
    monkeypatch.setattr(learner.alarm, "add", lambda q, y, q90, lower=1.0, censored=False: seen.append(lower) or False)
    for r in stream:
        learner.observe(r, max(r.output_tokens, 51), status="ok")
    assert seen == [50.0] * 50


def test_rows_without_prompt_text_still_save_every_save_every(tmp_path):
    """Engine-plugin records without prompt text (store_prompts off) teach the recalibration
    only; the periodic save used to sit after their early return and never ran."""
    learner = OnlineLearner(base(), cfg(state_dir=str(tmp_path), save_every=50), background=False)
    stream = [dataclasses.replace(r, prompt=None) for r in reqs(200, 100)]
    serve(learner, stream)
    assert learner.counts["learned"] == 200 and learner.counts["saves"] == 4
    assert (tmp_path / "online.npz").exists() and len(learner.buffer) == 0


def test_a_refit_that_raises_is_counted_and_the_model_kept(caplog):
    class Broken(type(PREDICTORS.create("model-median"))):
        def fit(self, requests, validation=None):
            if validation is not None:  # (the refit's fit; the first one works)
                raise RuntimeError("fit blew up")
            return super().fit(requests, validation)

    learner = OnlineLearner(Broken().fit(reqs(300, 100, start=10**6, seed=9)),
                            OnlineConfig(enabled=True, refit_every=2000, min_refit=100, holdout=20,
                                         tenant_rate=1e9, tenant_burst=10**9), background=False)  # fmt: skip
    with caplog.at_level("ERROR", logger="presched.learn"):
        serve(learner, reqs(250, 100))
    assert learner.version == 1 and learner.counts["refits"] == 0
    assert learner.counts["refit_failed"] >= 1 and "refit failed" in caplog.text


def test_an_absurd_length_is_ignored_not_a_traceback():
    learner = OnlineLearner(base(), cfg(), background=False)
    r = reqs(1, 100)[0]
    learner.predict([r])
    assert learner.observe(r, 10**400) is False and learner.counts["ignored"] == 1
    assert learner.observe(r, float("nan")) is False and learner.counts["ignored"] == 2


def test_a_refit_seeds_its_recalibration_with_the_cut_answers_too():
    """~30 % of the answers cut by max_tokens: the new model's recalibration got only the
    held-out labelled rows (the short ones) and its q90 covered 76 % of fresh answers; with the
    cut rows of the same span it covers ~90 %, as before the refit."""
    I90 = LEVELS.index(0.9)
    rng = np.random.default_rng(3)
    c = cfg(refit_every=100000, min_refit=800, holdout=200, alarm_h=1e9, alarm_band=0.99)  # alarm off
    learner = OnlineLearner(base(100), c, background=False)
    stream, cuts = reqs(1200, 100, seed=1), rng.uniform(20, 400, 1200).astype(int)
    learner.predict(stream)
    for r, cut in zip(stream, cuts):
        learner.observe(r, min(r.output_tokens, cut), status="length" if r.output_tokens >= cut else "ok", now=0.0)
    assert learner.version == 2
    pool = learner.conformal.pool
    assert 0.15 < pool.censored[: pool.n].mean() < 0.45  # the cut rows of the held-out span
    fresh = reqs(5000, 100, start=900000, seed=5)
    est = learner.predict(fresh)
    covered = np.mean(np.array([r.output_tokens for r in fresh]) <= est.quantiles[:, I90])
    assert 0.85 < covered < 0.95


def test_a_refit_under_way_when_the_alarm_fires_is_discarded():
    """Its data predate the change: swapping it in replaced the alarm's forgetting with a
    recalibration of pre-change rows (q90 coverage of the new answers fell to 0.04)."""
    gate = threading.Event()

    class Slow(type(PREDICTORS.create("model-median"))):
        def fit(self, requests, validation=None):
            if validation is not None:
                gate.wait(30)
            return super().fit(requests, validation)

    c = OnlineConfig(enabled=True, refit_every=4000, min_refit=250, holdout=200, tenant_rate=1e9,
                     tenant_burst=10**9, anchor_rows=0)  # fmt: skip
    learner = OnlineLearner(Slow().fit(reqs(300, 100, start=10**6, seed=9)), c)
    try:
        serve(learner, reqs(250, 100, seed=1))
        assert learner._job is not None and not learner._job.done()  # the refit waits on the gate
        serve(learner, reqs(300, 1000, start=5000, seed=2))  # answers 10x longer: the alarm fires
        assert learner.alarm.alarms
        gate.set()
        learner.wait(60)
        assert learner.version == 1 and learner.counts["refit_discarded"] == 1
        fresh = reqs(2000, 1000, start=90000, seed=4)
        est = learner.predict(fresh)
        assert np.mean(np.array([r.output_tokens for r in fresh]) <= est.quantiles[:, LEVELS.index(0.9)]) > 0.8
    finally:
        gate.set()
        learner.close()


def test_anchor_rows_never_outnumber_the_recent_rows_a_refit_trains_on():
    seen = []

    class Rec(type(PREDICTORS.create("model-median"))):
        def fit(self, requests, validation=None):
            if validation is not None:
                seen.append((sum(r.id.startswith("a") for r in requests), len(requests)))
            return super().fit(requests, validation)

    anchor = [dataclasses.replace(r, id="a" + r.id) for r in reqs(3000, 100, start=2 * 10**6, seed=7)]
    learner = OnlineLearner(Rec().fit(reqs(300, 100, start=10**6, seed=9)),
                            cfg(refit_every=2000, min_refit=250, holdout=200, anchor_rows=2000), anchor=anchor,
                            background=False)  # fmt: skip
    serve(learner, reqs(250, 100))
    (n_anchor, n_train), = seen
    assert n_anchor == n_train - n_anchor == 250 - 62  # 62 held out (a quarter)


def test_per_tenant_groups_of_a_model_and_tenant_with_a_bar_are_distinct():
    """'a|b' + 'c' and 'a' + 'b|c' were both the group 'a|b|c': one tenant's offsets served the other."""
    learner = OnlineLearner(base(100), cfg(per_tenant=True), background=False)
    one, two = Request(id="x", prompt_tokens=1, model="a|b", tenant="c"), Request(id="y", prompt_tokens=1, model="a", tenant="b|c")
    assert learner.group(one) != learner.group(two)
    assert learner.group(Request(id="z", prompt_tokens=1, model="m", tenant="t")) == "m|t"  # saved states keep their keys
