"""ShareGPT-format conversations: `[{"id": ..., "conversations": [{"from", "value"}, ...]}]`.

One request per conversation: the first human turn (`from` = `human`/`user`) is the prompt, the
first assistant turn after it (`gpt`/`chatgpt`/`assistant`/`bard`/`model`) gives the output
length; a conversation without a reply gets `output_tokens=None`, one without a human turn is
skipped. Both lengths come from `count_tokens` (default `approx_tokens`: ~4 characters per
token, see `loaders.tokens`), so they are approximations unless you pass a real tokenizer.

The file is one JSON document (optionally `.gz`), so errors name the record (1-based position
in the list), not a line. Ids are `sharegpt-<conversation id>` (or `<file stem>-<record>` when a
record has no id). There are no timestamps: every arrival is 0.
"""

from __future__ import annotations

import json
from pathlib import Path

from presched.workload.loaders import LOADERS
from presched.workload.loaders.errors import LoadError, wrap_invalid_request
from presched.workload.loaders.fields import check_limit
from presched.workload.loaders.files import base_name, read_text
from presched.workload.loaders.tokens import TokenCounter, approx_tokens
from presched.workload.request import InvalidRequestError, Request

HUMAN = frozenset({"human", "user"})
ASSISTANT = frozenset({"gpt", "chatgpt", "assistant", "bard", "model"})


@LOADERS.register("sharegpt")
def load_sharegpt(
    path: str | Path, count_tokens: TokenCounter | None = None, limit: int | None = None
) -> list[Request]:
    """Load a ShareGPT JSON file (`.json` or `.json.gz`). `limit` keeps the first N requests."""
    limit = check_limit(limit)
    count = count_tokens or approx_tokens
    text = read_text(path, "ShareGPT file")
    path = Path(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise LoadError(
            path, f"invalid JSON ({e.msg} at column {e.colno})", line=e.lineno
        ) from None
    if not isinstance(data, list):
        raise LoadError(path, f"expected a JSON list of conversations, got {type(data).__name__}")
    stem = base_name(path)
    out: list[Request] = []
    seen: dict[str, int] = {}
    for k, rec in enumerate(data, start=1):
        if limit is not None and len(out) >= limit:
            break
        if not isinstance(rec, dict):
            raise LoadError(path, "expected a JSON object", line=k, unit="record")
        turns = rec.get("conversations")
        if not isinstance(turns, list):
            raise LoadError(
                path,
                f"expected a list of turns, got {turns!r}",
                line=k,
                field="conversations",
                unit="record",
            )
        prompt, reply = _first_exchange(turns, path, k)
        if prompt is None:
            continue
        cid = rec.get("id")
        rid = f"sharegpt-{cid}" if isinstance(cid, (str, int)) and str(cid) else f"{stem}-{k:06d}"
        if rid in seen:  # ids are not guaranteed unique in ShareGPT dumps
            seen[rid] += 1
            rid = f"{rid}#{seen[rid]}"
        else:
            seen[rid] = 0
        try:
            out.append(
                Request(
                    id=rid,
                    prompt_tokens=count(prompt),
                    output_tokens=None if reply is None else count(reply),
                    prompt=prompt,
                    metadata={"conversation_id": cid, "turns": len(turns)},
                )
            )
        except InvalidRequestError as e:
            raise wrap_invalid_request(e, path, k, unit="record") from None
    return out


def _first_exchange(turns: list, path: Path, k: int) -> tuple[str | None, str | None]:
    """(first human text, first assistant text after it); None where absent."""
    prompt = None
    for t, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value", ""), str):
            raise LoadError(
                path,
                f"turn {t + 1}: expected {{'from': ..., 'value': <text>}}, got {turn!r:.80}",
                line=k,
                field="conversations",
                unit="record",
            )
        role = str(turn.get("from", "")).lower()
        if prompt is None:
            if role in HUMAN:
                prompt = turn.get("value", "")
        elif role in ASSISTANT:
            return prompt, turn.get("value", "")
    return prompt, None
