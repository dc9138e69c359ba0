"""Shared fixtures. The shared data (`<repo>/../shared/data` or $PRESCHED_DATA_DIR) must be
present: tests that need it fail loudly instead of being skipped.

Hypothesis explores new random examples on every local run; in CI (CI=true) it replays a fixed,
derandomized set so that a green build stays green for the same code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from presched.workload.paths import data_dir as _data_dir

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared data folder; raises FileNotFoundError (test error, not skip) if it is missing."""
    return _data_dir()
