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
--policy NAME` prints it; the docs' config tables are generated from it (`params_docs.py`).

A bad value raises `ParamsError` (a ValueError) whose lines name the dotted path of each problem:
`inner_params.base_quantum: Input should be greater than 0 (got 0)`. Drivers prefix the place the
parameters came from (`policy_params.` in the gateway, the sim and bench configs validate with
`validate_params` and get their own dotted paths from pydantic).
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, TypeVar

from pydantic import ConfigDict, ValidationError

from presched.config import Config
from presched.schedule.lengths import STATS

P = TypeVar("P", bound="PolicyParams")

Stat = Literal[STATS]  # type: ignore[valid-type]
"""A statistic of the predicted length (`schedule/lengths.py`): mean, point, rank, median, qNN."""
LengthStat = Literal[tuple(s for s in STATS if s != "rank")]  # type: ignore[valid-type]
"""A statistic that is a length in tokens (the rank score is not)."""


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


def router_params_model(name: str) -> type[PolicyParams]:
    """The parameter model of the registered router `name` (UnknownNameError if unknown)."""
    from presched.schedule.routers import ROUTERS

    return getattr(ROUTERS.get(name), "Params", NoParams)


def validate_params(name: str, params: Mapping[str, Any]) -> PolicyParams:
    """`params` of policy `name` checked by its model, raising pydantic's ValidationError: for
    use inside other configs' validators, where pydantic nests its paths (sim.policy_params.x)."""
    return params_model(name).model_validate(dict(params))


def validate_each(params_by_policy: Mapping[str, Mapping[str, Any]]) -> None:
    """Every entry {policy name: params} checked by that policy's model; one ValidationError
    with every problem, each path starting with the policy name (bench's
    policy_params.mlfq.base_quantum)."""
    details: list[Any] = []
    title = "policy_params"
    for name, params in params_by_policy.items():
        try:
            validate_params(name, params)
        except ValidationError as e:
            title = e.title
            details += [{"type": x["type"], "loc": (name, *x["loc"]), "input": x.get("input"),
                         **({"ctx": x["ctx"]} if "ctx" in x else {})} for x in e.errors()]  # fmt: skip
    if details:
        raise ValidationError.from_exception_data(title, details)
