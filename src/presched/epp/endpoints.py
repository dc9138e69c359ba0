"""The pool's endpoints: a static list, or a file re-read when it changes, and their health.

    pool = Pool(cfg, picker)
    await pool.start()      # models asked from /v1/models; then a check every health_interval_s

The file (`endpoints_file`) holds `endpoints: [{address, model, max_in_flight, kv_tokens}]`
(YAML or JSON), as a Kubernetes controller or a script writing EndpointSlice addresses would
keep it; a bad edit is logged and the last good list stays in force.

Health: GET http://ADDRESS/health (200 = up), as `presched serve` checks its backends; an
endpoint that failed requests lately stays down until its hold ends (`Backend.held`).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
from pydantic import TypeAdapter, ValidationError

from presched.config import UserError, format_validation_error, load_file
from presched.epp.config import EndpointConfig, EppConfig

_log = logging.getLogger("presched.epp")
_LIST = TypeAdapter(list[EndpointConfig])


def read_endpoints(path: Path) -> list[EndpointConfig]:
    """The endpoints listed in `path`; ValueError naming the file and the field."""
    if not Path(path).exists():
        raise ValueError(f"endpoints_file: endpoints file not found: {path}")
    try:
        data = load_file(path)
    except UserError as e:
        raise ValueError(f"endpoints_file: {e}") from None
    try:
        eps = _LIST.validate_python(data.get("endpoints"))
    except ValidationError as e:
        raise ValueError(f"endpoints_file {path}:\n" + format_validation_error(e, "endpoints")) from None
    if not eps:
        raise ValueError(f"endpoints_file {path}: endpoints: at least one endpoint is required")
    _unique(eps, f"endpoints_file {path}: endpoints")
    return eps


def _unique(eps: list[EndpointConfig], where: str) -> None:
    seen = set()
    for e in eps:
        if e.address in seen:
            raise ValueError(f"{where}: {e.address} is listed twice")
        seen.add(e.address)


def initial_endpoints(cfg: EppConfig) -> list[EndpointConfig]:
    """`endpoints` and the file's; ValueError naming an address listed in both."""
    if cfg.endpoints_file is None:
        return list(cfg.endpoints)
    eps = list(cfg.endpoints) + read_endpoints(cfg.endpoints_file)
    _unique(eps, f"endpoints and endpoints_file {cfg.endpoints_file}")
    return eps


class Pool:
    def __init__(self, cfg: EppConfig, picker) -> None:
        self.cfg, self.picker = cfg, picker
        self.client: httpx.AsyncClient | None = None
        self._task: asyncio.Task | None = None
        self._mtime = self._stat()

    def _stat(self) -> float | None:
        p = self.cfg.endpoints_file
        try:
            return p.stat().st_mtime_ns if p is not None else None
        except OSError:
            return None

    async def start(self) -> None:
        self.client = httpx.AsyncClient(timeout=self.cfg.connect_timeout_s)
        await self.check()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Never raises (the server's stop goes on to close the request log)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception:  # noqa: BLE001 - _loop catches its own; logged, never raised
                _log.exception("endpoints: the health loop had failed")
        if self.client is not None:
            await self.client.aclose()

    async def _loop(self) -> None:
        """Reload and check every health_interval_s; a round that fails is logged, never the
        end of the loop (a dead loop would check no endpoint and read no edit again)."""
        while True:
            await asyncio.sleep(self.cfg.health_interval_s)
            try:
                self.reload()
                await self.check()
            except Exception:  # noqa: BLE001
                _log.exception("endpoints: a reload or health check failed; trying again in %s s",
                               self.cfg.health_interval_s)  # fmt: skip

    def reload(self) -> None:
        """Apply the endpoints file if it changed since it was last read."""
        m = self._stat()
        if m is None or m == self._mtime:
            return
        self._mtime = m
        try:
            eps = initial_endpoints(self.cfg)
            self.picker.gw.set_endpoints(eps)  # applies all of it or nothing
        except ValueError as e:
            _log.warning("%s; keeping the endpoints in force", e)
            return
        _log.warning("endpoints now: %s", ", ".join(e.address for e in eps))

    async def check(self) -> None:
        gw = self.picker.gw
        live = [b for b in gw.backends if b.index not in gw.retired]
        await asyncio.gather(*(self._check(b) for b in live))

    async def _check(self, b) -> None:
        gw = self.picker.gw
        try:
            r = await self.client.get(f"{b.url}/health")
            ok = r.status_code == 200
            if ok and b.model is None:
                m = await self.client.get(f"{b.url}/v1/models")
                b.model = m.json()["data"][0]["id"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            ok = False
        if ok and b.held(gw.now()):
            ok = False
        if b.index not in gw.retired:
            gw.set_health(b, ok)
