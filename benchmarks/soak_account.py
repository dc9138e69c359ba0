"""The soak benchmark's accounting: what the client saw joined with what the gateway logged.

`account(recs, rows)` is a pure function (tested on hand-made cases in
tests/benchmarks/test_soak_script.py); `read_rows(path)` reads the gateway's SQLite log.
Definitions: see benchmarks/soak.py's module doc.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter
from pathlib import Path

import numpy as np

UID = re.compile(r"soak-([rs]\d+)")
"""The client's id of a request, at the start of its prompt (`soak-s123 ...`)."""
MALFORMED = ("truncated_json", "not_object", "max_tokens_string", "max_tokens_negative",
             "unknown_model", "n_3", "too_large", "bad_key", "chat_with_prompt")  # fmt: skip
"""Kinds of malformed request; each must get a 4xx and never be accepted."""
UNANSWERED = ("timeout", "conn_error", "cut")
"""Client outcomes without a final answer (final: 'ok', 'answered', 'stream_error'; neither:
'left' on purpose, 'not_sent')."""


def account(recs: list[dict], rows: list[dict]) -> dict:
    """Join client records (`Rec.row()`) with log rows (`id, tenant, status, error, prompt,
    queue_wait_s`) by the id in the prompt; the figures and their evidence (see the module doc)."""
    by_uid: dict[str, list[dict]] = {}
    unknown_rows = 0
    for r in rows:
        m = UID.search(r.get("prompt") or "")
        if m is None:
            unknown_rows += 1
        else:
            by_uid.setdefault(m[1], []).append(r)
    sent = [r for r in recs if r["outcome"] != "not_sent"]
    uids = {r["uid"] for r in sent}
    unanswered = [r["uid"] for r in sent if r["outcome"] in UNANSWERED]
    accepted = [r for r in sent if r["uid"] in by_uid or r["rid"] or r["status"] == 200]
    unlogged = [r["uid"] for r in accepted if r["uid"] not in by_uid]
    lost = sorted(set(unanswered) | set(unlogged))
    dup_logged = {u: len(v) for u, v in by_uid.items() if len(v) > 1}
    rids = Counter(r["rid"] for r in sent if r["rid"])
    dup_uids = set(dup_logged) | {r["uid"] for r in sent if rids.get(r["rid"], 0) > 1}
    ids = Counter(r["id"] for r in rows if UID.search(r.get("prompt") or "") is None)
    duplicated = len(dup_uids) + sum(n - 1 for n in ids.values() if n > 1)  # per request
    causes: Counter = Counter()
    bad_5xx = []
    for r in sent:
        logged = by_uid.get(r["uid"])
        status = logged[-1]["status"] if logged else r["status"]
        why = (logged[-1]["error"] if logged else r["msg"]) or ""
        if status is None or status < 500:
            continue
        allowed = status in (502, 503, 504) and "backend" in why.lower()
        causes[f"{status} {'backend' if allowed else 'GATEWAY'}: {why[:90]}"] += 1
        if not allowed:
            bad_5xx.append(r["uid"])
    strays = [u for u in by_uid if u not in uids]  # logged, never sent in this phase
    bad_5xx += [u for u in strays if any((x["status"] or 0) >= 500 for x in by_uid[u])]
    waits = [x["queue_wait_s"] for u, v in by_uid.items() for x in v
             if x["tenant"] == "victim" and x["queue_wait_s"] is not None]  # fmt: skip
    malformed = [r for r in sent if r["kind"] in MALFORMED]
    disagree = [r["uid"] for r in sent if r["outcome"] == "ok" and r["uid"] in by_uid
                and by_uid[r["uid"]][-1]["status"] != 200]  # fmt: skip
    return {
        "lost": len(lost),
        "duplicated": duplicated,
        "gateway_5xx": len(bad_5xx),
        "victim_p99_wait_s": float(np.percentile(waits, 99)) if waits else float("nan"),
        "sent": len(sent),
        "not_sent": len(recs) - len(sent),
        "accepted": len(accepted),
        "logged_once": sum(1 for u in uids if len(by_uid.get(u, ())) == 1),
        "logged_rows": len(rows),
        "unknown_rows": unknown_rows,
        "stray_logged": len(strays),
        "unanswered": len(unanswered),
        "accepted_unlogged": len(unlogged),
        "unanswered_accepted": sum(1 for u in unanswered if u in by_uid),  # the rest: never logged
        "conn_errors": dict(
            Counter((r["msg"] or "").split(":")[0] for r in sent if r["outcome"] == "conn_error")
        ),
        "outcomes": dict(Counter(r["outcome"] for r in sent)),
        "statuses": dict(Counter(str(r["status"]) for r in sent)),
        "log_statuses": dict(Counter(str(x["status"]) for x in rows)),
        "by_kind": {
            k: dict(Counter(f"{r['outcome']} {r['status']}" for r in sent if r["kind"] == k))
            for k in sorted({r["kind"] for r in sent})
        },
        "malformed_accepted": sum(1 for r in malformed if r["status"] == 200 or r["uid"] in by_uid),
        "five_xx_causes": dict(causes.most_common()),
        "ok_but_log_disagrees": len(disagree),
        "examples": {
            "lost": lost[:10],
            "gateway_5xx": bad_5xx[:10],
            "duplicated": sorted(dup_uids)[:10],
            "log_disagrees": disagree[:10],
        },
    }


def read_rows(path: Path) -> list[dict]:
    """Every row of the gateway's log (read-only), plus rows it saved as unwritten JSON lines."""
    rows = []
    if path.exists():
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        con.row_factory = sqlite3.Row
        try:
            rows = [dict(r) for r in con.execute(
                "SELECT id, tenant, status, error, prompt, queue_wait_s, backend FROM requests")]  # fmt: skip
        finally:
            con.close()
    for extra in path.parent.glob(path.name + ".unwritten-*.jsonl"):
        rows += [json.loads(line) for line in extra.read_text().splitlines() if line.strip()]
    return rows
