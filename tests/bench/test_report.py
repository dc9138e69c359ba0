"""The bench table on a narrow terminal: never a cut number, never a cut policy name."""

from __future__ import annotations

import io
import re

from builders import make_requests
from rich.console import Console

from presched.bench import BenchConfig, run_bench
from presched.bench.report import COLUMNS, _cell, render_table


def test_every_number_and_name_appears_whole_at_80_columns():
    cfg = BenchConfig(
        policies=["fcfs", "srpt-oracle", "sjf-oracle"], loads=[0.5, 0.95], capacity_requests=200
    )
    result = run_bench(cfg, requests=make_requests(n=300, seed=4))
    for width in (80, 120):
        buf = io.StringIO()
        render_table(result, Console(width=width, file=buf, force_terminal=True, color_system=None))
        text = buf.getvalue()
        assert "…" not in text
        assert max(len(line) for line in text.splitlines()) <= width
        tokens = set(re.split(r"[\s│┃]+", text))
        for row in result.rows:
            for col in COLUMNS:
                assert _cell(row, col) in tokens, (width, col[0], _cell(row, col))
