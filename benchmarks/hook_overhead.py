"""What the hidden-state hook (`presched.engine.plugin.worker`, issue 15) costs the engine.

    python benchmarks/hook_overhead.py                     # tiny random Llama, ~3 min
    python benchmarks/hook_overhead.py --model smollm2 --rounds 3 --requests 8 --tokens 32
    python benchmarks/hook_overhead.py --model smollm2 --egtp ...   # + EGTP's entropies (features.egtp)

Two engines of the same model and flags (presched's scheduler with `fcfs`, prefix caching off,
the model in the engine-core process, one thread each), one with `features` on (the default
middle layer, per-step states on; `--egtp`: the EGTP pool too, whose entropies need the LM head
at every prompt position) and one without. Rounds alternate between them (A B B A A B ...),
each `--requests` completions of `--tokens` tokens (ignore_eos) at once, so that load from other
processes falls on both alike; each engine idles while the other runs.

Figures: `figure: probe_worker_overhead_pct` = the hook's own time in the worker (hook add,
row split, fp32 sums, copies; timed inside the worker, the plugin stats' features_worker_s)
over the hooked engine's wall time of its rounds x 100; `figure: hook_tok_s_ratio` = the median
round throughput with the hook / without (1.0 = no cost; noisy on a shared machine);
`figure: hook_ms_per_step` = worker time per forward. Writes benchmarks/results/hook_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from presched.engine import launch
from presched.engine.models import resolve_model

OUT = Path(__file__).parent / "results"


async def completions_round(url: str, name: str, n: int, tokens: int, prompt_len: int) -> tuple[float, int]:
    ids = list(range(5, 5 + prompt_len))
    async with httpx.AsyncClient(timeout=600) as c:
        async def one(i):
            r = await c.post(f"{url}/v1/completions", json=dict(
                model=name, prompt=ids[i:] + ids[:i], max_tokens=tokens, ignore_eos=True,
                temperature=0.0))  # fmt: skip
            r.raise_for_status()
            return r.json()["usage"]["completion_tokens"]

        t0 = time.perf_counter()
        done = await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - t0, sum(done)


def _stats(path: Path) -> dict:
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--egtp", action="store_true", help="the hooked engine also pools EGTP (features.egtp)")
    ap.add_argument("--out", type=Path, default=OUT / "hook_overhead.json")
    a = ap.parse_args(argv)
    model = resolve_model(a.model)
    tmp = Path(tempfile.mkdtemp(prefix="hook-overhead-"))
    engines = {}
    for tag, feats in (("off", None), ("on", {"egtp": True} if a.egtp else {})):
        plugin = {"policy": "fcfs", "stats": str(tmp / f"{tag}.json"),
                  **({"features": feats} if feats is not None else {})}  # fmt: skip
        extra = [] if feats is not None else ["--no-enable-prefix-caching"]  # on: the launcher adds it
        engines[tag] = launch.start_engine(model, served_name="m", max_num_seqs=a.requests,
                                           inproc_worker=True, plugin=plugin, extra_args=extra,
                                           log_path=tmp / f"{tag}.log")  # fmt: skip
    try:
        for eng in engines.values():  # warm-up
            asyncio.run(completions_round(eng.url, "m", a.requests, 8, a.prompt_len))
        runs: dict[str, list[dict]] = {"off": [], "on": []}
        s0 = _stats(tmp / "on.json")
        for i in range(a.rounds):
            for tag in (("off", "on"), ("on", "off"))[i % 2]:  # each goes first half the time
                wall, toks = asyncio.run(completions_round(engines[tag].url, "m", a.requests, a.tokens,
                                                a.prompt_len))  # fmt: skip
                runs[tag].append({"wall_s": wall, "tokens": toks, "tok_s": toks / wall})
                print(f"{tag:>3}: {toks / wall:8.1f} tok/s ({wall:.2f} s)", flush=True)
        s1 = _stats(tmp / "on.json")
    finally:
        for eng in engines.values():
            eng.stop()
    worker_s = s1["features_worker_s"] - s0["features_worker_s"]
    steps = s1["features_worker_steps"] - s0["features_worker_steps"]
    wall_on = sum(r["wall_s"] for r in runs["on"])
    med = {t: statistics.median(r["tok_s"] for r in runs[t]) for t in runs}
    figures = {"probe_worker_overhead_pct": 100 * worker_s / wall_on,
               "hook_tok_s_ratio": med["on"] / med["off"],
               "hook_ms_per_step": 1e3 * worker_s / max(steps, 1)}  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({
        "config": vars(a) | {"out": str(a.out), "model_dir": str(model)},
        "machine": {"platform": platform.platform(), "note": "shared 2-core box; tok/s is noisy"},
        "runs": runs, "worker_s": worker_s, "worker_steps": steps, "figures": figures,
    }, indent=2))  # fmt: skip
    for k, v in figures.items():
        print(f"figure: {k} = {v:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
