"""Checking numeric policy options: one rule, errors that name the field (`policy_params` come
from experiment files, so a bad value must say which option is wrong)."""

from __future__ import annotations

import math


def number(field: str, value, low: float = 0.0, strict: bool = False, finite: bool = True) -> float:
    """`value` as a float if it is a real number (not a bool, not NaN) >= `low` (> with
    `strict`), finite unless `finite=False` (then +inf is allowed); else a ValueError naming
    `field`."""
    ok = (
        isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
        and (math.isfinite(value) or not finite) and (value > low if strict else value >= low)
    )  # fmt: skip
    if not ok:
        kind = "a finite number" if finite else "a number"
        raise ValueError(f"field '{field}': must be {kind} {'>' if strict else '>='} {low:g}, got {value!r}")
    return float(value)
