"""Wide tables on a narrow terminal, without cutting a cell: the columns are folded into several
tables, each repeating the key columns (load and policy; the predictor), and headers wrap at
spaces. `presched bench` and `presched eval` print through it.

    widths = column_widths(headers, rows)       # what each column needs
    for cols in column_groups(widths, keys=2, width=console.width): ...
"""

from __future__ import annotations

import textwrap
from typing import Sequence

PAD = 3  # per column: one space each side and a border
"""A rich table's columns cost their width plus PAD characters, and the table one more (the
closing border)."""


def table_width(widths: Sequence[int]) -> int:
    return sum(w + PAD for w in widths) + 1


def column_widths(headers: Sequence[str], rows: Sequence[Sequence[str]], wrap: bool) -> list[int]:
    """Each column's width: its longest cell and its header (its header's longest word when
    `wrap`: the header may then take several lines)."""
    return [max([max(len(w) for w in h.split()) if wrap else len(h)] + [len(r[i]) for r in rows])
            for i, h in enumerate(headers)]  # fmt: skip


def wrapped(header: str, width: int) -> str:
    """The header on lines of at most `width` characters, broken at spaces."""
    return "\n".join(textwrap.wrap(header, width)) or header


def fit(headers: Sequence[str], rows: Sequence[Sequence[str]], keys: int, width: int) -> tuple[list[int], list[list[int]]]:
    """(column widths, column groups) for printing `rows` in `width` characters: one group with
    every header on one line when that fits; else headers wrapped at spaces and the columns after
    the first `keys` packed into as few groups as fit (a group holds at least one column, so a
    single column wider than the rest of the line still prints whole)."""
    full = column_widths(headers, rows, wrap=False)
    if table_width(full) <= width:
        return full, [list(range(len(headers)))]
    need = column_widths(headers, rows, wrap=True)
    key, groups, cur = list(range(keys)), [], []
    for i in range(keys, len(headers)):
        if cur and table_width([need[j] for j in key + cur + [i]]) > width:
            groups.append(key + cur)
            cur = []
        cur.append(i)
    groups.append(key + cur)
    return need, groups
