"""What one held request costs the gateway: memory of requests queued, not yet forwarded.

    python benchmarks/held_memory.py               # 1,000 held requests (half streams)
    python benchmarks/held_memory.py --held 2000 --top 15

The gateway runs in this process (the real app over uvicorn, in a thread, queue mode, fcfs, one
backend with `max_in_flight` 1, the request log with prompts, as in the soak); its backend is
the repo's stub (a TEST DOUBLE, its own process); the client is its own process (one raw
HTTP/1.1 connection per request, soak-shaped bodies), so that only the gateway's allocations
are traced. A non-streaming request of 10^6 tokens holds the one slot; then `--held` requests
are sent and wait in the queue. tracemalloc snapshots before and after them give the live bytes
per held request by the code that holds them (the innermost presched frame, else the library);
an untraced round before it gives the difference in `sys.getallocatedblocks` and in RssAnon.
Then that round's clients leave, the backlog drains (each request cancelled and logged), and
RssAnon, the live blocks and glibc's heap are read again, before and after `malloc_trim(0)`:
whether the memory goes back.

Writes benchmarks/results/held_memory.json; prints `figure: held_request_kb = ...` (live Python
heap per held request, tracemalloc) and `figure: held_request_rss_kb = ...`.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import uvicorn

from presched.serve.app import build_app
from presched.serve.config import BackendConfig, ServeConfig
from presched.serve.log import RequestLog
from presched.serve.memory import heap

OUT = Path(__file__).resolve().parent / "results"
WORDS = "the gateway orders requests by their predicted length while engines crash and stall".split()

CLIENT = r"""
import asyncio, json, random, sys
host, port, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
words = sys.argv[5].split()
rng = random.Random(seed)
async def one(i, conns):
    r, w = await asyncio.open_connection(host, port)
    conns.append(w)
    text = f"soak-h{seed}x{i} " + " ".join(rng.choices(words, k=24))
    chat = rng.random() < 0.25
    body = {"model": "stub", "max_tokens": rng.randint(4, 32), "stream": rng.random() < 0.5, "ignore_eos": True}
    body.update({"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text})
    raw = json.dumps(body).encode()
    path = "/v1/chat/completions" if chat else "/v1/completions"
    w.write(f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer sk-flood\r\ncontent-length: {len(raw)}\r\n\r\n".encode() + raw)
    await w.drain()
async def main():
    conns = []
    for i in range(n):
        await one(i, conns)
    print("sent", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def malloc_trim() -> None:
    """glibc's malloc_trim(0): what handing malloc's free pages back would return (the gateway
    does not do it: docs/gateway.md, Memory). Nothing elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def anon_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return -1


def wait_for(cond, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def send(port: int, n: int, seed: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", CLIENT, "127.0.0.1", str(port), str(n), str(seed), " ".join(WORDS)],
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stdout is not None and p.stdout.readline().strip() == "sent"
    return p


def owner(tb) -> str:
    """Who holds an allocation: the innermost frame in presched (file:line), else the innermost
    frame's package (uvicorn, starlette, asyncio, ...)."""
    for f in reversed(tb):  # innermost first
        if "/presched/" in f.filename:
            return "presched/" + f.filename.split("/presched/", 1)[1] + f":{f.lineno}"
    f = tb[-1]
    parts = Path(f.filename).parts
    for lib in ("uvicorn", "starlette", "httptools", "asyncio", "json", "h11", "anyio"):
        if lib in parts:
            return lib
    return Path(f.filename).name


def measure(held: int, top: int, workdir: Path) -> dict:
    stub_port, gw_port = free_port(), free_port()
    stub = subprocess.Popen([sys.executable, "-m", "presched.serve.stub", "--port", str(stub_port),
                             "--token-s", "0.001"])  # fmt: skip
    procs = [stub]
    cfg = ServeConfig(backends=[BackendConfig(url=f"http://127.0.0.1:{stub_port}", name="a", model="stub",
                                              max_in_flight=1)],
                      tenants=[{"name": "flood", "api_key": "sk-flood"}],
                      max_queue=4 * held + 100, health_interval_s=60.0)  # fmt: skip
    log = RequestLog(workdir / "requests.sqlite", store_prompts=True)
    app = build_app(cfg, predictor=None, log=log)
    gw = app.state.gateway.gw
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=gw_port, log_level="warning",
                                           backlog=4 * held + 100))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    try:
        wait_for(lambda: _up(stub_port), "the stub")
        thread.start()
        wait_for(lambda: server.started, "the gateway")
        # warm-up: requests that complete (imports, caches, the log writer), then the blocker
        procs.append(send(gw_port, 50, 1))
        wait_for(lambda: gw.ended >= 50, "the warm-up")
        blocker = socket.create_connection(("127.0.0.1", gw_port))
        raw = json.dumps({"model": "stub", "prompt": "soak-blocker", "max_tokens": 10**6}).encode()
        blocker.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                        b"authorization: Bearer sk-flood\r\ncontent-length: %d\r\n\r\n%s" % (len(raw), raw))  # fmt: skip
        wait_for(lambda: gw.backends[0].num_running == 1, "the blocker to hold the slot")
        procs.append(send(gw_port, 20, 2))  # a few held already (first-time costs of the queue)
        wait_for(lambda: gw.num_waiting == 20, "20 held")
        # untraced: blocks and resident memory of `held` more
        time.sleep(0.5)
        gc.collect()
        b0, a0 = sys.getallocatedblocks(), anon_kb()
        h0 = heap()
        client = send(gw_port, held, 3)
        wait_for(lambda: gw.num_waiting == 20 + held, f"{held} more held")
        time.sleep(0.5)
        gc.collect()
        b1, a1, h1 = sys.getallocatedblocks(), anon_kb(), heap()
        # their clients leave: the backlog drains (each request cancelled, its row written)
        ended = gw.ended
        client.kill()
        client.wait()
        wait_for(lambda: gw.num_waiting == 20 and gw.ended >= ended + held, "the backlog to drain")
        time.sleep(1.0)
        gc.collect()
        b2, a2, h2 = sys.getallocatedblocks(), anon_kb(), heap()
        t = time.perf_counter()
        malloc_trim()
        trim_s = time.perf_counter() - t
        a3, h3 = anon_kb(), heap()
        drain = {"anon_kb": {"before": a0, "held": a1, "drained": a2, "trimmed": a3},
                 "blocks": {"before": b0, "held": b1, "drained": b2},
                 "heap": {"before": h0, "held": h1, "drained": h2, "trimmed": h3}, "trim_s": trim_s}  # fmt: skip
        # traced: where the bytes of `held` more are
        tracemalloc.start(16)
        procs.append(send(gw_port, held, 4))
        wait_for(lambda: gw.num_waiting == 20 + held, f"{held} more held, traced")
        time.sleep(0.5)
        gc.collect()
        snap = tracemalloc.take_snapshot()
        tracemalloc.stop()
        stats = snap.statistics("traceback")
        total = sum(s.size for s in stats)
        owners: dict[str, list[float]] = {}
        for s in stats:
            o = owners.setdefault(owner(s.traceback), [0.0, 0.0])
            o[0] += s.size / held
            o[1] += s.count / held
        ranked = sorted(owners.items(), key=lambda kv: -kv[1][0])[:top]
        sites = [{"owner": k, "bytes_per_request": v[0], "blocks_per_request": v[1]} for k, v in ranked]
        blocker.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        server.should_exit = True
        thread.join(timeout=10)
        log.close()
    return {"held": held, "traced_bytes_per_request": total / held,
            "blocks_per_request": (b1 - b0) / held, "rss_anon_kb_per_request": (a1 - a0) / held,
            "top_owners": sites, "drain": drain}  # fmt: skip


def _up(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--held", type=int, default=1000, help="requests held in the queue (1 to 5000)")
    ap.add_argument("--top", type=int, default=12, help="allocation sites to show")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    if not 1 <= a.held <= 5000:
        ap.error("--held: 1 to 5000")
    with tempfile.TemporaryDirectory(prefix="presched-held-") as tmp:
        res = measure(a.held, a.top, Path(tmp))
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "held_memory.json").write_text(json.dumps(res, indent=1))
    for s in res["top_owners"]:
        print(f"{s['bytes_per_request']:8.0f} B {s['blocks_per_request']:6.2f} blocks  {s['owner']}")
    print(f"blocks per held request: {res['blocks_per_request']:.1f}")
    d = res["drain"]
    print("RssAnon MB before / held / drained / after malloc_trim: "
          + " / ".join(f"{v / 1024:.1f}" for v in d["anon_kb"].values()) + f" (trim took {d['trim_s'] * 1e3:.1f} ms)")
    print("live blocks before / held / drained: " + " / ".join(str(v) for v in d["blocks"].values()))
    for k in ("held", "drained", "trimmed"):
        print(f"heap {k}: {d['heap'][k]}")
    print(f"figure: held_request_kb = {res['traced_bytes_per_request'] / 1024:.2f}")
    print(f"figure: held_request_rss_kb = {res['rss_anon_kb_per_request']:.2f}")


if __name__ == "__main__":
    main()
