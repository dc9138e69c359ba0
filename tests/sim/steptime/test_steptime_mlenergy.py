"""ML.ENERGY loader on the staged leaderboard files and on malformed files.

The staged data comes from the `data_dir` fixture (tests/conftest.py: `<repo>/../shared/data` or
$PRESCHED_DATA_DIR); a missing folder is a test error, not a skip."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from presched.sim.steptime import MLEnergyFormatError, load_mlenergy

NAME_8B = "meta-llama__Llama-3.1-8B-Instruct__lm-arena-chat.json"


@pytest.fixture
def mlenergy_dir(data_dir: Path) -> Path:
    return data_dir / "mlenergy-leaderboard-llm"


@pytest.fixture
def file_8b(mlenergy_dir: Path) -> Path:
    return mlenergy_dir / "models" / NAME_8B


def test_reads_the_real_8b_file(file_8b):
    recs = load_mlenergy(file_8b)
    assert len(recs) == 20
    h100 = [r for r in recs if r.gpu_model == "H100"]
    assert len(h100) == 11 and sum(r.gpu_model == "B200" for r in recs) == 9
    assert [r.max_num_seqs for r in h100] == [8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768]
    first = h100[0]
    assert first.model_id == "meta-llama/Llama-3.1-8B-Instruct" and first.task == "lm-arena-chat"
    assert first.num_gpus == 1 and first.tensor_parallel == 1
    assert first.median_itl == pytest.approx(7.316e-3, rel=1e-3)  # seconds
    assert first.p90_itl >= first.median_itl and first.p99_itl >= first.p90_itl
    assert first.avg_batch_size == pytest.approx(7.98, abs=0.01)
    assert first.output_throughput == pytest.approx(1069.6, rel=1e-3)
    assert 380 < first.avg_output_len < 420
    assert len(first.output_length_bins) == 51 and len(first.output_length_counts) == 50
    assert first.source == str(file_8b)
    by_seqs = {r.max_num_seqs: r.median_itl for r in h100}
    assert by_seqs[64] == pytest.approx(11.50e-3, rel=1e-3)
    assert by_seqs[256] == pytest.approx(26.13e-3, rel=1e-3)


def test_filters_on_a_directory(mlenergy_dir, file_8b):
    assert len(load_mlenergy(mlenergy_dir, model="Llama-3.1-8B-Instruct", gpu="h100")) == 11
    assert len(load_mlenergy(mlenergy_dir, model="meta-llama/llama-3.1-8b-instruct")) == 20
    assert len(load_mlenergy(file_8b, gpu="B200", task="lm-arena-chat")) == 9
    with pytest.raises(LookupError, match="gpu='A100'.*Llama-3.1-8B-Instruct lm-arena-chat H100"):
        load_mlenergy(file_8b, gpu="A100")
    with pytest.raises(LookupError, match="model='llama-9'"):
        load_mlenergy(mlenergy_dir, model="llama-9")


def _write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "org__model__task.json"
    p.write_text(json.dumps(data))
    return p


def _good() -> dict:
    hist = {"bins": [0, 10, 20], "counts": [3, 4]}
    conf = {"gpu_model": "H100", "num_gpus": 1, "max_num_seqs": 8, "avg_batch_size": 7.9,
            "median_itl_ms": 7.0, "p90_itl_ms": 8.0, "p99_itl_ms": 9.0,
            "output_throughput_tokens_per_sec": 1000.0, "avg_output_len": 12.0,
            "parallelization": {"tensor_parallel": 1, "expert_parallel": 1, "data_parallel": 1,
                                "notes": ""},
            "output_length_distribution": hist}
    return {"model_id": "org/model", "task": "task", "output_length_distribution": hist,
            "configurations": [conf, dict(copy.deepcopy(conf), max_num_seqs=16)]}


def test_parallelism_read_as_vllm_ran_it(tmp_path):
    data = _good()
    c0, c1 = data["configurations"]
    c0.update(num_gpus=8, parallelization={"tensor_parallel": 1, "expert_parallel": 8,
                                           "data_parallel": 1})  # ML.ENERGY's EP record
    c1.update(num_gpus=4, max_num_seqs=64, parallelization={
        "tensor_parallel": 1, "expert_parallel": 4, "data_parallel": 4})  # DP attention + EP
    a, b = load_mlenergy(_write(tmp_path, data))
    assert (a.tensor_parallel, a.vllm_tp, a.expert_parallel, a.data_parallel) == (1, 8, 8, 1)
    assert (b.vllm_tp, b.expert_parallel, b.data_parallel, b.max_num_seqs_per_rank) == (1, 4, 4, 16)


def test_real_moe_files_load_with_expert_parallelism(mlenergy_dir):
    recs = load_mlenergy(mlenergy_dir, model="Llama-4-Scout-17B-16E-Instruct")
    assert {(r.num_gpus, r.expert_parallel, r.vllm_tp) for r in recs} == {(4, 4, 4), (8, 8, 8)}
    every = load_mlenergy(mlenergy_dir)
    assert len(every) == 146 and all(r.vllm_tp * r.data_parallel == r.num_gpus for r in every)


def test_synthetic_file_round_trip(tmp_path):
    recs = load_mlenergy(_write(tmp_path, _good()))
    assert [r.max_num_seqs for r in recs] == [8, 16]
    assert recs[0].median_itl == pytest.approx(7e-3)


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda d: d["configurations"][1].pop("median_itl_ms"),
         r"configurations\[1\]\.median_itl_ms: missing"),
        (lambda d: d["configurations"][0].update(median_itl_ms="fast"),
         r"configurations\[0\]\.median_itl_ms: got 'fast'"),
        (lambda d: d["configurations"][0].update(max_num_seqs=0),
         r"configurations\[0\]\.max_num_seqs"),
        (lambda d: d["configurations"][0].update(gpu_model=None),
         r"configurations\[0\]\.gpu_model"),
        (lambda d: d["configurations"][1]["output_length_distribution"].update(bins=[0, 1]),
         r"configurations\[1\]\.output_length_distribution\.bins"),
        (lambda d: d["configurations"][0]["parallelization"].update(tensor_parallel=0),
         r"configurations\[0\]\.parallelization\.tensor_parallel"),
        (lambda d: d["configurations"][0].pop("parallelization"),
         r"configurations\[0\]\.parallelization: missing"),
        (lambda d: d["configurations"][0]["parallelization"].pop("expert_parallel"),
         r"configurations\[0\]\.parallelization\.expert_parallel: missing"),
        (lambda d: d["configurations"][0]["parallelization"].update(pipeline_parallel=2),
         r"configurations\[0\]\.parallelization\.pipeline_parallel: not representable"),
        (lambda d: d["configurations"][0]["parallelization"].update(tensor_parallel=2),
         r"configurations\[0\]\.parallelization\.tensor_parallel: tp 2 x dp 1 = 2 GPUs, "
         r"but num_gpus is 1"),
        (lambda d: d["configurations"][0].update(num_gpus=8, parallelization={
            "tensor_parallel": 1, "expert_parallel": 4, "data_parallel": 1}),
         r"configurations\[0\]\.parallelization\.expert_parallel: 4 on 8 GPUs"),
        (lambda d: d["configurations"][0].update(num_gpus=4, max_num_seqs=10, parallelization={
            "tensor_parallel": 1, "expert_parallel": 4, "data_parallel": 4}),
         r"configurations\[0\]\.max_num_seqs: 10 is not divisible by data_parallel 4"),
        (lambda d: d.pop("model_id"), r"field model_id: missing"),
        (lambda d: d.update(configurations={}), r"field configurations: got dict"),
    ],
)
def test_malformed_file_names_file_and_field(tmp_path, mutate, field):
    data = _good()
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(MLEnergyFormatError, match=field) as e:
        load_mlenergy(path)
    assert str(path) in str(e.value)


def test_malformed_copy_of_real_file(tmp_path, file_8b):
    bad = tmp_path / NAME_8B
    shutil.copy(file_8b, bad)
    data = json.loads(bad.read_text())
    del data["configurations"][3]["p99_itl_ms"]
    bad.write_text(json.dumps(data))
    with pytest.raises(MLEnergyFormatError) as e:
        load_mlenergy(tmp_path, model="Llama-3.1-8B-Instruct")
    assert str(bad) in str(e.value) and "configurations[3].p99_itl_ms: missing" in str(e.value)


def test_missing_path_and_bad_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_mlenergy(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no ML.ENERGY model files"):
        load_mlenergy(tmp_path)
    p = tmp_path / "a__b__c.json"
    p.write_text("[1, 2")
    with pytest.raises(MLEnergyFormatError, match="a__b__c.json: not valid JSON"):
        load_mlenergy(p)
