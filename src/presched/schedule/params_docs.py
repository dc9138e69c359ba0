"""The parameters of a policy as text: rows for `presched config --policy NAME`, and the
markdown config tables of the docs pages, generated from each policy's `Params` model.

A docs page holds a table between `<!-- params: NAME -->` (or `<!-- router-params: NAME -->`)
and `<!-- /params -->`; regenerate
after changing a model with

    python -m presched.schedule.params_docs docs/policies.md docs/policies/*.md

(tests/schedule/test_params.py checks that every page matches the models).
"""

from __future__ import annotations

import json
import re
import types
import typing
from typing import Annotated, Any, Literal

from pydantic.fields import FieldInfo

from presched.schedule.params import PolicyParams, params_model, router_params_model


def type_name(annotation: Any) -> str:
    """A short readable type: `float`, `int | None`, one of `"a"`, `"b"`, `dict[str, float]`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return type_name(args[0])
    if origin is Literal:
        names = [json.dumps(a) for a in args]
        qs = [n for n in names if re.fullmatch(r'"q\d+"', n)]
        if len(qs) > 2:  # the quantile statistics: "q10" ... "q99"
            names[names.index(qs[0])] = f"{qs[0]} ... {qs[-1]}"
            names = [n for n in names if n not in qs[1:]]
        return " | ".join(names)
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
                out.append(f"{sym} {v:g}" if isinstance(v, float) else f"{sym} {v}")
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


def params_table(name: str, router: bool = False) -> str:
    """The markdown config table of policy (or router) `name`, as the docs pages hold it."""
    rows = describe_params(router_params_model(name) if router else params_model(name))
    if not rows:
        return "None."
    lines = ["| option | type | default | meaning |", "|---|---|---|---|"]
    for n, t, d, h in rows:
        lines.append(f"| `{n}` | {_cell(t)} | `{d}` | {_cell(h)} |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


_BLOCK = re.compile(r"(<!-- (router-)?params: ([\w-]+) -->\n)(.*?)(<!-- /params -->)", re.S)


def sync_params_tables(text: str) -> str:
    """`text` (a docs page) with every block between `<!-- params: NAME -->` (a policy) or
    `<!-- router-params: NAME -->` and `<!-- /params -->` replaced by `params_table(NAME)`."""
    return _BLOCK.sub(lambda m: f"{m[1]}{params_table(m[3], bool(m[2]))}\n{m[5]}", text)


if __name__ == "__main__":  # python -m presched.schedule.params_docs docs/policies.md docs/policies/*.md
    import sys
    from pathlib import Path

    import presched.schedule  # noqa: F401  (registers the policies)

    for arg in sys.argv[1:]:
        path = Path(arg)
        old = path.read_text(encoding="utf-8")
        new = sync_params_tables(old)
        if new != old:
            path.write_text(new, encoding="utf-8")
            print(f"updated {path}")
