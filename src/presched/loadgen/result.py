"""What `presched replay` returns: `ReplayResult` (summary under the simulator's metric names,
one row per request, the completed requests as a `RecordTable`) and its JSON / CSV / table / PNG
outputs; `build_result` turns the requests' `Outcome`s into it through `metrics.summarize`, the
simulator's own code.
"""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from rich.table import Table

from presched.loadgen.wire import Outcome
from presched.metrics.records import RecordTable
from presched.metrics.summary import GoodputSLO, summarize
from presched.workload.request import Request

if TYPE_CHECKING:
    from presched.loadgen.replay import ReplayConfig


@dataclass
class _Record:
    """What `RecordTable.from_seqs` needs of one completed request."""

    id: str
    tenant: str
    arrival: float
    first_scheduled: float
    first_token: float
    finish: float
    max_itl: float
    prompt_tokens: int
    generated: int
    instance: int
    request: Request
    preemptions: int = 0
    recomputed_tokens: int = 0


@dataclass(repr=False)
class ReplayResult:
    """One replay: `summary` (simulator metric names plus failed, errors_by_status, send lag),
    `rows` (one dict per request, failed ones included), `records` (completed requests only)."""

    config: ReplayConfig
    model: str
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    records: RecordTable | None
    itl: tuple[np.ndarray, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # short: asyncio may repr the task holding it
        s = self.summary
        done = s.get("completed", 0)
        return f"ReplayResult({s['requests']} requests, {done} completed, {s['failed']} failed)"

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def to_json(self, path: str | Path) -> Path:
        """Config (without API keys), model, summary and `meta`; NaN is written as null."""
        cfg = json.loads(self.config.model_dump_json())
        cfg["api_key"] = "***" if self.config.api_key else None
        cfg["tenant_keys"] = {k: "***" for k in self.config.tenant_keys}
        doc = {"config": cfg, "model": self.model, "meta": self.meta, "summary": self.summary}
        path = Path(path)
        path.write_text(json.dumps(nan_to_none(doc), indent=2, default=str))
        return path

    def to_csv(self, path: str | Path) -> Path:
        path = Path(path)
        self.frame().to_csv(path, index=False)
        return path

    def table(self) -> Table:
        """Every summary figure, as `presched simulate` prints them."""
        s = self.summary
        title = f"replay: {s.get('completed', 0)}/{s['requests']} completed, {s['failed']} failed"
        caption = f"{self.model} ({self.config.endpoint}) at {self.config.url}"
        table = Table(title=title, caption=caption)
        table.add_column("metric")
        table.add_column("value", justify="right")
        for k, v in s.items():
            if isinstance(v, dict):
                v = ", ".join(f"{a}: {b}" for a, b in v.items()) or "-"
            table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
        return table

    def plot(self, path: str | Path) -> Path:
        """PNG: CDFs of E2E latency, TTFT and ITL, and the generator's send lag over the run."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        df = self.frame()
        ok = df[df["ok"]] if len(df) else df
        fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
        panels = [
            (axes[0, 0], ok.get("e2el_s"), "E2E latency (s)"),
            (axes[0, 1], ok.get("ttft_s"), "TTFT (s)"),
            (axes[1, 0], self.itl[0] if self.config.stream else None, "inter-token gap (s)"),
        ]
        for ax, col, label in panels:
            x = np.sort(np.asarray(col if col is not None else [], dtype=float))
            x = x[np.isfinite(x)]
            if x.size:
                ax.step(x, np.arange(1, x.size + 1) / x.size, where="post")
            else:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            ax.set_xlabel(label)
            ax.set_ylabel("fraction of requests" if "gap" not in label else "fraction of gaps")
            ax.grid(True, alpha=0.3)
        ax = axes[1, 1]
        if len(df):
            ax.plot(df["scheduled_s"], df["send_lag_ms"], ".", ms=3)
        ax.set_xlabel("scheduled send time (s)")
        ax.set_ylabel("generator send lag (ms)")
        ax.grid(True, alpha=0.3)
        s = self.summary
        fig.suptitle(f"replay of {s['requests']} requests to {self.model} ({self.config.endpoint}"
                     f"{', stream' if self.config.stream else ''}): {s['failed']} failed, "
                     f"max send lag {s['max_send_lag_ms']:.1f} ms", fontsize=10)  # fmt: skip
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


def nan_to_none(x):
    """`x` with every non-finite float (NaN, inf) replaced by None, for strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: nan_to_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [nan_to_none(v) for v in x]
    return x


def build_result(
    reqs: Sequence[Request],
    cfg: ReplayConfig,
    model: str,
    due: list[float],
    dispatched: list[float],
    sent: list[float],
    outcomes: Sequence[Outcome],
    max_tokens: Sequence[int],
    wall: float,
    slo: GoodputSLO | None,
) -> ReplayResult:
    """The result of a replay (called once by `replay.replay_async`): per request i its scheduled
    (`due`), handed-to-the-client (`dispatched`) and sent times, its `Outcome` and the max_tokens
    it was sent with; failed requests become rows only, the rest also records for `summarize`."""
    rows, recs, gaps = [], [], []
    errors: Counter[str] = Counter()
    backends: dict[str, int] = {}
    for i, (r, o) in enumerate(zip(reqs, outcomes)):
        row, gap = _row(r, o, cfg, due[i], dispatched[i], sent[i], max_tokens[i], backends)
        rows.append(row)
        if not row["ok"]:
            errors[o.kind] += 1
            continue
        gaps.append(gap)
        recs.append(_Record(r.id, r.tenant, row["sent_s"], row["first_scheduled_s"],
                            o.first_token, o.finish, row["max_itl_s"], row["prompt_tokens"],
                            row["output_tokens"], row["instance"], r))  # fmt: skip

    records = RecordTable.from_seqs(recs) if recs else None
    v = np.concatenate(gaps) if gaps else np.empty(0)
    itl = (v, np.ones(v.size, dtype=np.int64))
    summary: dict[str, Any] = {"completed": 0}
    if records is not None:
        with warnings.catch_warnings(), np.errstate(invalid="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # NaN queue waits without the header
            summary = summarize(records, itl, slo)
        _finite_queue_wait(summary, records)
        if not cfg.stream:  # no token before the last one was seen
            for k in list(summary):
                if k.endswith(("_tpot_ms", "_itl_ms")):
                    summary[k] = math.nan
    lag = np.asarray([row["send_lag_ms"] for row in rows])
    wait = np.asarray([row["client_wait_ms"] for row in rows])
    span = due[-1] - due[0]
    summary.update({
        "requests": len(reqs),
        "failed": int(sum(errors.values())),
        "errors_by_status": dict(sorted(errors.items())),
        "usage_missing": int(sum(row["usage_missing"] for row in rows)),
        "offered_rate": (len(reqs) - 1) / span if span > 0 else math.nan,
        "wall_s": wall,
        "mean_send_lag_ms": float(lag.mean()),
        "p99_send_lag_ms": float(np.percentile(lag, 99)),
        "max_send_lag_ms": float(lag.max()),
        "mean_client_wait_ms": float(wait.mean()),
        "max_client_wait_ms": float(wait.max()),
    })  # fmt: skip
    return ReplayResult(cfg, model, summary, rows, records, itl)


def _row(r: Request, o: Outcome, cfg: ReplayConfig, due: float, dispatched: float, sent: float,
         max_tokens: int, backends: dict[str, int]) -> tuple[dict[str, Any], np.ndarray]:  # fmt: skip
    """One request's CSV row (times in seconds from the start), and its inter-token gaps."""
    generated = o.completion_tokens if o.completion_tokens is not None else len(o.events)
    if o.kind is None and generated <= 0:
        o.fail("no_tokens", "the reply has no output token")
    ok = o.kind is None
    instance = -1  # backend header: an index, or a name numbered in order of first appearance
    if o.backend is not None and o.backend.isdigit():
        instance = int(o.backend)
    elif o.backend is not None:
        instance = backends.setdefault(o.backend, len(backends))
    ev = np.asarray(o.events, dtype=float)
    gap = np.diff(ev) if cfg.stream and ev.size > 1 else np.empty(0)
    row = {
        "id": r.id, "tenant": r.tenant, "ok": ok, "status": o.status, "error": o.error,
        "scheduled_s": due, "sent_s": sent,
        "send_lag_ms": (dispatched - due) * 1e3, "client_wait_ms": (sent - dispatched) * 1e3,
        "first_scheduled_s": sent + o.queue_wait_ms / 1e3, "first_token_s": o.first_token,
        "finish_s": o.finish, "queue_wait_s": o.queue_wait_ms / 1e3,
        "ttft_s": o.first_token - sent, "e2el_s": o.finish - sent,
        "prompt_tokens": o.prompt_tokens if o.prompt_tokens is not None else r.prompt_tokens,
        "data_prompt_tokens": r.prompt_tokens, "max_tokens_sent": max_tokens,
        "output_tokens": generated if ok else None,
        "usage_missing": ok and o.completion_tokens is None,
        "finish_reason": o.finish_reason, "events": len(o.events),
        "max_itl_s": float(gap.max()) if gap.size else (0.0 if cfg.stream else math.nan),
        "backend": o.backend, "instance": instance,
    }  # fmt: skip
    return row, gap


def _finite_queue_wait(summary: dict[str, Any], rec: RecordTable) -> None:
    """summarize's long-request P99 and max queue wait are NaN as soon as one request lacks the
    queue-wait header; recompute them over the requests that have it (still NaN if none has)."""
    wait = rec.queue_wait
    finite = np.isfinite(wait)
    if finite.all() or not finite.any():
        return
    n = len(rec)
    half = max(n // 2, 1)
    longest = np.argsort(rec.output_tokens, kind="stable")[n - half :]
    w_long = wait[longest][np.isfinite(wait[longest])]
    summary["long_p99_queue_wait_ms"] = (
        float(np.percentile(w_long, 99) * 1e3) if w_long.size else math.nan
    )
    summary["max_queue_wait_ms"] = float(wait[finite].max() * 1e3)
