"""Reading input files: optional gzip, strict UTF-8 with the line of the first bad byte.

Loaders read a whole file into memory at once (the staged data sets are a few MB), which is
both the fastest way in Python and lets a decoding error be pinned to a line number.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterator

from presched.workload.loaders.errors import LoadError


def existing_file(path: str | Path, what: str = "input file") -> Path:
    """`path` as a Path, or `FileNotFoundError` naming the full path."""
    p = Path(path).expanduser()
    if not p.is_file():
        if p.exists():
            raise FileNotFoundError(f"{what} {str(p)!r} is not a file")
        raise FileNotFoundError(f"{what} not found: {str(p)!r}")
    return p


def read_text(path: str | Path, what: str = "input file") -> str:
    """The file's text; `.gz` files are decompressed. Non-UTF-8 bytes raise `LoadError`
    naming the line. A leading UTF-8 byte-order mark is dropped."""
    p = existing_file(path, what)
    if p.suffix == ".gz":
        try:
            with gzip.open(p, "rb") as f:
                data = f.read()
        except (OSError, EOFError) as e:
            raise LoadError(p, f"not a readable gzip file ({e})") from None
    else:
        data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise LoadError(
            p,
            f"not valid UTF-8 (byte {data[e.start : e.start + 1]!r} at offset {e.start})",
            line=line,
        ) from None
    text = text.removeprefix("\ufeff")
    return text


def base_name(path: str | Path) -> str:
    """The file name without `.gz` and its format suffix: `trace.jsonl.gz` -> `trace`."""
    name = Path(path).name
    name = name.removesuffix(".gz")
    stem, dot, _ = name.rpartition(".")
    return stem if dot else name


def format_suffix(path: str | Path) -> str:
    """The format suffix ignoring `.gz`: `trace.jsonl.gz` -> `.jsonl`."""
    p = Path(path)
    if p.suffix == ".gz":
        p = p.with_suffix("")
    return p.suffix.lower()


def split_lines(text: str) -> list[str]:
    """Lines split on `\\n` only (a trailing `\\r` dropped), so numbering matches what editors and
    `LoadError` count; `str.splitlines` would also split on characters that JSON text may contain
    raw (U+2028, U+0085, ...)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


class _RepeatedKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: a dict, or _RepeatedKey when a key occurs twice (json.loads
    keeps the last value silently)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_no_repeated_keys)


def jsonl_rows(text: str, path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSON Lines text; a line that is not
    valid JSON or not an object, or an object with a key twice (in any nested object too),
    raises LoadError naming the file and line (and the key as the field)."""
    for lineno, line in enumerate(split_lines(text), start=1):
        if not line.strip():
            continue
        try:
            row = _DECODER.decode(line)
        except json.JSONDecodeError as e:
            raise LoadError(
                path, f"invalid JSON ({e.msg} at column {e.colno})", line=lineno
            ) from None
        except _RepeatedKey as e:
            raise LoadError(path, "the key appears twice in one object (JSON would keep the last "
                            "value silently)", line=lineno, field=e.key) from None  # fmt: skip
        if not isinstance(row, dict):
            raise LoadError(path, f"expected a JSON object, got {type(row).__name__}", line=lineno)
        yield lineno, row
