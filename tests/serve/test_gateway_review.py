"""Review fixes of the hardened gateway: each test here failed before its fix.

Driven on the real objects (`parse_body`, `PredictBatcher` with its worker thread, `Gateway`);
no HTTP where the bug is not in the HTTP layer.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.serve.request_body import Done, parse_body


@settings(max_examples=50, deadline=None)
@given(mantissa=st.integers(1, 9), exp=st.integers(309, 5000), sign=st.sampled_from(["", "-"]),
       field=st.sampled_from(["temperature", "top_p", "presence_penalty"]))  # fmt: skip
def test_a_number_that_overflows_a_double_is_refused_naming_the_body(mantissa, exp, sign, field):
    """1e400 is valid JSON but Python reads it as inf: forwarded, it would be `Infinity` (not
    JSON) to the backend. It is refused like NaN / Infinity."""
    raw = f'{{"model": "m", "prompt": "x", "{field}": {sign}{mantissa}e{exp}}}'.encode()
    with pytest.raises(Done) as d:
        parse_body(raw, False, ["m"])
    err = json.loads(d.value.response.body)["error"]
    assert d.value.response.status_code == 400 and err["param"] == "body", err
    assert "out of range" in err["message"]


def test_finite_floats_and_zero_temperature_are_accepted():
    raw = b'{"model": "m", "prompt": "x", "temperature": 0, "top_p": 1e-320, "frequency_penalty": -1.5e3}'
    body, prompt = parse_body(raw, False, ["m"])
    assert body["temperature"] == 0 and body["top_p"] == 1e-320 and prompt == "x"
