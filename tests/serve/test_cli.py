"""`presched serve` flags: refused at start with the field named, never silently dropped."""

from __future__ import annotations

import subprocess
import sys


def _serve(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "presched.cli", "serve", *args, "--log", "none"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip


def test_max_in_flight_0_is_refused_not_dropped(tmp_path):
    # `if max_in_flight` dropped 0: the gateway started with the default 16
    r = _serve(tmp_path, "-b", "http://127.0.0.1:9001", "--max-in-flight", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "backends.0.max_in_flight: Input should be greater than or equal to 1" in r.stderr


def test_a_missing_config_file_is_named_as_the_serve_config(tmp_path):
    r = _serve(tmp_path, "-c", "nofile.yaml")
    assert r.returncode == 2 and r.stderr.strip() == "error: --config: serve config file not found: nofile.yaml"
