"""Base class for typed configs.

Every config in presched is a frozen pydantic model whose fields carry a `description`; the CLI
prints those descriptions as option help, and an experiment file (YAML/JSON) sets the same fields.
Unknown keys are refused, and a bad value is reported with the field's dotted path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class UserError(ValueError):
    """Bad input from the user: the CLI prints it without a traceback and exits with code 2."""


def load_file(path: Path) -> dict:
    """A YAML (or .json) config file as a mapping ({} when empty); errors name the file."""
    if not path.exists():
        raise UserError(f"experiment file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: the top level must be a mapping of sections (workload, sim, ...)")
    return data


def set_path(d: dict, dotted: str, value: Any) -> None:
    """d[a][b][c] = value for dotted = 'a.b.c', creating sections as needed; a number indexes a
    list that exists ('backends.1.max_in_flight')."""
    keys = dotted.split(".")
    node: Any = d
    for i, k in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(node, list):
            where = ".".join(keys[:i])
            if not (k.isdigit() and int(k) < len(node)):
                raise UserError(f"--set {dotted}: {where!r} is a list of {len(node)}; "
                                f"index it with 0..{len(node) - 1}")  # fmt: skip
            if last:
                node[int(k)] = value
                return
            node = node[int(k)]
        elif isinstance(node, dict):
            if last:
                node[k] = value
                return
            node = node.setdefault(k, {})
        else:
            raise UserError(f"--set {dotted}: {'.'.join(keys[:i])!r} is not a section")


def apply_overrides(data: dict, flags: dict[str, Any], sets: list[str], example: str) -> dict:
    """Command-line flags (dotted path -> value; None = not given), then `--set KEY=VALUE` items
    (values read as YAML), onto a config mapping. `example` shows a KEY=VALUE in errors."""
    for key, value in flags.items():
        if value is not None:
            set_path(data, key, value)
    for item in sets:
        if "=" not in item:
            raise UserError(f"--set {item!r}: expected KEY=VALUE, e.g. {example}")
        key, raw = item.split("=", 1)
        set_path(data, key.strip(), yaml.safe_load(raw))
    return data


class Config(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


def format_validation_error(err: ValidationError, where: str = "") -> str:
    """One line per problem, each naming the field path: `engine.max_num_seqs: ...`, with the
    value given when it is one value (a whole section given back adds only noise), and without
    pydantic's "Value error, " prefix on our validators' own messages."""
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        if where:
            path = f"{where}.{path}" if path else where
        msg = e["msg"].removeprefix("Value error, ") if e.get("type") == "value_error" else e["msg"]
        given = e.get("input")
        got = "" if isinstance(given, (dict, list, tuple)) else f" (got {given!r})"
        lines.append(f"{path}: {msg}{got}")
    return "\n".join(lines)
