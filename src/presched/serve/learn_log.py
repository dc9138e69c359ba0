"""Teaching an `OnlineLearner` from a request log: the gateway's (`log.path`) or the engine
plugin's per-request records (`engine/plugin/records.py`, the same schema).

    presched learn --from-log records.sqlite --state DIR [--predictor model.npz] [--follow 5]
    last, counts = feed(learner, "records.sqlite", after=0)   # rows with rowid > after, in order

`feed` reads the rows appended after `after` (SQLite rowids: the order rows were written, which
for the engine's records is the order requests were freed), read-only, while the writer goes on
(WAL). Each row teaches what the gateway's live path teaches (`serve/learn.py`): status 200 with
an output length is a label (`ok`), or a lower bound when a length limit cut it (`is_censored`:
`length`); status 499 (`cancelled`) and any other status (`failed`) teach nothing. The learner
predicts each row's request (in batches of at most `max_pending`, again after a refit) just
before it observes it: the model scored is the learner's own, not whatever predicted the request
in the engine (the records' `pred_*` columns are left alone), so the recalibration and the drift
alarm measure the learner's model on the engine's answers. The rate caps run on the rows' own
clock (`ts`, the arrival time: it steps back and forth in completion order, and a bucket's clock
only moves forward, so a tenant gets at most burst + rate x the span of its rows' `ts`; a row
without one counts at the stamp of the row before it). Rows
without prompt text (the plugin's `store_prompts` off) depend on the learner's model: one that
predicts from lengths (`linear-prompt`, ...) predicts them, so they recalibrate and move the
alarm, but never join the refit buffer (the learner refits on rows with prompt text only); one
that reads prompt text (`needs_text`: `text-gbm`, `lexical-gbm`, `probe`, ...) cannot predict
them, so it has no score for them either: they are skipped and counted as `no_text` (they
teach nothing; turn the plugin's `store_prompts` on to learn from them).

The position (the log's path and the last rowid learned) is part of the learner's state: `feed`
hands each row's position to `observe`, which records it with what the row taught, so every save
(the end of a pass, and those within one: every `save_every` rows, after each refit) names the
last row it holds, written atomically with it; a run stopped anywhere (Ctrl-C, a crash) resumes
after that row and learns no row twice. `read_position` reads it from the state's header; a
state saved before the header held it falls back to the `log-position.json` kept beside it then.
What reads the state: a gateway with `learn.state_dir` set to the same folder resumes the
learner (recalibration, alarm, refitted model). The engine plugin does not: it loads the `.npz`
model it was started with and has no learner of its own.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from presched.predict.base import has_text, reads_text
from presched.serve.log_format import TABLE, connect_ro
from presched.serve.log_read import is_censored
from presched.workload.request import Request

POSITION = "log-position.json"  # where an older presched kept the position (read, never written)
_COLS = "rowid, id, ts, tenant, model, status, prompt_tokens, max_tokens, output_tokens, finish_reason, prompt"


def row_status(status: Any, output_tokens: int | None, finish_reason: str | None, max_tokens: int | None) -> str:
    """What a log row teaches: ok / length (censored) / cancelled / failed."""
    if status == 200 and output_tokens is not None and output_tokens >= 1:
        return "length" if is_censored(finish_reason, output_tokens, max_tokens) else "ok"
    return "cancelled" if status == 499 else "failed"


def _int(v: Any) -> int | None:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def feed(learner: Any, path: str | Path, after: int = 0, batch: int = 256) -> tuple[int, dict[str, int]]:
    """Teach `learner` the rows of the log at `path` with rowid > `after`; returns (the last
    rowid read, rows by what they taught: ok / length / cancelled / failed / skipped (no prompt
    length) / no_text (a label without prompt text, when the learner's model reads text)). Rows are
    read, predicted and observed `batch` at a time, never more than the learner remembers
    predictions for (`max_pending`: a prediction forgotten before its row is observed would leave
    the row unscored)."""
    batch = max(1, min(batch, learner.cfg.max_pending))
    log = _log_id(path)
    conn, path = connect_ro(path)
    try:
        cur = conn.execute(f"SELECT {_COLS} FROM {TABLE} WHERE rowid > ? ORDER BY rowid", (after,))
        counts = {"ok": 0, "length": 0, "cancelled": 0, "failed": 0, "skipped": 0, "no_text": 0}
        while rows := cur.fetchmany(batch):  # bounded memory on a large file
            after = rows[-1][0]
            _teach(learner, log, rows, counts)
            learner.position = {"log": log, "rowid": after}  # skipped rows too (they teach nothing)
    finally:
        conn.close()
    return after, counts


def _log_id(path: str | Path) -> str:
    return str(Path(path).resolve())


def _teach(learner: Any, log: str, rows: list[tuple], counts: dict[str, int]) -> None:
    chunk, reqs = [], []
    text = reads_text(learner)  # the learner's model reads prompt text (the engine may not store it)
    stamps = [float(r[2]) if isinstance(r[2], (int, float)) and math.isfinite(r[2]) else None for r in rows]
    # a row without a finite ts counts at the last stamp before it (else the chunk's first): one
    # clock for the tenant buckets (the learner's default, the monotonic clock, is another one)
    now = next((t for t in stamps if t is not None), None)
    for (rowid, rid, _, tenant, model, status, p_tok, max_tok, o_tok, finish, prompt), ts in zip(rows, stamps):
        o_tok, p_tok, max_tok = _int(o_tok), _int(p_tok), _int(max_tok)
        kind = row_status(status, o_tok, finish, max_tok)
        now = ts if ts is not None else now
        if kind in ("ok", "length") and (p_tok is None or p_tok < 1):
            counts["skipped"] += 1  # no prompt length: nothing to predict from
            continue
        if kind in ("ok", "length") and text and not has_text(prompt if isinstance(prompt, str) else None):
            counts["no_text"] += 1  # a text predictor cannot predict it: no score, no label to learn
            continue
        req = Request(id=str(rid), prompt_tokens=max(p_tok or 1, 1), model=model or "", tenant=tenant or "default",
                      prompt=prompt if isinstance(prompt, str) else None,
                      max_tokens=max_tok if max_tok and max_tok > 0 else None)  # fmt: skip
        chunk.append((req, kind, o_tok, now, rowid))
        if kind in ("ok", "length"):
            reqs.append(req)
    version = learner.version
    if reqs:
        learner.predict(reqs)  # remembered by id until observed
    for i, (req, kind, o_tok, now, rowid) in enumerate(chunk):
        counts[kind] += 1
        learner.observe(req, o_tok if kind in ("ok", "length") else None, status=kind, now=now,
                        position={"log": log, "rowid": rowid})  # fmt: skip
        if learner.version != version:  # a refit was swapped in: predict the rest with it
            version = learner.version
            rest = [r for r, k, *_ in chunk[i + 1:] if k in ("ok", "length")]
            if rest:
                learner.predict(rest)


def read_position(state: str | Path, log: str | Path) -> int:
    """The last rowid of `log` that the learner saved in `state` holds (0 if none, or if its
    position is of another log)."""
    from presched.predict.online.state import read_header

    header = read_header(state)
    if header is None:
        return 0
    if "position" in header:
        pos = header["position"]
    else:  # saved before the header held it: the position file written beside the state then
        p = Path(state) / POSITION
        pos = json.loads(p.read_text(encoding="utf-8")) if p.exists() else None
    return int(pos["rowid"]) if isinstance(pos, dict) and pos.get("log") == _log_id(log) else 0
