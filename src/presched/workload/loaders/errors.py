"""`LoadError`: a bad row in an input file, reported as file + line + field.

Every loader raises it for anything wrong inside a file (a malformed value, a missing column,
bytes that are not UTF-8, a value the `Request` record refuses), so a user can go straight to
the offending line:

    AzureLLMInferenceTrace_conv.csv line 17, field 'GeneratedTokens': expected an integer >= 1, got 'abc'

Line numbers are 1-based and count physical lines; for CSV the header is line 1. Formats that
are one JSON document (ShareGPT) count records instead (`record 17`). A missing file is a plain
`FileNotFoundError` with the path.
"""

from __future__ import annotations

import re
from pathlib import Path

from presched.workload.request import InvalidRequestError


class LoadError(ValueError):
    """A problem at a place in an input file. Attributes: `path`, `line`, `field`, `problem`."""

    def __init__(
        self,
        path: str | Path,
        problem: str,
        line: int | None = None,
        field: str | None = None,
        unit: str = "line",
    ) -> None:
        self.path = Path(path)
        self.problem = problem
        self.line = line
        self.field = field
        where = self.path.name
        if line is not None:
            where += f" {unit} {line}"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {problem}")


_FIELD_MSG = re.compile(r"field '([^']+)': (.*)", re.DOTALL)


def wrap_invalid_request(
    err: InvalidRequestError,
    path: str | Path,
    line: int | None,
    columns: dict[str, str] | None = None,
    unit: str = "line",
) -> LoadError:
    """Turn the `Request` constructor's error into a `LoadError` at `path`/`line`.

    `columns` maps Request field names to the file's column names (e.g. `prompt_tokens` ->
    `ContextTokens`) so the message names what the user sees in the file.
    """
    m = _FIELD_MSG.match(str(err))
    if m is None:
        return LoadError(path, str(err), line=line, unit=unit)
    field, problem = m.group(1), m.group(2)
    if columns:
        field = columns.get(field, field)
    return LoadError(path, problem, line=line, field=field, unit=unit)
