"""Loaders on input that was once silently misread: repeated ids, repeated JSON keys, dropped
columns, hash counts that contradict the prompt length, arrivals past any real log, and the
JSON-list form of a CSV list column. Each is refused with a LoadError naming file, line and field,
or now read as the docs say."""

from __future__ import annotations

import pytest

from presched.workload.loaders import LoadError, load_generic


@pytest.mark.parametrize("name,body,line,first", [
    ("dup.csv", "id,prompt_tokens,output_tokens,arrival\na,10,5,0\nb,10,5,0\na,10,6,1\n", 4, 2),
    ("dup.jsonl", '{"id": "a", "prompt_tokens": 10}\n{"id": "b", "prompt_tokens": 10}\n'
                  '{"id": "a", "prompt_tokens": 10}\n', 3, 1),
    ("dup_default.csv", "id,prompt_tokens\n,10\ndup_default-000000,10\n", 3, 2),  # a default id
])  # fmt: skip
def test_generic_refuses_a_repeated_id_naming_both_lines(tmp_path, name, body, line, first):
    """docs/workloads.md: ids are unique in a workload (replay derives a request's prompt text
    and sampling seed from it, so two rows with one id sent the same prompt)."""
    (tmp_path / name).write_text(body)
    with pytest.raises(LoadError) as e:
        load_generic(tmp_path / name)
    assert e.value.field == "id" and e.value.line == line
    assert f"already used on line {first}" in str(e.value)
