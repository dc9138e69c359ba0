"""A minimal OpenAI-compatible upstream: a stand-in engine for tests and the overhead benchmark.

It is a TEST DOUBLE, not an engine: every request generates exactly `max_tokens` tokens (as a
real engine does with `ignore_eos`; finish_reason "length"), or, when the body names
`stub_output_tokens: N`, min(N, max_tokens) tokens (finish_reason "stop" when N < max_tokens:
an answer that ended by itself, what online learning needs to see), one token every `token_s` seconds (0 = all at once), with at
most `max_concurrency` requests generating at a time (the rest wait FIFO, or by the request's
`priority` field, lower first, as vLLM's priority scheduling orders its waiting queue). Its wire
format follows vLLM's OpenAI server: SSE `data: {...}` events, a final usage event when
`stream_options.include_usage` is set, then `data: [DONE]`. The real-engine tests use vLLM itself.

Faults, for the gateway's tests: `stall_after=k` sends the headers and `k` token events (a
non-streaming answer: the headers and the first bytes of its body) and then nothing, until the
client goes away; `event_end` is what ends each event (`"\n"` never sends a blank line,
`"\r\n\r\n"` is the CRLF framing some servers use).

    python -m presched.serve.stub --port 9001 --token-s 0.01 --max-concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import json
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


class StubEngine:
    def __init__(self, model: str = "stub", token_s: float = 0.0, max_concurrency: int = 1_000_000,
                 ttft_s: float = 0.0, stall_after: int | None = None, event_end: str = "\n\n",
                 record: bool = False) -> None:  # fmt: skip
        self.model, self.token_s, self.ttft_s = model, token_s, ttft_s
        self.stall_after, self.event_end = stall_after, event_end
        self.max_concurrency = max_concurrency
        self.running = 0
        self._waiting: list[tuple[int, int, asyncio.Future]] = []
        self._tie = itertools.count()
        self.started: list[str] = []  # request ids (the prompt's text), in the order they ran
        self.received = 0
        self.record = record
        self.seen: list[tuple[dict, dict]] = []  # with `record`: (headers, body) of each request

    async def _acquire(self, priority: int) -> None:
        if self.running < self.max_concurrency and not self._waiting:
            self.running += 1
            return
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._tie), fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release()
            raise

    def _release(self) -> None:
        self.running -= 1
        while self._waiting and self.running < self.max_concurrency:
            _, _, fut = heapq.heappop(self._waiting)
            if not fut.cancelled():
                self.running += 1
                fut.set_result(None)

    def app(self) -> Starlette:
        routes = [
            Route("/health", lambda r: Response(status_code=200)),
            Route("/v1/models", self.models),
            Route("/v1/completions", self.generate, methods=["POST"]),
            Route("/v1/chat/completions", self.generate, methods=["POST"]),
        ]
        app = Starlette(routes=routes)
        app.state.engine = self
        return app

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "presched-stub"}]})  # fmt: skip

    async def generate(self, request: Request) -> Response:
        body = await request.json()
        self.received += 1
        if self.record:
            self.seen.append((dict(request.headers), body))
        chat = request.url.path.endswith("chat/completions")
        n = int(body.get("max_tokens") or 16)
        stop = body.get("stub_output_tokens")
        reason = "length"
        if isinstance(stop, int) and not isinstance(stop, bool) and 1 <= stop < n:
            n, reason = stop, "stop"
        prompt = (body.get("messages") or [{}])[-1].get("content") if chat else body.get("prompt", "")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(self._tie)}"
        usage_wanted = bool((body.get("stream_options") or {}).get("include_usage"))
        await self._acquire(int(body.get("priority") or 0))
        self.started.append(str(prompt))
        kind = "chat.completion" if chat else "text_completion"
        usage = {"prompt_tokens": max(len(str(prompt)) // 4, 1), "completion_tokens": n}
        usage["total_tokens"] = usage["prompt_tokens"] + n
        if not body.get("stream") and self.stall_after is not None:
            async def stalled():
                try:
                    yield b'{"id": "' + rid.encode() + b'", '
                    await asyncio.Event().wait()  # until the client goes away
                finally:
                    self._release()

            return StreamingResponse(stalled(), media_type="application/json")
        if not body.get("stream"):
            try:
                await asyncio.sleep(self.ttft_s + self.token_s * n)
            finally:
                self._release()
            text = " tok" * n
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "finish_reason": reason} if chat else
                      {"index": 0, "text": text, "finish_reason": reason})  # fmt: skip
            return JSONResponse({"id": rid, "object": kind, "created": int(time.time()),
                                 "model": self.model, "choices": [choice], "usage": usage})  # fmt: skip

        end = self.event_end

        async def events():
            try:
                if self.ttft_s:
                    await asyncio.sleep(self.ttft_s)
                for i in range(n):
                    if i == self.stall_after:
                        await asyncio.Event().wait()  # until the client goes away
                    if self.token_s and i:
                        await asyncio.sleep(self.token_s)
                    last = i == n - 1
                    choice = ({"index": 0, "delta": {"content": " tok"},
                               "finish_reason": reason if last else None} if chat else
                              {"index": 0, "text": " tok", "finish_reason": reason if last else None})  # fmt: skip
                    chunk = {"id": rid, "object": kind + ("" if not chat else ".chunk"),
                             "created": 0, "model": self.model, "choices": [choice]}  # fmt: skip
                    yield f"data: {json.dumps(chunk)}{end}"
                if usage_wanted:
                    chunk = {"id": rid, "object": kind, "created": 0, "model": self.model,
                             "choices": [], "usage": usage}  # fmt: skip
                    yield f"data: {json.dumps(chunk)}{end}"
                yield f"data: [DONE]{end}"
            finally:
                self._release()

        return StreamingResponse(events(), media_type="text/event-stream")


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description="A stand-in OpenAI-compatible upstream (test double).")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9001)
    ap.add_argument("--model", default="stub")
    ap.add_argument("--token-s", type=float, default=0.0, help="seconds per output token")
    ap.add_argument("--ttft-s", type=float, default=0.0, help="seconds before the first token")
    ap.add_argument("--max-concurrency", type=int, default=1_000_000)
    ap.add_argument("--stall-after", type=int, default=None, help="send this many tokens, then nothing (a fault)")
    a = ap.parse_args()
    eng = StubEngine(a.model, a.token_s, a.max_concurrency, a.ttft_s, stall_after=a.stall_after)
    uvicorn.run(eng.app(), host=a.host, port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
