"""Every command of README.md, as written, works: each ```bash block is parsed, each command
run for real (a subprocess, in a scratch folder that sees `examples/`), two at a time, each after
the earlier commands that write a file it reads (`train -o model.npz` before `predict -m
model.npz`), with a quick
variant where a flag allows (fewer requests, one load). Commands that install software, start a
server in the foreground, or take over a minute are listed in SKIP with the reason, so a new
command is run unless someone says why not. The README's sample table must be the output of
`presched bench` itself (`python scripts/readme_sample.py` regenerates it)."""

from __future__ import annotations

import importlib.util
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

SKIP = {  # command prefix -> why it is not run by test_every_readme_command_runs
    "python3 -m venv": "installs the package (network, minutes): .ci/run runs it as written "
    "(test_ci_runs_the_readmes_two_commands_as_written); its `presched bench` is "
    "test_readme_sample_is_the_output_of_presched_bench",
    "bash scripts/engine/install.sh &&": "the test command: runs this test suite (.ci/run runs it as written)",
    "scripts/engine/install.sh": "installs vLLM and starts it in the foreground (30-60 s a start "
    "on 2 cores, over this file's budget); the test command runs the install, tests/engine the "
    "launcher's start_engine; test_the_gateway_block_runs puts a stand-in engine in its place",
    "presched serve": "starts the gateway in the foreground: test_the_gateway_block_runs",
    "presched replay": "needs the gateway running: test_the_gateway_block_runs",
}
QUICK = [  # (command prefix, extra arguments): the same command, smaller
    ("presched bench", ["-n", "200", "--loads", "0.9"]),
    ("presched simulate", ["-n", "200"]),
    ("presched train -p text-gbm -o", ["--param", "max_rounds=30"]),  # full fit: ~1 min
    ("presched replay", ["-n", "5", "--rate", "20"]),  # as written: 30 requests over 30 s
]


def readme_commands(text: str) -> list[str]:
    """The commands of every ```bash block: continuation lines joined, comments and blank
    lines dropped."""
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                cmds.append(line)
    return cmds


def readme_inputs(cmds: list[str], i: int) -> list[int]:
    """The earlier commands that write (`-o FILE`) a file command i names."""
    words = set(re.split(r"[\s=]", cmds[i]))
    return [j for j, c in enumerate(cmds[:i]) if (m := re.search(r"(?:^|\s)-o\s+(\S+)", c)) and m[1] in words]


def _argv(cmd: str) -> list[str]:
    argv = shlex.split(cmd)
    assert argv[0] == "presched", f"not a presched command and not in SKIP: {cmd!r}"
    extra = next((x for p, x in QUICK if cmd.startswith(p)), [])
    return [sys.executable, "-m", "presched.cli", *argv[1:], *extra]


def test_readme_commands_parse_into_known_kinds():
    cmds = readme_commands(README.read_text())
    assert len(cmds) >= 15
    assert any(
        c.startswith("presched bench -w azure-code") and "lengths_from=castillo" in c
        and "predictions.path=model.npz" in c
        for c in cmds
    )


def test_commands_that_read_a_trained_model_wait_for_its_training():
    cmds = readme_commands(README.read_text())
    train = cmds.index("presched train -p text-gbm -o model.npz")
    users = [i for i, c in enumerate(cmds) if "model.npz" in c and i != train]
    assert len(users) >= 2  # `predict -m model.npz` and `bench ... predictions.path=model.npz`
    assert all(readme_inputs(cmds, i) == [train] for i in users)
    assert readme_inputs(cmds, train) == [] and readme_inputs(cmds, cmds.index(next(c for c in cmds if "mine.npz" in c))) == []


def test_every_readme_command_runs(tmp_path, data_dir):
    (tmp_path / "examples").symlink_to(ROOT / "examples")

    cmds = [c for c in readme_commands(README.read_text()) if not any(c.startswith(p) for p in SKIP)]

    def run(cmd: str, after: list[Future]) -> str | None:
        for dep in after:  # submitted before this one, so running or done: no deadlock
            dep.result()
        r = subprocess.run(_argv(cmd), cwd=tmp_path, capture_output=True, text=True, timeout=600)
        return None if r.returncode == 0 else f"{cmd}\n  exit {r.returncode}: {r.stderr.strip()[-500:]}"

    with ThreadPoolExecutor(2) as pool:  # two at a time, each after the commands whose file it reads
        futures: list[Future] = []
        for i, cmd in enumerate(cmds):
            futures.append(pool.submit(run, cmd, [futures[j] for j in readme_inputs(cmds, i)]))
        failures = [f for f in (fut.result() for fut in futures) if f]
    assert not failures, "README commands that fail:\n" + "\n".join(failures)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout  # generous: a busy 2-core box starts uvicorn slowly
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args} exited {proc.returncode}: {proc.stderr.read()[-800:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} not ready after {timeout} s")


def test_the_gateway_block_runs(tmp_path):
    """The README's gateway block, its three commands in order: the engine (the README allows
    any OpenAI-compatible server at --backend; here `presched.serve.stub`, a TEST DOUBLE, stands
    in for vLLM), then `presched serve` as written and `presched replay` (quick: 5 requests),
    the README's ports swapped for free ones."""
    block = next(b for b in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S) if "presched serve" in b)
    engine_cmd, serve_cmd, replay_cmd = readme_commands(f"```bash\n{block}```")
    assert engine_cmd.startswith("scripts/engine/install.sh") and "--port 8100" in engine_cmd
    ports = {"8100": str(_free_port()), "8080": str(_free_port())}
    swap = lambda cmd: re.sub(r"\b(8100|8080)\b", lambda m: ports[m.group(1)], cmd)  # noqa: E731
    procs = [subprocess.Popen([sys.executable, "-m", "presched.serve.stub", "--port", ports["8100"],
                               "--token-s", "0.001"], stderr=subprocess.PIPE, text=True)]  # fmt: skip
    try:
        _wait_ready(f"http://127.0.0.1:{ports['8100']}/health", procs[0])
        procs.append(subprocess.Popen(_argv(swap(serve_cmd)), cwd=tmp_path, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))  # fmt: skip
        _wait_ready(f"http://127.0.0.1:{ports['8080']}/health", procs[1])
        r = subprocess.run(_argv(swap(replay_cmd)), cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert "replay: 5/5 completed, 0 failed" in r.stdout, r.stdout
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert (tmp_path / "presched-requests.sqlite").exists()  # the gateway logged the requests


def test_readme_sample_is_the_output_of_presched_bench(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "readme_sample", ROOT / "scripts" / "readme_sample.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.run_bench(tmp_path / "out")  # the default command, no files needed
    assert mod.sample_in(README.read_text()) == out, "run `python scripts/readme_sample.py`"
    assert (tmp_path / "out" / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_ci_runs_the_readmes_two_commands_as_written():
    # .ci/run runs the README's first two bash blocks (quickstart, then the test command) as
    # written, in that order, in one shell, and nothing else
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    quickstart, test_command = (b.strip() for b in blocks[:2])
    assert test_command == "bash scripts/engine/install.sh && python -m pytest -q -n 2 --durations=25"
    lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    assert commands == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', quickstart, test_command]