"""The hypothesis profiles of tests/conftest.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st


def test_no_deadline_locally_and_derandomized_in_ci():
    assert settings.get_profile("presched").deadline is None
    ci = settings.get_profile("ci")
    assert ci.deadline is None and ci.derandomize
    assert settings.default.deadline is None  # the profile in force for this run


@given(st.integers())
def test_a_property_without_its_own_settings_has_no_deadline(_):
    assert settings.default.deadline is None
