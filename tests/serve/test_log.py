"""The gateway's SQLite request log (`presched.serve.log`, read back by `presched.serve.log_read`)
and training from it (`presched.serve.train_log`). Everything here runs on real SQLite files and real CASTILLO
prompts; nothing is mocked."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sqlite3
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.stats import kendalltau

from presched.predict import LEVELS, load_predictor
from presched.predict.data import castillo_requests
from presched.serve.log import NAMES, LogFileError, LogWriteError, RequestLog
from presched.serve.log_read import load_log_requests, read_log, requests_from_log
from presched.serve.train_log import LogTrainingError, train_from_log

FAST_TEXT_GBM = {"folds": 3, "svd": 16, "max_rounds": 300, "scale_folds": 2}
MODELS = ["llama-3.1-8b", "qwen2.5-14b"]
MAX_TOKENS = 1024


def row(i: int, **kw) -> dict:
    base = {"id": f"r{i}", "ts": 1_700_000_000.0 + i * 0.01, "tenant": "t", "model": "m",
            "endpoint": "completions", "stream": 1, "status": 200, "prompt_tokens": 10,
            "max_tokens": 100, "output_tokens": 20, "finish_reason": "stop",
            "prompt": f"prompt {i}"}  # fmt: skip
    return {**base, **kw}


@pytest.fixture(scope="module")
def castillo(data_dir):
    """(train, test): 300 and 500 shuffled CASTILLO rows of two models (prompt-disjoint splits)."""
    train = castillo_requests("validate", models=MODELS)
    test = castillo_requests("test", models=MODELS)
    random.Random(0).shuffle(train)
    random.Random(1).shuffle(test)
    return train[:300], test[:500]


def castillo_log(path, reqs, store_prompts=True, prompt_every=1):
    """A log as the gateway would write it for `reqs` served with max_tokens=1024: longer
    outputs are cut (finish_reason 'length'); a few failed / disconnected requests mixed in."""
    with RequestLog(path, store_prompts=store_prompts) as log:
        for i, r in enumerate(reqs):
            out = min(r.output_tokens, MAX_TOKENS)
            log.write({"id": r.id, "ts": 1_700_000_000.0 + i, "tenant": "acme", "model": r.model,
                       "backend": "b0", "endpoint": "chat", "stream": 1, "status": 200,
                       "prompt_tokens": r.prompt_tokens, "max_tokens": MAX_TOKENS,
                       "output_tokens": out,
                       "finish_reason": "length" if r.output_tokens >= MAX_TOKENS else "stop",
                       "pred_mean": None, "priority": float(i), "queue_wait_s": 0.01, "ttft_s": 0.1,
                       "e2e_s": 2.0, "retries": 0,
                       "prompt": r.prompt if i % prompt_every == 0 else None})  # fmt: skip
        for j in range(5):
            log.write(row(10_000 + j, status=499, output_tokens=None, finish_reason=None))
            log.write(row(20_000 + j, status=502, error="backend down", output_tokens=None))
    return path


# --- writing --------------------------------------------------------------------------------------
def test_writes_from_threads_and_tasks_are_all_committed(tmp_path):
    path = tmp_path / "log.db"
    log = RequestLog(path, batch_rows=64)
    n_threads, per_thread, n_tasks, per_task = 4, 2_000, 8, 500

    def worker(k):
        for i in range(per_thread):
            log.write(row(k * 100_000 + i))

    async def task(k):
        for i in range(per_task):
            log.write(row(10_000_000 + k * 100_000 + i))
            if i % 50 == 0:
                await asyncio.sleep(0)

    async def tasks():
        await asyncio.gather(*(task(k) for k in range(n_tasks)))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    asyncio.run(tasks())
    for t in threads:
        t.join()
    log.close()
    log.close()  # idempotent
    total = n_threads * per_thread + n_tasks * per_task
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM requests").fetchone() == (
            total,
            total,
        )
    assert log.committed == total and log.unwritten == 0
    assert len(read_log(path)) == total
    with pytest.raises(RuntimeError, match="closed"):
        log.write(row(0))


def test_write_never_waits_for_the_database(tmp_path):
    # A relation, not a speed: while another connection holds SQLite's write lock nothing can be
    # committed, yet all 10,000 write() calls return (a write that touched the database would
    # block on the lock, then fail); once the lock is released every row is committed.
    rows = [row(i, pred_quantiles=[float(q) for q in range(11)]) for i in range(10_000)]
    path = tmp_path / "log.db"
    with RequestLog(path) as log:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # the write lock: the log's writer thread must wait
        for r in rows:
            log.write(r)
        assert log.committed == 0  # the writer is stuck on the lock; its callers were not
        holder.execute("COMMIT")
        holder.close()
        log.flush()
        assert log.count() == 10_000 and log.committed == 10_000


def test_flush_makes_rows_visible_to_readers_while_open(tmp_path):
    path = tmp_path / "log.db"
    with RequestLog(path) as log:
        for i in range(300):
            log.write(row(i))
        log.flush()
        assert len(read_log(path)) == 300  # a reader sees committed rows while the writer is open
        assert [r.id for r in requests_from_log(path)][:3] == ["r0", "r1", "r2"]


def test_prompt_is_stored_only_when_enabled(tmp_path):
    for store in (False, True):
        path = tmp_path / f"log-{store}.db"
        with RequestLog(path, store_prompts=store) as log:
            log.write(row(1, prompt="a secret prompt"))
        got = read_log(path)["prompt"].tolist()
        assert got == (["a secret prompt"] if store else [None])


def test_bad_rows_are_rejected_at_write(tmp_path):
    with RequestLog(tmp_path / "log.db") as log:
        with pytest.raises(ValueError, match="unknown column.*'prompt_len'.*'zzz'"):
            log.write({**row(1), "prompt_len": 3, "zzz": 1})
        with pytest.raises(ValueError, match="'id'"):
            log.write({"ts": 1.0})
        log.write({"id": "only-id"})  # missing columns are NULL
    df = read_log(tmp_path / "log.db")
    assert df["id"].tolist() == ["only-id"] and df.drop(columns="id").isna().all(axis=None)


def test_values_are_stored_with_their_types(tmp_path):
    path = tmp_path / "log.db"
    q = np.linspace(5, 500, len(LEVELS))
    with RequestLog(path) as log:
        log.write(row(1, pred_mean=np.float32(42.5), pred_quantiles=q, output_tokens=np.int64(7),
                      stream=True, priority=np.float64(-3.0)))  # fmt: skip
        log.write(row(2, output_tokens=None, pred_quantiles=None))
    df = read_log(path)
    assert df["pred_quantiles"][0] == pytest.approx(q.tolist()) and df["pred_quantiles"][1] is None
    assert df["output_tokens"].tolist()[0] == 7 and df["output_tokens"].isna().tolist() == [
        False,
        True,
    ]
    assert df["pred_mean"][0] == 42.5 and df["stream"][0] == 1 and df["priority"][0] == -3.0
    assert list(df.columns) == list(NAMES)


def test_refused_rows_are_reported_and_saved_never_dropped(tmp_path):
    path = tmp_path / "log.db"
    log = RequestLog(path)
    log.write(row(1))
    log.write(row(2))
    log.write(row(1, tenant="dup", prompt=b"\xff"))  # duplicate primary key
    with pytest.raises(LogWriteError, match=r"1 row\(s\) refused.*'r1'.*UNIQUE"):
        log.flush()
    with pytest.raises(LogWriteError, match=r"saved them to .*unwritten-\d+\.jsonl"):
        log.close()
    with sqlite3.connect(path) as conn:
        assert sorted(r[0] for r in conn.execute("SELECT id FROM requests")) == ["r1", "r2"]
    dump = next(tmp_path.glob("log.db.unwritten-*.jsonl"))
    saved = [json.loads(line) for line in dump.read_text().splitlines()]
    assert [(s["id"], s["tenant"]) for s in saved] == [("r1", "dup")]
    assert all(s["_error"] for s in saved)


def test_values_sqlite_cannot_store_are_stored_clamped_or_as_text(tmp_path):
    """Regression: max_tokens >= 2**63 (OverflowError), a dict or a lone surrogate (encode
    error) kept the whole row out of the file."""
    path = tmp_path / "log.db"
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    with RequestLog(path, store_prompts=True) as log:
        log.write(row(1, max_tokens=2**70, output_tokens=-(2**80), priority=2**64, retries=True))
        log.write(row(2, error={"not": "storable"}, pred_quantiles=["a", None], tenant=object()))
        log.write(row(3, prompt="caf\u00e9 \ud800 x", error="\udfff", model=np.str_("m")))
        log.write(row(4, error=deep, pred_mean=np.float64(np.nan), queue_wait_s=np.array([1.5])))
        log.flush()
        assert log.count() == 4 and log.unwritten == 0
    df = read_log(path).set_index("id")
    assert df.loc["r1", "max_tokens"] == 2**63 - 1 and df.loc["r1", "output_tokens"] == -(2**63)
    assert df.loc["r1", "priority"] == 2.0**64 and df.loc["r1", "retries"] == 1
    assert json.loads(df.loc["r2", "error"]) == {"not": "storable"}
    with sqlite3.connect(path) as conn:
        q = conn.execute("SELECT pred_quantiles FROM requests WHERE id = 'r2'").fetchone()[0]
    assert json.loads(q) == ["a", None]
    assert df.loc["r2", "tenant"].startswith("<object object")
    assert df.loc["r3", "prompt"] == "caf\u00e9 \ufffd x" and df.loc["r3", "error"] == "\ufffd"
    assert df.loc["r3", "model"] == "m"
    assert df.loc["r4", "error"] == "<unstorable list>" and np.isnan(df.loc["r4", "pred_mean"])
    assert np.isnan(df.loc["r4", "queue_wait_s"])  # text in a REAL column reads as NaN
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT queue_wait_s FROM requests WHERE id = 'r4'").fetchone() == ("[1.5]",)


def test_a_locked_database_delays_rows_but_loses_none(tmp_path):
    path = tmp_path / "log.db"
    log = RequestLog(path)
    log.write(row(0))
    log.flush()
    log._conn.execute("PRAGMA busy_timeout=0")  # fail at once on a lock instead of waiting 5 s
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # another process holding the write lock
    for i in range(1, 50):
        log.write(row(i))
    with pytest.raises(LogWriteError, match=r"49 row\(s\) not committed yet.*locked"):
        log.flush()
    blocker.execute("COMMIT")
    blocker.close()
    log.flush()  # retried: now everything is in
    assert log.count() == 50
    log.close()


# --- opening -----------------------------------------------------------------------------------
def test_reopening_appends_and_keeps_the_mode(tmp_path):
    path = tmp_path / "sub" / "log.db"
    with RequestLog(path) as log:
        log.write(row(1))
    with RequestLog(path) as log:
        log.write(row(2))
        assert log.count() == 2
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        indexes = [r[1] for r in conn.execute("PRAGMA index_list(requests)")]
        assert "requests_ts" in indexes


def test_a_table_made_elsewhere_is_accepted_only_with_every_column(tmp_path):
    ok = tmp_path / "ok.db"
    with sqlite3.connect(ok) as conn:
        conn.execute(f"CREATE TABLE requests ({', '.join(NAMES)}, extra TEXT)")
    with RequestLog(ok) as log:
        log.write(row(1))
    assert read_log(ok)["id"].tolist() == ["r1"]
    short = tmp_path / "short.db"
    with sqlite3.connect(short) as conn:
        conn.execute("CREATE TABLE requests (id TEXT PRIMARY KEY, ts REAL, status INTEGER)")
    for f in (RequestLog, read_log, load_log_requests):
        with pytest.raises(LogFileError, match=r"short\.db.*lacks column\(s\) tenant, model"):
            f(short)


def test_files_that_are_not_logs_are_refused_untouched(tmp_path):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    marked = tmp_path / "marked.db"
    with sqlite3.connect(marked) as conn:
        conn.execute("PRAGMA application_id = 1234")
    text = tmp_path / "notes.db"
    text.write_text("this is not a database\n" * 100)
    cases = [(other, "no table 'requests'; its tables: users"), (marked, "application_id 0x4d2"),
             (text, "not an SQLite database")]  # fmt: skip
    for path, why in cases:
        before = path.read_bytes()
        for f in (RequestLog, read_log, load_log_requests):
            with pytest.raises(
                LogFileError, match=f"{path.name}: not a presched request log.*{why}"
            ):
                f(path)
        assert path.read_bytes() == before
    with pytest.raises(LogFileError, match="request log not found: .*missing.db"):
        read_log(tmp_path / "missing.db")


# --- reading for training -------------------------------------------------------------------------
def test_requests_from_log_keeps_complete_successful_rows(tmp_path, caplog):
    path = tmp_path / "log.db"
    with RequestLog(path, store_prompts=True) as log:
        log.write(row(1))  # kept
        log.write(row(2, status=499, output_tokens=None))  # client went away
        log.write(row(3, status=500, output_tokens=20))  # failed
        log.write(row(4, output_tokens=None))  # length unknown
        log.write(row(5, output_tokens=100, finish_reason="length"))  # cut by max_tokens
        log.write(row(6, output_tokens=100, finish_reason=None))  # unknown: counts as cut
        log.write(row(7, output_tokens=100, finish_reason="stop"))  # ended at the limit: kept
        log.write(
            row(8, output_tokens=60, finish_reason="length", max_tokens=None)
        )  # context window
        log.write(row(9, prompt_tokens=None))  # prompt size unknown
        log.write(row(10, model="other", tenant=None, prompt=None, max_tokens=None))  # kept
    res = load_log_requests(path)
    assert [r.id for r in res.requests] == ["r1", "r7", "r10"]
    assert res.rows == 10 and res.without_prompt == 1 and res.censored_kept == 0
    assert res.censored_share == 0.5  # 3 cut of the 6 successful rows with a known length
    assert res.dropped == {"status": 2, "no_output_tokens": 1, "no_prompt_tokens": 1, "censored": 3}
    r1, _, r10 = res.requests
    assert (r1.prompt_tokens, r1.output_tokens, r1.max_tokens, r1.model, r1.tenant, r1.prompt) == (
        10,
        20,
        100,
        "m",
        "t",
        "prompt 1",
    )
    assert r1.arrival == 0 and r10.arrival == pytest.approx(0.09)
    assert (r10.tenant, r10.prompt, r10.max_tokens, r10.model) == ("default", None, None, "other")

    kept = load_log_requests(path, keep_censored=True)
    assert [r.id for r in kept.requests] == ["r1", "r5", "r6", "r7", "r8", "r10"]
    assert kept.censored_kept == 3 and kept.dropped["censored"] == 0
    assert [r.metadata["censored"] for r in kept.requests] == [
        False,
        True,
        True,
        False,
        True,
        False,
    ]

    assert [r.id for r in load_log_requests(path, model="other").requests] == ["r10"]
    with pytest.raises(ValueError, match="no row .* has model 'nope'; its models: 'm', 'other'"):
        load_log_requests(path, model="nope")
    with caplog.at_level(logging.INFO, logger="presched.serve.log_read"):
        assert len(requests_from_log(path)) == 3
    assert (
        "3 of 10 log rows usable "
        "(dropped: 2 status, 1 no output tokens, 1 no prompt tokens, 3 censored); "
        "50% of the completed requests were cut (max_tokens, the context window or a repetition stop)"
        in caplog.text
    )


# --- training from the log -----------------------------------------------------------------------
def test_train_from_log_end_to_end(castillo, tmp_path):
    train, test = castillo
    path = castillo_log(tmp_path / "log.db", train)
    n_cut = sum(r.output_tokens >= MAX_TOKENS for r in train)
    out, report = train_from_log(path, "text-gbm", tmp_path / "models" / "tg", params=FAST_TEXT_GBM)
    assert out == tmp_path / "models" / "tg.npz" and out.is_file()
    assert report["rows"] == len(train) + 10 and report["used"] == len(train) - n_cut
    assert report["dropped"] == {
        "status": 10,
        "no_output_tokens": 0,
        "no_prompt_tokens": 0,
        "censored": n_cut,
    }
    assert report["fit_requests"] + report["validation_requests"] == report["used"]
    assert report["censored_share"] == pytest.approx(n_cut / len(train))
    assert 0.15 < report["validation_requests"] / report["used"] < 0.35
    assert set(report["models"]) == {r.model for r in train}

    pred = load_predictor(out)
    est = pred.predict(test)
    assert est.quantiles.shape == (len(test), len(LEVELS)) and np.all(
        np.diff(est.quantiles, axis=1) >= 0
    )
    y = np.array([r.output_tokens for r in test])
    assert kendalltau(est.point, y).statistic > 0.15  # it learned something from 300 logged prompts


def test_train_from_log_without_prompt_text(castillo, tmp_path):
    train, test = castillo
    path = castillo_log(tmp_path / "log.db", train, store_prompts=False)
    with pytest.raises(
        LogTrainingError, match="reads prompt text.*prompt logging was off.*model-median"
    ):
        train_from_log(path, "text-gbm", tmp_path / "tg.npz", params=FAST_TEXT_GBM)
    assert not (tmp_path / "tg.npz").exists()
    out, report = train_from_log(path, "linear-prompt", tmp_path / "lin.npz", validation_fraction=0)
    assert report["without_prompt_used"] == report["used"] == report["fit_requests"]
    assert report["validation_requests"] == 0
    est = load_predictor(out).predict(test)
    assert np.isfinite(est.quantiles).all()


def test_train_from_log_with_some_prompt_text_uses_those_rows(castillo, tmp_path):
    train, _ = castillo
    path = castillo_log(tmp_path / "log.db", train, prompt_every=2)  # logging on half the time
    _, report = train_from_log(path, "text-gbm", tmp_path / "tg.npz", params=FAST_TEXT_GBM)
    usable = len(load_log_requests(path).requests)
    assert report["without_prompt_left_out"] > 0
    assert report["used"] + report["without_prompt_left_out"] == usable
    assert report["without_prompt_used"] == 0


def test_train_from_log_errors(castillo, tmp_path):
    train, _ = castillo
    path = castillo_log(tmp_path / "log.db", train[:20])
    with pytest.raises(LogTrainingError, match="unknown predictor 'nope'; known: .*model-median"):
        train_from_log(path, "nope", tmp_path / "x.npz")
    with pytest.raises(LogTrainingError, match="validation_fraction"):
        train_from_log(path, "model-median", tmp_path / "x.npz", validation_fraction=1.0)
    with pytest.raises(ValueError, match="unknown parameter"):
        train_from_log(path, "text-gbm", tmp_path / "x.npz", params={"num_treez": 3})
    failed = tmp_path / "failed.db"
    with RequestLog(failed) as log:
        log.write(row(1, status=502, output_tokens=None))
    with pytest.raises(LogTrainingError, match="no row to train on .*1 status"):
        train_from_log(failed, "model-median", tmp_path / "x.npz")
    with pytest.raises(LogFileError, match="not found"):
        train_from_log(tmp_path / "absent.db", "model-median", tmp_path / "x.npz")


def test_cli_trains_from_a_log_of_forced_lengths_only_with_keep_censored(tmp_path):
    from typer.testing import CliRunner

    from presched.cli import app

    path = tmp_path / "log.sqlite"
    with RequestLog(path) as log:  # replayed with ignore_eos: every row was cut by max_tokens
        for i in range(40):
            log.write(row(i, prompt_tokens=10 + i, max_tokens=20 + 2 * i,
                          output_tokens=20 + 2 * i, finish_reason="length"))  # fmt: skip
    args = ["train", "-p", "linear-prompt", "-o", str(tmp_path / "m.npz"), "--from-log", str(path)]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code != 0 and not (tmp_path / "m.npz").exists()
    # the refusal says how to use them (it named only the 40 censored rows)
    assert "--keep-censored" in str(refused.exception) + refused.output, refused.output
    ok = CliRunner().invoke(app, args + ["--keep-censored"])
    assert ok.exit_code == 0, ok.output
    from presched.workload.request import Request

    est = load_predictor(tmp_path / "m.npz").predict([Request(id="q", prompt_tokens=30, model="m")])
    assert 20 < est[0].mean < 200  # learned from the cut lengths (20..98 tokens)


def test_a_repetition_stop_is_a_cut_not_a_label(tmp_path):
    """vLLM's repetition detector ends a looping answer with finish_reason 'repetition': its
    length is a lower bound, like max_tokens' cut, so it is censored (it was a training label)."""
    from presched.serve.learn import learn_fields

    path = tmp_path / "log.db"
    with RequestLog(path, store_prompts=True) as log:
        log.write(row(1, output_tokens=40, finish_reason="repetition"))
        log.write(row(2, output_tokens=40, finish_reason="stop"))
    res = load_log_requests(path)
    assert [r.id for r in res.requests] == ["r2"] and res.dropped["censored"] == 1

    class Learner:  # records what the gateway teaches (the learner itself: tests/predict/online)
        alarm = SimpleNamespace(active=False)
        seen: list = []

        def version_of(self, rid):
            return 1

        def observe(self, request, tokens, status):
            self.seen.append(status)

    learner = Learner()
    seq = SimpleNamespace(id="r", request=SimpleNamespace(max_tokens=100))
    for reason in ("repetition", "length", "stop"):
        learn_fields(learner, seq, SimpleNamespace(status=200, tokens=40, finish_reason=reason))
    assert learner.seen == ["length", "length", "ok"]
