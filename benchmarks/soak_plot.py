"""The soak benchmark's plot: gateway memory (resident, and its live heap), requests in flight and answers per second by kind
over the run, with the kills, stall episodes and flood bursts marked (`benchmarks/soak.py`
writes it as soak.png)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot(res: dict, recs: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = res["samples"]
    t = [x["t"] for x in s]
    fig, axes = plt.subplots(3, 1, figsize=(12, 9), sharex=True)
    axes[0].plot(t, [x["anon_mb"] for x in s], label="RssAnon (the figure)")
    axes[0].plot(t, [x["rss_mb"] for x in s], label="VmRSS (with file pages)")
    axes[0].legend(fontsize=8)
    axes[0].axvline(res["meta"]["warmup_s"], color="grey", ls=":", lw=0.8)
    axes[0].set_ylabel("gateway RSS (MB)")
    live = axes[0].twinx()
    live.plot(t, [x.get("python_allocated_blocks", np.nan) / 1e3 for x in s], color="green", lw=0.8,
              label="live heap (thousand blocks, right)")  # fmt: skip
    live.set_ylabel("live Python blocks (thousands)")
    live.legend(fontsize=8, loc="lower right")
    axes[1].plot(t, [x["in_flight"] for x in s])
    axes[1].set_ylabel("client requests in flight")
    width = max(1.0, res["meta"]["duration_s"] / 120)
    bins = np.arange(0, res["meta"]["duration_s"] + res["meta"]["client_timeout_s"] + width, width)
    groups = {"200 ok": lambda r: r["outcome"] == "ok",
              "4xx": lambda r: r["outcome"] == "answered" and 400 <= (r["status"] or 0) < 500,
              "5xx / stream error": lambda r: r["outcome"] == "stream_error" or (r["status"] or 0) >= 500,
              "left on purpose": lambda r: r["outcome"] == "left",
              "no answer": lambda r: r["outcome"] in ("timeout", "conn_error", "cut")}  # fmt: skip
    for name, f in groups.items():
        h, _ = np.histogram([r["t_end"] for r in recs if r["t_end"] is not None and f(r)], bins)
        axes[2].plot(bins[:-1], h / width, label=name, drawstyle="steps-post")
    axes[2].set_yscale("symlog")
    axes[2].set_ylabel("answers per second (by end time)")
    axes[2].set_xlabel("seconds into the soak")
    axes[2].legend(fontsize=8, ncol=5)
    for ev in res["events"]:
        for ax in axes:
            if ev["event"] == "kill a":
                ax.axvline(ev["t"], color="red", lw=0.8, alpha=0.6)
            elif ev["event"] == "stall_on":
                ax.axvline(ev["t"], color="orange", lw=0.8, alpha=0.6)
    every = res["meta"]["flood_every_s"]
    for k in range(int(res["meta"]["duration_s"] // every) + 1 if every else 0):
        axes[1].axvline(every / 4 + k * every, color="purple", ls="--", lw=0.7, alpha=0.5)
    axes[2].set_xlim(0, max([r["t_end"] for r in recs if r["t_end"] is not None] + [1.0]) + width)
    f = res["figures"]
    fig.suptitle(
        f"soak at {res['meta']['rps']:.0f} req/s ({res['meta']['backends']})\nlost {f['soak_lost']:g}, "
        f"duplicated {f['soak_duplicated']:g}, gateway 5xx {f['soak_gateway_5xx']:g}; red: backend a "
        "killed, orange: stall starts, purple: flood burst",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out / "soak.png", dpi=110)
    plt.close(fig)
