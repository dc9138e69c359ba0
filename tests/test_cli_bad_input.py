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
