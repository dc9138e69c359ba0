"""How well can *anything that knows only the prompt* rank SmolLM2's sampled answer lengths?
The reference that issue 15's probe figures need (`probe_step0_tau`, `probe_refine<g>_tau`).

    python benchmarks/probe_ceiling.py            # seconds; reads the committed 4-sample dataset

Reads the natural-length dataset `scripts/smollm2_lengths.py` writes (default
`benchmarks/results/smollm2_lengths.jsonl`: SmolLM2-135M-Instruct, 4 sampled answers per
CASTILLO prompt, temperature 0.7, top_p 0.9, cap 512). Answers cut at the cap count at the cap
(ties), as `benchmarks/probes_records.py` scores them. At step 0 every answer counts; after g
generated tokens, the answers still running (L > g), each ranked by its remaining length L - g.

Two references, on the prompts of `--split` (default test):

- **Leave-one-out oracle** (`loo_oracle`): answer k of a prompt is predicted by the mean of the
  remaining lengths of the prompt's *other* answers still running at g (an answer without such a
  sibling is left out). It knows the prompt's length distribution from up to 3 independent draws
  of it, which no predictor trained on other prompts can know better than with an infinite
  number: so it is close to (a little below) the best a prompt-level predictor can do.
- **Prompt-level ceiling** (`prompt_ceiling`): the tau-b of the *exact* per-prompt mean against one
  answer, extrapolated from the within-prompt agreement. If answers are a prompt effect plus
  independent noise under a Gaussian copula, two answers of one prompt have Kendall tau
  tau_pair = (2/pi) asin(rho) with rho the share of variance the prompt explains, and the prompt
  effect itself ranks one answer at (2/pi) asin(sqrt(rho)). tau_pair is pooled over every
  ordered pair of a prompt's answers still running at g. A model, not a measurement: it is
  checked on simulated prompts with a known rho (tests/benchmarks/test_probe_ceiling_script.py),
  and on the data by the tau-b it predicts for the leave-one-out oracle (`model_oracle_tau`,
  from the mean number of siblings) beside the one measured.

What a per-step predictor such as `probe-refine` reads (the served model's state after g tokens)
is more than the prompt: it sees where *this* answer has gone, so it can in principle beat these
references. If it cannot, the goal of 0.70 needs that state to explain most of the sampling
noise of the rest of the answer.

`--cap N` scores the lengths as a run with `max_tokens` N would have cut them (to compare with
records made at that cap). Writes benchmarks/results/probe_ceiling.json and .png
(`probe_ceiling-capN.*` with `--cap`; with the measured probe-refine / prior
points of benchmarks/results/probes_records.json beside, when that file exists); ends with
`figure:` lines `prompt_oracle_step0_tau`, `prompt_ceiling_step0_tau`,
`prompt_ceiling_step0_mean_tau` (against the mean of a prompt's answers, `mean_ceiling`),
`prompt_oracle_refine<g>_tau`, `prompt_ceiling_refine<g>_tau`, `prompt_oracle_refine<g>_answers`,
`ceiling_prompts`.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from presched.predict.metrics import kendall_tau_b

RESULTS = Path(__file__).resolve().parent / "results"
STEPS = (16, 64, 256)
SPLITS = ("train", "validate", "test", "all")


def load_lengths(path: Path, split: str = "test", cap: int | None = None) -> tuple[list[list[int]], int]:
    """(per prompt of `split`, its sampled lengths; the cap): rows of the dataset file, whose
    first line is its config, cut at `cap` (default the file's `max_tokens`; a lower cap gives
    exactly the lengths a run with that `max_tokens` would have had, since sampling is the same
    up to it). A missing file, a row without lengths or a cap above the file's is refused by name."""
    if split not in SPLITS:
        raise SystemExit(f"--split: expected one of {', '.join(SPLITS)}, got {split!r}")
    if not path.is_file():
        raise SystemExit(f"--lengths: no such file {path} (scripts/smollm2_lengths.py writes it)")
    lines = [json.loads(s) for s in path.read_text().splitlines() if s.strip()]
    if not lines or "config" not in lines[0]:
        raise SystemExit(f"--lengths: {path} does not start with a config line")
    made = int(lines[0]["config"]["max_tokens"])
    if cap is not None and not 1 <= cap <= made:
        raise SystemExit(f"--cap: expected 1..{made} (the file's max_tokens), got {cap}")
    cap = made if cap is None else cap
    out = []
    for n, row in enumerate(lines[1:], start=2):
        ls = row.get("lengths")
        if not isinstance(ls, list) or not ls or not all(isinstance(v, int) and v >= 1 for v in ls):
            raise SystemExit(f"--lengths: line {n}: field 'lengths' must be a list of integers >= 1")
        if split == "all" or row.get("split") == split:
            out.append([min(v, cap) for v in ls])
    return out, cap


def _running(lengths: list[list[int]], g: int) -> list[list[int]]:
    """Per prompt, the remaining lengths L - g of its answers still running at g (L > g)."""
    return [[v - g for v in ls if v > g] for ls in lengths]


def loo_oracle(lengths: list[list[int]], g: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(prediction, target) per answer still running at g (L > g; at g = 0 every answer): the
    target its remaining length L - g, the prediction the mean remaining length of its prompt's
    other answers still running at g. Answers without such a sibling are left out."""
    pred, target = [], []
    for run in _running(lengths, g):
        if len(run) < 2:
            continue
        total = sum(run)
        for v in run:
            pred.append((total - v) / (len(run) - 1))
            target.append(v)
    return np.asarray(pred, dtype=float), np.asarray(target, dtype=float)


def pair_tau(lengths: list[list[int]], g: int = 0) -> float:
    """Kendall tau-b between two answers of one prompt, pooled over every ordered pair (j, k),
    j != k, of each prompt's answers still running at g (remaining lengths)."""
    a, b = [], []
    for run in _running(lengths, g):
        for j, x in enumerate(run):
            for k, y in enumerate(run):
                if j != k:
                    a.append(x)
                    b.append(y)
    return kendall_tau_b(np.asarray(a, float), np.asarray(b, float)) if len(a) >= 4 else math.nan


def prompt_ceiling(lengths: list[list[int]], g: int = 0) -> tuple[float, float]:
    """(rho, the exact prompt mean's tau-b against one answer) under the Gaussian copula model
    of the module doc; rho is clipped at 0 (a negative within-prompt agreement: no prompt
    effect)."""
    return ceiling_of(pair_tau(lengths, g))


def ceiling_of(pair: float) -> tuple[float, float]:
    """`prompt_ceiling` from the pooled pair tau-b `pair_tau` (nan for nan)."""
    if not math.isfinite(pair):
        return math.nan, math.nan
    rho = max(math.sin(math.pi * pair / 2), 0.0)
    return rho, 2 / math.pi * math.asin(math.sqrt(rho))


def _mean_share(rho: float, k: float) -> float:
    """The share of the variance of the mean of k answers that the prompt explains."""
    return k * rho / (1 + (k - 1) * rho)


def model_loo_tau(rho: float, siblings: float) -> float:
    """The tau-b the copula model predicts for the mean of `siblings` other answers against one
    answer: corr = sqrt(rho) * sqrt(k rho / (1 + (k - 1) rho)) (the mean of k noisy draws
    keeps that share of the prompt effect's correlation), tau = (2/pi) asin(corr). Beside the
    measured leave-one-out oracle, it checks the model on the data."""
    if not (math.isfinite(rho) and siblings >= 1) or rho <= 0:
        return math.nan
    return 2 / math.pi * math.asin(math.sqrt(rho) * math.sqrt(_mean_share(rho, siblings)))


def mean_ceiling(rho: float, k: int) -> float:
    """The exact prompt effect's tau-b against the *mean* of k answers of each prompt (the target
    `benchmarks/probes.py` scores step 0 against, k = 4): the mean keeps k rho / (1 + (k - 1) rho)
    of the variance for the prompt, so corr = sqrt(that) and tau = (2/pi) asin(corr)."""
    if not (math.isfinite(rho) and k >= 1) or rho <= 0:
        return math.nan
    return 2 / math.pi * math.asin(math.sqrt(_mean_share(rho, k)))


def evaluate(lengths: list[list[int]], steps=STEPS) -> dict:
    k = min(len(ls) for ls in lengths)
    out: dict = {"prompts": len(lengths), "samples": k, "steps": {}}
    for g in (0, *steps):
        pred, target = loo_oracle(lengths, g)
        pair = pair_tau(lengths, g)
        rho, ceiling = ceiling_of(pair)
        running = [n for run in _running(lengths, g) if (n := len(run)) >= 2]
        siblings = float(np.average(np.asarray(running) - 1, weights=running)) if running else math.nan
        out["steps"][g] = {"answers": int(target.size), "siblings": siblings,
                           "oracle_tau": kendall_tau_b(pred, target) if target.size >= 4 else math.nan,
                           "model_oracle_tau": model_loo_tau(rho, siblings),
                           "pair_tau": pair, "rho": rho, "ceiling_tau": ceiling}  # fmt: skip
    out["ceiling_step0_mean_tau"] = mean_ceiling(out["steps"][0]["rho"], k)
    return out


def figures_of(res: dict) -> dict[str, float]:
    s = res["steps"]
    f = {"prompt_oracle_step0_tau": s[0]["oracle_tau"], "prompt_ceiling_step0_tau": s[0]["ceiling_tau"],
         "prompt_ceiling_step0_mean_tau": res["ceiling_step0_mean_tau"]}
    for g, row in s.items():
        if g:
            f[f"prompt_oracle_refine{g}_tau"] = row["oracle_tau"]
            f[f"prompt_ceiling_refine{g}_tau"] = row["ceiling_tau"]
            f[f"prompt_oracle_refine{g}_answers"] = row["answers"]
    f["ceiling_prompts"] = res["prompts"]
    return f


def measured_points(records_json: Path) -> dict[str, dict[int, float]]:
    """probe-refine's and the step-0 probe's measured tau-b per step from a probes_records.json
    (empty when the file is absent). Those are other samples of the same prompts (one answer
    per prompt, the same sampling config): comparable, not paired."""
    if not records_json.is_file():
        return {}
    res = json.loads(records_json.read_text())
    steps = {int(g): row for g, row in res.get("steps", {}).items()}
    pts = {"probe-refine (records)": {g: row["refine_tau"] for g, row in steps.items()},
           "step-0 probe's E[L-g | L>g] (records)": {g: row["probe_prior_tau"] for g, row in steps.items()}}
    probe0 = res.get("step0", {}).get("probe", {}).get("tau")
    if probe0 is not None:
        pts["step-0 probe, rank score (records)"] = {0: probe0}
    return pts


def plot(res: dict, measured: dict[str, dict[int, float]], path: Path) -> None:
    from presched.plotting import pyplot, save

    fig, ax = pyplot().subplots(figsize=(6.4, 4))
    gs = sorted(res["steps"])
    ax.plot(gs, [res["steps"][g]["ceiling_tau"] for g in gs], "o-", label="prompt-level ceiling (Gaussian copula)")
    ax.plot(gs, [res["steps"][g]["oracle_tau"] for g in gs], "s-", label="leave-one-out oracle (other answers)")
    for name, pts in measured.items():
        ks = sorted(pts)
        ax.plot(ks, [pts[k] for k in ks], "x--", label=name)
    ax.axhline(0.70, color="0.4", ls=":", lw=1, label="issue 15 goal (refine, g=64)")
    ax.set_xscale("symlog", linthresh=16)
    ax.set_xticks(gs, [str(g) for g in gs])
    ax.set_xlabel("generated tokens g")
    ax.set_ylabel("Kendall tau-b of the remaining length")
    ax.set_ylim(0, 1)
    ax.set_title(f"what the prompt alone can rank: SmolLM2, {res['prompts']} prompts x 4 answers, cap {res['cap']}",
                 fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=Path, default=RESULTS / "smollm2_lengths.jsonl",
                    help="the 4-sample natural-length dataset (scripts/smollm2_lengths.py)")
    ap.add_argument("--split", default="test", help="prompts scored: train, validate, test or all")
    ap.add_argument("--cap", type=int, default=None,
                    help="score as if answers were cut at this max_tokens (<= the file's; default the file's)")
    ap.add_argument("--records-json", type=Path, default=RESULTS / "probes_records.json",
                    help="measured probe-refine points to plot beside (benchmarks/probes_records.py)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    lengths, cap = load_lengths(a.lengths, a.split, a.cap)
    if len(lengths) < 2:
        raise SystemExit(f"--lengths: {a.lengths} has {len(lengths)} prompts in split {a.split!r}; need >= 2")
    res = {"lengths": str(a.lengths), "split": a.split, "cap": cap, **evaluate(lengths)}
    res["figures"] = figures_of(res)
    res["measured"] = measured_points(a.records_json)
    a.out.mkdir(parents=True, exist_ok=True)
    name = "probe_ceiling" if a.cap is None else f"probe_ceiling-cap{cap}"
    (a.out / f"{name}.json").write_text(json.dumps(res, indent=1, default=float))
    plot(res, res["measured"], a.out / f"{name}.png")
    print(f"{'g':>4} {'answers':>8} {'LOO oracle':>11} {'(model)':>8} {'pair tau':>9} {'rho':>6} {'ceiling':>8}")
    for g, row in res["steps"].items():
        print(f"{g:>4} {row['answers']:>8} {row['oracle_tau']:>11.3f} {row['model_oracle_tau']:>8.3f} "
              f"{row['pair_tau']:>9.3f} {row['rho']:>6.3f} {row['ceiling_tau']:>8.3f}")  # fmt: skip
    print(f"wrote {a.out / name}.json, .png")
    for k, v in res["figures"].items():
        print(f"figure: {k} = {v:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
