"""Base class for typed configs.

Every config in presched is a frozen pydantic model whose fields carry a `description`; the CLI
prints those descriptions as option help, and an experiment file (YAML/JSON) sets the same fields.
Unknown keys are refused, and a bad value is reported with the field's dotted path.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class UserError(Exception):
    """Bad input from the user: the CLI prints it without a traceback and exits with code 2."""


class Config(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


def format_validation_error(err: ValidationError, where: str = "") -> str:
    """One line per problem, each naming the field path: `engine.max_num_seqs: ...`."""
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        if where:
            path = f"{where}.{path}" if path else where
        lines.append(f"{path}: {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)
