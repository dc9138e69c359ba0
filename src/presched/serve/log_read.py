"""Reading the gateway's request log back: the whole table for analysis, or labelled requests
for training a length predictor.

    read_log("requests.db")                  # -> pandas.DataFrame (analysis, plots)
    load_log_requests("requests.db")         # -> LogRequests: training requests + what was dropped
    requests_from_log("requests.db")         # -> list[Request], logging what was left out

Readers open the file read-only and may run while the gateway writes (WAL mode); a file that is
not a presched log is refused (`LogFileError`, see `presched.serve.log`).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from presched.serve.log_format import COLUMNS, TABLE, connect_ro, select_columns
from presched.workload.request import Request

log = logging.getLogger(__name__)

def read_log(path: str | Path):
    """The whole log as a pandas DataFrame, one row per request in arrival order: integer
    columns as nullable `Int64`, real ones as float64 (NULL = NaN; text the writer stored in a
    numeric column, an object it could not make a number, reads as NaN too), `pred_quantiles`
    parsed to lists of floats (None when NULL)."""
    import pandas as pd

    conn, path = connect_ro(path)
    try:
        df = pd.read_sql_query(f"SELECT {select_columns(conn)} FROM {TABLE} ORDER BY ts, rowid", conn)
    finally:
        conn.close()
    for n, t in COLUMNS.items():
        if t in ("INTEGER", "REAL") and not pd.api.types.is_numeric_dtype(df[n]):  # text the writer
            df[n] = pd.to_numeric(df[n], errors="coerce")  # could not make a number (see log_format.cell)
        if t == "INTEGER":
            df[n] = df[n].astype("Int64")
        elif t == "REAL":
            df[n] = df[n].astype("float64")
    df["pred_quantiles"] = [
        json.loads(v) if isinstance(v, str) else None for v in df["pred_quantiles"]
    ]
    return df


@dataclass
class LogRequests:
    """What `load_log_requests` made of a log: the training requests and the rows it left out."""

    requests: list[Request]
    rows: int
    """Rows read (of `model` when one was asked for)."""
    dropped: dict[str, int]
    """Rows left out, by reason: `status` (not 200), `no_output_tokens` (NULL or < 1),
    `no_prompt_tokens` (NULL or < 1), `censored` (cut by a length limit; 0 with keep_censored)."""
    censored_kept: int = 0
    """Censored rows kept as if complete (keep_censored=True)."""
    without_prompt: int = 0
    """Kept requests without prompt text (prompt logging was off)."""

    @property
    def censored_share(self) -> float:
        """Censored rows (dropped or kept) among the successful rows with a known length."""
        cens = self.dropped["censored"] + self.censored_kept
        done = len(self.requests) + self.dropped["censored"]
        return cens / done if done else 0.0

    def summary(self) -> str:
        why = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in self.dropped.items() if n)
        s = f"{len(self.requests):,} of {self.rows:,} log rows usable"
        if why:
            s += f" (dropped: {why})"
        if self.censored_kept:
            s += f"; {self.censored_kept:,} censored rows kept as complete"
        if self.censored_share > 0.1:
            s += (f"; {self.censored_share:.0%} of the completed requests were cut (max_tokens, the "
                  f"context window or a repetition stop): long requests are under-represented")  # fmt: skip
        if self.without_prompt:
            s += f"; {self.without_prompt:,} without prompt text"
        return s


CUT_REASONS = frozenset({"length", "repetition"})
"""finish_reasons of a generation the server cut: 'length' (max_tokens, the context window) and
vLLM's 'repetition' (its repetition detector ended a looping answer)."""


def is_censored(finish_reason: str | None, output_tokens: int, max_tokens: int | None) -> bool:
    """True when generation was cut, so the natural length is unknown (only a lower bound):
    finish_reason in CUT_REASONS, or an unknown finish_reason with output_tokens reaching
    max_tokens."""
    if finish_reason is not None:
        return finish_reason in CUT_REASONS
    return max_tokens is not None and output_tokens >= max_tokens


def _int(v: Any) -> int | None:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    return int(v)


def load_log_requests(
    path: str | Path, model: str | None = None, keep_censored: bool = False
) -> LogRequests:
    """Labelled `Request`s for training a length predictor, from a request log.

    Kept: rows with status 200 and a known `output_tokens` (the backend's usage count) and
    `prompt_tokens`. Each becomes `Request(id, prompt_tokens, output_tokens, model, tenant,
    prompt (text, or None when prompt logging was off), max_tokens, arrival = seconds after the
    log's first row)`, metadata {"ts", "finish_reason", "backend", "censored"}, plus the
    request's pooled prompt state under its `FeatureSpec.key()` when the engine plugin's
    hidden-state hook recorded one (`prompt_features`: what `probe` trains on), and its per-step
    states (`step_features`, plugin config `features.record_steps`) as {g: vector} under the key
    of their step FeatureSpec (`hidden:MODEL:L<layer>:step:s<sink>`): what `probe-refine` trains
    on (its `fit` makes one row per g < output_tokens).

    Censored lengths: a request whose generation was cut by `max_tokens` (finish_reason 'length'
    and output_tokens == max_tokens), by the context window, or by vLLM's repetition detector
    (finish_reason 'repetition') did not end on its own: its true
    length is only known to be at least output_tokens. Such rows are dropped by default and
    counted in `dropped["censored"]` (`is_censored` is the rule; a row with unknown
    finish_reason counts as censored when output_tokens >= max_tokens), so every label is a true
    length. Neither choice is unbiased: kept as if complete (`keep_censored=True`) they pull
    predictions down to the cap; dropped, the longest requests are under-represented. When the
    share is large (`censored_share`), raise max_tokens while collecting, or keep them when the
    cap is what the gateway will see anyway (e.g. a benchmark with ignore_eos).

    `model`: only rows of this served model (a clear error lists the log's models otherwise).
    """
    conn, path = connect_ro(path)
    try:
        where, args = ("WHERE model = ?", (model,)) if model is not None else ("", ())
        cols = ("id, ts, tenant, model, backend, status, prompt_tokens, max_tokens, output_tokens, "
                "finish_reason, prompt")  # fmt: skip
        rows = conn.execute(
            f"SELECT {cols} FROM {TABLE} {where} ORDER BY ts, rowid", args
        ).fetchall()
        if model is not None and not rows:
            known = [
                r[0] for r in conn.execute(f"SELECT DISTINCT model FROM {TABLE} ORDER BY model")
            ]
            names = ", ".join(map(repr, known)) or "none (the log is empty)"
            raise ValueError(f"model: no row of {path} has model {model!r}; its models: {names}")
        features = prompt_features(conn)
        for rid, states in step_features(conn).items():
            features.setdefault(rid, {}).update(states)
    finally:
        conn.close()
    dropped = {"status": 0, "no_output_tokens": 0, "no_prompt_tokens": 0, "censored": 0}
    t0 = min((r[1] for r in rows if r[1] is not None), default=0.0)
    out: list[Request] = []
    kept_censored = no_text = 0
    for rid, ts, tenant, mdl, backend, status, p_tok, max_tok, o_tok, finish, prompt in rows:
        o_tok, p_tok, max_tok = _int(o_tok), _int(p_tok), _int(max_tok)
        if status != 200:
            dropped["status"] += 1
            continue
        if o_tok is None or o_tok < 1:
            dropped["no_output_tokens"] += 1
            continue
        if p_tok is None or p_tok < 1:
            dropped["no_prompt_tokens"] += 1
            continue
        cens = is_censored(finish, o_tok, max_tok)
        if cens and not keep_censored:
            dropped["censored"] += 1
            continue
        kept_censored += cens
        no_text += prompt is None
        out.append(Request(
            id=str(rid), prompt_tokens=p_tok, output_tokens=o_tok,
            max_tokens=max_tok if max_tok and max_tok > 0 else None,
            model=mdl or "", tenant=tenant or "default", prompt=prompt,
            arrival=max(0.0, ts - t0) if ts is not None else 0.0,
            metadata={"ts": ts, "finish_reason": finish, "backend": backend,
                      "censored": bool(cens), **features.get(rid, {})},
        ))  # fmt: skip
    return LogRequests(out, len(rows), dropped, kept_censored, no_text)


def prompt_features(conn) -> dict[str, dict]:
    """{request id: {FeatureSpec key: vector}} from the engine plugin's `prompt_features`,
    `egtp_features` and `draft_features` tables (records.py; the hidden-state hooks' pooled
    prompt states: mean and EGTP of the served model, mean of the draft model), {} when the log
    has none."""
    from presched.engine.plugin.records import FEATURE_TABLES

    out: dict[str, dict] = {}
    for table in FEATURE_TABLES:
        for rid, key, vec in _feature_rows(conn, table, "id, spec, vec"):
            out.setdefault(rid, {})[key] = vec
    return out


def step_features(conn) -> dict[str, dict[str, dict[int, Any]]]:
    """{request id: {step FeatureSpec key: {g: vector}}} from the engine plugin's
    `step_features` table (records.py; the state at each request's g-th generated token for g
    in `features.record_steps`) and its `answer_features` table (the answer-so-far pools at the
    same g, under their 'answer' spec's key), {} when the log has none."""
    from presched.engine.plugin.records import ANSWER_FEATURE_TABLE, STEP_FEATURE_TABLE

    out: dict[str, dict] = {}
    for table in (STEP_FEATURE_TABLE, ANSWER_FEATURE_TABLE):
        for rid, key, g, vec in _feature_rows(conn, table, "id, spec, g, vec"):
            out.setdefault(rid, {}).setdefault(key, {})[int(g)] = vec
    return out


def _feature_rows(conn, table: str, columns: str):
    """(id, FeatureSpec key, ..., vector) of each row of a records feature table (`columns`: id
    and spec first, the vector last), none when the table is absent."""
    from presched.engine.plugin.features import unpack
    from presched.predict.probe.spec import FeatureSpec

    if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone():
        return
    keys: dict[str, str] = {}
    for rid, spec, *rest, vec in conn.execute(f"SELECT {columns} FROM {table}"):
        if spec not in keys:
            keys[spec] = FeatureSpec.parse(json.loads(spec), f"{table}.spec").key()
        yield (str(rid), keys[spec], *rest, unpack(vec))


def requests_from_log(
    path: str | Path, model: str | None = None, keep_censored: bool = False
) -> list[Request]:
    """`load_log_requests(...).requests`, logging (logger `presched.serve.log_read`, INFO) how many
    rows were left out and why."""
    res = load_log_requests(path, model=model, keep_censored=keep_censored)
    log.info("%s: %s", path, res.summary())
    return res.requests
