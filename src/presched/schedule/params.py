"""Typed policy parameters: one frozen pydantic model per policy class (`Policy.Params`).

    class MLFQParams(PolicyParams):
        num_levels: int = Field(8, ge=1, le=64, description="Levels K ...")

    @POLICIES.register("mlfq")
    class MLFQ(Policy):
        Params = MLFQParams

    POLICIES.create("mlfq", base_quantum=64)   # validated by MLFQParams, then built

The model is the single source of a policy's options: `Policy.__init__` validates its keyword
arguments with it (unknown names refused; numbers strict: no bools, no strings, no NaN, finite
unless the field says otherwise) and keeps the result as `policy.params`; `presched config
--policy NAME` prints it; the docs' config tables are generated from it (`params_table`).

A bad value raises `ParamsError` (a ValueError) whose lines name the dotted path of each problem:
`inner_params.base_quantum: Input should be greater than 0 (got 0)`. Drivers prefix the place the
parameters came from (`policy_params.` in the gateway, the sim and bench configs validate with
`validate_params` and get their own dotted paths from pydantic).
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any, Literal, Mapping, TypeVar

from pydantic import ConfigDict, ValidationError
from pydantic.fields import FieldInfo

from presched.config import Config
from presched.schedule.lengths import STATS

P = TypeVar("P", bound="PolicyParams")

Stat = Literal[STATS]  # type: ignore[valid-type]
"""A statistic of the predicted length (`schedule/lengths.py`): mean, point, rank, median, qNN."""


class PolicyParams(Config):
    """Base of every policy's parameters: frozen, unknown keys refused, strict types."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, strict=True)


class NoParams(PolicyParams):
    """A policy without parameters (any key is refused)."""


class ParamsError(ValueError):
    """Bad policy parameters; `problems` are (dotted path, message) pairs, one line each."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("\n".join(f"{p}: {m}" if p else m for p, m in problems))

    @classmethod
    def of(cls, err: ValidationError) -> ParamsError:
        out = []
        for e in err.errors():
            msg = e["msg"].removeprefix("Value error, ")
            if e["type"] not in ("extra_forbidden", "missing"):
                msg += f" (got {e.get('input')!r})"
            out.append((".".join(str(p) for p in e["loc"]), msg))
        return cls(out)

    def under(self, prefix: str) -> ParamsError:
        """The same problems with `prefix.` in front of each path (where the params came from)."""
        return ParamsError([(f"{prefix}.{p}" if p else prefix, m) for p, m in self.problems])


def parse(model: type[P], params: Mapping[str, Any]) -> P:
    """`params` validated by `model`; a `ParamsError` naming each bad field otherwise."""
    try:
        return model.model_validate(dict(params))
    except ValidationError as e:
        raise ParamsError.of(e) from None


def params_model(name: str) -> type[PolicyParams]:
    """The parameter model of the registered policy `name` (UnknownNameError if unknown)."""
    from presched.schedule.registry import POLICIES

    return getattr(POLICIES.get(name), "Params", NoParams)


def validate_params(name: str, params: Mapping[str, Any]) -> PolicyParams:
    """`params` of policy `name` checked by its model, raising pydantic's ValidationError: for
    use inside other configs' validators, where pydantic nests its paths (sim.policy_params.x)."""
    return params_model(name).model_validate(dict(params))


# --- description: `presched config --policy NAME` and the docs' config tables -----------------
def type_name(annotation: Any) -> str:
    """A short readable type: `float`, `int | None`, one of `"a"`, `"b"`, `dict[str, float]`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def bounds(info: FieldInfo) -> str:
    """The numeric bounds of a field, e.g. `> 0`, `>= 1, <= 64`, plus `finite` where enforced."""
    out = []
    for m in info.metadata:
        for attr, sym in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{sym} {v:g}")
    return ", ".join(out)


def describe_params(model: type[PolicyParams]) -> list[tuple[str, str, str, str]]:
    """(name, type and bounds, default as JSON, help) of every field of `model`."""
    rows = []
    for name, info in model.model_fields.items():
        kind = type_name(info.annotation)
        b = bounds(info)
        default = info.get_default(call_default_factory=True)
        rows.append((name, f"{kind} ({b})" if b else kind, json.dumps(default), info.description or ""))
    return rows


def params_table(name: str) -> str:
    """The markdown config table of policy `name`, as the docs pages hold it (a test checks)."""
    rows = describe_params(params_model(name))
    if not rows:
        return "None."
    lines = ["| option | type | default | meaning |", "|---|---|---|---|"]
    for n, t, d, h in rows:
        lines.append(f"| `{n}` | {_cell(t)} | `{d}` | {_cell(h)} |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def not_rank(policy: str) -> Any:
    """A `stat` validator for policies that need a length in tokens (the rank score is none):
    `_length = field_validator("stat")(not_rank("srpt"))`."""

    def check(cls, v: str) -> str:
        if v == "rank":
            raise ValueError(f"'rank' is a unitless score, not a length in tokens; {policy} needs "
                             "a length: mean, point, median or a quantile (order by rank with sjf "
                             "or rank)")  # fmt: skip
        return v

    return classmethod(check)


def validate_params_at(key: str, name: str, params: Mapping[str, Any]) -> PolicyParams:
    """`validate_params` with `key` in front of every error path (one entry of a mapping of
    policies to their params, e.g. bench's policy_params.mlfq.base_quantum)."""
    try:
        return validate_params(name, params)
    except ValidationError as e:
        details = [{"type": x["type"], "loc": (key, *x["loc"]), "input": x.get("input"),
                    **({"ctx": x["ctx"]} if "ctx" in x else {})} for x in e.errors()]  # fmt: skip
        raise ValidationError.from_exception_data(e.title, details) from None  # type: ignore[arg-type]
