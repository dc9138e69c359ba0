"""A whole GIE stack on 127.0.0.1 in one process tree: stand-in engines (or your engines), the
picker, and a real Envoy in front.

    with LocalStack(cfg, stubs=3, token_s=0.01) as st:     # `presched epp local` runs one
        httpx.post(f"{st.url}/v1/completions", json={...})   # through Envoy -> picker -> engine
        st.picker.gw.backends, st.engines[0].seen            # the decisions, what engines got

The stubs (`presched.serve.stub.StubEngine`, a test double of an engine: exactly `max_tokens`
tokens, `token_s` apart) and the picker run on one asyncio loop in a background thread; Envoy is
a child process, stopped by its PID when the stack closes (a background Envoy that outlives the
command that started it is killed in some sandboxes: keep everything under one process).
`stop_engine(i)` takes an engine down mid-run (its connections close), for fault tests.
"""

from __future__ import annotations

import asyncio
import socket
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from presched.epp import envoy as E
from presched.epp.config import EndpointConfig, EppConfig
from presched.epp.server import EppServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalStack:
    def __init__(self, cfg: dict[str, Any] | EppConfig | None = None, stubs: int = 2, token_s: float = 0.0,
                 predictor: Any = None, log: Any = None, workdir: Path | None = None,
                 baselines: tuple[str, ...] = (), stub_concurrency: int = 1_000_000,
                 failure_mode_allow: bool = False, envoy_port: int | None = None,
                 stub_endpoint: dict[str, Any] | None = None) -> None:  # fmt: skip
        """`cfg`: EppConfig fields (endpoints filled in from the stubs when `stubs` > 0, each
        with the `stub_endpoint` fields, e.g. {"max_in_flight": 2}); `baselines`: also plain
        Envoy listeners over the same engines ('round-robin', 'least-request'), for comparisons."""
        self._cfg_in = cfg or {}
        self.n_stubs, self.token_s, self.stub_concurrency = stubs, token_s, stub_concurrency
        self.predictor, self.log = predictor, log
        self._tmp = None if workdir is not None else tempfile.TemporaryDirectory(prefix="presched-epp-")
        self.workdir = Path(workdir or self._tmp.name)
        self.baseline_names = baselines
        self.failure_mode_allow = failure_mode_allow
        self.envoy_port = envoy_port
        self.stub_endpoint = stub_endpoint or {}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="epp-local", daemon=True)
        self.engines: list = []
        self._servers: list = []
        self.server: EppServer | None = None
        self.envoy = None
        self.ports: dict[str, int] = {}

    # --- running things on the stack's loop ----------------------------------------------------
    def call(self, coro, timeout: float | None = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call_soon(self, fn, *args) -> Any:
        """Run `fn(*args)` on the loop (the picker's state is the loop's) and return its result."""
        fut: Future = Future()

        def run():
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001
                fut.set_exception(e)

        self.loop.call_soon_threadsafe(run)
        return fut.result(30)

    @property
    def picker(self):
        return self.server.picker

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['envoy']}"

    # --- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> "LocalStack":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self._thread.start()
        addrs = [f"127.0.0.1:{self.call(self._start_stub())}" for _ in range(self.n_stubs)]
        data = self._cfg_in.model_dump() if isinstance(self._cfg_in, EppConfig) else dict(self._cfg_in)
        if addrs:
            data["endpoints"] = [EndpointConfig(address=a, **self.stub_endpoint).model_dump() for a in addrs]
        data.setdefault("port", free_port())
        data.setdefault("log", {"path": None})
        cfg = EppConfig.model_validate(data)
        self.server = self.call(self._start_picker(cfg))
        self.ports["epp"] = self.server.port
        self.ports["envoy"], self.ports["admin"] = self.envoy_port or free_port(), free_port()
        base = {}
        for name in self.baseline_names:
            self.ports[name] = free_port()
            base[name] = (self.ports[name], {"round-robin": "ROUND_ROBIN", "least-request": "LEAST_REQUEST"}[name])
        boot = E.bootstrap(self.ports["envoy"], self.server.port, self.ports["admin"],
                           failure_mode_allow=self.failure_mode_allow, baselines=base,
                           endpoints=self.envoy_hosts(), fallbacks=cfg.fallbacks,
                           dest_header=cfg.destination_header, body_mode=cfg.envoy_body_mode,
                           max_body_bytes=cfg.max_body_bytes, max_event_bytes=cfg.max_event_bytes)  # fmt: skip
        path = E.write_bootstrap(self.workdir / "envoy.json", boot)
        self.envoy_log = self.workdir / "envoy.log"
        self.envoy = E.start_envoy(path, self.envoy_log, base_id=self.ports["admin"])
        E.wait_ready(self.ports["admin"], self.envoy, log_path=self.envoy_log)

    def envoy_hosts(self) -> list[str]:
        """The pool's endpoints as the picker has them (`endpoints` and the endpoints file's):
        the hosts of Envoy's cluster."""
        gw = self.picker.gw
        return [b.name for b in gw.backends if b.index not in gw.retired]

    async def _start_stub(self, port: int | None = None, i: int | None = None) -> int:
        import uvicorn

        from presched.serve.stub import StubEngine

        eng = StubEngine("tiny", self.token_s, self.stub_concurrency, record=True)
        port = port or free_port()
        srv = uvicorn.Server(uvicorn.Config(eng.app(), host="127.0.0.1", port=port, log_level="error",
                                            access_log=False, lifespan="off"))  # fmt: skip
        task = asyncio.get_running_loop().create_task(srv.serve())
        for _ in range(500):
            if srv.started:
                break
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        if i is None:
            self.engines.append(eng)
            self._servers.append((srv, task))
        else:
            self.engines[i], self._servers[i] = eng, (srv, task)
        return port

    async def _start_picker(self, cfg: EppConfig) -> EppServer:
        server = EppServer(cfg, self.predictor, self.log)
        await server.start()
        return server

    def restart_picker(self) -> float:
        """Stop the picker and start a fresh one on the same port (its queues and books start
        empty); the seconds it was not listening."""
        import time

        cfg = self.server.cfg.model_copy(update={"port": self.server.port})
        old = self.server
        t = time.monotonic()
        self.call(old.stop(0))
        self.server = self.call(self._start_picker(cfg))
        return time.monotonic() - t

    def stop_engine(self, i: int) -> None:
        """Take engine `i` down at once: it stops listening and its open connections close."""
        srv, task = self._servers[i]

        async def down():
            srv.should_exit = srv.force_exit = True
            for s in getattr(srv, "servers", []):
                s.close()
            for conn in list(srv.server_state.connections):  # uvicorn's open connections
                if getattr(conn, "transport", None) is not None:
                    conn.transport.abort()
            await asyncio.wait_for(task, 10)

        self.call(down())

    def restart_engine(self, i: int) -> None:
        """Start engine `i` again on its port (a fresh stub)."""
        port = int(self.picker.cfg.endpoints[i].address.rpartition(":")[2])
        self.call(self._start_stub(port, i))

    def close(self) -> None:
        if self.envoy is not None:
            E.stop(self.envoy)
            self.envoy = None
        if self._thread.is_alive():
            if self.server is not None:
                self.call(self.server.stop(1.0))
            for srv, task in self._servers:
                srv.should_exit = True
            for srv, task in self._servers:
                try:
                    self.call(asyncio.wait_for(asyncio.shield(task), 10))
                except Exception:  # noqa: BLE001 - already down (stop_engine)
                    pass
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        if self._tmp is not None:
            self._tmp.cleanup()
