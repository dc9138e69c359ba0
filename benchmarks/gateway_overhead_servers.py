"""benchmarks/gateway_overhead.py's servers: the stub and each gateway variant as its own process,
started as users start them, with their CPU time from /proc."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")



# --- the servers -----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine_busy_seconds() -> float:
    """CPU seconds all processes of the machine have used (from /proc/stat)."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return (user + nice + system + irq + softirq + steal) / _TICK


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class Servers:
    """The stub and the three gateway variants, each a process; `ports[target]`."""

    def __init__(self, workdir: Path, pythonpath: str | None = None) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        self.env = dict(os.environ)
        if pythonpath:
            self.env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [pythonpath, self.env.get("PYTHONPATH")])
            )

    def _spawn(self, name: str, cmd: list[str]) -> None:
        with open(self.workdir / f"{name.replace('+', '-')}.log", "wb") as err:
            self.procs[name] = subprocess.Popen(
                cmd, stdout=err, stderr=subprocess.STDOUT, cwd=self.workdir, env=self.env
            )

    def libraries(self) -> dict[str, bool]:
        """Which optional speed-ups the servers' Python finds (uvicorn uses uvloop and httptools
        when importable; httpcore imports sniffio on every lock it makes and is slow without it)."""
        code = (
            "import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is not None "
            "for m in ('uvloop', 'httptools', 'sniffio')}))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], env=self.env, capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout)

    def start(self, targets: tuple[str, ...]) -> None:
        py = sys.executable
        self.ports["direct"] = free_port()
        self._spawn(
            "direct", [py, "-m", "presched.serve.stub", "--port", str(self.ports["direct"])]
        )
        self._wait_ready("direct", "/v1/models")
        upstream = f"http://127.0.0.1:{self.ports['direct']}"
        extra = {
            "gateway": ["--log", "none"],
            "passthrough": ["--log", "none", "--mode", "passthrough"],
            "gateway+log": ["--log", str(self.workdir / "requests.sqlite")],
        }
        gws = [t for t in targets if t != "direct"]
        for t in gws:
            self.ports[t] = free_port()
            self._spawn(
                t,
                [
                    py,
                    "-m",
                    "presched.cli",
                    "serve",
                    "--backend",
                    upstream,
                    "--port",
                    str(self.ports[t]),
                    *extra[t],
                ],
            )
        for t in gws:
            self._wait_ready(t, "/health")

    def _wait_ready(self, name: str, path: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                break
            if self._get_ok(name, path):
                return
            time.sleep(0.1)
        log = (self.workdir / f"{name.replace('+', '-')}.log").read_text(errors="replace")
        raise RuntimeError(
            f"{name} did not start within {timeout:.0f} s; its output:\n{log[-3000:]}"
        )

    async def settle(self, timeout: float = 20.0) -> float:
        """Wait until no server is busy (each used < 10 % of a core over 0.3 s: a backlog left
        by an overloaded run is worked off) and every gateway reports a healthy backend (its
        health check may have timed out meanwhile), at most `timeout` s; returns the seconds."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            c0 = self.cpu()
            await asyncio.sleep(0.3)
            c1 = self.cpu()
            if all(c1[t] - c0[t] < 0.03 for t in c1):
                gateways = [t for t in self.ports if t != "direct"]
                if all(await asyncio.gather(*(self._health_ok(t) for t in gateways))):
                    break
        return time.monotonic() - t0

    async def _health_ok(self, name: str) -> bool:
        try:
            async with asyncio.timeout(2.0):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.ports[name])
                try:
                    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    return (await reader.readline()).startswith(b"HTTP/1.1 200")
                finally:
                    writer.close()
        except (OSError, TimeoutError):
            return False

    def _get_ok(self, name: str, path: str) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.ports[name]), timeout=2) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                return s.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    def cpu(self) -> dict[str, float]:
        return {t: cpu_seconds(p.pid) for t, p in self.procs.items()}

    def stop(self) -> None:
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
