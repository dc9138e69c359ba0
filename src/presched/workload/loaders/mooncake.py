"""Mooncake (Kimi) FAST'25 traces: JSON Lines with prefix-block hashes.

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 13]}

One request per line: `arrival` = timestamp (ms since trace start) / 1000, `prompt_tokens` =
input_length, `output_tokens` = output_length. `hash_ids` (ids of the prompt's 512-token prefix
blocks, the last one partial; equal ids = shareable KV cache, and an id names its whole prefix:
checked on the shared trace) become `block_hashes` with `hash_block_tokens` = 512, keeping the
ids of full blocks only (`input_length // 512` of them: the simulator's prefix cache, like vLLM's,
shares only full blocks); any other keys go to `metadata`. A row must have one id per block,
`ceil(input_length / 512)` (every row of both shared traces does), or none (no `hash_ids`, or
`[]`: nothing to share); another count is refused naming `hash_ids`. Ids are `mooncake-<name>-<row index, 6 digits>`, `<name>` being the
file stem without `_trace` (`mooncake-conversation-000123`).
"""

from __future__ import annotations

from pathlib import Path

from presched.workload.loaders import LOADERS
from presched.workload.loaders.errors import LoadError, wrap_invalid_request
from presched.workload.loaders.fields import ARRIVAL_HINT, MAX_ARRIVAL, check_limit, parse_float, parse_int
from presched.workload.loaders.files import base_name, jsonl_rows, read_text
from presched.workload.paths import data_dir
from presched.workload.request import InvalidRequestError, Request

BLOCK_TOKENS = 512
"""Tokens per Mooncake hash block (the trace's README)."""
REQUIRED = ("timestamp", "input_length", "output_length")
_TO_COLUMN = {
    "prompt_tokens": "input_length",
    "output_tokens": "output_length",
    "arrival": "timestamp",
}


@LOADERS.register("mooncake")
def load_mooncake(path: str | Path, limit: int | None = None) -> list[Request]:
    """Load a Mooncake trace (`.jsonl`, optionally `.gz`). `limit` keeps the first N rows."""
    limit = check_limit(limit)
    text = read_text(path, "Mooncake trace")
    path = Path(path)
    name = base_name(path).removesuffix("_trace")
    out: list[Request] = []
    if limit == 0:
        return out
    for lineno, row in jsonl_rows(text, path):  # parses lazily: rows past `limit` are not read
        for key in REQUIRED:
            if key not in row:
                raise LoadError(path, "missing", line=lineno, field=key)
        arrival = parse_float(row.pop("timestamp"), path, lineno, "timestamp",
                              maximum=MAX_ARRIVAL * 1000, hint=ARRIVAL_HINT) / 1000.0  # fmt: skip
        prompt = parse_int(row.pop("input_length"), path, lineno, "input_length")
        output = parse_int(row.pop("output_length"), path, lineno, "output_length")
        hashes = row.pop("hash_ids", [])
        if not isinstance(hashes, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in hashes
        ):
            raise LoadError(
                path, f"expected a list of integers, got {hashes!r}", line=lineno, field="hash_ids"
            )
        blocks = -(-prompt // BLOCK_TOKENS)  # ceil: one id per 512-token block, the last partial
        if hashes and len(hashes) != blocks:  # too few shrank the shareable prefix, extras were dropped
            raise LoadError(path, f"{len(hashes)} ids for input_length {prompt}, expected "
                            f"ceil({prompt} / {BLOCK_TOKENS}) = {blocks}", line=lineno, field="hash_ids")  # fmt: skip
        full = tuple(hashes[: prompt // BLOCK_TOKENS]) if prompt > 0 else ()
        try:
            out.append(
                Request(
                    id=f"mooncake-{name}-{len(out):06d}",
                    prompt_tokens=prompt,
                    arrival=arrival,
                    output_tokens=output,
                    block_hashes=full,
                    hash_block_tokens=BLOCK_TOKENS if full else 0,
                    metadata=row,
                )
            )
        except InvalidRequestError as e:
            raise wrap_invalid_request(e, path, lineno, _TO_COLUMN) from None
        if limit is not None and len(out) >= limit:
            break
    return out


@LOADERS.register("mooncake-conv")
def load_mooncake_conv(path: str | Path | None = None, limit: int | None = None) -> list[Request]:
    """The shared conversation trace (12,031 rows, ~1 h of real Kimi traffic, 3.40 req/s)."""
    return load_mooncake(path or data_dir() / "mooncake-fast25" / "conversation_trace.jsonl", limit)
