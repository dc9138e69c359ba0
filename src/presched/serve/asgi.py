"""Raw ASGI helpers of the gateway's generation endpoints."""

from __future__ import annotations

import asyncio
import contextlib


async def until_disconnect(work, receive) -> bool:
    """Run `work`; if the client disconnects first, cancel it (closing the upstream request)
    and return True."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watcher):
            if not t.done():
                t.cancel()
        for t in (task, watcher):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
    if task.cancelled():
        return True
    if task.exception() is not None:
        raise task.exception()  # type: ignore[misc]
    return False


class RawASGI:
    """Marks a coroutine as a raw ASGI endpoint for Starlette's Route."""

    def __init__(self, fn) -> None:
        self.fn = fn

    async def __call__(self, scope, receive, send) -> None:
        await self.fn(scope, receive, send)
