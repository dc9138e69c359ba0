"""Azure LLM inference trace 2023 (Splitwise): `TIMESTAMP,ContextTokens,GeneratedTokens`.

    2023-11-16 18:17:03.9799600,4808,10

One request per row: `prompt_tokens` = ContextTokens, `output_tokens` = GeneratedTokens,
`arrival` = seconds since the earliest timestamp (the first row; the files are sorted). No
prompt text, model or session. Any other column goes to `metadata` as text, as in the generic
loader (an empty cell is absent); a column named twice is refused. Ids are `azure-<name>-<row index, 6 digits>` where `<name>` is the
file stem without the `AzureLLMInferenceTrace_` prefix (`azure-conv-000123`).

Timestamps have 7 fractional digits, more than `datetime` keeps, and 20k rows through
`strptime` or pandas per row is slow; they are split by hand: date -> day number (cached),
`HH:MM:SS.fffffff` -> seconds as float.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

from presched.workload.loaders import LOADERS
from presched.workload.loaders.errors import LoadError, wrap_invalid_request
from presched.workload.loaders.fields import MAX_ARRIVAL, check_limit, parse_int
from presched.workload.loaders.files import base_name, read_text, split_lines
from presched.workload.paths import data_dir
from presched.workload.request import InvalidRequestError, Request

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_TO_COLUMN = {
    "prompt_tokens": "ContextTokens",
    "output_tokens": "GeneratedTokens",
    "arrival": "TIMESTAMP",
}
_FOLDER = "azure-llm-2023"


@LOADERS.register("azure")
def load_azure(path: str | Path, limit: int | None = None) -> list[Request]:
    """Load an Azure LLM 2023 trace CSV (any path). `limit` keeps the first N rows."""
    limit = check_limit(limit)
    text = read_text(path, "Azure trace")
    path = Path(path)
    lines = split_lines(text)
    if not lines or not lines[0].strip():
        raise LoadError(path, f"empty file; expected the header {','.join(COLUMNS)}", line=1)
    header = [h.strip() for h in lines[0].split(",")]
    for col in COLUMNS:
        if col not in header:
            raise LoadError(path, f"missing column (header is {lines[0]!r})", line=1, field=col)
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        raise LoadError(path, "column appears more than once", line=1, field=dupes[0])
    i_ts, i_in, i_out = (header.index(c) for c in COLUMNS)
    extra = [(i, h) for i, h in enumerate(header) if h not in COLUMNS]  # kept in metadata
    width = len(header)
    name = base_name(path).removeprefix("AzureLLMInferenceTrace_")

    # (line, day, second of day, prompt, output, other columns)
    rows: list[tuple[int, int, float, int, int, dict[str, str]]] = []
    days: dict[str, int] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        if limit is not None and len(rows) >= limit:
            break
        if not line.strip():
            continue
        parts = line.split(",")
        if len(parts) != width:
            raise LoadError(
                path,
                f"expected {width} comma-separated fields, got {len(parts)}: {line!r}",
                line=lineno,
            )
        day, sod = _timestamp(parts[i_ts], days, path, lineno)
        prompt = parse_int(parts[i_in], path, lineno, "ContextTokens")
        output = parse_int(parts[i_out], path, lineno, "GeneratedTokens")
        other = {h: parts[i].strip() for i, h in extra if parts[i].strip()}
        rows.append((lineno, day, sod, prompt, output, other))

    if not rows:
        return []
    # Day and second-of-day stay separate so the 1e-7 s resolution survives the subtraction.
    d0, s0 = min((r[1], r[2]) for r in rows)
    out = []
    for k, (lineno, day, sod, prompt, output, other) in enumerate(rows):
        arrival = (day - d0) * 86400.0 + (sod - s0)
        if arrival > MAX_ARRIVAL:
            raise LoadError(path, f"{arrival:.0f} s after the earliest timestamp; a trace may span "
                            f"at most {MAX_ARRIVAL:g} s (116 days)", line=lineno, field="TIMESTAMP")  # fmt: skip
        try:
            out.append(
                Request(
                    id=f"azure-{name}-{k:06d}",
                    prompt_tokens=prompt,
                    arrival=arrival,
                    output_tokens=output,
                    metadata=other,
                )
            )
        except InvalidRequestError as e:
            raise wrap_invalid_request(e, path, lineno, _TO_COLUMN) from None
    return out


@LOADERS.register("azure-conv")
def load_azure_conv(path: str | Path | None = None, limit: int | None = None) -> list[Request]:
    """The shared conversation trace (19,366 rows, ~1 h, 5.53 req/s)."""
    return load_azure(path or data_dir() / _FOLDER / "AzureLLMInferenceTrace_conv.csv", limit)


@LOADERS.register("azure-code")
def load_azure_code(path: str | Path | None = None, limit: int | None = None) -> list[Request]:
    """The shared code-completion trace (8,819 rows, ~1 h, 2.57 req/s, very bursty)."""
    return load_azure(path or data_dir() / _FOLDER / "AzureLLMInferenceTrace_code.csv", limit)


def _timestamp(raw: str, days: dict[str, int], path: Path, lineno: int) -> tuple[int, float]:
    """`YYYY-MM-DD HH:MM:SS[.fraction]` -> (day number, seconds into that day)."""
    s = raw.strip()
    try:
        day_str, clock = s.split(" ") if " " in s else s.split("T")
        day = days.get(day_str)
        if day is None:
            day = days[day_str] = date.fromisoformat(day_str).toordinal()
        hh, mm, ss = clock.split(":")
        h, m, sec = int(hh), int(mm), float(ss)
        if not (0 <= h < 24 and 0 <= m < 60 and 0 <= sec < 61):
            raise ValueError
    except ValueError:
        raise LoadError(
            path,
            f"expected a timestamp like '2023-11-16 18:17:03.9799600', got {raw!r}",
            line=lineno,
            field="TIMESTAMP",
        ) from None
    return day, (h * 3600 + m * 60) + sec
