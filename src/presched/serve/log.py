"""The gateway's request log: one SQLite row per accepted request (the writer and the file
format; reading it back is `presched.serve.log_read`).

    log = RequestLog("requests.db", store_prompts=False)   # who: the gateway, at start-up
    log.write({"id": rid, "ts": t, "status": 200, ...})     # on the event loop, per request (~µs)
    log.close()                                             # at shutdown: commits everything

`write` never touches the database: it checks the keys and appends the row to a queue. One
writer thread drains the queue and inserts in batches (`executemany`, one commit per batch:
after `batch_s` seconds or `batch_rows` rows, whichever comes first). The file is in WAL mode with
`synchronous=NORMAL`, so a commit costs no fsync and readers (`read_log`, `presched train
--from-log`) can read while the gateway writes.

Nothing accepted is dropped silently, and no value keeps a row out: every value is made one
SQLite can store (`log_format.cell`): an integer beyond 64 bits is clamped to the int64 range (a float in
REAL columns), text that is not valid Unicode has its lone surrogates replaced by U+FFFD, and any
other object (a dict, a list of non-numbers) is stored as its JSON or `repr` text. A transient
SQLite error (locked, I/O, disk full) keeps the batch and retries it; a row SQLite refuses for
good (a duplicate id) is set aside. `flush()` and `close()` raise `LogWriteError` while rows are unwritten;
`close()` first saves them as JSON lines next to the log (`<log>.unwritten-<unix time>.jsonl`).

The file carries SQLite's `application_id` (`APPLICATION_ID`), so another SQLite file is refused
instead of being written into; the table, the id and the checks are `presched.serve.log_format`
(its `COLUMNS`, `NAMES`, `TABLE`, `APPLICATION_ID` and `LogFileError` are importable from here).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import queue
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from presched.serve.log_format import (APPLICATION_ID, COLUMNS, NAMES, TABLE, LogFileError, cell,
                                       check_file, connect_ro)  # fmt: skip

__all__ = ["APPLICATION_ID", "COLUMNS", "NAMES", "TABLE", "LogFileError", "LogWriteError",
           "RequestLog"]  # fmt: skip
log = logging.getLogger(__name__)
_NAMESET = frozenset(NAMES)
_INSERT = f"INSERT INTO {TABLE} ({', '.join(NAMES)}) VALUES ({', '.join('?' * len(NAMES))})"
_JSONABLE = (str, int, float, type(None))
_PROMPT = NAMES.index("prompt")
_TRANSIENT_RETRY_S = (0.05, 0.2, 1.0)
"""Delays between the retries of a batch after a transient error, when a flush or close waits."""
_REFUSED = (sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.ProgrammingError, OverflowError,
            TypeError)  # fmt: skip
"""Errors that retrying cannot fix: a duplicate id, a value SQLite cannot store."""


class LogWriteError(RuntimeError):
    """Accepted rows that could not be committed (`flush` / `close` raise it; none is dropped)."""


# --- writing ------------------------------------------------------------------------------------
@dataclass
class _Flush:
    """A marker in the queue: set once every row queued before it has been dealt with."""

    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


_STOP = object()


class RequestLog:
    """Append-only request log backed by SQLite (see the module doc).

    `path`: the database file, created with its parent folder when missing; an existing file must
    be a presched log. `store_prompts`: keep the `prompt` column's text (off by default: prompts
    may be private); without it `prompt` is always NULL. `batch_s` / `batch_rows`: how long the
    writer gathers rows before a commit, and the most rows per commit.
    """

    def __init__(self, path: str | Path, store_prompts: bool = False, batch_s: float = 0.05,
                 batch_rows: int = 256) -> None:  # fmt: skip
        if not batch_s > 0 or batch_rows < 1:
            raise ValueError(
                f"batch_s must be > 0 and batch_rows >= 1, got {batch_s}, {batch_rows}"
            )
        self.path = Path(path)
        self.store_prompts = store_prompts
        self.batch_s = batch_s
        self.batch_rows = batch_rows
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            check_file(conn, self.path, create=True)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=5000")
        except BaseException:
            conn.close()
            raise
        self._conn = conn  # used only by the writer thread from here on
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: list[tuple] = []  # rows taken off the queue, not yet committed
        self._failed: list[tuple[tuple, str]] = []  # rows SQLite refused for good, and why
        self._transient: str | None = None  # last transient error while rows are pending
        self._closed = False
        self._close_lock = threading.Lock()
        self.committed = 0
        """Rows committed by this `RequestLog` (not counting rows already in the file)."""
        self._thread = threading.Thread(
            target=self._run, name=f"request-log:{self.path.name}", daemon=True
        )
        self._thread.start()
        atexit.register(self._at_exit)  # a gateway that exits without close() still commits

    # --- the hot path ---------------------------------------------------------------------------
    def write(self, row: dict[str, Any]) -> None:
        """Queue one row (column -> value; absent columns are NULL). Cheap and non-blocking: safe
        on the event loop and from any thread. Unknown keys raise ValueError (a bug upstream)."""
        if not row.keys() <= _NAMESET:
            bad = sorted(set(row) - _NAMESET)
            raise ValueError(f"request log row: unknown column(s) {', '.join(map(repr, bad))}; "
                             f"known: {', '.join(NAMES)}")  # fmt: skip
        if "id" not in row:
            raise ValueError("request log row: field 'id' is missing")
        if self._closed:
            raise RuntimeError(f"request log {self.path} is closed")
        self._q.put(row.copy())

    # --- control ------------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        """Block until every row written before this call is committed; raises `LogWriteError`
        when some could not be (they stay queued for a later retry or `close`)."""
        if self._closed:
            self._raise_unwritten()
            return
        marker = _Flush()
        self._q.put(marker)
        if not marker.done.wait(timeout):
            raise TimeoutError(f"request log {self.path}: flush did not finish in {timeout} s")
        if marker.error:
            raise LogWriteError(marker.error)

    def count(self) -> int:
        """Rows in the log file, including every row written so far (flushes first)."""
        if not self._closed:
            self.flush()
        conn, _ = connect_ro(self.path)
        try:
            return conn.execute(f"SELECT COUNT(*) FROM {TABLE}").fetchone()[0]
        finally:
            conn.close()

    def close(self) -> None:
        """Commit everything, stop the writer thread and close the file. Idempotent. If rows
        could not be committed they are saved as JSON lines beside the log and `LogWriteError`
        says where."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            atexit.unregister(self._at_exit)
            self._q.put(_STOP)
            self._thread.join()
            self._conn.close()
        self._raise_unwritten(save=True)

    def _at_exit(self) -> None:
        try:
            self.close()
        except LogWriteError as e:
            log.error("%s", e)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def unwritten(self) -> int:
        """Rows accepted but not committed (pending or refused), as far as the writer knows."""
        return len(self._pending) + len(self._failed)

    # --- the writer thread ------------------------------------------------------------------------
    def _run(self) -> None:
        q = self._q
        stop = False
        while not stop:
            markers: list[_Flush] = []
            try:
                try:  # rows left by a transient error are retried every second
                    item = q.get(timeout=1.0) if self._pending else q.get()
                except queue.Empty:
                    item = None
                deadline = time.monotonic() + self.batch_s
                while item is not None:
                    if item is _STOP:
                        stop = True
                    elif isinstance(item, _Flush):
                        markers.append(item)
                    else:
                        self._pending.append(self._tuple(item))
                    if stop or markers or len(self._pending) >= self.batch_rows:
                        break
                    left = deadline - time.monotonic()
                    try:
                        item = q.get(timeout=left) if left > 0 else q.get_nowait()
                    except queue.Empty:
                        break
                self._commit(retries=_TRANSIENT_RETRY_S if (stop or markers) else ())
                if stop:
                    self._drain_rest()
            except Exception as e:  # the writer must outlive any surprise
                self._transient = f"{type(e).__name__}: {e}"
                log.exception("request log %s: writer error", self.path)
            finally:
                for m in markers:
                    m.error = self._problem()
                    m.done.set()

    def _drain_rest(self) -> None:
        """After the stop marker: commit rows of writes that raced with `close`."""
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Flush):
                item.done.set()
            elif item is not _STOP:
                self._pending.append(self._tuple(item))
        self._commit(retries=_TRANSIENT_RETRY_S)

    def _tuple(self, row: dict[str, Any]) -> tuple:
        vals = [cell(row.get(n), t.split()[0]) for n, t in COLUMNS.items()]
        if not self.store_prompts:
            vals[_PROMPT] = None
        return tuple(vals)

    def _commit(self, retries: tuple[float, ...] = ()) -> None:
        """Insert and commit the pending rows. A transient error keeps them pending (retried after
        each delay in `retries`, then by the writer loop); rows refused for good are set aside."""
        for delay in (0.0, *retries):
            if not self._pending:
                return
            if delay:
                time.sleep(delay)
            try:
                self._insert(self._pending)
            except _REFUSED:
                self._isolate()  # some row is bad: insert one by one, set the bad ones aside
                continue
            except sqlite3.Error as e:
                self._transient = f"{type(e).__name__}: {e}"
                continue
            self.committed += len(self._pending)
            self._pending = []
            self._transient = None

    def _insert(self, rows: list[tuple]) -> None:
        """One transaction: all of `rows` or none (SQLite may have rolled back by itself)."""
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(_INSERT, rows)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    def _isolate(self) -> None:
        """Insert the pending rows one by one: refused ones are set aside, ones hitting a
        transient error stay pending."""
        still: list[tuple] = []
        for row in self._pending:
            try:
                self._insert([row])
                self.committed += 1
            except _REFUSED as e:
                self._failed.append((row, f"{type(e).__name__}: {e}"))
            except sqlite3.Error as e:
                self._transient = f"{type(e).__name__}: {e}"
                still.append(row)
        self._pending = still

    def _problem(self) -> str | None:
        parts = []
        if self._pending:
            parts.append(f"{len(self._pending)} row(s) not committed yet ({self._transient})")
        if self._failed:
            ex = "; ".join(f"id {row[0]!r}: {why}" for row, why in self._failed[:3])
            parts.append(f"{len(self._failed)} row(s) refused by SQLite (e.g. {ex})")
        return f"request log {self.path}: " + ", ".join(parts) if parts else None

    def _raise_unwritten(self, save: bool = False) -> None:
        problem = self._problem()
        if problem is None:
            return
        if save:
            rows = [(r, None) for r in self._pending] + self._failed
            dump = self.path.with_name(f"{self.path.name}.unwritten-{int(time.time())}.jsonl")
            try:
                with open(dump, "a") as f:
                    for r, why in rows:
                        rec = {
                            n: (v if isinstance(v, _JSONABLE) else repr(v)) for n, v in zip(NAMES, r)
                        }
                        f.write(json.dumps({**rec, "_error": why}) + "\n")
                problem += f"; saved them to {dump}"
            except OSError as e:
                problem += f"; could not save them to {dump} either ({e})"
        raise LogWriteError(problem)


_READERS = ("read_log", "LogRequests", "is_censored", "load_log_requests", "requests_from_log")


def __getattr__(name: str) -> Any:
    """The readers moved to `presched.serve.log_read`; old imports from here keep working."""
    if name in _READERS:
        from presched.serve import log_read

        return getattr(log_read, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
