"""What presched's in-engine scheduler costs a saturated engine (issue 14's
`engine_plugin_overhead_pct`, in a focused form): stock vLLM vs the plugin running `fcfs`.

    python benchmarks/plugin_overhead.py                     # tiny random Llama, ~4 min
    python benchmarks/plugin_overhead.py --model smollm2 --rounds 6

Two engines with the same flags as `benchmarks/engine_e2e.py` (max_num_seqs 8, block size 128,
prefix caching off, the model in the engine-core process, one thread), one stock (vLLM's priority
scheduler) and one with `--scheduler-cls` presched's `PreschedScheduler` running `fcfs` (the same
order as stock: only the plugin's cost differs). Each round sends `--requests` completions of
`--tokens` forced tokens (ignore_eos) at once, so the batch stays full; rounds alternate which
engine goes first (A B B A ...) and each engine idles while the other runs, so load from other
processes falls on both alike.

Figures: `figure: engine_plugin_overhead_pct` = median over rounds of
(1 - plugin tok/s / stock tok/s) x 100, each round's pair compared (the per-round values are in
the JSON: on a shared machine they spread several points either way);
`figure: engine_plugin_own_pct` = the plugin's own time (timed inside the engine: the stats'
`plugin_own_s`, see `PreschedScheduler.schedule`) over the plugin engine's wall time x 100, a
noise-free lower bound (it leaves out the waiting-queue calls vLLM makes, which replace vLLM's
own queue); `figure: engine_plugin_own_us_per_step`. Writes benchmarks/results/plugin_overhead.json
and .png (tok/s per round, both engines).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.append(str(Path(__file__).parent))  # hook_overhead.py beside it
from hook_overhead import completions_round  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402

from presched.engine import launch  # noqa: E402
from presched.engine.models import resolve_model  # noqa: E402
from presched.plotting import pyplot, save  # noqa: E402

OUT = Path(__file__).parent / "results"
ENGINE_ARGS = ["--block-size", "128", "--no-enable-prefix-caching"]  # as engine_e2e.py


def figures(runs: dict[str, list[dict]], own_s: float, steps: int) -> dict[str, float]:
    """The headline figures from the rounds' {wall_s, tokens} of each engine and the plugin's
    own time over those rounds."""
    pairs = list(zip(runs["stock"], runs["plugin"], strict=True))
    per_round = [100 * (1 - (p["tokens"] / p["wall_s"]) / (s["tokens"] / s["wall_s"])) for s, p in pairs]
    wall = sum(r["wall_s"] for r in runs["plugin"])
    return {"engine_plugin_overhead_pct": statistics.median(per_round),
            "engine_plugin_own_pct": 100 * own_s / wall,
            "engine_plugin_own_us_per_step": 1e6 * own_s / max(steps, 1)}  # fmt: skip


def plot(runs: dict[str, list[dict]], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, rs in runs.items():
        ax.plot(range(1, len(rs) + 1), [r["tokens"] / r["wall_s"] for r in rs], "o-", label=name)
    ax.set_xlabel("round")
    ax.set_ylabel("output tok/s (batch full)")
    ax.set_title("stock vLLM vs presched's scheduler running fcfs")
    ax.legend()
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="tiny, smollm2 or a model folder")
    ap.add_argument("--rounds", type=int, default=10, help="rounds per engine (alternating)")
    ap.add_argument("--requests", type=int, default=48, help="completions per round, sent at once")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256, help="forced output tokens per completion")
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--out", type=Path, default=OUT / "plugin_overhead.json")
    a = ap.parse_args(argv)
    for name in ("rounds", "requests", "max_num_seqs", "tokens", "prompt_len"):
        if not 1 <= getattr(a, name) <= 10_000:
            ap.error(f"--{name.replace('_', '-')} must be in 1..10000")
    console = Console()
    model = resolve_model(a.model)
    tmp = Path(tempfile.mkdtemp(prefix="plugin-overhead-"))
    stats = tmp / "stats.json"
    engines = {}
    try:
        with console.status("starting the two engines ..."):
            for name, plugin in (("stock", None), ("plugin", {"policy": "fcfs", "stats": str(stats)})):
                engines[name] = launch.start_engine(
                    model, served_name="m", max_num_seqs=a.max_num_seqs, inproc_worker=True,
                    plugin=plugin, extra_args=ENGINE_ARGS, log_path=tmp / f"{name}.log")  # fmt: skip
        for eng in engines.values():  # warm-up
            asyncio.run(completions_round(eng.url, "m", a.max_num_seqs, 8, a.prompt_len))
        s0 = json.loads(stats.read_text())
        runs: dict[str, list[dict]] = {"stock": [], "plugin": []}
        prog = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console)  # fmt: skip
        with prog:
            task = prog.add_task("rounds", total=2 * a.rounds)
            for i in range(a.rounds):
                for name in (("stock", "plugin"), ("plugin", "stock"))[i % 2]:
                    wall, toks = asyncio.run(completions_round(
                        engines[name].url, "m", a.requests, a.tokens, a.prompt_len))  # fmt: skip
                    runs[name].append({"wall_s": wall, "tokens": toks})
                    prog.update(task, advance=1, description=f"{name}: {toks / wall:.0f} tok/s")
        s1 = json.loads(stats.read_text())
    finally:
        for eng in engines.values():
            eng.stop()
    own_s = s1["plugin_own_s"] - s0["plugin_own_s"]
    steps = s1["steps"] - s0["steps"]
    figs = figures(runs, own_s, steps)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({
        "config": vars(a) | {"out": str(a.out), "model_dir": str(model)},
        "machine": {"platform": platform.platform(), "note": "shared 2-core box; tok/s is noisy"},
        "runs": runs, "plugin_own_s": own_s, "plugin_steps": steps, "figures": figs,
    }, indent=2))  # fmt: skip
    plot(runs, a.out.with_suffix(".png"))
    for k, v in figs.items():
        print(f"figure: {k} = {v:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
