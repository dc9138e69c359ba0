"""The backends of `benchmarks/soak.py`: real HTTP servers on 127.0.0.1, each its own process.

- `StallServer` (run as `python benchmarks/soak_backends.py --port P`): a TEST DOUBLE that
  answers like `presched.serve.stub` (one token every `--token-s` s, exactly `max_tokens`)
  until it is told to stall (`POST /soak/stall {"on": true}`): from then on every new generation
  request gets its response headers (200) and then nothing, for as long as the peer keeps the
  connection open (at most `--stall-max-s`), like a hung engine whose HTTP front still works.
  `GET /health` stays 200 throughout. `POST /soak/stall {"on": false}` ends the episode for new
  requests (hung ones stay hung). `GET /soak/stats` counts what it received and stalled.
- `Proc`: one backend process (the repo's stub, the stall server, or a vLLM engine through
  `presched.engine.launch`) that can be killed with SIGKILL (a crash) and started again on the
  same port; `stop()` ends it by PID, and is safe to call twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from presched.serve.stub import StubEngine

KEYS = {"victim": "sk-victim", "flood": "sk-flood"}
"""Tenant -> API key of the gateway's two tenants."""
MAX_BODY = 65536
"""The gateway's max_body_bytes in the soak (the 'too_large' malformed body exceeds it)."""


class StallEngine(StubEngine):
    """The stub, plus stall episodes switched over HTTP (see the module doc)."""

    def __init__(self, *args, stall_max_s: float = 600.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stalling = False
        self.stall_max_s = stall_max_s
        self.stalled = 0
        self.hung = 0  # stalled requests whose connection is still open

    def app(self):
        app = super().app()
        app.add_route("/soak/stall", self.set_stall, methods=["POST"])
        app.add_route("/soak/stats", self.stats, methods=["GET"])
        return app

    async def set_stall(self, request: Request) -> Response:
        body = await request.json()
        self.stalling = bool(body.get("on"))
        return await self.stats(request)

    async def stats(self, request: Request) -> Response:
        return JSONResponse({"stalling": self.stalling, "received": self.received,
                             "stalled": self.stalled, "hung": self.hung})  # fmt: skip

    async def generate(self, request: Request) -> Response:
        if not self.stalling:
            return await super().generate(request)
        body = json.loads(await request.body())
        self.received += 1
        self.stalled += 1

        async def nothing():
            self.hung += 1
            try:
                await asyncio.sleep(self.stall_max_s)
            finally:
                self.hung -= 1
            yield b""  # pragma: no cover - only after stall_max_s

        media = "text/event-stream" if body.get("stream") else "application/json"
        return StreamingResponse(nothing(), media_type=media)


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Block until GET `url` answers 200; RuntimeError after `timeout` s or if `proc` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url}: not ready after {timeout:.0f} s")


def post_json(url: str, body: bytes, timeout: float = 5.0) -> bytes:
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


class Proc:
    """A backend process on a fixed port: `start()`, `kill()` (SIGKILL, a crash), `stop()`.

    kind: 'stub' (python -m presched.serve.stub), 'stall' (this file) or 'engine' (vLLM on the
    tiny model through presched.engine.launch; `engine_kwargs` go to `start_engine`)."""

    def __init__(self, name: str, kind: str, port: int, workdir: Path, model: str,
                 token_s: float, env: dict[str, str], engine_kwargs: dict | None = None) -> None:  # fmt: skip
        self.name, self.kind, self.port, self.workdir = name, kind, port, workdir
        self.model, self.token_s, self.env = model, token_s, env
        self.engine_kwargs = engine_kwargs or {}
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.engine = None  # presched.engine.launch.EngineProcess in engine mode
        self.starts = 0

    def start(self, timeout: float = 60.0) -> None:
        self.starts += 1
        if self.kind == "engine":
            from presched.engine import launch, models

            self.engine = launch.start_engine(
                models.ensure_tiny_llama(), port=self.port, served_name=self.model,
                log_path=self.workdir / f"{self.name}-{self.starts}.log", **self.engine_kwargs)  # fmt: skip
            self.proc = self.engine.proc
            return
        here = Path(__file__).resolve()
        cmd = ([sys.executable, "-m", "presched.serve.stub"] if self.kind == "stub"
               else [sys.executable, str(here)])  # fmt: skip
        cmd += ["--port", str(self.port), "--model", self.model, "--token-s", str(self.token_s)]
        with open(self.workdir / f"{self.name}-{self.starts}.log", "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env,
                                         start_new_session=True)  # fmt: skip
        wait_http(f"{self.url}/health", timeout, self.proc)

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)  # start_new_session: the server leads its own group
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the server (and its process group): a crash, no drain."""
        self._signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)
        if self.engine is not None:
            self.engine.stop(timeout=1)  # forget it in launch's registry
            self.engine = None
        self.proc = None

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 5 s; safe to call twice."""
        if self.engine is not None:
            self.engine.stop(timeout=10)
            self.engine, self.proc = None, None
            return
        if self.proc is None:
            return
        self._signal_group(signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_mb(pid: int) -> dict[str, float]:
    """A process's resident memory in MB: `rss_mb` (VmRSS, all resident pages) and `anon_mb`
    (RssAnon: its heap and stacks; file-backed pages, which the kernel evicts and reloads under
    memory pressure from other processes, are left out)."""
    got = {"rss_mb": float("nan"), "anon_mb": float("nan")}  # NaN: the process is gone
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return got
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon"):
            got["rss_mb" if name == "VmRSS" else "anon_mb"] = int(value.split()[0]) / 1024
    return got


HEAP_GAUGES = ("python_allocated_blocks", "malloc_in_use_bytes", "malloc_free_bytes")


def live_heap(base: str) -> dict[str, float]:
    """The gateway's live heap from its /metrics (`presched_python_allocated_blocks`, glibc's
    `presched_malloc_in_use_bytes` / `_free_bytes`); NaN where it did not answer."""
    got = dict.fromkeys(HEAP_GAUGES, float("nan"))
    req = urllib.request.Request(f"{base}/metrics", headers={"authorization": f"Bearer {KEYS['victim']}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            text = r.read().decode()
    except (OSError, urllib.error.URLError):
        return got
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("presched_") and name[9:] in got:
            got[name[9:]] = float(value)
    return got


class Rig:
    """The backends and the gateway, as processes; `stop()` ends every one by PID."""

    def __init__(self, args, workdir: Path) -> None:
        self.args, self.workdir = args, workdir
        self.env = dict(os.environ)
        kind = "engine" if args.engine else "stub"
        ekw = {
            "max_num_seqs": args.max_in_flight,
            "max_model_len": 1024,
            "threads": 1,
            "inproc_worker": True,
        }
        self.backends = {n: Proc(n, kind, free_port(), workdir, args.model, args.token_s, self.env, ekw)
                         for n in ("a", "b")}  # fmt: skip
        self.backends["stall"] = Proc(
            "stall", "stall", free_port(), workdir, args.model, args.token_s, self.env
        )
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "requests.sqlite"
        self.gateway: subprocess.Popen | None = None

    def config(self) -> dict:
        a = self.args
        return {"port": self.port, "policy": a.policy, "health_interval_s": 1.0, "max_body_bytes": MAX_BODY,
                "backends": [{"url": p.url, "name": n, "model": a.model, "max_in_flight": a.max_in_flight}
                             for n, p in self.backends.items()],
                "tenants": [{"name": t, "api_key": k} for t, k in KEYS.items()],
                "log": {"path": str(self.log_path), "store_prompts": True}}  # fmt: skip

    def start(self) -> None:
        for p in self.backends.values():
            p.start(timeout=300 if p.kind == "engine" else 60)
        cfg = self.workdir / "serve.json"
        cfg.write_text(json.dumps(self.config(), indent=1))
        cmd = [sys.executable, "-m", "presched.cli", "serve", "-c", str(cfg)]
        for s in self.args.gateway_set:
            cmd += ["--set", s]
        with open(self.workdir / "gateway.log", "wb") as out:
            self.gateway = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self.env)  # fmt: skip
        wait_http(f"{self.base}/health", 90, self.gateway)

    def sigterm_gateway(self, wait_s: float) -> dict:
        """SIGTERM (the gateway drains), SIGKILL after `wait_s`; how it went."""
        t = time.monotonic()
        self.gateway.send_signal(signal.SIGTERM)
        try:
            code = self.gateway.wait(wait_s)
            clean = True
        except subprocess.TimeoutExpired:
            self.gateway.kill()
            code, clean = self.gateway.wait(10), False
        return {"exit_code": code, "clean": clean, "drain_s": time.monotonic() - t}

    def stop(self) -> None:
        if self.gateway is not None and self.gateway.poll() is None:
            self.gateway.kill()
            self.gateway.wait(10)
        for p in self.backends.values():
            p.stop()

    def stall(self, on: bool) -> None:
        post_json(f"{self.backends['stall'].url}/soak/stall", json.dumps({"on": on}).encode())


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(
        description="The soak benchmark's stalling backend (a test double)."
    )
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="stub")
    ap.add_argument("--token-s", type=float, default=0.0)
    ap.add_argument("--stall-max-s", type=float, default=600.0)
    a = ap.parse_args()
    eng = StallEngine(a.model, a.token_s, stall_max_s=a.stall_max_s)
    uvicorn.run(eng.app(), host="127.0.0.1", port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
