"""Is a run far past the deployment's capacity? `presched simulate` warns when it is: the queue
then grows for the whole run, and the latencies measure the backlog, not the policy.

Both rates are taken over the arrival window (first to last arrival):

    offered = output tokens of every request / window
    served  = output tokens generated inside the window / window

A request's tokens are counted as generated evenly between its first token and its finish. Over
the window, not until the last request finished: after the last arrival the deployment only
drains, and one long answer arriving near the end (CASTILLO's lengths reach 15k tokens) would
otherwise make a run with no queue at all look slow. A short, bursty window can still offer more
than it serves for a moment without any queue forming, so the warning also needs the queue: the
mean TTFT (mostly queue wait) at least the mean decode time.
"""

from __future__ import annotations

import numpy as np

from presched.metrics.records import RecordTable


def load_ratio(records: RecordTable) -> tuple[float, float] | None:
    """(offered, served) output tokens per second over the arrival window; None when the window
    is empty (fewer than two distinct arrival times)."""
    arrival = np.asarray(records.arrival, dtype=float)
    if len(arrival) < 2:
        return None
    start, end = float(arrival.min()), float(arrival.max())
    window = end - start
    if window <= 0:
        return None
    tokens = np.asarray(records.output_tokens, dtype=float)
    first, finish = np.asarray(records.first_token, dtype=float), np.asarray(records.finish, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(finish > first, (end - first) / (finish - first), (first <= end).astype(float))
    done = float(np.sum(tokens * np.clip(share, 0.0, 1.0)))
    return float(tokens.sum()) / window, done / window


def overload_warning(records: RecordTable, ratio: float = 1.5) -> str | None:
    """A line when the workload offered output tokens at `ratio` times or more the rate the
    deployment served them while requests arrived, and requests waited longer for their first
    token than they took to decode (a queue formed); None otherwise."""
    rates = load_ratio(records)
    if rates is None:
        return None
    offered, served = rates
    ttft = float(np.mean(records.ttft))
    if offered < ratio * max(served, 1e-9) or ttft < float(np.mean(records.finish - records.first_token)):
        return None
    times = f"{offered / served:.1f}x" if served > 0 else "far more than"
    return (f"offered load is {times} what this deployment served while requests arrived "
            f"({offered:,.0f} vs {served:,.0f} output tok/s): the queue grows for the whole run "
            f"(mean TTFT {ttft:,.0f} s). Lower --rate, add --instances, or use "
            "`presched bench`, which runs at fractions of the measured capacity.")  # fmt: skip
