"""The gateway's upstream HTTP client side by side with aiohttp's and httpx's: client CPU per request.

    python benchmarks/upstream_clients.py                 # 3 repeats x 2000 requests per client and mode
    python benchmarks/gateway_overhead.py --clients       # the same, from the overhead benchmark
    python benchmarks/upstream_clients.py --requests 500 --repeats 1   # a smoke run

Why: `presched.serve.upstream` is a hand-written HTTP/1.1 client, kept only if the libraries
cost clearly more CPU per proxied request (the gateway's added latency is mostly CPU). Each
client sends the same POST /v1/completions bodies (max_tokens 16, non-streaming and streaming:
16 SSE events + usage + [DONE]) to `presched.serve.stub` (a TEST DOUBLE that answers at once;
its own process), `--concurrency` (8) at a time over keep-alive connections, and reads each body
to its end as the gateway does (`aread` / every raw chunk). Measured: this process's CPU time
(`time.process_time`) per request, which is only the client's work and its event loop's (uvloop
when installed, as uvicorn runs the gateway). Repeats rotate the clients' order; every figure is
the median over repeats, and the ratios are taken within each repeat.

Writes benchmarks/results/upstream_clients.json and prints `figure: name = value` lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).parent / "results"
CLIENTS = ("upstream", "aiohttp", "httpx")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bodies(n: int, stream: bool) -> list[bytes]:
    return [json.dumps({"model": "stub", "prompt": f"request {i} " + "word " * 60, "max_tokens": 16,
                        "stream": stream, "stream_options": {"include_usage": True} if stream else None}).encode()
            for i in range(n)]  # fmt: skip


async def _run(client: str, url: str, bodies: list[bytes], stream: bool, concurrency: int) -> tuple[float, int]:
    """(CPU seconds of this process, bytes read) for all `bodies` with one client."""
    path = "/v1/completions"
    if client == "upstream":
        from presched.serve.upstream import Upstream

        up = Upstream(max_idle=2 * concurrency)

        async def one(b: bytes) -> int:
            r = await up.post(url, path, b)
            n = sum(len(c) for c in [c async for c in r.aiter_raw()]) if stream else len(await r.aread())
            await r.aclose()
            return n

        close = up.aclose
    elif client == "aiohttp":
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2 * concurrency),
                                        auto_decompress=False)  # fmt: skip
        headers = {"content-type": "application/json"}

        async def one(b: bytes) -> int:
            async with session.post(url + path, data=b, headers=headers) as r:
                if stream:
                    return sum([len(c) async for c in r.content.iter_any()])
                return len(await r.read())

        close = session.close
    else:
        import httpx

        hc = httpx.AsyncClient(limits=httpx.Limits(max_connections=2 * concurrency), timeout=None)
        headers = {"content-type": "application/json"}

        async def one(b: bytes) -> int:
            async with hc.stream("POST", url + path, content=b, headers=headers) as r:
                return sum([len(c) async for c in r.aiter_raw()])

        close = hc.aclose

    queue = list(reversed(bodies))
    got = 0

    async def worker() -> None:
        nonlocal got
        while queue:
            n = await one(queue.pop())
            got += n

    for b in bodies[-50:]:  # warm-up: connections, imports, caches
        await one(b)
    del queue[:50]  # the warm-up bodies (the queue is reversed)
    cpu0 = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu = time.process_time() - cpu0
    await close()
    return cpu, got


def measure(requests: int = 2000, repeats: int = 3, concurrency: int = 8) -> dict:
    """Start the stub, measure every client `repeats` times in both modes, stop the stub."""
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is in the serve extra
        loop_factory = asyncio.new_event_loop
    port = _free_port()
    stub = subprocess.Popen([sys.executable, "-m", "presched.serve.stub", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        for _ in range(200):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        runs = []
        for rep in range(repeats):
            order = CLIENTS[rep % 3:] + CLIENTS[:rep % 3]
            for stream in (False, True):
                bodies = _bodies(requests + 50, stream)
                row = {"repeat": rep, "stream": stream}
                sizes = {}
                for client in order:
                    with asyncio.Runner(loop_factory=loop_factory) as runner:
                        cpu, got = runner.run(_run(client, url, bodies, stream, concurrency))
                    row[f"{client}_cpu_us"] = cpu / requests * 1e6
                    sizes[client] = got / requests
                # the stub numbers its answers, so sizes differ by a digit or two, no more
                assert max(sizes.values()) - min(sizes.values()) < 0.05 * min(sizes.values()), sizes
                row["bytes_per_request"] = sizes
                for client in CLIENTS[1:]:
                    row[f"{client}_vs_upstream"] = row[f"{client}_cpu_us"] / row["upstream_cpu_us"]
                runs.append(row)
    finally:
        stub.terminate()
        stub.wait(10)
    summary = {}
    for stream in (False, True):
        rows = [r for r in runs if r["stream"] == stream]
        mode = "stream" if stream else "plain"
        for key in rows[0]:
            if key.endswith(("_cpu_us", "_vs_upstream")):
                summary[f"{mode}_{key}"] = statistics.median(r[key] for r in rows)
    meta = {"requests": requests, "repeats": repeats, "concurrency": concurrency,
            "loop": loop_factory.__module__, "loadavg": os.getloadavg(),
            "upstream": "presched.serve.stub, its own process (test double that answers at once)"}  # fmt: skip
    return {"meta": meta, "summary": summary, "runs": runs}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="measured requests per client, mode and repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight at a time")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    if a.requests < 1 or a.repeats < 1 or not 1 <= a.concurrency <= 1000:
        ap.error("--requests, --repeats: >= 1; --concurrency: 1..1000")
    result = measure(a.requests, a.repeats, a.concurrency)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "upstream_clients.json").write_text(json.dumps(result, indent=1))
    for r in result["runs"]:
        print("repeat {repeat} stream={stream}: ".format(**r)
              + "  ".join(f"{c} {r[c + '_cpu_us']:.0f} us" for c in CLIENTS)
              + f"  aiohttp/upstream {r['aiohttp_vs_upstream']:.2f}  httpx/upstream {r['httpx_vs_upstream']:.2f}")  # fmt: skip
    for k, v in result["summary"].items():
        print(f"figure: {k} = {v:.4g}")


if __name__ == "__main__":
    main()
