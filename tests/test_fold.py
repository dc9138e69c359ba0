"""Folding a wide table's columns into several tables that fit a width, never cutting a cell."""

from __future__ import annotations

from presched.fold import fit, table_width, wrapped


def test_one_table_when_it_fits_else_groups_that_each_fit_and_repeat_the_keys():
    headers = ["policy", "mean E2EL s", "p99 E2EL s", "goodput req/s"]
    rows = [["srpt-oracle", "12.34", "123.45", "3.90"]]
    widths, groups = fit(headers, rows, keys=1, width=200)
    assert groups == [[0, 1, 2, 3]] and widths == [11, 11, 10, 13]  # headers on one line
    widths, groups = fit(headers, rows, keys=1, width=40)
    assert widths == [11, 5, 6, 7]  # headers wrap at spaces: the longest word or cell
    assert all(g[0] == 0 for g in groups) and sorted({i for g in groups for i in g}) == [0, 1, 2, 3]
    assert all(table_width([widths[i] for i in g]) <= 40 for g in groups)
    assert wrapped("goodput req/s", 7) == "goodput\nreq/s"


def test_a_column_wider_than_the_line_still_gets_a_table_of_its_own():
    widths, groups = fit(["k", "v"], [["a", "x" * 50]], keys=1, width=20)
    assert groups == [[0, 1]] and widths[1] == 50
