"""`presched eval`'s tables on a narrow terminal: never a cut number (they were printed 150
characters wide whatever the terminal, so an 80-column one wrapped every line)."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from presched.predict.evaluate import evaluate, generic_split
from presched.predict.report import ACCURACY, CALIBRATION_COST, _fmt, full_width, render_table
from presched.workload.loaders.generic import load_generic

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_every_number_appears_whole_within_80_and_120_columns():
    split = generic_split(load_generic(EXAMPLES / "requests.jsonl"), 0.2, 0.1, 0)
    result = evaluate(["model-median", "linear-prompt"], [split], single_calls=5, batches=2)
    assert all(row["status"] == "ok" for row in result.rows)
    for width in (80, 120, full_width(result)):
        buf = io.StringIO()
        render_table(result, Console(width=width, file=buf, force_terminal=True, color_system=None))
        lines = buf.getvalue().splitlines()
        assert max(len(line) for line in lines) <= width
        table = [line for line in lines if line[:1] in "┏┃┡│└"]
        assert not any("…" in line for line in table)
        tokens = set(re.split(r"[\s│┃]+", "\n".join(table)))
        for row in result.rows:
            assert row["predictor"] in tokens
            for key, head, fmt in ACCURACY + CALIBRATION_COST:
                assert _fmt(row.get(key), fmt) in tokens, (width, head, _fmt(row.get(key), fmt))
    assert full_width(result) > 120  # the widest table is folded at 120 columns too
