"""Loaders on input that was once silently misread: repeated ids, repeated JSON keys, dropped
columns, hash counts that contradict the prompt length, arrivals past any real log, and the
JSON-list form of a CSV list column. Each is refused with a LoadError naming file, line and field,
or now read as the docs say."""

from __future__ import annotations

import pytest

from presched.workload.loaders import LoadError, load_azure, load_generic, load_mooncake


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


@pytest.mark.parametrize("name,body,field", [
    ("epoch.csv", "id,prompt_tokens,output_tokens,arrival\na,10,5,1700000000\nb,20,6,1700000001\n", "arrival"),
    ("huge.jsonl", '{"prompt_tokens": 10, "arrival": 1e300}\n', "arrival"),
    ("epoch_trace.jsonl", '{"timestamp": 1700000000000, "input_length": 10, "output_length": 5}\n',
     "timestamp"),  # Mooncake: milliseconds
])  # fmt: skip
def test_an_arrival_past_1e7_seconds_is_refused_as_an_epoch_time(tmp_path, name, body, field):
    """An epoch timestamp (1.7e9 s) was read as seconds since the start: a run 54 years long,
    and float rounding at 1e9 s and past takes the milliseconds TTFT is made of."""
    (tmp_path / name).write_text(body)
    load = load_mooncake if field == "timestamp" else load_generic
    with pytest.raises(LoadError) as e:
        load(tmp_path / name)
    assert e.value.field == field and e.value.line == (2 if name.endswith(".csv") else 1)
    assert "make epoch timestamps relative" in str(e.value)


def test_an_azure_trace_longer_than_116_days_is_refused(tmp_path):
    (tmp_path / "long.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"
        "2024-11-16 18:17:04.0319600,3180,8\n"
    )
    with pytest.raises(LoadError) as e:
        load_azure(tmp_path / "long.csv")
    assert e.value.field == "TIMESTAMP" and e.value.line == 3 and "at most 1e+07 s" in str(e.value)


def test_arrivals_up_to_the_bound_still_load(tmp_path):
    (tmp_path / "ok.csv").write_text("id,prompt_tokens,arrival\na,10,0\nb,10,1e7\n")
    assert [r.arrival for r in load_generic(tmp_path / "ok.csv")] == [0.0, 1e7]


def test_azure_keeps_other_columns_in_metadata_as_the_generic_loader_does(tmp_path, data_dir):
    """A copy of the real code trace with a Model column: it was dropped silently."""
    src = (data_dir / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv").read_text().splitlines()[:6]
    lines = [src[0] + ",Model,Region"] + [f"{line},gpt-4,{'eu' if i % 2 else ''}" for i, line in enumerate(src[1:])]
    (tmp_path / "extra.csv").write_text("\n".join(lines) + "\n")
    reqs = load_azure(tmp_path / "extra.csv")
    assert [r.metadata for r in reqs[:2]] == [{"Model": "gpt-4"}, {"Model": "gpt-4", "Region": "eu"}]
    assert reqs[0].model == ""  # a column of the file, not presched's model field
    generic = tmp_path / "same.csv"
    generic.write_text("prompt_tokens,Model\n10,gpt-4\n")
    assert load_generic(generic)[0].metadata == reqs[0].metadata  # the same rule
    plain = load_azure(data_dir / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv", limit=5)
    assert all(r.metadata == {} for r in plain)


def test_azure_refuses_a_column_named_twice(tmp_path):
    (tmp_path / "twice.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n2023-11-16 18:17:03.9799600,4808,10,5\n"
    )
    with pytest.raises(LoadError) as e:
        load_azure(tmp_path / "twice.csv")
    assert e.value.field == "ContextTokens" and e.value.line == 1


@pytest.mark.parametrize("row,count,blocks", [
    ('{"timestamp": 0, "input_length": 4096, "output_length": 5, "hash_ids": [1]}', 1, 8),  # too few
    ('{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1,2,3,4,5,6,7,8,9]}', 9, 2),
    ('{"timestamp": 0, "input_length": 1025, "output_length": 5, "hash_ids": [1,2]}', 2, 3),  # partial block
])  # fmt: skip
def test_mooncake_hash_ids_must_be_one_per_512_token_block(tmp_path, row, count, blocks):
    """Too few ids silently shrank the shareable prefix; extra ones were dropped."""
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, '
                                      '"hash_ids": [7, 8]}\n' + row + "\n")  # fmt: skip
    with pytest.raises(LoadError) as e:
        load_mooncake(tmp_path / "t.jsonl")
    assert e.value.field == "hash_ids" and e.value.line == 2
    assert f"{count} ids for input_length" in str(e.value) and f"= {blocks}" in str(e.value)


def test_mooncake_rows_with_the_right_count_or_none_load(tmp_path, data_dir):
    (tmp_path / "t.jsonl").write_text(
        '{"timestamp": 0, "input_length": 1025, "output_length": 5, "hash_ids": [1, 2, 3]}\n'
        '{"timestamp": 1, "input_length": 100, "output_length": 5}\n'
        '{"timestamp": 2, "input_length": 100, "output_length": 5, "hash_ids": []}\n'
    )
    assert [r.block_hashes for r in load_mooncake(tmp_path / "t.jsonl")] == [(1, 2), (), ()]
    for name in ("conversation_trace.jsonl", "synthetic_trace.jsonl"):  # every shared row agrees
        assert len(load_mooncake(data_dir / "mooncake-fast25" / name)) in (12_031, 3_993)


@pytest.mark.parametrize("load,body,field", [
    (load_generic, '{"prompt_tokens": 10, "output_tokens": 5}\n{"prompt_tokens": 10, "output_tokens": 5, '
                   '"prompt_tokens": 99}\n', "prompt_tokens"),
    (load_mooncake, '{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]}\n'
                    '{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2], '
                    '"input_length": 9000}\n', "input_length"),
    (load_generic, '{"prompt_tokens": 10}\n{"prompt_tokens": 10, "extra": {"a": 1, "a": 2}}\n', "a"),  # nested
])  # fmt: skip
def test_a_json_key_given_twice_is_refused_naming_line_and_key(tmp_path, load, body, field):
    """json.loads keeps the last value silently: the row read 99 prompt tokens (or 9000)."""
    (tmp_path / "dup.jsonl").write_text(body)
    with pytest.raises(LoadError) as e:
        load(tmp_path / "dup.jsonl")
    assert e.value.line == 2 and e.value.field == field and "appears twice" in str(e.value)


def test_a_csv_list_column_may_be_a_json_list(tmp_path):
    """docs/workloads.md: output_samples is "JSON list, or integers separated by spaces"; in CSV
    the JSON form ("[5, 6]", as save_generic writes metadata lists) was refused at '[5,'."""
    (tmp_path / "s.csv").write_text('id,prompt_tokens,output_tokens,output_samples,block_hashes,hash_block_tokens\n'
                                    'a,10,5,"[5, 6]","[-3, 4]",16\nb,10,5,7 8,,\n')  # fmt: skip
    a, b = load_generic(tmp_path / "s.csv")
    assert a.output_samples == (5, 6) and a.block_hashes == (-3, 4) and b.output_samples == (7, 8)


@pytest.mark.parametrize("cell,problem", [('"[5, 6"', "expected a JSON list of integers"),
                                          ('"[5, 0]"', "expected integers >= 1"),
                                          ('"[5, true]"', "expected integers >= 1"),
                                          ('"[[5]]"', "expected integers >= 1")])  # fmt: skip
def test_a_bad_json_list_in_csv_names_line_and_field(tmp_path, cell, problem):
    (tmp_path / "s.csv").write_text(f"id,prompt_tokens,output_samples\na,10,{cell}\n")
    with pytest.raises(LoadError) as e:
        load_generic(tmp_path / "s.csv")
    assert e.value.line == 2 and e.value.field == "output_samples" and problem in str(e.value)
