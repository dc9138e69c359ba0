"""The Request record: validation names the field; target_tokens; immutability."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from presched.workload import InvalidRequestError, Request


def test_minimal_request_defaults():
    r = Request(id="a", prompt_tokens=10)
    assert r.arrival == 0.0 and r.output_tokens is None and r.tenant == "default"
    assert r.output_samples == () and r.metadata == {}


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"id": "", "prompt_tokens": 1}, "id"),
        ({"id": 3, "prompt_tokens": 1}, "id"),
        ({"id": "a", "prompt_tokens": 0}, "prompt_tokens"),
        ({"id": "a", "prompt_tokens": 1.5}, "prompt_tokens"),
        ({"id": "a", "prompt_tokens": True}, "prompt_tokens"),
        ({"id": "a", "prompt_tokens": 1, "arrival": -1.0}, "arrival"),
        ({"id": "a", "prompt_tokens": 1, "arrival": math.inf}, "arrival"),
        ({"id": "a", "prompt_tokens": 1, "output_tokens": 0}, "output_tokens"),
        ({"id": "a", "prompt_tokens": 1, "max_tokens": 0}, "max_tokens"),
        ({"id": "a", "prompt_tokens": 1, "slo_ttft": 0.0}, "slo_ttft"),
        ({"id": "a", "prompt_tokens": 1, "slo_tpot": -1}, "slo_tpot"),
        ({"id": "a", "prompt_tokens": 1, "slo_e2e": "1"}, "slo_e2e"),
    ],
)
def test_invalid_field_is_named(kwargs, field):
    with pytest.raises(InvalidRequestError, match=f"field '{field}'"):
        Request(**kwargs)


def test_invalid_request_error_is_value_error():
    assert issubclass(InvalidRequestError, ValueError)


def test_target_tokens_caps_by_max_tokens():
    assert Request(id="a", prompt_tokens=1, output_tokens=50).target_tokens == 50
    assert Request(id="a", prompt_tokens=1, output_tokens=50, max_tokens=20).target_tokens == 20
    with pytest.raises(InvalidRequestError, match="output_tokens is unknown"):
        _ = Request(id="a", prompt_tokens=1).target_tokens


def test_frozen_and_replace_validates():
    r = Request(id="a", prompt_tokens=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.prompt_tokens = 6  # type: ignore[misc]
    assert dataclasses.replace(r, arrival=2.5).arrival == 2.5
    with pytest.raises(InvalidRequestError, match="field 'arrival'"):
        dataclasses.replace(r, arrival=-0.1)


def test_metadata_not_compared():
    assert Request(id="a", prompt_tokens=1, metadata={"x": 1}) == Request(id="a", prompt_tokens=1)


@given(
    prompt=st.integers(min_value=-5, max_value=10**6),
    output=st.one_of(st.none(), st.integers(min_value=-5, max_value=10**6)),
)
def test_property_valid_iff_counts_positive(prompt, output):
    ok = prompt >= 1 and (output is None or output >= 1)
    if ok:
        r = Request(id="x", prompt_tokens=prompt, output_tokens=output)
        assert r.prompt_tokens == prompt
    else:
        with pytest.raises(InvalidRequestError, match="field '(prompt|output)_tokens'"):
            Request(id="x", prompt_tokens=prompt, output_tokens=output)
