"""benchmarks/mlfq_tuning.py: the selection arithmetic (the grid itself is the script's run)."""

from __future__ import annotations

import math

import pytest
from builders import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("mlfq_tuning.py")


def test_scores_use_only_the_seeds_asked_for(bench):
    rows = [{"policy": "a", "seed": s, "gain_capture": g} for s, g in ((0, 0.9), (1, 0.7), (3, 0.1))]
    assert bench.score(rows, "a", (0, 1)) == pytest.approx(0.8)  # validation seed 3 not counted
    assert bench.score(rows, "a", (3,)) == pytest.approx(0.1)
    assert math.isnan(bench.score(rows, "b", (0,)))


def test_grid_labels_are_unique_and_selection_and_validation_seeds_disjoint(bench):
    labels = [bench.label(c) for c in bench.GRID]
    assert len(set(labels)) == len(labels) == 48 and bench.label(bench.GRID[0]) == "bq64 rw4 qr2"
    assert not set(bench.SELECTION) & set(bench.VALIDATION)
