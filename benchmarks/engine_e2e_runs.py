"""benchmarks/engine_e2e.py's processes and one measured run: the gateways in front of the engine,
CPU accounting from /proc, the engine's own metrics, warm-up, and `run_one` (replay and measure)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import Progress

from engine_e2e_configs import BLOCK_SIZE, CONFIGS, KEYS, METRICS
from presched.engine import affinity, launch
from presched.engine.calibrate import parse_histograms
from presched.loadgen.replay import ReplayConfig, run_replay
from presched.workload.request import Request

_TICK = os.sysconf("SC_CLK_TCK")


# --- processes ---------------------------------------------------------------------------------
def process_cpu(pid: int) -> float:
    f = affinity.stat(pid)
    return (int(f[11]) + int(f[12])) / _TICK if f else 0.0


def group_cpu(pgid: int) -> float:
    """CPU seconds of the live processes in a process group (the engine: server, core, worker)."""
    return sum((int(f[11]) + int(f[12])) / _TICK for _, f in affinity.processes() if int(f[2]) == pgid)


def machine_cpu() -> float:
    """Busy CPU seconds of the whole machine (all cores) since boot."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / _TICK  # minus idle and iowait


class Gateways:
    """One `presched serve` process per gateway configuration, in front of the engine."""

    def __init__(self, engine_url: str, max_in_flight: int, pred: Path, workdir: Path, names: list[str]) -> None:
        self.urls: dict[str, str] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs = []
        for name in names:
            flags = CONFIGS[name][0]
            if flags is None:
                continue
            port = launch.free_port()
            cmd = [sys.executable, "-m", "presched.cli", "serve", "--backend", engine_url,
                   "--port", str(port), "--max-in-flight", str(max_in_flight), "--log", "none",
                   *[f.format(pred=pred) for f in flags]]  # fmt: skip
            self.logs.append(open(workdir / f"{name}.log", "wb"))  # noqa: SIM115 - closed in stop
            self.procs[name] = subprocess.Popen(cmd, stdout=self.logs[-1], stderr=subprocess.STDOUT)
            self.urls[name] = f"http://127.0.0.1:{port}"
        self.workdir = workdir

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        for name, url in self.urls.items():
            while True:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if self.procs[name].poll() is not None or time.monotonic() > deadline:
                    log = (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"gateway {name} did not start:\n{log}")
                time.sleep(0.2)

    def stop(self) -> None:
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in self.logs:
            f.close()


def engine_metrics(url: str) -> dict[str, tuple[float, float]]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return parse_histograms(r.read().decode(), METRICS)


def kv_blocks(log: Path) -> int | None:
    """KV-cache blocks from the engine log ('CPU KV cache size: 524,288 tokens')."""
    m = re.search(r"KV cache size: ([\d,]+) tokens", log.read_text(errors="replace"))
    return int(m.group(1).replace(",", "")) // BLOCK_SIZE if m else None


def warm_up(urls: list[str], model: str) -> None:
    body = json.dumps({"model": model, "prompt": "warm up the path", "max_tokens": 8,
                       "ignore_eos": True}).encode()  # fmt: skip
    for url in urls:
        for _ in range(2):
            req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                r.read()


def settle(url: str, reqs: list[Request], model: str, seqs: int) -> None:
    """A discarded burst of the workload's first requests straight at the engine, after each
    calibration: without it the first run after one ran up to 40 % slower per token than the
    others (measured twice, on the idle machine)."""
    burst = [dataclasses.replace(r, arrival=0.0) for r in reqs[: 2 * seqs]]
    run_replay(burst, ReplayConfig(url=url, model=model, stream=True, force_lengths=True, timeout_s=300))


# --- one run -----------------------------------------------------------------------------------
def run_one(name: str, url: str, reqs: list[Request], model: str, eng, gws: Gateways,
            prog: Progress, task) -> dict[str, Any]:  # fmt: skip
    """Replay `reqs` at `url` and measure: the replay's figures, the engine's own decode time per
    token, CPU seconds of each party and of the rest of the machine."""
    gw = gws.procs.get(name)
    m0, load0 = engine_metrics(eng.url), os.getloadavg()
    c0 = (group_cpu(eng.proc.pid), process_cpu(gw.pid) if gw else 0.0, process_cpu(os.getpid()), machine_cpu())
    prog.update(task, completed=0, total=len(reqs), description=name)
    cfg = ReplayConfig(url=url, model=model, stream=True, force_lengths=True, timeout_s=900)
    res = run_replay(reqs, cfg, progress=lambda d, t: prog.update(task, completed=d))
    time.sleep(0.3)  # the engine records a request just after its last byte
    m1, load1 = engine_metrics(eng.url), os.getloadavg()
    c1 = (group_cpu(eng.proc.pid), process_cpu(gw.pid) if gw else 0.0, process_cpu(os.getpid()), machine_cpu())
    s = res.summary
    wall = s["wall_s"]
    dec = [m1[k][0] - m0[k][0] for k in METRICS], [m1[k][1] - m0[k][1] for k in METRICS]
    cpu = {k: c1[i] - c0[i] for i, k in enumerate(("engine", "gateway", "replay", "machine"))}
    cpu["others"] = max(0.0, cpu["machine"] - cpu["engine"] - cpu["gateway"] - cpu["replay"])
    ok = [row for row in res.rows if row["ok"]]
    return {
        "config": name, "summary": {k: s.get(k) for k in KEYS}, "wall_s": wall,
        "errors_by_status": s["errors_by_status"],
        "errors": [row["error"] for row in res.rows if not row["ok"]][:5],
        "output_tokens": int(sum(row["output_tokens"] for row in ok)),
        "engine_decode_s_per_token": dec[0][0] / max(1.0, dec[0][1] - dec[1][0]),
        "cpu_s": cpu, "others_cores": cpu["others"] / wall, "loadavg": [load0[0], load1[0]],
        "e2e_s": {row["id"]: round(row["e2el_s"], 4) for row in ok},
        "ttft_s": {row["id"]: round(row["ttft_s"], 4) for row in ok},
        "send_lag_ms": {row["id"]: round(row["send_lag_ms"], 1) for row in res.rows},
        "sent_s": {row["id"]: round(row["sent_s"], 4) for row in res.rows if np.isfinite(row["sent_s"])},
        "queue_wait_s": {row["id"]: round(row["queue_wait_s"], 4) for row in ok if np.isfinite(row["queue_wait_s"])},
        "prompt_tokens": {row["id"]: row["prompt_tokens"] for row in ok},
    }  # fmt: skip
