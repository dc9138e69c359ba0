"""Typed policy parameters (`schedule/params.py`): every policy's options come from one frozen
model; bad values are refused with the dotted path of the field, however deeply nested; the
configs that carry `policy_params` report their own full paths; the docs tables are the models."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from presched.bench.config import BenchConfig
from presched.config import format_validation_error
from presched.schedule import POLICIES
from presched.schedule.routers import ROUTERS
from presched.schedule.params import ParamsError, PolicyParams, params_model
from presched.schedule.params_docs import params_table, sync_params_tables
from presched.serve.config import ServeConfig
from presched.serve.gateway import Gateway
from presched.sim.setup import SimConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = [DOCS / "policies.md", *sorted((DOCS / "policies").glob("*.md"))]


@pytest.mark.parametrize("name", POLICIES.names())
def test_every_policy_has_a_frozen_documented_model_whose_defaults_build_it(name):
    model = params_model(name)
    assert issubclass(model, PolicyParams)
    assert model.model_config["frozen"] and model.model_config["extra"] == "forbid"
    for field, info in model.model_fields.items():
        assert info.description, f"{name}.{field} has no help text"
    defaults = model().model_dump()
    policy = POLICIES.create(name, **defaults)  # the defaults, spelled out, are valid params
    assert policy.params == model()
    with pytest.raises(ValidationError, match="frozen"):
        policy.params.__setattr__(next(iter(defaults), "x"), 1)


def test_unknown_and_mistyped_params_name_the_field():
    with pytest.raises(ParamsError, match=r"^bogus: Extra inputs are not permitted$"):
        POLICIES.create("fcfs", bogus=1)
    with pytest.raises(ParamsError, match=r"^num_levels: expected an integer, not a boolean \(got True\)$"):
        POLICIES.create("mlfq", num_levels=True)  # a bool is no number (config.Config's check)
    with pytest.raises(ParamsError, match=r"^rate: Input should be a valid number \(got '5'\)$"):
        POLICIES.create("aging", rate="5")  # strict: no strings for numbers
    with pytest.raises(ParamsError, match=r"^c_frac: Input should be a finite number"):
        POLICIES.create("srpt", c_frac=math.inf)
    err = pytest.raises(ParamsError, POLICIES.create, "slo", batch=0, context=-1).value
    assert [p for p, _ in err.problems] == ["batch", "context"]  # every problem, one line each


def test_wrapped_params_are_checked_by_the_inner_model_with_the_dotted_path():
    with pytest.raises(ParamsError) as e:
        POLICIES.create("kv-admission", inner="mlfq", inner_params={"base_quantum": 0})
    assert str(e.value) == "inner_params.base_quantum: Input should be greater than 0 (got 0)"
    with pytest.raises(ParamsError) as e:  # two wrappers deep
        POLICIES.create("vtc", inner="fallback",
                        inner_params={"inner": "mlfq", "inner_params": {"num_levels": 0}})  # fmt: skip
    assert str(e.value).startswith("inner_params.inner_params.num_levels: Input should be greater")
    with pytest.raises(ParamsError, match=r"^conservative: unknown policy 'nope'; known: "):
        POLICIES.create("fallback", conservative="nope")
    with pytest.raises(ParamsError, match=r"^inner_params\.inner: 'vtc' has its own queue"):
        POLICIES.create("kv-admission", inner="fallback", inner_params={"inner": "vtc"})


def test_configs_that_carry_policy_params_report_their_full_paths():
    bad = {"inner": "mlfq", "inner_params": {"base_quantum": 0}}
    with pytest.raises(ValidationError) as e:
        SimConfig(policy="kv-admission", policy_params=bad)
    assert format_validation_error(e.value, "sim") == (
        "sim.policy_params.inner_params.base_quantum: Input should be greater than 0 (got 0)")
    with pytest.raises(ValidationError) as e:
        BenchConfig(policies=["fcfs", "vtc"], policy_params={"vtc": bad, "mlfq": {"preempt": 1}})
    # (in the order of the merged sections: the bench's default mlfq section comes first)
    assert sorted(format_validation_error(e.value).splitlines()) == [
        "policy_params.mlfq.preempt: Input should be a valid boolean (got 1)",
        "policy_params.vtc.inner_params.base_quantum: Input should be greater than 0 (got 0)",
    ]
    with pytest.raises(ValidationError) as e:
        ServeConfig(backends=[{"url": "http://127.0.0.1:1"}], policy="fallback", policy_params=bad)
    assert format_validation_error(e.value).startswith("policy_params.inner_params.base_quantum:")
    # checks that need the built policy still name the path, when the policies are built
    with pytest.raises(ValueError, match=r"^policy_params\.inner: 'vtc' has its own queue"):
        SimConfig(policy="fallback", policy_params={"inner": "vtc"}).policy_factory()
    cfg = ServeConfig(backends=[{"url": "http://127.0.0.1:1"}], policy="fallback",
                      policy_params={"inner": "vtc"})  # fmt: skip
    with pytest.raises(ValueError, match=r"^policy_params\.inner: 'vtc' has its own queue"):
        Gateway(cfg)  # builds its policies, no request sent


finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e9, max_value=1e9)


@settings(max_examples=80, deadline=None)
@given(base=finite, ratio=finite, levels=st.integers(-5, 100), weight=finite)
def test_mlfq_accepts_exactly_what_its_bounds_say(base, ratio, levels, weight):
    # found by this test: a large ratio made the quanta overflow (a traceback, not an error)
    ok = base > 0 and ratio >= 1 and 1 <= levels <= 64 and weight >= 0
    ok = ok and math.log10(base) + (levels - 1) * math.log10(ratio) <= 18  # the last quantum
    params = dict(base_quantum=base, quantum_ratio=ratio, num_levels=levels, prompt_weight=weight)
    if ok:
        pol = POLICIES.create("mlfq", **params)
        assert pol.quanta == [base * ratio**i for i in range(levels)]
        assert pol.prompt_weight == weight
    else:
        with pytest.raises(ParamsError) as e:
            POLICIES.create("mlfq", **params)
        named = {p for p, _ in e.value.problems}
        assert named <= {"base_quantum", "quantum_ratio", "num_levels", "prompt_weight"} and named


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_docs_config_tables_are_generated_from_the_models(page):
    text = page.read_text(encoding="utf-8")
    assert sync_params_tables(text) == text, (
        f"{page.name} is out of date: python -m presched.schedule.params_docs docs/policies.md docs/policies/*.md")


def test_every_policy_and_router_with_params_has_its_table_in_the_docs():
    text = "".join(p.read_text(encoding="utf-8") for p in PAGES)
    for name in POLICIES.names():
        if not POLICIES.get(name).__module__.startswith("presched."):
            continue  # registered by a test (tests/engine/faulty_policy.py, in the same process)
        if params_model(name).model_fields:
            assert f"<!-- params: {name} -->\n{params_table(name)}\n<!-- /params -->" in text, name
    for name in ("least-work", "p2c-work", "short-long"):  # least-work-oracle: least-work's
        table = params_table(name, router=True)
        assert f"<!-- router-params: {name} -->\n{table}\n<!-- /params -->" in text, name


def test_router_params_are_typed_too():
    with pytest.raises(ParamsError, match=r"^d: Input should be a valid integer \(got 1.5\)$"):
        ROUTERS.create("p2c-work", d=1.5)
    with pytest.raises(ParamsError, match=r"^stat: Input should be 'mean'"):
        ROUTERS.create("short-long", stat="rank")
    assert ROUTERS.create("short-long", window=10, prompt_weight=0.5).params.prompt_weight == 0.5
