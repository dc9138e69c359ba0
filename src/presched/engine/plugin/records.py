"""Per-request records from inside the engine, in the gateway's request-log schema.

One row per request the engine freed (finished, length-capped or aborted), written to an SQLite
file with the gateway's `requests` table (`presched.serve.log.COLUMNS`, its `application_id`), so
`presched train --from-log FILE`, `read_log` and the harness read it as they read a gateway log.
Two columns are added (readers that do not know them leave them alone): `preemptions` and
`recomputed_tokens`, plus `pred_source` ('xargs', 'predictor', 'probe', 'refine', 'draft-probe' or
NULL; pred_mean and pred_quantiles are the request's final estimate, the last that replaced one).

Times are the engine core's (unix seconds): `ts` = vLLM's arrival time (set by its API server),
`queue_wait_s` = first admission to the running batch - arrival, `ttft_s` = first output token
back from the model - arrival, `e2e_s` = the request freed - arrival (the client sees each a few
milliseconds later, after detokenization and HTTP). `status` 200 for a request that stopped or
hit its length, 499 for one aborted (client gone) before it finished, 500 for one vLLM ended
with FINISHED_ERROR (`error` says so, `finish_reason` 'error': its output was cut short, so the
log readers leave it out of training data, as every row that is not 200); `finish_reason` is
vLLM's (FINISHED_IGNORED, a prompt over the length cap, is 'length'); `backend` = 'engine'.

With hidden-state features on (plugin config `features`), a side table `prompt_features` gets
one row per freed request that has a pooled prompt state: `id` (the requests row's), `spec` (the
`FeatureSpec` JSON: model folder name, layer, hidden, pooling 'mean', sink), `n` (positions
pooled), `missing`, `pools` (pooled states received, > 1 after a recompute), `steps` (per-step
states received), `vec` (little-endian float32 bytes, `features.unpack`). With
`features.draft_layer`, `draft_features` has the same columns for the draft model's pooled
prompt state (its spec's role 'draft', `steps` 0); with `features.egtp`, `egtp_features` for
the entropy-weighted pool (spec pooling 'egtp'). With `features.record_steps` (steps on),
`step_features` gets one row per freed request and generated-token count g in record_steps
that it reached (L > g): `id`, `g`, `spec` (FeatureSpec JSON, pooling 'step', role 'served', the
same model, layer, hidden and sink as the pooled prompt state's), `vec` (the state at its g-th
generated token), primary key (id, g): what `presched train -p probe-refine --from-log` reads;
`answer_features`, the same columns, the answer-so-far pool A_g at the same g (the mean of the
states at generated tokens 1..g; spec pooling 'answer'), for probe-refine with `answer` on.

Each row is committed when its request is freed (WAL, synchronous=NORMAL: no fsync, tens of
microseconds), so a killed engine loses none.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from presched.serve.log import APPLICATION_ID, COLUMNS, TABLE
from presched.serve.log_format import ADDED

EXTRA_COLUMNS: dict[str, str] = {"preemptions": "INTEGER", "recomputed_tokens": "INTEGER",
                                 "pred_source": "TEXT"}  # fmt: skip
ALL_COLUMNS = {**COLUMNS, **EXTRA_COLUMNS}


FEATURE_TABLE = "prompt_features"
DRAFT_FEATURE_TABLE = "draft_features"  # the same columns, the draft model's pooled states (steps 0)
EGTP_FEATURE_TABLE = "egtp_features"  # the same columns, the EGTP pools (`features.egtp`)
FEATURE_TABLES = (FEATURE_TABLE, EGTP_FEATURE_TABLE, DRAFT_FEATURE_TABLE)
FEATURE_COLUMNS: dict[str, str] = {"id": "TEXT PRIMARY KEY", "spec": "TEXT", "n": "INTEGER",
                                   "missing": "INTEGER", "pools": "INTEGER", "steps": "INTEGER",
                                   "vec": "BLOB"}  # fmt: skip
STEP_FEATURE_TABLE = "step_features"  # per-step states at `features.record_steps` tokens
STEP_FEATURE_COLUMNS: dict[str, str] = {"id": "TEXT", "g": "INTEGER", "spec": "TEXT", "vec": "BLOB"}
ANSWER_FEATURE_TABLE = "answer_features"  # the same columns: answer-so-far pools A_g (pooling 'answer')


class RecordError(RuntimeError):
    """The records file cannot be used (not a presched log, lacks columns)."""


class RecordWriter:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # a short lock wait: another writer must not stall the engine loop (sqlite waits 5 s)
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=0.1)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self._prepare()
        names = list(ALL_COLUMNS)
        self._insert = (f"INSERT OR REPLACE INTO {TABLE} ({', '.join(names)}) "
                        f"VALUES ({', '.join('?' * len(names))})")  # fmt: skip
        self._names = names
        self.rows = 0
        self._feature_inserts: dict[str, str] = {}  # feature table -> its INSERT, once the table exists

    def _prepare(self) -> None:
        c = self.conn
        app_id = c.execute("PRAGMA application_id").fetchone()[0]
        tables = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        if app_id not in (0, APPLICATION_ID) or (tables and TABLE not in tables):
            raise RecordError(f"records: {self.path} is not a presched request log")
        if TABLE not in tables:
            cols = ", ".join(f"{n} {t}" for n, t in ALL_COLUMNS.items())
            c.execute(f"CREATE TABLE {TABLE} ({cols})")
            c.execute(f"CREATE INDEX {TABLE}_ts ON {TABLE}(ts)")
            c.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            return
        have = {r[1] for r in c.execute(f"PRAGMA table_info({TABLE})")}
        missing = [n for n in COLUMNS if n not in have and n not in ADDED]
        if missing:
            raise RecordError(f"records: {self.path}: table {TABLE!r} lacks {', '.join(missing)}")
        for n, t in {**{a: COLUMNS[a] for a in ADDED}, **EXTRA_COLUMNS}.items():
            if n not in have:
                c.execute(f"ALTER TABLE {TABLE} ADD COLUMN {n} {t}")

    def write(self, row: dict[str, Any]) -> None:
        self.conn.execute(self._insert, [row.get(n) for n in self._names])  # autocommit
        self.rows += 1

    def write_features(self, seq, spec_json: str, egtp: bool = False) -> None:
        """The `prompt_features` row of a freed request (an EngineSeq with a pooled state), or
        with `egtp` its `egtp_features` row (the entropy-weighted pool of the same positions)."""
        table, vec = (EGTP_FEATURE_TABLE, seq.features_egtp) if egtp else (FEATURE_TABLE, seq.features_prompt)
        self._feature_row(table, vec, [seq.id, spec_json, seq.features_n, seq.features_missing,
                                       seq.feature_pools, seq.feature_steps])  # fmt: skip

    def write_draft_features(self, seq, spec_json: str) -> None:
        """The `draft_features` row of a freed request with the draft model's pooled state."""
        self._feature_row(DRAFT_FEATURE_TABLE, seq.features_draft,
                          [seq.id, spec_json, seq.draft_n, seq.draft_missing, seq.draft_pools, 0])  # fmt: skip

    def write_step_features(self, seq, spec_json: str, answer_spec_json: str | None = None) -> None:
        """The `step_features` rows of a freed request, one per g in `seq.features_record`, and
        with `answer_spec_json` its `answer_features` rows, one per g in
        `seq.features_record_answer`."""
        from presched.engine.plugin.features import pack

        tables = [(STEP_FEATURE_TABLE, spec_json, seq.features_record)]
        answers = getattr(seq, "features_record_answer", None)
        if answer_spec_json is not None and answers:
            tables.append((ANSWER_FEATURE_TABLE, answer_spec_json, answers))
        for table, spec, vecs in tables:
            insert = self._feature_insert(table, STEP_FEATURE_COLUMNS, ", PRIMARY KEY (id, g)")
            self.conn.executemany(insert, [(seq.id, int(g), spec, pack(v)) for g, v in sorted(vecs.items())])

    def _feature_row(self, table: str, vec, values: list) -> None:
        """One row of a feature table: `values` are FEATURE_COLUMNS but the last, `vec`."""
        from presched.engine.plugin.features import pack

        self.conn.execute(self._feature_insert(table, FEATURE_COLUMNS), [*values, pack(vec)])

    def _feature_insert(self, table: str, columns: dict[str, str], constraint: str = "") -> str:
        """The INSERT of a feature table, creating the table on first use."""
        insert = self._feature_inserts.get(table)
        if insert is None:
            cols = ", ".join(f"{n} {t}" for n, t in columns.items())
            self.conn.execute(f"CREATE TABLE IF NOT EXISTS {table} ({cols}{constraint})")
            insert = self._feature_inserts[table] = (
                f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) "
                f"VALUES ({', '.join('?' * len(columns))})")  # fmt: skip
        return insert

    def close(self) -> None:
        self.conn.close()


# vLLM 0.32's finish reason of each finished status (vllm.v1.request._FINISHED_REASON_MAP)
FINISH_REASONS = {"FINISHED_STOPPED": "stop", "FINISHED_LENGTH_CAPPED": "length",
                  "FINISHED_ABORTED": "abort", "FINISHED_IGNORED": "length",
                  "FINISHED_ERROR": "error", "FINISHED_REPETITION": "repetition"}  # fmt: skip
STATUS = {"FINISHED_ABORTED": 499, "FINISHED_ERROR": 500}  # as the client sees it; else 200
ERRORS = {"FINISHED_ERROR": "engine error: vLLM ended the request (FINISHED_ERROR: a grammar that "
                            "failed to compile or rejected a token, an encoder-cache mismatch or "
                            "a failed KV load)"}  # fmt: skip


def record_row(seq, status_name: str, model: str, prompt: str | None = None) -> dict[str, Any]:
    """The log row of a freed request (`seq`: an EngineSeq; `status_name`: vLLM's status)."""
    reason = FINISH_REASONS.get(status_name, status_name.lower())
    a = seq.arrival
    est = seq.estimate

    def since(t):
        return None if t is None else max(t - a, 0.0)

    return {
        "id": seq.id, "ts": a, "tenant": seq.request.tenant, "model": model, "backend": "engine",
        "endpoint": None, "stream": None, "status": STATUS.get(status_name, 200),
        "error": ERRORS.get(status_name), "prompt_tokens": seq.prompt_tokens,
        "max_tokens": seq.request.max_tokens,
        "output_tokens": seq.generated, "finish_reason": reason,
        "pred_mean": None if est is None else float(est.mean),
        "pred_quantiles": None if est is None else json.dumps([float(x) for x in est.quantiles]),
        "priority": None, "queue_wait_s": since(seq.first_scheduled),
        "ttft_s": since(seq.first_token), "e2e_s": since(seq.finish), "retries": 0,
        "prompt": prompt, "preemptions": seq.preemptions,
        "recomputed_tokens": seq.recomputed_tokens, "pred_source": seq.pred_source,
    }  # fmt: skip
