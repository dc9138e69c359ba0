"""Loaders on the real shared files (row counts and stats as the data READMEs state) and on
small broken temp files (LoadError names file, line and field)."""

from __future__ import annotations

import gzip
import json
import time

import numpy as np
import pytest

from presched.workload import InvalidRequestError, Request
from presched.workload.loaders import (
    LOADERS,
    LoadError,
    approx_tokens,
    castillo_models,
    load_azure,
    load_azure_code,
    load_azure_conv,
    load_castillo,
    load_generic,
    load_mooncake,
    load_mooncake_conv,
    load_sharegpt,
    save_generic,
)
from presched.workload.loaders.errors import wrap_invalid_request

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def _stats(x):
    x = np.asarray(x, dtype=float)
    return x.mean(), np.median(x), np.quantile(x, 0.9), np.quantile(x, 0.99), x.max()


def test_registry_names():
    assert set(LOADERS.names()) >= {
        "azure", "azure-conv", "azure-code", "mooncake", "mooncake-conv", "castillo", "sharegpt", "generic",
    }  # fmt: skip


# ---------------------------------------------------------------- Azure


def test_azure_conv_rows_and_stats():
    t = time.perf_counter()
    reqs = load_azure_conv()
    elapsed = time.perf_counter() - t
    assert len(reqs) == 19_366
    # generous on purpose (~0.2 s measured): catches a loader gone pathological (row-by-row
    # parsing in a quadratic loop), not a slow or busy machine
    assert elapsed < 30.0, f"loading 19k Azure rows took {elapsed:.2f} s"
    assert reqs[0].id == "azure-conv-000000" and reqs[123].id == "azure-conv-000123"
    arr = np.array([r.arrival for r in reqs])
    assert arr[0] == 0.0 and np.all(np.diff(arr) >= 0)
    assert arr[-1] == pytest.approx(3501.72, abs=0.01)  # README: span 3,502 s
    assert len(reqs) / arr[-1] == pytest.approx(5.53, abs=0.005)
    mean, med, p90, p99, mx = _stats(
        [r.prompt_tokens for r in reqs]
    )  # README: 1155 / 1020 / 2734 / 4142 / 14050
    assert (round(mean), med, round(p99), mx) == (1155, 1020, 4142, 14050) and 2734 <= p90 <= 2735
    mean, med, p90, p99, mx = _stats(
        [r.output_tokens for r in reqs]
    )  # README: 211.1 / 129 / 424 / 601 / 1000
    assert round(mean, 1) == 211.1 and (med, p90, round(p99), mx) == (129, 424, 601, 1000)


def test_azure_timestamps_keep_sub_microsecond_resolution(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(
        f"{AZURE_HEADER}\n2023-11-16 23:59:59.9999999,5,6\n2023-11-17 00:00:00.0000001,5,6\n"
    )
    reqs = load_azure(f)
    assert reqs[1].arrival == pytest.approx(2e-7, abs=1e-10)
    assert reqs[0].id == "azure-t-000000"


def test_azure_code_rows_and_stats():
    reqs = load_azure_code()
    assert len(reqs) == 8_819
    assert reqs[0].id == "azure-code-000000"
    assert np.mean([r.prompt_tokens for r in reqs]) == pytest.approx(2048, abs=1)
    assert np.mean([r.output_tokens for r in reqs]) == pytest.approx(27.9, abs=0.05)
    assert reqs[-1].arrival == pytest.approx(3436, abs=1)


def test_azure_limit():
    reqs = load_azure_conv(limit=10)
    assert len(reqs) == 10 and reqs[9].id == "azure-conv-000009"
    with pytest.raises(ValueError, match="^limit:"):
        load_azure_conv(limit=-1)


def _azure_copy(tmp_path, data_dir, n=20):
    """The first n data rows of the real conv trace, in a temp file of the same name."""
    lines = (
        (data_dir / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv")
        .read_text()
        .splitlines()[: n + 1]
    )
    f = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    return f, lines


def test_azure_bad_field_names_file_line_field(tmp_path, data_dir):
    f, lines = _azure_copy(tmp_path, data_dir)
    ts, ctx, _ = lines[16].split(",")  # line 17 of the file (header = line 1)
    lines[16] = f"{ts},{ctx},abc"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(LoadError) as e:
        load_azure(f)
    assert str(e.value) == (
        "AzureLLMInferenceTrace_conv.csv line 17, field 'GeneratedTokens': expected an integer >= 1, got 'abc'"
    )
    assert (e.value.line, e.value.field, e.value.path) == (17, "GeneratedTokens", f)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize(
    "row, field",
    [
        ("2023-11-16 18:15:46.68,0,44", "ContextTokens"),
        ("2023-11-16 18:15:46.68,-3,44", "ContextTokens"),
        ("2023-11-16 18:15:46.68,12,0", "GeneratedTokens"),
        ("2023-11-16 18:15:46.68,12,1.5", "GeneratedTokens"),
        ("2023-11-16 25:15:46.68,12,3", "TIMESTAMP"),
        ("yesterday,12,3", "TIMESTAMP"),
    ],
)
def test_azure_bad_values(tmp_path, row, field):
    f = tmp_path / "x.csv"
    f.write_text(f"{AZURE_HEADER}\n2023-11-16 18:15:46.6805900,374,44\n{row}\n")
    with pytest.raises(LoadError, match=rf"^x\.csv line 3, field '{field}': "):
        load_azure(f)


def test_azure_wrong_field_count(tmp_path):
    f = tmp_path / "x.csv"
    f.write_text(f"{AZURE_HEADER}\n2023-11-16 18:15:46.6805900,374\n")
    with pytest.raises(LoadError, match=r"^x\.csv line 2: expected 3 comma-separated fields"):
        load_azure(f)


def test_azure_missing_column(tmp_path):
    f = tmp_path / "x.csv"
    f.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n")
    with pytest.raises(LoadError, match=r"^x\.csv line 1, field 'GeneratedTokens': missing column"):
        load_azure(f)


def test_non_utf8_names_the_line(tmp_path, data_dir):
    f, lines = _azure_copy(tmp_path, data_dir)
    data = ("\n".join(lines[:4]) + "\n").encode() + b"2023-11-16 18:15:55.1\xff\xfe,3,4\n"
    f.write_bytes(data)
    with pytest.raises(
        LoadError, match=r"^AzureLLMInferenceTrace_conv\.csv line 5: not valid UTF-8"
    ) as e:
        load_azure(f)
    assert e.value.line == 5


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope" / "trace.csv"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        load_azure(missing)
    with pytest.raises(FileNotFoundError, match="samples.csv.gz"):
        load_castillo(tmp_path, model="x")


# ---------------------------------------------------------------- Mooncake


def test_mooncake_conversation_rows_and_stats():
    reqs = load_mooncake_conv()
    assert len(reqs) == 12_031
    assert reqs[0].id == "mooncake-conversation-000000"
    # 6758 tokens: 14 hash ids, the last one a partial block, which is not shareable
    assert reqs[0].block_hashes == tuple(range(13)) and reqs[0].hash_block_tokens == 512
    assert all(len(r.block_hashes) == r.prompt_tokens // 512 for r in reqs)
    assert max(r.arrival for r in reqs) == pytest.approx(3537, abs=1)  # ms / 1000
    assert np.mean([r.prompt_tokens for r in reqs]) == pytest.approx(12035, abs=1)
    assert np.mean([r.output_tokens for r in reqs]) == pytest.approx(342.6, abs=0.05)
    refs = sum(len(r.block_hashes) for r in reqs)  # full blocks: 288,500 ids in the file
    assert refs == 276_491 and len({h for r in reqs for h in r.block_hashes}) == 170_899


@pytest.mark.parametrize(
    "line, field, problem",
    [
        ('{"timestamp": 5, "output_length": 3, "hash_ids": []}', "input_length", "missing"),
        (
            '{"timestamp": 5, "input_length": "x", "output_length": 3}',
            "input_length",
            "expected an integer",
        ),
        (
            '{"timestamp": -5, "input_length": 2, "output_length": 3}',
            "timestamp",
            "expected a finite number",
        ),
        (
            '{"timestamp": 5, "input_length": 2, "output_length": 0}',
            "output_length",
            "expected an integer >= 1",
        ),
        (
            '{"timestamp": 5, "input_length": 2, "output_length": 3, "hash_ids": "1 2"}',
            "hash_ids",
            "expected a list",
        ),
    ],
)
def test_mooncake_bad_rows(tmp_path, line, field, problem):
    f = tmp_path / "m_trace.jsonl"
    f.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [0]}\n\n'
        + line
        + "\n"
    )
    with pytest.raises(LoadError, match=rf"^m_trace\.jsonl line 3, field '{field}': {problem}"):
        load_mooncake(f)


def test_mooncake_bad_json_and_extra_keys(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text(
        '{"timestamp": 1500, "input_length": 10, "output_length": 3, "turn": 2}\n{"timestamp": \n'
    )
    with pytest.raises(LoadError, match=r"^m\.jsonl line 2: invalid JSON"):
        load_mooncake(f)
    r = load_mooncake(f, limit=1)[0]
    assert r.arrival == 1.5 and r.metadata == {"turn": 2} and r.block_hashes == ()


# ---------------------------------------------------------------- CASTILLO

LLAMA = "meta-llama--Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def llama_test():
    return load_castillo(model="llama-3.1-8b", split="test")


@pytest.fixture(scope="module")
def llama_all():
    return load_castillo(model=LLAMA, sample="mean")


def test_castillo_models():
    models = castillo_models()
    assert len(models) == 13 and LLAMA in models


def test_castillo_test_split_rows(llama_test):
    # README coverage: test has 14,121 rows over 13 models; 1,110 prompts for all but gemma-3-12b.
    assert len(llama_test) == 1_110
    assert len(load_castillo(model="gemma-3-12b", split="test")) == 801
    assert all(r.metadata["split"] == "test" and r.model == LLAMA for r in llama_test)
    assert len({r.id for r in llama_test}) == 1_110


def test_castillo_fields(llama_test):
    r = next(r for r in llama_test if r.metadata["prompt_id"] == "f1982d7c7b424be4")
    assert r.prompt == "Describe the history of Python programming language."
    assert r.output_samples == (
        706,
        824,
        928,
        768,
        826,
        715,
        745,
        891,
        824,
        814,
    )  # README: 706..928, mean 804.1
    assert r.output_tokens == 706  # sample 0 by default
    assert r.arrival == 0.0 and r.id == "castillo-Llama-3.1-8B-Instruct-f1982d7c7b424be4"
    assert r.metadata["dataset"] == "Alpaca" and r.metadata["category"] == "undefined"
    assert set(r.metadata) >= {"dataset", "category", "split", "prompt_id"}
    assert all(len(x.output_samples) == 10 for x in llama_test)


def test_castillo_sample_choice(llama_all):
    by_id = {r.metadata["prompt_id"]: r for r in llama_all}
    assert by_id["f1982d7c7b424be4"].output_tokens == 804  # rounded mean of the 10
    third = load_castillo(model=LLAMA, split="test", sample=3, limit=5)
    assert [r.output_tokens for r in third] == [r.output_samples[3] for r in third]


def test_castillo_all_splits_deduplicated_and_stats(llama_all):
    # README: 4,707 rows for Llama-3.1-8B, a few prompt_ids in two splits -> deduplicated.
    pids = [r.metadata["prompt_id"] for r in llama_all]
    assert len(pids) == len(set(pids))
    assert 4_690 <= len(llama_all) < 4_707
    assert {r.metadata["split"] for r in llama_all} == {"train", "validate", "test"}
    # README: mean of per-prompt mean 467 over the model's rows
    assert np.mean([r.output_tokens for r in llama_all]) == pytest.approx(467, abs=2)


def test_castillo_model_resolution_errors():
    with pytest.raises(ValueError, match="ambiguous") as e:
        load_castillo(model="llama-3.2", split="test", limit=1)
    assert "Llama-3.2-1B-Instruct" in str(e.value) and "Llama-3.2-3B-Instruct" in str(e.value)
    with pytest.raises(ValueError, match="unknown CASTILLO model 'gpt-4'") as e:
        load_castillo(model="gpt-4")
    assert LLAMA in str(e.value)
    with pytest.raises(ValueError, match="^model: choose"):
        load_castillo()
    assert (
        load_castillo(model="META-LLAMA--LLAMA-3.1-8B-INSTRUCT", split="test", limit=1)[0].model
        == LLAMA
    )


@pytest.mark.parametrize(
    "kw, arg",
    [({"split": "dev"}, "split"), ({"sample": 10}, "sample"), ({"sample": "avg"}, "sample")],
)
def test_castillo_bad_options(kw, arg):
    with pytest.raises(ValueError, match=f"^{arg}:"):
        load_castillo(model=LLAMA, **kw)


def _castillo_folder(tmp_path, sizes="5 6 7 8 9 10 11 12 13 14", dataset="Alpaca"):
    header = "sample_id,prompt_id,dataset,split,model,input_size,n_samples,output_sizes"
    rows = [f"s1,p1,{dataset},test,org--M-1,12,10,1 2 3 4 5 6 7 8 9 10", f"s2,p2,Alpaca,test,org--M-1,9,10,{sizes}",
            "s3,p1,Alpaca,validate,org--M-1,12,10,1 2 3 4 5 6 7 8 9 10", "s4,p1,Alpaca,test,org--M-2,12,10,3 3"]  # fmt: skip
    (tmp_path / "samples.csv.gz").write_bytes(
        gzip.compress(("\n".join([header, *rows]) + "\n").encode())
    )
    prompts = [
        {"prompt_id": "p1", "prompt_text": "hi", "category": "c"},
        {"prompt_id": "p2", "prompt_text": "yo"},
    ]
    (tmp_path / "prompts.jsonl.gz").write_bytes(
        gzip.compress("".join(json.dumps(p) + "\n" for p in prompts).encode())
    )
    return tmp_path


@pytest.mark.parametrize("dataset", ["Alpaca", '"Alp, ""aca"""'])  # plain and quoted CSV
def test_castillo_small_folder_and_bad_row(tmp_path, dataset):
    folder = _castillo_folder(tmp_path, dataset=dataset)
    reqs = load_castillo(folder, model="m-1", sample="mean")  # p1 twice (test, validate): kept once
    assert [r.output_tokens for r in reqs] == [6, 10] and reqs[1].prompt == "yo"
    assert reqs[0].metadata["dataset"] == ("Alpaca" if dataset == "Alpaca" else 'Alp, "aca"')
    assert castillo_models(folder) == ["org--M-1", "org--M-2"]
    with pytest.raises(
        LoadError, match=r"^samples\.csv\.gz line 5, field 'output_sizes': sample 4 asked for"
    ):
        load_castillo(folder, model="m-2", sample=4)
    _castillo_folder(tmp_path, sizes="5 6 x 8", dataset=dataset)
    with pytest.raises(
        LoadError,
        match=r"^samples\.csv\.gz line 3, field 'output_sizes': expected integers >= 1, got 'x'",
    ):
        load_castillo(folder, model="m-1")


# ---------------------------------------------------------------- ShareGPT

SHAREGPT_TEST = "castillo/raw_instruct/ShareGPT/raw_ShareGPT_test.json.gz"


def test_sharegpt_test_file(data_dir):
    path = data_dir / SHAREGPT_TEST
    reqs = load_sharegpt(path)
    assert len(reqs) == 200
    assert len({r.id for r in reqs}) == 200
    raw = json.loads(gzip.decompress(path.read_bytes()))
    first = raw[0]["conversations"]
    assert reqs[0].prompt == first[0]["value"] and reqs[0].id == f"sharegpt-{raw[0]['id']}"
    assert reqs[0].prompt_tokens == approx_tokens(first[0]["value"])
    assert reqs[0].output_tokens == approx_tokens(first[1]["value"])
    assert all(r.output_tokens is not None for r in reqs)
    # README: first reply mean 291 Mistral tokens; the 4-chars/token proxy is in the same range
    assert 200 < np.mean([r.output_tokens for r in reqs]) < 400


def test_sharegpt_custom_counter_and_edge_cases(tmp_path):
    data = [
        {"id": "a", "conversations": [{"from": "system", "value": "be nice"}, {"from": "human", "value": "one two three"},
                                      {"from": "gpt", "value": "four five"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "no human"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "unanswered"}]},
    ]  # fmt: skip
    f = tmp_path / "s.json"
    f.write_text(json.dumps(data))
    reqs = load_sharegpt(f, count_tokens=lambda s: len(s.split()))
    assert [(r.id, r.prompt_tokens, r.output_tokens) for r in reqs] == [
        ("sharegpt-a", 3, 2),
        ("sharegpt-c", 1, None),
    ]
    data[1]["conversations"] = "oops"
    f.write_text(json.dumps(data))
    with pytest.raises(
        LoadError, match=r"^s\.json record 2, field 'conversations': expected a list"
    ):
        load_sharegpt(f)
    with pytest.raises(LoadError, match=r"^s\.json record 1, field 'prompt_tokens'"):
        load_sharegpt(tmp_path / "s.json", count_tokens=lambda s: 0, limit=1)


# ---------------------------------------------------------------- generic


def test_generic_jsonl_schema(tmp_path):
    f = tmp_path / "log.jsonl"
    rows = [
        {"id": "r1", "arrival": 0.5, "prompt_tokens": 10, "output_tokens": 5, "max_tokens": 64, "tenant": "gold",
         "model": "m", "prompt": "hello", "output_samples": [4, 5, 6], "slo_ttft": 0.2, "slo_tpot": 0.05,
         "slo_e2e": 9, "user": "u7"},
        {"prompt": "x" * 40, "output_samples": "3 4", "arrival": None},
    ]  # fmt: skip
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b = load_generic(f)
    assert a == Request(id="r1", prompt_tokens=10, arrival=0.5, output_tokens=5, max_tokens=64, tenant="gold",
                        model="m", prompt="hello", output_samples=(4, 5, 6), slo_ttft=0.2, slo_tpot=0.05, slo_e2e=9.0)  # fmt: skip
    assert a.metadata == {"user": "u7"}
    assert (b.id, b.prompt_tokens, b.output_samples, b.arrival) == ("log-000001", 10, (3, 4), 0.0)
    assert load_generic(f, count_tokens=len)[1].prompt_tokens == 40


def test_generic_csv_schema(tmp_path):
    f = tmp_path / "log.csv"
    f.write_text('id,arrival,prompt_tokens,output_tokens,output_samples,prompt,region\n'
                 'a,1.25,7,3,3 4 5,"multi\nline, with comma",eu\n'
                 'b,2,8,,,,\n')  # fmt: skip
    a, b = load_generic(f)
    assert (a.arrival, a.prompt, a.output_samples, a.metadata) == (
        1.25,
        "multi\nline, with comma",
        (3, 4, 5),
        {"region": "eu"},
    )
    assert (b.output_tokens, b.prompt, b.metadata) == (None, None, {})


@pytest.mark.parametrize(
    "name, body, line, field, problem",
    [
        (
            "z.csv",
            "prompt_tokens,output_tokens\n5,3\n5,0\n",
            3,
            "output_tokens",
            "expected an integer >= 1, got '0'",
        ),
        ("z.csv", "prompt_tokens,arrival\n5,-1\n", 2, "arrival", "expected a finite number >= 0"),
        ("z.csv", "prompt_tokens,slo_ttft\n5,0\n", 2, "slo_ttft", "expected a finite number > 0"),
        ("z.csv", "id,output_tokens\na,3\n", 1, "prompt_tokens", "missing column"),
        (
            "z.csv",
            'prompt_tokens,prompt\n5,"a\nb"\n4,x\nabc,y\n',
            5,
            "prompt_tokens",
            "expected an integer",
        ),
        ("z.jsonl", '{"prompt_tokens": 5}\n{"output_tokens": 5}\n', 2, "prompt_tokens", "missing"),
        (
            "z.jsonl",
            '{"prompt_tokens": 5, "output_tokens": 0}\n',
            1,
            "output_tokens",
            "expected an integer >= 1",
        ),
        ("z.jsonl", '{"prompt_tokens": true}\n', 1, "prompt_tokens", "expected an integer"),
        (
            "z.jsonl",
            '{"prompt_tokens": 5, "output_samples": [1, "b"]}\n',
            1,
            "output_samples",
            "expected integers",
        ),
        ("z.jsonl", '{"prompt_tokens": 5, "tenant": 3}\n', 1, "tenant", "expected text"),
        ("z.jsonl", '{"prompt_tokens": 5, "output_tokens": []}\n', 1, "output_tokens", "expected"),
        ("z.jsonl", '{"prompt_tokens": 5, "output_tokens": [3, 0]}\n', 1, "output_tokens",
         "expected integers >= 1"),
        ("z.jsonl", '{"prompt_tokens": 5, "output_tokens": [3], "output_samples": [3]}\n', 1,
         "output_tokens", "a list here holds the samples"),
    ],
)
def test_generic_bad_rows(tmp_path, name, body, line, field, problem):
    f = tmp_path / name
    f.write_text(body)
    with pytest.raises(LoadError) as e:
        load_generic(f)
    assert str(e.value).startswith(f"{name} line {line}, field '{field}': {problem}"), str(e.value)


def test_generic_output_tokens_as_a_list_are_samples(tmp_path):
    # outside data gives sampled lengths under output_tokens (`[652]`, `[652, 700]`): the first
    # is the length, all of them the samples, as if given as output_samples
    f = tmp_path / "s.jsonl"
    f.write_text('{"prompt_tokens": 5, "output_tokens": [652]}\n'
                 '{"prompt_tokens": 5, "output_tokens": [40, 7, 9]}\n')
    a, b = load_generic(f)
    assert (a.output_tokens, a.output_samples) == (652, (652,))
    assert (b.output_tokens, b.output_samples) == (40, (40, 7, 9))
    # the same in CSV: a cell holding a JSON list (it was "expected an integer >= 1, got '[5, 6]'")
    g = tmp_path / "s.csv"
    g.write_text('prompt_tokens,output_tokens\n5,"[652]"\n5,"[40, 7, 9]"\n5,12\n')
    a, b, c = load_generic(g)
    assert (a.output_tokens, a.output_samples) == (652, (652,))
    assert (b.output_tokens, b.output_samples) == (40, (40, 7, 9)) and c.output_tokens == 12
    g.write_text('prompt_tokens,output_tokens\n5,"[4, x]"\n')
    with pytest.raises(LoadError, match=r"^s\.csv line 2, field 'output_tokens'"):
        load_generic(g)


def test_generic_other_errors(tmp_path):
    f = tmp_path / "z.jsonl"
    f.write_text('{"prompt_tokens": 5}\n[1, 2]\n')
    with pytest.raises(LoadError, match=r"^z\.jsonl line 2: expected a JSON object"):
        load_generic(f)
    g = tmp_path / "z.csv"
    g.write_text("prompt_tokens,x\n5,1,2\n")
    with pytest.raises(LoadError, match=r"^z\.csv line 2: expected 2 fields"):
        load_generic(g)
    g.write_bytes(b"prompt_tokens,prompt\n5,ok\n6,caf\xe9\n")
    with pytest.raises(LoadError, match=r"^z\.csv line 3: not valid UTF-8"):
        load_generic(g)
    with pytest.raises(ValueError, match="^path: cannot tell the format"):
        load_generic(tmp_path / "z.txt")


@pytest.mark.parametrize("name", ["rt.jsonl", "rt.csv", "rt.jsonl.gz", "rt.csv.gz"])
def test_generic_round_trip(tmp_path, name):
    reqs = load_castillo(model="llama-3.1-8b", split="test", limit=30)  # text with newlines, quotes
    reqs += load_mooncake_conv(limit=5) + load_azure_conv(limit=5)
    reqs.append(Request(id="full", prompt_tokens=3, arrival=1 / 3, output_tokens=2, max_tokens=9, tenant="t",
                        model="m", prompt='"q", a\nb', output_samples=(1, 2), slo_ttft=0.1, slo_tpot=0.02, slo_e2e=4.0))  # fmt: skip
    path = save_generic(reqs, tmp_path / name)
    back = load_generic(path)
    assert back == reqs  # every schema field, floats exactly (metadata is not compared)
    if name.startswith("rt.jsonl"):
        assert back[0].metadata == reqs[0].metadata
        assert back[30].block_hashes == reqs[30].block_hashes != ()
    else:
        assert back[0].metadata["prompt_id"] == reqs[0].metadata["prompt_id"]


def test_save_generic_refuses_colliding_metadata(tmp_path):
    with pytest.raises(ValueError, match="metadata key 'arrival'"):
        save_generic(
            [Request(id="a", prompt_tokens=1, metadata={"arrival": 3})], tmp_path / "x.jsonl"
        )


def test_wrap_invalid_request_maps_field():
    err = InvalidRequestError("field 'prompt_tokens': got 0, expected an integer >= 1")
    wrapped = wrap_invalid_request(err, "/a/b/t.csv", 4, {"prompt_tokens": "ContextTokens"})
    assert str(wrapped) == "t.csv line 4, field 'ContextTokens': got 0, expected an integer >= 1"
    assert isinstance(wrapped, LoadError) and wrapped.line == 4
