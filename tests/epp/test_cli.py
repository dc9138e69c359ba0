"""`presched epp` refuses bad configurations at start, naming the field, without a traceback."""

from __future__ import annotations

import subprocess
import sys


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "presched.cli", "epp", *args, "--log", "none"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_config_errors_name_the_field_and_exit_2():
    r = _run()
    assert r.returncode == 2 and "endpoints: " in r.stderr and "Traceback" not in r.stderr
    r = _run("--endpoint", "127.0.0.1:1", "--set", "destination_header=Bad Header")
    assert r.returncode == 2 and "destination_header: not a lower-case HTTP header name" in r.stderr
    r = _run("--endpoint", "127.0.0.1:1", "--policy", "nope")
    assert r.returncode == 2 and "policy" in r.stderr and "unknown policy 'nope'" in r.stderr
    r = _run("--endpoint", "127.0.0.1:1", "--policy", "sjf")  # needs predictions, none loaded
    assert r.returncode == 2 and r.stderr.startswith("error: predictor:")


def test_a_port_in_use_is_refused_naming_port_without_a_traceback():
    """grpcio raises RuntimeError("Failed to bind ...") for a port in use: it came out as a
    traceback instead of the error naming `port`."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = _run("--endpoint", "127.0.0.1:1", "--port", str(s.getsockname()[1]))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    # (gRPC's C core logs its own line first)
    assert r.stderr.splitlines()[-1].startswith("error: port: cannot listen on 127.0.0.1:"), r.stderr
