"""The generic request-log schema: how to bring your own data (JSONL or CSV, `.gz` allowed).

One request per JSONL line / CSV row. Columns (see docs/workloads.md for the full table):

| column           | required | meaning                                                            |
|------------------|----------|--------------------------------------------------------------------|
| `prompt_tokens`  | yes*     | prompt length in tokens (* or give `prompt` and it is counted)     |
| `id`             | no       | unique id (a repeat is refused); default `<stem>-<row index:06d>`  |
| `arrival`        | no       | seconds since the start of the log (<= 1e7); default 0             |
| `output_tokens`  | no       | true output length (>= 1; 0 is refused as a bad row); a JSON list = |
|                  |          | sampled lengths: the first is the length, all go to output_samples |
| `max_tokens`     | no       | generation cap of the request                                      |
| `tenant`         | no       | tenant / user class; default "default"                             |
| `model`          | no       | model name                                                         |
| `prompt`         | no       | prompt text                                                        |
| `output_samples` | no       | other observed output lengths: JSON list or space-separated ints   |
| `slo_ttft`, `slo_tpot`, `slo_e2e` | no | latency targets in seconds                            |
| `block_hashes`   | no       | prefix-cache hashes of full blocks (JSON list / space-separated)   |
| `hash_block_tokens` | with block_hashes | tokens per hashed block                               |

Any other column goes to `metadata` (CSV values stay strings). In CSV an empty cell means
"absent"; in JSONL so does `null`. The format is chosen by extension: `.jsonl`/`.ndjson` or `.csv`.
`save_generic` writes the same schema, so `load_generic(save_generic(reqs, p))` gives back
equal requests (metadata values survive JSONL as JSON; in CSV they come back as strings).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from presched.workload.loaders import LOADERS
from presched.workload.loaders.errors import LoadError, wrap_invalid_request
from presched.workload.loaders.fields import (
    ARRIVAL_HINT,
    MAX_ARRIVAL,
    check_limit,
    parse_float,
    parse_int,
    parse_int_list,
)
from presched.workload.loaders.files import base_name, format_suffix, jsonl_rows, read_text
from presched.workload.loaders.tokens import TokenCounter, approx_tokens
from presched.workload.request import InvalidRequestError, Request

FIELDS = (
    "id", "arrival", "prompt_tokens", "output_tokens", "max_tokens", "tenant", "model", "prompt",
    "output_samples", "slo_ttft", "slo_tpot", "slo_e2e", "block_hashes", "hash_block_tokens",
)  # fmt: skip
"""Schema columns in the order `save_generic` writes them."""

JSONL_SUFFIXES = (".jsonl", ".ndjson")
CSV_SUFFIXES = (".csv",)


def _kind(path: Path) -> str:
    suffix = format_suffix(path)
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in CSV_SUFFIXES:
        return "csv"
    known = ", ".join(JSONL_SUFFIXES + CSV_SUFFIXES)
    raise ValueError(
        f"path: cannot tell the format of {str(path)!r} from its extension; use one of {known} (optionally + .gz)"
    )


@LOADERS.register("generic")
def load_generic(
    path: str | Path,
    count_tokens: TokenCounter | None = None,
    limit: int | None = None,
    ignore: Iterable[str] = (),
) -> list[Request]:
    """Load a log in the generic schema. `count_tokens` counts `prompt` text when a row has no
    `prompt_tokens` (default `approx_tokens`, ~4 chars/token). `limit` keeps the first N rows.
    `ignore` names columns dropped unread (`presched predict` ignores the output lengths)."""
    limit = check_limit(limit)
    path = Path(path)
    kind = _kind(path)
    text = read_text(path, "request log")
    rows = _jsonl_rows(text, path) if kind == "jsonl" else _csv_rows(text, path)
    count = count_tokens or approx_tokens
    stem = base_name(path)
    drop = tuple(ignore)
    out: list[Request] = []
    first_line: dict[str, int] = {}  # id -> the line that gave it: ids are unique in a workload
    for lineno, row in rows:
        if limit is not None and len(out) >= limit:
            break
        for name in drop:
            row.pop(name, None)
        req = _request(row, path, lineno, f"{stem}-{len(out):06d}", count)
        if req.id in first_line:  # replay derives a request's prompt text and seed from its id
            raise LoadError(path, f"id {req.id!r} is already used on line {first_line[req.id]}; "
                            "ids must be unique", line=lineno, field="id")  # fmt: skip
        first_line[req.id] = lineno
        out.append(req)
    return out


def _jsonl_rows(text: str, path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    for lineno, row in jsonl_rows(text, path):
        yield lineno, {k: v for k, v in row.items() if v is not None}


def _csv_rows(text: str, path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        return
    if "prompt_tokens" not in header and "prompt" not in header:
        raise LoadError(
            path,
            f"missing column: the header needs prompt_tokens or prompt (it is {','.join(header)!r})",
            line=1,
            field="prompt_tokens",
        )
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        raise LoadError(path, "column appears more than once", line=1, field=dupes[0])
    prev = reader.line_num
    for row in reader:
        lineno = prev + 1
        prev = reader.line_num
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != len(header):
            raise LoadError(
                path,
                f"expected {len(header)} fields (as in the header), got {len(row)}",
                line=lineno,
            )
        yield lineno, {h: v for h, v in zip(header, row) if v != ""}


def _request(
    row: dict[str, Any], path: Path, line: int, default_id: str, count: TokenCounter
) -> Request:
    row = dict(row)
    kw: dict[str, Any] = {}
    prompt = row.pop("prompt", None)
    if prompt is not None:
        if not isinstance(prompt, str):
            raise LoadError(path, f"expected text, got {prompt!r}", line=line, field="prompt")
        kw["prompt"] = prompt
    if "prompt_tokens" in row:
        kw["prompt_tokens"] = parse_int(row.pop("prompt_tokens"), path, line, "prompt_tokens")
    elif prompt is not None:
        kw["prompt_tokens"] = count(prompt)
    else:
        raise LoadError(
            path,
            "missing (give prompt_tokens, or prompt text to count)",
            line=line,
            field="prompt_tokens",
        )
    rid = row.pop("id", default_id)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or str(rid) == "":
        raise LoadError(path, f"expected a non-empty string, got {rid!r}", line=line, field="id")
    kw["id"] = str(rid)
    if "arrival" in row:
        kw["arrival"] = parse_float(row.pop("arrival"), path, line, "arrival",
                                    maximum=MAX_ARRIVAL, hint=ARRIVAL_HINT)  # fmt: skip
    out = row.pop("output_tokens", None)
    if isinstance(out, list) or (isinstance(out, str) and out.lstrip().startswith("[")):
        # sampled lengths (a JSON list; in CSV, a cell holding one): the first is the length
        if "output_samples" in row:
            raise LoadError(path, "a list here holds the samples; give it or output_samples, "
                            "not both", line=line, field="output_tokens")  # fmt: skip
        samples = parse_int_list(out, path, line, "output_tokens")
        if not samples:
            raise LoadError(path, "expected an integer >= 1 or a non-empty list, got []",
                            line=line, field="output_tokens")  # fmt: skip
        kw["output_tokens"], kw["output_samples"] = samples[0], samples
    elif out is not None:
        kw["output_tokens"] = parse_int(out, path, line, "output_tokens")
    if "max_tokens" in row:
        kw["max_tokens"] = parse_int(row.pop("max_tokens"), path, line, "max_tokens")
    for name in ("tenant", "model"):
        if name in row:
            v = row.pop(name)
            if not isinstance(v, str) or (name == "tenant" and not v):
                raise LoadError(path, f"expected text, got {v!r}", line=line, field=name)
            kw[name] = v
    if "output_samples" in row:
        kw["output_samples"] = parse_int_list(
            row.pop("output_samples"), path, line, "output_samples"
        )
    for name in ("slo_ttft", "slo_tpot", "slo_e2e"):
        if name in row:
            kw[name] = parse_float(row.pop(name), path, line, name, strict=True)
    if "block_hashes" in row:
        kw["block_hashes"] = parse_int_list(row.pop("block_hashes"), path, line, "block_hashes",
                                            minimum=-(2**63))  # fmt: skip
    if "hash_block_tokens" in row:
        kw["hash_block_tokens"] = parse_int(row.pop("hash_block_tokens"), path, line,
                                            "hash_block_tokens")  # fmt: skip
    try:
        return Request(**kw, metadata=row)
    except InvalidRequestError as e:
        raise wrap_invalid_request(e, path, line) from None


def save_generic(requests: Iterable[Request], path: str | Path) -> Path:
    """Write requests in the generic schema (format by extension, `.gz` compresses); returns
    the path. Fields at their default (None, "", (), tenant "default", arrival 0 in JSONL) are
    left out. Metadata keys become extra columns; a metadata key that is also a schema column is
    refused. In CSV, metadata lists/dicts are written as JSON text."""
    path = Path(path)
    kind = _kind(path)
    rows = [_row(r) for r in requests]
    if kind == "jsonl":
        body = "".join(
            json.dumps(row, ensure_ascii=False, default=_json_default) + "\n" for row in rows
        )
    else:
        columns = [f for f in FIELDS if any(f in row for row in rows)]
        extra = sorted({k for row in rows for k in row} - set(FIELDS))
        buf = io.StringIO(newline="")
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(columns + extra)
        for row in rows:
            writer.writerow([_csv_cell(row.get(c)) for c in columns + extra])
        body = buf.getvalue()
    data = body.encode("utf-8")
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    return path


def _row(r: Request) -> dict[str, Any]:
    row: dict[str, Any] = {"id": r.id}
    if r.arrival != 0:
        row["arrival"] = float(r.arrival)
    row["prompt_tokens"] = r.prompt_tokens
    for name in ("output_tokens", "max_tokens"):
        if getattr(r, name) is not None:
            row[name] = getattr(r, name)
    if r.tenant != "default":
        row["tenant"] = r.tenant
    if r.model:
        row["model"] = r.model
    if r.prompt is not None:
        row["prompt"] = r.prompt
    if r.output_samples:
        row["output_samples"] = list(r.output_samples)
    for name in ("slo_ttft", "slo_tpot", "slo_e2e"):
        if getattr(r, name) is not None:
            row[name] = getattr(r, name)
    if r.block_hashes:
        row["block_hashes"] = list(r.block_hashes)
        row["hash_block_tokens"] = r.hash_block_tokens
    for key, value in r.metadata.items():
        if key in FIELDS:
            raise ValueError(
                f"request {r.id!r}: metadata key {key!r} is also a schema column; rename it"
            )
        row[key] = list(value) if isinstance(value, tuple) else value
    return row


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return " ".join(str(v) for v in value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False, default=_json_default)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _json_default(value: Any) -> Any:
    """Metadata values JSON does not know: numpy scalars/arrays, sets; else their text."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)
