"""Base class for typed configs.

Every config in presched is a frozen pydantic model whose fields carry a `description`; the CLI
prints those descriptions as option help, and an experiment file (YAML/JSON) sets the same fields.
Unknown keys are refused, a boolean where a number is expected is refused (pydantic's lax mode
reads `true` as 1), so is a float that is not finite (NaN, inf), and a bad value is reported with the field's dotted path.
"""

from __future__ import annotations

import json
import re
import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator


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


def deep_merge(base: Any, over: Any) -> Any:
    """`over` laid onto `base`: mappings merge key by key (recursively); anything else in `over`
    (a value, a list, None) replaces what `base` has. Neither argument is changed."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = deep_merge(base[k], v) if k in base else v
        return out
    return over


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
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        """A boolean where a number is expected is refused: pydantic's lax mode reads `true` as
        1 (`--set workload.num_requests=true` ran one request), YAML's `yes`/`on` included."""
        field = cls.model_fields.get(info.field_name or "")
        where = None if field is None else _bool_as_number(field.annotation, value)
        if where is not None:
            at, kind = where
            raise ValueError(f"{at + ': ' if at else ''}expected {kind}, not a boolean")
        return value


def _unwrap(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _members(annotation: Any) -> list[Any]:
    """The alternatives of a union (Annotated stripped); [annotation] for anything else."""
    annotation = _unwrap(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        return [m for a in get_args(annotation) for m in _members(a)]
    return [annotation]


def _bool_as_number(annotation: Any, value: Any, at: str = "") -> tuple[str, str] | None:
    """(where in `value`, 'an integer' or 'a number') for a boolean that `annotation` would read
    as a number: `value` itself, or an item of a list/tuple/set or a value of a dict; None if
    there is none (a bool where bool, Any or no number is accepted is left to pydantic)."""
    members = _members(annotation)
    if isinstance(value, bool):
        if any(m is bool or m is Any or m is object for m in members):
            return None
        if any(m is int for m in members):
            return at, "an integer"
        if any(m is float for m in members):
            return at, "a number"
        return None
    if isinstance(value, (list, tuple, set, frozenset)):
        for m in members:
            origin, args = get_origin(m), get_args(m)
            if origin in (list, set, frozenset) and args:
                items = [(args[0], v) for v in value]
            elif origin is tuple and args:  # tuple[int, ...] or tuple[int, str]
                variadic = len(args) == 2 and args[1] is Ellipsis
                items = [(args[0], v) for v in value] if variadic else list(zip(args, value))
            else:
                continue
            for i, (a, v) in enumerate(items):
                found = _bool_as_number(a, v, f"{at}[{i}]")
                if found is not None:
                    return found
        return None
    if isinstance(value, dict):
        for m in members:
            if get_origin(m) is dict and len(get_args(m)) == 2:
                for k, v in value.items():
                    found = _bool_as_number(get_args(m)[1], v, f"{at}.{k}" if at else str(k))
                    if found is not None:
                        return found
        return None
    return None


_UNION_TAG = re.compile(r"^(?:[a-z]+(?:-[a-z]+)*\[.*\]|constrained-[a-z]+|int|float|str|bool|none)$")


def _is_union_tag(part: Any) -> bool:
    """pydantic's name for a union member in an error's location (`constrained-int`,
    `literal['mean']`, `function-after[...]`): no field of ours, so not shown."""
    return isinstance(part, str) and _UNION_TAG.match(part) is not None


def format_validation_error(err: ValidationError, where: str = "") -> str:
    """One line per problem, each naming the field path: `engine.max_num_seqs: ...`, with the
    value given when it is one value (a whole section given back adds only noise) and the message
    does not already say it, and without pydantic's "Value error, " prefix on our validators' own
    messages. A value that fits none of a union's members (`sample: int 0-9 | 'mean'`) is one
    line naming the field and what each member accepts, not one line per member."""
    groups: dict[str, list[tuple[str, Any]]] = {}
    unions: set[str] = set()  # paths whose errors come from a union's members
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"] if not _is_union_tag(p))
        if where:
            path = f"{where}.{path}" if path else where
        msg = e["msg"].removeprefix("Value error, ") if e.get("type") == "value_error" else e["msg"]
        groups.setdefault(path, []).append((msg, e.get("input")))
        if any(_is_union_tag(p) for p in e["loc"]):
            unions.add(path)
    lines = []
    for path, items in groups.items():
        msgs = [m for i, (m, _) in enumerate(items) if m not in [x for x, _ in items[:i]]]
        if path in unions and len(msgs) > 1 and len({repr(g) for _, g in items}) == 1:
            rest = [m.removeprefix("Input should be ") for m in msgs[1:]]
            msgs = [", or ".join([msgs[0], *rest])]
        given = items[0][1]
        for msg in msgs:
            said = ", got " in msg or "(got " in msg
            got = "" if said or isinstance(given, (dict, list, tuple)) else f" (got {given!r})"
            lines.append(f"{path}: {msg}{got}" if path else f"{msg}{got}")  # (a model validator's: no field path)
    return "\n".join(lines)
