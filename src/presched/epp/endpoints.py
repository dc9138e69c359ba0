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
import contextlib
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
    return eps


def initial_endpoints(cfg: EppConfig) -> list[EndpointConfig]:
    return list(cfg.endpoints) + (read_endpoints(cfg.endpoints_file) if cfg.endpoints_file else [])


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
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.client is not None:
            await self.client.aclose()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.health_interval_s)
            self.reload()
            await self.check()

    def reload(self) -> None:
        """Apply the endpoints file if it changed since it was last read."""
        m = self._stat()
        if m is None or m == self._mtime:
            return
        self._mtime = m
        try:
            eps = list(self.cfg.endpoints) + read_endpoints(self.cfg.endpoints_file)
        except ValueError as e:
            _log.warning("%s; keeping the endpoints in force", e)
            return
        self.picker.gw.set_endpoints(eps)
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
