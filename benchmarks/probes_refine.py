"""benchmarks/probes.py's `probe-refine` part: the remaining length of answers still running after
g = 16 / 64 / 256 generated tokens, from the model's state at the g-th answer token.

Needs the answers' token ids (`scripts/smollm2_lengths.py --ids-out`, default
<engine cache>/smollm2_answers.jsonl; prompts generated without it have no rows here). Each
answer of a train prompt gives a fitting row per g it outlived, each of a validate prompt a
calibration row; test answers are scored per g, beside the step-0 predictors' own conditional
estimate E[L - g | L > g] for the same rows (the prior that refinement must beat). States are
computed with the transformers reference (`PromptFeaturizer.encode_steps`, one forward per
answer) and cached by prompt id and sample.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from presched.predict.estimate import LEVELS
from presched.predict.metrics import kendall_tau_b, max_coverage_error_pts
from presched.predict.probe import ProbeRefine

STEPS = (16, 64, 256)


def load_answers(path: Path, rows: list[dict]) -> dict[str, list[list[int]]]:
    """prompt_id -> the answers' token ids, for the dataset's prompts whose ids were kept."""
    if not path.exists():
        return {}
    want = {r["prompt_id"]: len(r["lengths"]) for r in rows}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            a = json.loads(line)
            if want.get(a["prompt_id"]) == len(a["answers"]):
                out[a["prompt_id"]] = a["answers"]
    return out


def step_states(rows: list[dict], answers: dict, cache: Path, layer: int, model: str) -> dict[str, np.ndarray]:
    """"prompt_id/sample" -> (len(STEPS), d) states (NaN where the answer had stopped)."""
    have: dict[str, np.ndarray] = {}
    if cache.exists():
        z = np.load(cache, allow_pickle=False)
        if int(z["layer"]) == layer and tuple(z["steps"]) == STEPS:
            have = dict(zip(z["keys"], z["states"]))
    todo = [(r, j) for r in rows if r["prompt_id"] in answers for j in range(len(r["lengths"]))
            if f"{r['prompt_id']}/{j}" not in have]  # fmt: skip
    if todo:
        from rich.progress import Progress

        from presched.engine import models
        from presched.predict.probe.features import PromptFeaturizer

        fz = PromptFeaturizer(models.resolve_model("smollm2"), layer=layer, threads=os.cpu_count() or 1,
                              batch=8, model_name=model)  # fmt: skip
        ids = {r["prompt_id"]: fz.token_ids([r["prompt"]])[0] for r, _ in todo}
        with Progress() as bar:
            task = bar.add_task("answer states", total=len(todo))
            for i in range(0, len(todo), 32):
                chunk = todo[i : i + 32]
                pairs = [(ids[r["prompt_id"]], answers[r["prompt_id"]][j]) for r, j in chunk]
                out = fz.encode_steps(pairs, STEPS)
                for k, (r, j) in enumerate(chunk):
                    have[f"{r['prompt_id']}/{j}"] = out[k]
                bar.advance(task, len(chunk))
        keys = sorted(have)
        np.savez(cache, layer=layer, steps=np.array(STEPS), keys=np.array(keys),
                 states=np.stack([have[k] for k in keys]))  # fmt: skip
    return have


def _rows(rows, split, states, prompt_feats, answers):
    """Arrays (S, P, g, L, prompt_id) of the split's answers at every step they outlived."""
    S, P, g, L, pid = [], [], [], [], []
    for r in rows:
        if r["split"] != split or r["prompt_id"] not in answers:
            continue
        for j, n in enumerate(r["lengths"]):
            for k, step in enumerate(STEPS):
                if n > step:
                    S.append(states[f"{r['prompt_id']}/{j}"][k])
                    P.append(prompt_feats[r["prompt_id"]]["mean"])
                    g.append(step)
                    L.append(n)
                    pid.append(r["prompt_id"])
    if not S:
        return None
    return np.stack(S), np.stack(P), np.array(g, float), np.array(L, float), np.array(pid)


def evaluate(rows, prompt_feats, step0: dict, test_reqs, answers_path: Path, cache: Path, layer: int,
             model: str) -> dict | None:  # fmt: skip
    """Refinement results per step, or None when no answer ids exist. `step0`: fitted step-0
    predictors whose conditional estimates are the baselines."""
    answers = load_answers(answers_path, rows)
    if not answers:
        print(f"probe-refine: no answer token ids in {answers_path} (run scripts/smollm2_lengths.py --ids-out); skipped")
        return None
    states = step_states(rows, answers, cache, layer, model)
    fit, cal, test = (_rows(rows, s, states, prompt_feats, answers) for s in ("train", "validate", "test"))
    if fit is None or cal is None or test is None:
        print("probe-refine: answers with ids are missing from a split; skipped")
        return None
    refine = ProbeRefine(layer=layer).fit_steps(*fit[:4], *cal[:4])
    S, P, g, L, pid = test
    est = refine.predict_steps(S, P, g)
    mean_rem = est.mean_remaining(g)
    index = {r.id: i for i, r in enumerate(test_reqs)}
    prior = {n: p.predict(test_reqs) for n, p in step0.items()}
    out = {"prompts_with_ids": len(answers), "fit_rows": len(fit[0]), "calibration_rows": len(cal[0]), "steps": {}}
    for step in STEPS:
        m = g == step
        if m.sum() < 5:
            continue
        rem = L[m] - step
        res = {"test_answers": int(m.sum()), "test_prompts": int(len(set(pid[m]))),
               "refine_tau": kendall_tau_b(mean_rem[m], rem),
               "refine_coverage_err_pts": max_coverage_error_pts((L[m, None] <= est.quantiles[m]).mean(0)),
               "refine_mae": float(np.abs(mean_rem[m] - rem).mean())}  # fmt: skip
        rows_i = np.array([index[p] for p in pid[m]])
        for n, e in prior.items():
            cond = e.mean_remaining(np.full(len(e), float(step)))[rows_i]
            res[f"{n}_prior_tau"] = kendall_tau_b(cond, rem)
        out["steps"][step] = res
        print(f"probe-refine after {step:3d} tokens: tau-b {res['refine_tau']:.3f} on {res['test_answers']} "
              f"answers still running ({res['test_prompts']} prompts); step-0 priors "
              + ", ".join(f"{n} {res[f'{n}_prior_tau']:.3f}" for n in prior))  # fmt: skip
    out["levels"] = list(LEVELS)
    return out
