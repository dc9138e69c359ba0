"""Shared fixtures. The shared data (`<repo>/../shared/data` or $PRESCHED_DATA_DIR) must be
present: tests that need it fail loudly instead of being skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from presched.workload.paths import data_dir as _data_dir


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared data folder; raises FileNotFoundError (test error, not skip) if it is missing."""
    return _data_dir()
