"""The request log's file format: the `requests` table (`COLUMNS`), the `application_id` that
marks a presched log, checking a file before use, and making any value a cell SQLite can store.

    check_file(conn, path, create=True)     # who: `RequestLog`, at open (makes the table)
    conn, path = connect_ro(path)           # who: the readers in `presched.serve.log_read`
    cell(2**70, "INTEGER")                  # -> 9223372036854775807 (clamped, never raises)

A file is refused (`LogFileError`) when it is not SQLite, carries another application id, or has
a `requests` table lacking a column of `COLUMNS`; a `requests` table without the application id
is accepted when it has every column (extra columns are left alone). Columns added since the
first format (`ADDED`) may be missing: readers see NULL there, and a writer adds them.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

COLUMNS: dict[str, str] = {
    "id": "TEXT PRIMARY KEY",
    "ts": "REAL",               # unix time of arrival at the gateway
    "tenant": "TEXT",
    "model": "TEXT",
    "backend": "TEXT",          # NULL if never sent to a backend
    "endpoint": "TEXT",         # 'completions' | 'chat'
    "stream": "INTEGER",        # 0/1
    "status": "INTEGER",        # HTTP status the client got; 499 = client disconnected
    "error": "TEXT",
    "prompt_tokens": "INTEGER",
    "max_tokens": "INTEGER",
    "output_tokens": "INTEGER",  # true, from the backend's usage; NULL if unknown
    "finish_reason": "TEXT",
    "pred_mean": "REAL",
    "pred_quantiles": "TEXT",   # JSON list of 11 floats at predict LEVELS; NULL without predictor
    "priority": "REAL",         # the policy key, or the vLLM priority sent
    "queue_wait_s": "REAL",
    "ttft_s": "REAL",
    "e2e_s": "REAL",
    "retries": "INTEGER",
    "prompt": "TEXT",           # NULL unless prompt logging is enabled
    "predictor_version": "INTEGER",  # online learning: the predictor version that predicted it
    "drift_alarm": "INTEGER",   # online learning: 1 if the drift alarm was raised when it ended
}  # fmt: skip
"""The `requests` table: column -> SQLite type."""

ADDED: tuple[str, ...] = ("predictor_version", "drift_alarm")
"""Columns newer than the first format: a log without them is still read (NULL there), and a
writer opening one adds them (`ALTER TABLE ... ADD COLUMN`)."""

NAMES: tuple[str, ...] = tuple(COLUMNS)
TABLE = "requests"
APPLICATION_ID = 0x70736C67  # "pslg": marks a file as a presched request log


class LogFileError(ValueError):
    """A file that is not a presched request log, or one whose table lacks columns."""


def _columns(conn: sqlite3.Connection) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({TABLE})")]


def check_file(conn: sqlite3.Connection, path: Path, create: bool) -> None:
    """Refuse a file that is not a presched log (or not SQLite), or a table lacking columns.
    With `create`, an empty database gets the table, the index and the application id."""
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    except sqlite3.DatabaseError as e:
        raise LogFileError(
            f"{path}: not a presched request log (not an SQLite database: {e})"
        ) from None
    if app_id not in (0, APPLICATION_ID):
        raise LogFileError(f"{path}: not a presched request log (SQLite application_id "
                           f"{app_id:#x}, a presched log has {APPLICATION_ID:#x})")  # fmt: skip
    if TABLE not in tables:
        if app_id == APPLICATION_ID or tables or not create:
            what = f"its tables: {', '.join(sorted(tables))}" if tables else "it has no tables"
            raise LogFileError(f"{path}: not a presched request log (no table {TABLE!r}; {what})")
        cols = ",\n  ".join(f"{n} {t}" for n, t in COLUMNS.items())
        conn.execute("BEGIN")
        conn.execute(f"CREATE TABLE {TABLE} (\n  {cols}\n)")
        conn.execute(f"CREATE INDEX {TABLE}_ts ON {TABLE}(ts)")
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("COMMIT")
        return
    have = set(_columns(conn))
    missing = [n for n in NAMES if n not in have and n not in ADDED]
    if not missing and create:
        for n in ADDED:
            if n not in have:
                conn.execute(f"ALTER TABLE {TABLE} ADD COLUMN {n} {COLUMNS[n]}")
    if missing:
        raise LogFileError(f"{path}: table {TABLE!r} lacks column(s) {', '.join(missing)} "
                           f"(a presched request log has: {', '.join(NAMES)})")  # fmt: skip


def select_columns(conn: sqlite3.Connection) -> str:
    """The SELECT list of every column of `COLUMNS`, NULL for an `ADDED` one the file lacks."""
    have = set(_columns(conn))
    return ", ".join(n if n in have else f"NULL AS {n}" for n in NAMES)


def connect_ro(path: str | Path) -> tuple[sqlite3.Connection, Path]:
    path = Path(path)
    if not path.is_file():
        raise LogFileError(f"request log not found: {path}")
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        check_file(conn, path, create=False)
    except BaseException:
        conn.close()
        raise
    return conn, path


_I64 = (-(2**63), 2**63 - 1)
_SURROGATE = re.compile("[\ud800-\udfff]")


def cell(v: Any, kind: str = "TEXT") -> Any:
    """A value SQLite can store in a column of type `kind` (never raises): numpy scalars to
    Python, integers beyond 64 bits clamped (REAL: a float), invalid Unicode repaired, lists of
    numbers and arrays to JSON text, anything else to JSON or repr text."""
    if v is None or isinstance(v, (float, bytes)):
        return v
    if isinstance(v, int):  # bool too
        return float(v) if kind == "REAL" else min(max(int(v), _I64[0]), _I64[1])
    if isinstance(v, str):
        try:
            v.encode("utf-8")
            return v
        except UnicodeEncodeError:
            return _SURROGATE.sub("\ufffd", v)
    if hasattr(v, "tolist"):  # numpy scalar or array
        with contextlib.suppress(Exception):
            v = v.tolist()
            if v is None or isinstance(v, (int, float, str, bytes)):
                return cell(v, kind)
    if isinstance(v, (list, tuple)):
        with contextlib.suppress(TypeError, ValueError, OverflowError):
            return json.dumps([float(x) for x in v])
    try:
        return cell(json.dumps(v, default=repr) if isinstance(v, (dict, list, tuple)) else repr(v))
    except Exception:  # noqa: BLE001 - e.g. nested too deeply for json
        return f"<unstorable {type(v).__name__}>"
