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


def test_the_plot_shows_every_policy_distinctly_on_linear_axes():
    """The issue's two plot faults: the sjf-oracle line hidden under srpt-oracle's (same style),
    and log axes that labelled one tick."""
    import matplotlib.pyplot as plt

    from presched.bench.report import figure

    cfg = BenchConfig(policies=["fcfs", "mlfq", "sjf-oracle", "srpt-oracle"], loads=[0.5, 0.8, 0.95],
                      capacity_requests=200)  # fmt: skip
    fig = figure(run_bench(cfg, requests=make_requests(n=300, seed=4)))
    try:
        panels = [ax for ax in fig.axes if ax.lines]
        assert len(panels) == 4
        for ax in panels:
            assert [line.get_label() for line in ax.lines] == cfg.policies
            looks = {(line.get_linestyle(), line.get_marker()) for line in ax.lines}
            assert len(looks) == len(cfg.policies)  # no two policies drawn alike
            assert ax.get_xscale() == ax.get_yscale() == "linear"
            lo, hi = ax.get_ylim()
            shown = [t for t in ax.get_yticks() if lo <= t <= hi]
            assert len(shown) >= 4 and lo == 0
    finally:
        plt.close(fig)
