"""presched/config.py: `--set` paths onto a config mapping, and errors that name the path."""

from __future__ import annotations

import pytest

from presched.config import UserError, apply_overrides, set_path


def test_dotted_paths_create_sections_and_index_lists():
    data = {"backends": [{"url": "http://a"}, {"url": "http://b"}]}
    set_path(data, "log.path", "x.sqlite")
    set_path(data, "backends.1.max_in_flight", 16)
    set_path(data, "backends.0", {"url": "http://c"})
    assert data == {"backends": [{"url": "http://c"}, {"url": "http://b", "max_in_flight": 16}],
                    "log": {"path": "x.sqlite"}}  # fmt: skip


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("backends.2.url", "'backends' is a list of 2; index it with 0..1"),
        ("backends.first.url", "'backends' is a list of 2"),
        ("policy.name", "'policy' is not a section"),
        ("backends.0.url.scheme", "'backends.0.url' is not a section"),
    ],
)
def test_a_path_that_does_not_fit_names_itself(path, message):
    data = {"backends": [{"url": "http://a"}, {"url": "http://b"}], "policy": "sjf"}
    with pytest.raises(UserError, match=message):
        set_path(data, path, 1)


def test_overrides_read_values_as_yaml_after_the_flags():
    data = apply_overrides({"backends": [{"url": "u"}]}, {"policy": "sjf", "router": None},
                           ["policy=fcfs", "backends.0.max_in_flight=8", "policy_params={starvation_s: 30}"],
                           "max_queue=500")  # fmt: skip
    assert data == {"backends": [{"url": "u", "max_in_flight": 8}], "policy": "fcfs",
                    "policy_params": {"starvation_s": 30}}  # fmt: skip
    with pytest.raises(UserError, match="expected KEY=VALUE, e.g. max_queue=500"):
        apply_overrides({}, {}, ["policy"], "max_queue=500")


def test_validation_errors_name_the_field_and_give_back_one_value_only():
    from pydantic import ValidationError

    from presched.config import format_validation_error
    from presched.workload.config import WorkloadConfig

    with pytest.raises(ValidationError) as e:
        WorkloadConfig(source="castillo", num_requests=0)
    text = format_validation_error(e.value)
    assert "num_requests: Input should be greater than or equal to 1 (got 0)" in text
    with pytest.raises(ValidationError) as e:
        WorkloadConfig(source="castillo")  # the model validator's own message, on the section
    text = format_validation_error(e.value, "workload")
    assert text.startswith("workload: model is required by source 'castillo'")
    assert "Value error" not in text and "(got {" not in text


def test_an_error_that_says_what_it_got_is_not_given_it_twice():
    from pydantic import ValidationError

    from presched.config import format_validation_error
    from presched.loadgen.replay import ReplayConfig

    with pytest.raises(ValidationError) as e:
        ReplayConfig(url="localhost:8080")
    text = format_validation_error(e.value, "replay")
    assert text == "replay.url: expected an http:// or https:// base URL, got 'localhost:8080'"


@pytest.mark.parametrize("value", [12, -1, "foo"])
def test_a_value_outside_a_union_is_one_line_naming_the_field_and_every_choice(value):
    from pydantic import ValidationError

    from presched.config import format_validation_error
    from presched.workload.config import WorkloadConfig

    with pytest.raises(ValidationError) as e:
        WorkloadConfig(sample=value)
    text = format_validation_error(e.value, "workload")
    assert len(text.splitlines()) == 1 and text.startswith("workload.sample: "), text
    assert "'mean'" in text and f"(got {value!r})" in text
    assert "constrained-int" not in text and "literal[" not in text
