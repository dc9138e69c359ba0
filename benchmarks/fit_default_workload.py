"""Fit the embedded default workload: Azure code arrivals, CASTILLO Llama-3.1-8B lengths.

    python benchmarks/fit_default_workload.py            # rewrite the table, print the figures
    python benchmarks/fit_default_workload.py --dry-run  # print only

Writes `src/presched/workload/data/default_lengths.json`: the quantiles (every percentile plus
99.5 % and 99.9 %) of
- the interarrival gaps of the Azure LLM 2023 code trace, in units of its mean gap (the last
  level set so the top 0.1 % keeps its mean, see _gap_quantiles), and its mean
  arrival rate;
- prompt and output tokens of CASTILLO's Llama-3.1-8B generations (all splits, sample 0), and
  their correlation (the default draws them independently);
- `text_gbm_sigma`: the noisy-oracle sigma whose Kendall tau-b on a default sample equals
  text-gbm's measured tau-b against served lengths on CASTILLO test prompts (TEXT_GBM_TAU,
  docs/policy-evidence.md), found by bisection.
Then draws default samples from the new table and prints mean/median/p90/p99/max of the data vs
the samples (the figures quoted in docs/workloads.md). Needs the shared data (see
presched.workload.paths.data_dir).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from presched.predict.metrics import kendall_tau_b
from presched.predict.noisy_oracle import noisy_oracle
from presched.workload.arrivals import mean_rate
from presched.workload.default import LengthTable
from presched.workload.loaders import load_azure_code
from presched.workload.loaders.castillo import load_castillo

OUT = (
    Path(__file__).resolve().parents[1]
    / "src"
    / "presched"
    / "workload"
    / "data"
    / "default_lengths.json"
)
LEVELS = [round(p / 100, 2) for p in range(100)] + [0.995, 0.999, 1.0]
CASTILLO_MODEL = "llama-3.1-8b"
TEXT_GBM_TAU = 0.434  # text-gbm vs served lengths, CASTILLO test, seed 0 (docs/policy-evidence.md)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank), for Spearman's correlation."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return (sums / counts)[inv]


def _stats(x: np.ndarray, fmt: str = "{:.0f}") -> list[str]:
    q = np.quantile(x, [0.5, 0.9, 0.99])
    return [f"{x.mean():.2f}", *(fmt.format(v) for v in (*q, x.max()))]


def _gap_quantiles(gaps: np.ndarray) -> np.ndarray:
    """Quantiles of the gaps at LEVELS, except the last: linear interpolation spreads the top
    0.1 % evenly between q99.9 and the maximum (one 557-mean-gap silence), which would inflate the
    mean gap by 20 %; the last value is instead set so that segment has the data's mean."""
    q = np.quantile(gaps, LEVELS)
    top = gaps[gaps >= q[-2]]
    q[-1] = max(q[-2], 2 * top.mean() - q[-2])
    return q


def sigma_for_tau(reqs, target: float) -> float:
    """The noisy-oracle sigma whose tau-b on `reqs` is `target` (bisection; tau falls with sigma)."""
    y = [r.target_tokens for r in reqs]
    lo, hi = 0.0, 5.0
    for _ in range(20):
        mid = (lo + hi) / 2
        if kendall_tau_b(noisy_oracle(reqs, mid, seed=1).point, y) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


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

    code = load_azure_code()
    times = np.sort([r.arrival for r in code])
    gaps = np.diff(times) / np.diff(times).mean()
    cas = load_castillo(model=CASTILLO_MODEL)
    prompt = np.array([r.prompt_tokens for r in cas], dtype=float)
    output = np.array([r.output_tokens for r in cas], dtype=float)
    table = {
        "arrivals_source": "azure-llm-2023/AzureLLMInferenceTrace_code.csv",
        "lengths_source": f"castillo, model {CASTILLO_MODEL}, all splits, sample 0",
        "generated_by": "python benchmarks/fit_default_workload.py",
        "arrival_rows": len(code),
        "length_rows": len(cas),
        "span_s": round(float(times[-1] - times[0]), 6),
        "rate": round(mean_rate(times), 6),
        "gap_cv": round(float(gaps.std() / gaps.mean()), 4),
        "spearman_prompt_output": round(
            float(np.corrcoef(_ranks(prompt), _ranks(output))[0, 1]), 4
        ),
        "pearson_prompt_output": round(float(np.corrcoef(prompt, output)[0, 1]), 4),
        "text_gbm_tau": TEXT_GBM_TAU,
        "text_gbm_sigma": 0.0,  # filled in below, from the fitted lengths
        "levels": LEVELS,
        "gaps": [round(float(v), 6) for v in _gap_quantiles(gaps)],
        "prompt_tokens": [round(float(v), 2) for v in np.quantile(prompt, LEVELS)],
        "output_tokens": [round(float(v), 2) for v in np.quantile(output, LEVELS)],
    }
    fitted = LengthTable.from_dict(table)
    rng = np.random.default_rng(args.seed)
    _, out_sample = fitted.sample(20_000, rng)
    table["text_gbm_sigma"] = round(sigma_for_tau(_as_requests(out_sample), TEXT_GBM_TAU), 3)
    if not args.dry_run:
        body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in table.items())
        OUT.write_text("{\n" + body + "\n}\n", encoding="utf-8")
        print(f"wrote {OUT.relative_to(OUT.parents[4])} ({len(LEVELS)} levels)")
    default_workload_table = LengthTable.from_dict(table)
    print(
        f"arrivals: {table['arrivals_source']}: {table['arrival_rows']} requests over "
        f"{table['span_s']:.0f} s, mean rate {table['rate']:.3f} req/s ((n-1)/span), gap CV {table['gap_cv']:.2f}"
    )
    print(
        f"lengths: {table['lengths_source']}: {table['length_rows']} requests; prompt/output "
        f"Spearman {table['spearman_prompt_output']:+.3f}, Pearson {table['pearson_prompt_output']:+.3f} "
        "(the default draws them independently)"
    )
    print(
        f"text_gbm_sigma {table['text_gbm_sigma']:.3f}: noisy-oracle tau-b {TEXT_GBM_TAU} on 20000 default lengths"
    )
    samples = {}
    for n in dict.fromkeys((args.n, 2000)):
        rng = np.random.default_rng(args.seed)
        t = default_workload_table.arrival_times(n, default_workload_table.rate, rng)
        p, o = default_workload_table.sample(n, rng)
        samples[n] = (np.diff(t) * default_workload_table.rate, p, o)
        print(
            f"default draw n={n}, seed={args.seed}: mean rate {mean_rate(t):.3f} req/s, "
            f"gap CV {samples[n][0].std() / samples[n][0].mean():.2f}"
        )
    print()
    print("| quantity | source | mean | median | p90 | p99 | max |")
    print("|---|---|---|---|---|---|---|")
    for k, (name, data, fmt) in enumerate((("gap / mean gap", gaps, "{:.3f}"), ("input tokens", prompt, "{:.0f}"),
                                           ("output tokens", output, "{:.0f}"))):  # fmt: skip
        print(f"| {name} | data | " + " | ".join(_stats(data, fmt)) + " |")
        for n, drawn in samples.items():
            print(
                f"| {name} | default n={n} | "
                + " | ".join(_stats(drawn[k].astype(float), fmt))
                + " |"
            )


def _as_requests(output: np.ndarray):
    from presched.workload.request import Request

    return [
        Request(id=str(i), prompt_tokens=1, arrival=0.0, output_tokens=int(o))
        for i, o in enumerate(output)
    ]


if __name__ == "__main__":
    main()
