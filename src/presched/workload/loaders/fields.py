"""Field parsers shared by the loaders; each raises `LoadError` naming file, line and field.

They accept both CSV text (`"12"`) and JSON values (`12`); an integer may also be written as an
integral float (`12.0`, what pandas writes for an int column with gaps). Booleans are refused.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from presched.workload.loaders.errors import LoadError

MAX_ARRIVAL = 1e7
"""Latest arrival a loader accepts, in seconds from the start of the log (~116 days): later ones
are Unix epoch times (1.7e9) or typos, and past ~1e7 s float rounding eats the milliseconds that
TTFT is made of."""
ARRIVAL_HINT = "; make epoch timestamps relative to the first request"


def parse_int(
    value: Any, path: Path, line: int, field: str, minimum: int = 1, unit: str = "line"
) -> int:
    """An integer >= `minimum` from CSV text or a JSON number."""
    out: int | None = None
    if isinstance(value, bool):
        out = None
    elif isinstance(value, int):
        out = value
    elif isinstance(value, float):
        out = int(value) if value.is_integer() else None
    elif isinstance(value, str):
        s = value.strip()
        try:
            out = int(s)
        except ValueError:
            try:
                f = float(s)
            except ValueError:
                f = math.nan
            out = int(f) if f.is_integer() else None
    if out is None or out < minimum:
        raise LoadError(
            path,
            f"expected an integer >= {minimum}, got {value!r}",
            line=line,
            field=field,
            unit=unit,
        )
    return out


def parse_float(
    value: Any,
    path: Path,
    line: int,
    field: str,
    minimum: float = 0.0,
    strict: bool = False,
    unit: str = "line",
    maximum: float | None = None,
    hint: str = "",
) -> float:
    """A finite number >= `minimum` (> `minimum` when `strict`), and <= `maximum` if given, from
    CSV text or JSON; `hint` is added to the message of a value past `maximum`."""
    out = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out = float(value)
    elif isinstance(value, str):
        try:
            out = float(value.strip())
        except ValueError:
            pass
    ok = math.isfinite(out) and (out > minimum if strict else out >= minimum)
    if not ok or (maximum is not None and out > maximum):
        op = ">" if strict else ">="
        most = "" if maximum is None else f" and <= {maximum:g}"
        raise LoadError(
            path,
            f"expected a finite number {op} {minimum:g}{most}, got {value!r}"
            + (hint if ok else ""),
            line=line,
            field=field,
            unit=unit,
        )
    return out


def parse_int_list(
    value: Any, path: Path, line: int, field: str, minimum: int = 1
) -> tuple[int, ...]:
    """A list of integers: a JSON list (in JSONL, or as CSV text starting with `[`, as
    `save_generic` writes metadata lists), or text with the numbers separated by spaces."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as e:
            raise LoadError(path, f"expected a JSON list of integers ({e.msg}), got {value!r}",
                            line=line, field=field) from None  # fmt: skip
        if not isinstance(parsed, list):
            raise LoadError(path, f"expected a JSON list of integers, got {value!r}", line=line, field=field)
        value = parsed
    if isinstance(value, str):
        items: list[Any] = value.split()
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise LoadError(
            path,
            f"expected a list of integers or space-separated integers, got {value!r}",
            line=line,
            field=field,
        )
    out = []
    for item in items:
        try:
            out.append(parse_int(item, path, line, field, minimum))
        except LoadError:
            raise LoadError(
                path,
                f"expected integers >= {minimum}, got {item!r} in {value!r}",
                line=line,
                field=field,
            ) from None
    return tuple(out)


def check_limit(limit: Any) -> int | None:
    """`limit` (keep the first N requests) must be None or an integer >= 0."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit: expected None or an integer >= 0, got {limit!r}")
    return limit
