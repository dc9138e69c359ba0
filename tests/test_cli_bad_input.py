"""Bad input to the `presched` commands ends in `error: ...` naming the field or file, exit code
2, no traceback; nothing given is silently misread. Real subprocesses, as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def presched(*args, cwd=None):
    env = {**os.environ, "COLUMNS": "200"}  # messages unwrapped, so phrases can be matched
    return subprocess.run([sys.executable, "-m", "presched.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300, env=env)  # fmt: skip


def refused(r, *phrases):
    """The run ended in a clean `error:` naming every phrase, exit code 2."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.startswith("error:"), r.stderr
    for phrase in phrases:
        assert phrase in r.stderr, (phrase, r.stderr)


OK_CSV = "id,prompt_tokens,output_tokens,arrival\na,10,5,0\nb,20,6,1\n"


@pytest.mark.parametrize("name,text", [("empty.jsonl", ""),
                                       ("header_only.csv", "id,prompt_tokens,output_tokens,arrival\n")])  # fmt: skip
def test_simulate_refuses_an_empty_workload_naming_the_source(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    r = presched("simulate", "-w", "generic", "--path", name, "--json", cwd=tmp_path)
    refused(r, "workload: source 'generic'", name, "gave no request")
    assert r.stdout == ""  # no summary of zero completed requests


@pytest.mark.parametrize("setting,field", [
    ("workload.num_requests=true", "workload.num_requests"),
    ("sim.engine.max_num_seqs=yes", "sim.engine.max_num_seqs"),  # YAML's yes is a boolean too
])  # fmt: skip
def test_a_boolean_setting_is_not_read_as_1(tmp_path, setting, field):
    (tmp_path / "ok.csv").write_text(OK_CSV)
    r = presched("simulate", "-w", "generic", "--path", "ok.csv", "--json", "--set", setting, cwd=tmp_path)
    refused(r, f"{field}: expected an integer, not a boolean")


@pytest.mark.parametrize("setting,message", [
    ("sim.num_instances=100000000", "sim.num_instances: Input should be less than or equal to 4096"),
    ("sim.step_time.hardware={name: g, peak_flops: 1.0e15, mem_bandwidth: 3.0e12, mem_capacity: .inf, "
     "interconnect_bandwidth: 4.5e11}", "sim.step_time.hardware: mem_capacity: Input should be a finite number"),
])  # fmt: skip
def test_simulate_refuses_unbounded_sizes(tmp_path, setting, message):
    (tmp_path / "ok.csv").write_text(OK_CSV)
    r = presched("simulate", "-w", "generic", "--path", "ok.csv", "--json", "--set", setting, cwd=tmp_path)
    refused(r, message)


def test_simulate_refuses_an_epoch_arrival(tmp_path):
    (tmp_path / "huge.csv").write_text("id,prompt_tokens,output_tokens,arrival\na,10,5,1e300\nb,20,6,1\n")
    r = presched("simulate", "-w", "generic", "--path", "huge.csv", "--json", cwd=tmp_path)
    refused(r, "huge.csv line 2, field 'arrival'", "make epoch timestamps relative")


def test_replay_refuses_a_time_scale_that_never_ends(tmp_path):
    (tmp_path / "ok.csv").write_text(OK_CSV)
    r = presched("replay", "-w", "generic", "--path", "ok.csv", "--url", "http://127.0.0.1:9", "-m", "x",
                 "-o", "rp", "--set", "replay.time_scale=1e300", cwd=tmp_path)  # fmt: skip
    refused(r, "replay.time_scale: Input should be less than or equal to 1000")


TEXT_CSV = ("id,prompt_tokens,output_tokens,arrival,prompt,model\na,10,5,0,hi there,m\nb,20,6,1,hello,m\n"
            "c,20,7,1,hey you,m\nd,20,8,1,yo,m\n")  # fmt: skip


@pytest.fixture
def outputs(tmp_path):
    """A folder with ok.csv, a folder `adir`, a file `afile` and a trained model m.npz."""
    (tmp_path / "ok.csv").write_text(TEXT_CSV)
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("")
    r = presched("train", "-p", "model-median", "-d", "ok.csv", "-o", "m.npz", "-q",
                 "--validation-fraction", "0", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return tmp_path


@pytest.mark.parametrize("args,message", [
    (("simulate", "-w", "generic", "--path", "ok.csv", "--records", "adir"), "--records: adir is a folder"),
    (("bench", "-w", "generic", "--path", "ok.csv", "-q", "-o", "afile", "-p", "fcfs", "-l", "0.5"),
     "--out: afile is a file"),
    (("predict", "-m", "m.npz", "-i", "ok.csv", "-o", "adir"), "adir: Is a directory"),
    (("predict", "-m", "m.npz", "-i", "ok.csv", "-o", "afile/p.jsonl"), "afile"),  # a file as a folder
    (("config", "--dump", "adir"), "adir: Is a directory"),
    (("replay", "-w", "generic", "--path", "ok.csv", "--url", "http://127.0.0.1:9", "-m", "x", "-o", "afile"),
     "--out: afile is a file"),
])  # fmt: skip
def test_an_output_path_that_cannot_be_written_is_an_error_not_a_traceback(outputs, args, message):
    refused(presched(*args, cwd=outputs), message)


def test_simulate_records_makes_its_folders(tmp_path):
    (tmp_path / "ok.csv").write_text(OK_CSV)
    r = presched("simulate", "-w", "generic", "--path", "ok.csv", "--json", "--records", "new/sub/x.csv",
                 cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "new/sub/x.csv").read_text().startswith("id,")
