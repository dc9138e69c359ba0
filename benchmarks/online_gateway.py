"""benchmarks/online.py --gateway: one stream through `presched serve --learn` against the stub.

The stub (`presched.serve.stub`, a test double) answers each request with the stream's true
length (`stub_output_tokens`, finish_reason "stop"); every 10th request gets a max_tokens below
its length, so the engine cuts it (finish_reason "length": censored). Requests go in arrival
order, `concurrency` at a time, over real HTTP; then the request log and /metrics are read back:
the predictor versions the log recorded, the learner's counters, and tau-b / coverage of the
logged predictions per window (as the offline runs score them).
"""

from __future__ import annotations

import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

import httpx
import numpy as np

from presched.predict import LEVELS
from presched.predict.metrics import coverage, kendall_tau_b
from presched.predict.online import OnlineConfig
from presched.serve.app import build_app
from presched.serve.config import ServeConfig
from presched.serve.learn import make_learner
from presched.serve.log import RequestLog
from presched.serve.log_read import read_log
from presched.serve.stub import StubEngine
from presched.workload.request import Request


def _serve(app) -> tuple[str, Any, threading.Thread]:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           timeout_graceful_shutdown=5))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.01)
    return f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}", server, thread


def drive_gateway(predictor: Any, stream: Sequence[Request], learn: OnlineConfig, concurrency: int = 8,
                  window: int = 100) -> dict[str, Any]:  # fmt: skip
    model = stream[0].model
    stream = [r for r in stream if r.model == model]
    with tempfile.TemporaryDirectory() as tmp:
        stub_url, stub, stub_thread = _serve(StubEngine(model=model).app())
        cfg = ServeConfig(backends=[{"url": stub_url, "model": model, "max_in_flight": concurrency}],
                          predictor=None, learn=learn.model_copy(update={"enabled": True, "state_dir": str(Path(tmp) / "state")}),
                          log={"path": str(Path(tmp) / "log.sqlite"), "store_prompts": True})  # fmt: skip
        learner = make_learner(cfg, predictor)
        log = RequestLog(cfg.log.path, store_prompts=True)
        url, server, thread = _serve(build_app(cfg, learner, log))

        def send(i: int) -> int:
            r = stream[i]
            cut = i % 10 == 9 and r.output_tokens > 2
            body = {"model": model, "prompt": r.prompt, "max_tokens": r.output_tokens // 2 if cut else 16_384,
                    "stub_output_tokens": r.output_tokens}  # fmt: skip
            return httpx.post(url + "/v1/completions", json=body, timeout=60).status_code

        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            codes = list(pool.map(send, range(len(stream))))
        wall = time.perf_counter() - t0
        learner.wait(120)
        metrics = httpx.get(url + "/metrics").text
        server.should_exit = True
        thread.join(30)
        stub.should_exit = True
        stub_thread.join(10)
        df = read_log(cfg.log.path)
        saved = (Path(tmp) / "state" / "online.npz").exists()
    ok = df[(df["status"] == 200) & (df["finish_reason"] == "stop")]
    y = ok["output_tokens"].to_numpy(float)
    q = np.array(ok["pred_quantiles"].tolist())
    windows = []
    for lo in range(0, len(y) - window + 1, window):
        sl = slice(lo, lo + window)
        err = np.abs(coverage(q[sl], y[sl]) - np.asarray(LEVELS))[:9] * 100
        windows.append({"start": lo, "tau_b": kendall_tau_b(ok["pred_mean"].to_numpy()[sl], y[sl]),
                        "coverage_err_max_pts": float(err.max())})  # fmt: skip
    lines = [ln for ln in metrics.splitlines() if ln.startswith(("presched_predictor_version", "presched_drift", "presched_learn"))]
    return {"requests": len(stream), "status_200": codes.count(200), "wall_s": wall, "state_saved": saved,
            "versions_logged": sorted({int(v) for v in df["predictor_version"].dropna()}),
            "censored_logged": int((df["finish_reason"] == "length").sum()), "counts": learner.status(),
            "windows": windows, "metrics": lines}  # fmt: skip
