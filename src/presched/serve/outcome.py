"""What happened to one request, and the request-log row that records it.

    out = Outcome()                               # who: `GatewayApp.generate`, once accepted
    ...                                           # `Relay` (and the app's error paths) fill it
    log.write(log_row(seq, body, chat, out, text))   # `GatewayApp._end`, once per request

`crash_row` is the row of a request that an unexpected exception ended before admission (it
has no `GatewaySeq`). The columns are `presched.serve.log.COLUMNS`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from presched.predict.estimate import LEVELS
from presched.serve.backend import Backend
from presched.serve.seq import GatewaySeq


class Outcome:
    """What happened to one accepted request (filled while serving, read by `GatewayApp._end`)."""

    __slots__ = ("status", "error", "kind", "tokens", "backend", "retries", "started", "finish_reason")

    def __init__(self) -> None:
        self.status = 0
        self.error: str | None = None
        self.kind = "server_error"
        self.tokens: int | None = None
        self.backend: Backend | None = None
        self.retries = 0
        self.started = False
        self.finish_reason: str | None = None


def log_row(seq: GatewaySeq, body: dict, chat: bool, out: Outcome, text: Any) -> dict[str, Any]:
    """The log row of an accepted request that has ended (`seq.finish` is set); `text` is the
    prompt text (None or token ids: no prompt stored)."""
    est = seq.estimate
    q = None if est is None else [round(est.quantile(p), 2) for p in LEVELS]
    fs, ft = seq.first_scheduled, seq.first_token
    return {
        "id": seq.id, "ts": seq.ts, "tenant": seq.tenant, "model": seq.request.model,
        "backend": out.backend.name if out.backend is not None else None,
        "endpoint": "chat" if chat else "completions", "stream": int(bool(body.get("stream"))),
        "status": out.status, "error": out.error, "prompt_tokens": seq.prompt_tokens,
        "max_tokens": seq.request.max_tokens,
        "output_tokens": out.tokens if out.status == 200 else None,  # engine usage only
        "finish_reason": out.finish_reason,
        "pred_mean": float(est.mean) if est is not None else None, "pred_quantiles": q,
        "priority": seq.key, "queue_wait_s": None if fs is None else fs - seq.arrival,
        "ttft_s": None if ft is None else ft - seq.arrival, "e2e_s": seq.finish - seq.arrival,
        "retries": out.retries, "prompt": text if isinstance(text, str) else None,
    }  # fmt: skip


def crash_row(tenant: str | None, chat: bool, e: Exception) -> dict[str, Any]:
    """The log row of a request that exception `e` ended before admission (status 500)."""
    return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:20]}", "ts": time.time(),
            "tenant": tenant, "endpoint": "chat" if chat else "completions", "status": 500,
            "error": f"gateway error: {type(e).__name__}: {e}", "retries": 0}  # fmt: skip
