"""Fit the embedded default workload to the Azure LLM 2023 conversation trace.

    python benchmarks/fit_default_workload.py            # rewrite the table, print the figures
    python benchmarks/fit_default_workload.py --dry-run  # print only

Writes `src/presched/workload/data/default_lengths.json`: the quantiles of prompt and output
tokens at every percentile plus 99.5 % and 99.9 %, the trace's mean arrival rate and the
prompt/output correlation. Then draws a default sample from the new table and prints
mean/median/p90/p99/max of the trace vs the sample (the figures quoted in docs/workloads.md).
Needs the shared data (see presched.workload.paths.data_dir).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from presched.workload.arrivals import mean_rate, poisson
from presched.workload.default import LengthTable
from presched.workload.loaders import load_azure_conv
from presched.workload.paths import data_dir

OUT = (
    Path(__file__).resolve().parents[1]
    / "src"
    / "presched"
    / "workload"
    / "data"
    / "default_lengths.json"
)
LEVELS = [round(p / 100, 2) for p in range(100)] + [0.995, 0.999, 1.0]


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank), for Spearman's correlation."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return (sums / counts)[inv]


def _stats(x: np.ndarray) -> list[str]:
    q = np.quantile(x, [0.5, 0.9, 0.99])
    return [f"{x.mean():.1f}", f"{q[0]:.0f}", f"{q[1]:.0f}", f"{q[2]:.0f}", f"{x.max():.0f}"]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--dry-run", action="store_true", help="print the figures, do not write the table"
    )
    ap.add_argument(
        "--n",
        type=int,
        default=100_000,
        help="size of the default sample to compare (default 100000)",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the default sample (default 0)")
    args = ap.parse_args()

    reqs = load_azure_conv()
    times = np.array([r.arrival for r in reqs])
    prompt = np.array([r.prompt_tokens for r in reqs], dtype=float)
    output = np.array([r.output_tokens for r in reqs], dtype=float)
    table = {
        "source": "azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
        "generated_by": "python benchmarks/fit_default_workload.py",
        "rows": len(reqs),
        "span_s": round(float(times.max() - times.min()), 6),
        "rate": round(mean_rate(times), 6),
        "spearman_prompt_output": round(
            float(np.corrcoef(_ranks(prompt), _ranks(output))[0, 1]), 4
        ),
        "pearson_prompt_output": round(float(np.corrcoef(prompt, output)[0, 1]), 4),
        "levels": LEVELS,
        "prompt_tokens": [round(float(v), 2) for v in np.quantile(prompt, LEVELS)],
        "output_tokens": [round(float(v), 2) for v in np.quantile(output, LEVELS)],
    }
    if not args.dry_run:
        body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in table.items())
        OUT.write_text("{\n" + body + "\n}\n", encoding="utf-8")
        print(f"wrote {OUT.relative_to(OUT.parents[4])} ({len(LEVELS)} levels)")

    fitted = LengthTable.from_dict(table)
    samples = {}  # the draws of default_workload(n, seed=seed), from the table just fitted
    for n in dict.fromkeys((args.n, 2000)):
        rng = np.random.default_rng(args.seed)
        sample_times = poisson(n, fitted.rate, rng)
        samples[n] = (sample_times, *fitted.sample(n, rng))
    print(
        f"trace: {data_dir() / table['source']}: {table['rows']} requests over "
        f"{table['span_s']:.0f} s, mean rate {table['rate']:.3f} req/s ((n-1)/span)"
    )
    print(
        f"prompt/output correlation in the trace: Spearman {table['spearman_prompt_output']:+.3f},"
        f" Pearson {table['pearson_prompt_output']:+.3f} (the default draws them independently)"
    )
    for n, (sample_times, _, _) in samples.items():
        print(
            f"default_workload({n}, seed={args.seed}): mean rate {mean_rate(sample_times):.3f} req/s"
        )
    print()
    print("| tokens | source | mean | median | p90 | p99 | max |")
    print("|---|---|---|---|---|---|---|")
    for k, (name, t) in enumerate((("input", prompt), ("output", output))):
        print(f"| {name} | trace | " + " | ".join(_stats(t)) + " |")
        for n, drawn in samples.items():
            row = _stats(drawn[1 + k].astype(float))
            print(f"| {name} | default n={n} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
