"""The static embedding table: a prompt's embedding is the mean of its head/tail ids' rows
(ids outside the table ignored), a projection folds a linear map in exactly, the state round-trips.
The distillation itself (model2vec over MiniLM, minutes) is not run here: the tables are built
from known vectors."""

from __future__ import annotations

import numpy as np
import pytest

from presched.predict.static_embed import StaticTable


def _table(head=3, tail=1):
    ids = np.array([5, 7, 11])
    vec = np.array([[1.0, 0.0], [0.0, 2.0], [4.0, 4.0]], dtype=np.float32)
    return StaticTable(ids, vec, head=head, tail=tail)


def test_mean_of_head_and_tail_rows_skipping_unknown_ids():
    t = _table(head=2, tail=1)
    # text 0: ids 5, 99 (absent), 7, 11 -> head {5, 99}, tail {11}: mean of rows 5 and 11
    # text 1: nothing known -> zeros; text 2: empty
    ids = np.array([5, 99, 7, 11, 123456], dtype=np.uint64)
    off = np.array([0, 4, 5, 5])
    got = t.embed(ids, off)
    assert got == pytest.approx(np.array([[2.5, 2.0], [0.0, 0.0], [0.0, 0.0]]))


def test_project_is_exact_and_state_round_trips():
    t = _table()
    ids = np.array([5, 7, 7, 11, 5], dtype=np.uint64)
    off = np.array([0, 3, 5])
    W = np.array([[1.0, 0.5, 0.0], [2.0, 0.0, 1.0]])
    assert t.project(W).embed(ids, off) == pytest.approx(t.embed(ids, off) @ W, rel=1e-6)
    back = StaticTable.from_state(t.state(), head=3, tail=1)
    assert back.embed(ids, off) == pytest.approx(t.embed(ids, off))


def test_distill_refuses_dims_out_of_range():
    with pytest.raises(ValueError, match="dims: expected 1..128"):
        StaticTable.distill(0, np.array([1, 2]))
