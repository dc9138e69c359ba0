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


def test_every_engine_test_runs_in_the_engine_tier(request):
    # conftest.py puts the engine tier on one xdist worker by node id: an `engine` test outside
    # ENGINE_FILES would start its own engines on the other worker, beside the tier's
    from conftest import in_engine_tier

    assert in_engine_tier("tests/engine/test_plugin.py::test_x") and not in_engine_tier("tests/sim/test_x.py::t")
    engine = [i.nodeid for i in request.session.items if i.get_closest_marker("engine")]
    assert [n for n in engine if not in_engine_tier(n)] == []
