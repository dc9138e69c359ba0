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


def test_envoy_port_in_use_or_out_of_range_and_negative_stubs_are_refused_naming_the_flag():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _run("--stubs", "1", "--envoy-port", str(port))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: --envoy-port: cannot listen on 127.0.0.1:{port}"), r.stderr
    r = _run("--stubs", "1", "--envoy-port", "70000")
    assert r.returncode == 2 and "--envoy-port" in r.stderr and "65535" in r.stderr, r.stderr
    r = _run("--stubs", "-1")
    assert r.returncode == 2 and "--stubs" in r.stderr and "validation error" not in r.stderr, r.stderr


def test_envoy_exiting_at_start_is_an_error_naming_the_port_and_its_kept_log(monkeypatch):
    """Envoy exiting before it was ready came out as a traceback ending `RuntimeError: envoy
    exited with code 1 (see its log)`, the log in a folder already deleted."""
    import shutil
    import subprocess as sp

    import pytest

    from presched.config import UserError
    from presched.epp import cli, envoy
    from presched.epp.config import EppConfig

    def failing(config, log_path, concurrency=1, base_id=None):
        log_path.write_text("[critical] cannot bind: no such device\n")
        return sp.Popen([sys.executable, "-c", "raise SystemExit(1)"])

    monkeypatch.setattr(envoy, "start_envoy", failing)
    cfg = EppConfig.model_validate({"endpoints": [{"address": "127.0.0.1:1"}], "log": {"path": None}})
    with pytest.raises(UserError) as e:
        cli._run_local(cfg, None, None, 1, None)
    msg = str(e.value)
    assert msg.startswith("--envoy-port ") and "envoy exited with code 1; its log: " in msg, msg
    assert "cannot bind: no such device" in msg
    log = msg.split("its log: ")[1].splitlines()[0]
    assert log.endswith("envoy.log") and "cannot bind" in open(log).read()
    shutil.rmtree(log.rpartition("/")[0])


def test_missing_config_and_endpoints_files_are_named_by_kind(tmp_path):
    r = _run("--config", str(tmp_path / "nofile.yaml"))
    assert r.returncode == 2 and "picker config file (EppConfig) not found: " in r.stderr, r.stderr
    r = _run("--endpoints-file", str(tmp_path / "nofile.yaml"))
    assert r.returncode == 2 and "endpoints_file: endpoints file not found: " in r.stderr, r.stderr
    assert "experiment file" not in r.stderr
