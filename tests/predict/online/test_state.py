"""Saving and resuming an `OnlineLearner` (`state.py`): crashes while saving, what a resumed
learner keeps (the refit schedule) and what it takes from the config it is resumed with."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from predict.online.test_learner import base, cfg, reqs, serve

from presched.predict.online import OnlineConfig, OnlineLearner
from presched.predict.online.state import HEADER, OWNER, _unique_ids


def header(folder):
    with np.load(folder / HEADER) as z:
        return json.loads(str(z["__header__"]))


@pytest.fixture
def crash_on_header(monkeypatch):
    """os.replace that fails when it would move the header into place (a crash just before)."""
    real = os.replace

    def replace(src, dst):
        if str(dst).endswith("online.npz"):
            raise OSError("crash before the header")
        real(src, dst)

    def crash(fn, *args):
        monkeypatch.setattr(os, "replace", replace)
        try:
            with pytest.raises(OSError, match="crash before the header"):
                fn(*args)
        finally:
            monkeypatch.setattr(os, "replace", real)

    return crash


def test_a_crash_while_saving_a_resumed_learner_leaves_the_last_state(tmp_path, crash_on_header):
    learner = OnlineLearner(base(100), cfg(), background=False)
    serve(learner, reqs(100, 300))
    learner.save(str(tmp_path))
    learner = OnlineLearner.resume(str(tmp_path), cfg(), background=False)  # a restart
    serve(learner, reqs(100, 300, start=1000))
    crash_on_header(learner.save, str(tmp_path))
    back = OnlineLearner.resume(str(tmp_path), cfg(), background=False)
    assert back.counts["learned"] == 100 and len(back.buffer) == 100  # the first save, whole
    assert [r.id for r, _ in back.buffer] == [r.id for r in reqs(100, 300)]


def test_a_model_left_by_a_crashed_save_is_never_taken_for_the_running_one(tmp_path, crash_on_header):
    rcfg = OnlineConfig(enabled=True, refit_every=100, min_refit=100, holdout=20, anchor_rows=0,
                        tenant_rate=1e9, tenant_burst=10**9)  # fmt: skip
    learner = OnlineLearner(base(100), rcfg, background=False)
    learner.save(str(tmp_path))  # version 1
    serve(learner, reqs(100, 5000, seed=1))  # a refit: version 2, answers ~5000
    assert learner.version == 2
    crash_on_header(learner.save, str(tmp_path))  # version 2's model written, never committed
    learner = OnlineLearner.resume(str(tmp_path), rcfg, background=False)  # back at version 1
    serve(learner, reqs(100, 20, seed=2))  # another version 2, answers ~20
    probe = reqs(1, 20, start=99_999)
    live = learner.base.predict(probe).point[0]
    learner.save(str(tmp_path))
    back = OnlineLearner.resume(str(tmp_path), rcfg, background=False)
    assert back.version == 2 and live < 100
    assert np.isclose(back.base.predict(probe).point[0], live)
    named = header(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([HEADER, OWNER, named["model"], named["buffer"]])


@pytest.mark.parametrize("anchor_rows", [0, 60])
def test_a_learner_resumed_between_batches_refits_as_one_never_stopped(tmp_path, anchor_rows):
    """With anchor rows the refits draw them at random: the draws go on after a resume (the
    generator's state is saved); restarted from the seed, the refitted models differ."""
    rcfg = OnlineConfig(enabled=True, refit_every=2000, min_refit=250, holdout=50, tenant_rate=1e9,
                        tenant_burst=10**9, anchor_rows=anchor_rows)  # fmt: skip
    anchor = reqs(400, 500, start=90_000, seed=99) if anchor_rows else ()
    batches = [reqs(100, 300 if b < 5 else 900, start=b * 100, seed=b) for b in range(10)]
    steady = OnlineLearner(base(100), rcfg, anchor, background=False)
    for stream in batches:
        serve(steady, stream)
    assert steady.counts["refits"] == 3 and steady.alarm.alarms  # alarms restart the schedule on the way
    learner = OnlineLearner(base(100), rcfg, anchor, background=False)
    for stream in batches:  # saved and resumed between batches (`presched learn` run now and then)
        serve(learner, stream)
        learner.save(str(tmp_path))
        learner = OnlineLearner.resume(str(tmp_path), rcfg, anchor, background=False)
    assert learner.counts["refits"] == 3 and learner.version == steady.version
    probe = reqs(20, 300, start=50_000)
    assert np.allclose(learner.predict(probe).quantiles, steady.predict(probe).quantiles)
    # the refitted model itself (the recalibration divides its point out of the quantiles above):
    # its median is of the same recent and anchor rows (758 vs 773 tokens with the draws restarted)
    assert learner.base.predict(probe).point[0] == steady.base.predict(probe).point[0]


def test_a_learner_resumed_with_other_settings_runs_on_them(tmp_path):
    old = cfg()
    new = cfg(alarm_h=40.0, alarm_window=150, alarm_band=0.2, window=100, min_group=10, recalibrate_every=5)
    calm, shifted = reqs(300, 100, seed=5), reqs(300, 400, start=1000, seed=6)  # then 4x longer answers
    learner = OnlineLearner(base(100), old, background=False)
    serve(learner, calm)
    learner.save(str(tmp_path))
    back = OnlineLearner.resume(str(tmp_path), new, background=False)
    ref = OnlineLearner(base(100), new, background=False)  # the same stream, on the new settings throughout
    serve(ref, calm)
    assert not learner.alarm.alarms and not ref.alarm.alarms
    for r in shifted:
        for lr in (back, ref):
            lr.predict([r])
            lr.observe(r, r.output_tokens, now=0.0)
    assert ref.alarm.alarms and back.alarm.alarms == ref.alarm.alarms
    probe = reqs(20, 400, start=50_000)
    assert np.allclose(back.predict(probe).quantiles, ref.predict(probe).quantiles)
    assert back.conformal.groups["m"].n == ref.conformal.groups["m"].n <= 100


def test_a_state_of_other_quantile_levels_is_refused_naming_the_field(tmp_path):
    learner = OnlineLearner(base(100), cfg(), background=False)
    serve(learner, reqs(50, 100))
    learner.save(str(tmp_path))
    with np.load(tmp_path / HEADER) as z:
        saved = {k: z[k] for k in z.files}
    h = json.loads(str(saved["__header__"]))
    h["conformal"]["levels"] = h["conformal"]["levels"][:-1]
    np.savez(tmp_path / HEADER, **{**saved, "__header__": np.array(json.dumps(h))})
    with pytest.raises(ValueError, match="'levels'"):
        OnlineLearner.resume(str(tmp_path), cfg(), background=False)


def test_a_buffer_with_a_reused_request_id_is_saved_and_resumed(tmp_path):
    # clients may send their own request ids again; the buffer is read back by the generic
    # loader, which refuses a repeated id, so a resume failed and the gateway would not start
    learner = OnlineLearner(base(), cfg(), background=False)
    first, again = reqs(30, 100), reqs(30, 100, seed=1)  # the same ids r0..r29, other answers
    serve(learner, first)
    serve(learner, again)
    learner.save(tmp_path)
    back = OnlineLearner.resume(tmp_path, cfg())
    assert [k for _, k in back.buffer] == [k for _, k in learner.buffer]
    ids = [r.id for r, _ in back.buffer]
    assert len(set(ids)) == 60 and ids[:30] == [f"r{i}" for i in range(30)] and ids[30] == "r0~30"
    back.save(tmp_path)  # ids stay as they are from save to save
    assert [r.id for r, _ in OnlineLearner.resume(tmp_path, cfg()).buffer] == ids


def test_buffer_ids_are_made_unique_without_taking_an_id_a_row_brings():
    """Clients reuse ids; the saved buffer's must be unique (the loader refuses a repeat), each
    first occurrence keeping its own. A made-up `x~<row>` once repeated an id a row brought
    (["x~2", "x", "x"] wrote x~2 twice, and the state could not be resumed)."""
    rng = np.random.default_rng(0)
    names = ["x", "x~1", "x~2", "x~3", "x~5", "y"]
    for _ in range(300):
        ids = [names[i] for i in rng.integers(0, len(names), rng.integers(1, 8))]
        pairs = [(reqs(1, 100)[0].__class__(id=i, prompt="p", prompt_tokens=1, output_tokens=5), 5) for i in ids]
        out = _unique_ids(pairs)
        assert len(set(out)) == len(out), (ids, out)
        firsts = {}
        for i, rid in enumerate(ids):
            firsts.setdefault(rid, i)
        assert all(out[i] == rid for rid, i in firsts.items()), (ids, out)


def test_a_resumed_learner_keeps_each_tenants_label_bucket(tmp_path):
    """At most burst + rate * span labels per tenant across restarts: the buckets are saved
    (each resume used to refill them: 20 labels learned over 4 runs against a bound of 5)."""
    c = OnlineConfig(enabled=True, refit_every=0, tenant_rate=1e-6, tenant_burst=5, state_dir=str(tmp_path))
    learned = 0
    for run in range(4):
        learner = OnlineLearner.resume(str(tmp_path), c, background=False) or OnlineLearner(base(), c, background=False)
        stream = reqs(20, 100, start=100 * run)
        before = learner.counts["learned"]
        serve(learner, stream, now=0.0)
        learned += learner.counts["learned"] - before
        learner.close()
    assert learned == 5


def test_a_state_dir_is_one_processs_and_a_second_is_refused_naming_it(tmp_path):
    """Two gateways on one folder interleaved their saves (each deleted the files the other's
    header was about to name). A real second process holds the folder here."""
    import subprocess
    import sys

    folder = tmp_path / "state"
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; from presched.predict.online.state import claim; "
                               f"claim({str(folder)!r}); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=r"^state_dir: .*state is in use by another process"):
            OnlineLearner(base(), cfg(state_dir=str(folder)), background=False)
    finally:
        holder.kill()
        holder.wait()
    a = OnlineLearner(base(), cfg(state_dir=str(folder)), background=False)  # free again
    b = OnlineLearner(base(), cfg(state_dir=str(folder)), background=False)  # and shared within a process
    a.save(str(folder))
    b.save(str(folder))
    assert (folder / HEADER).exists()
