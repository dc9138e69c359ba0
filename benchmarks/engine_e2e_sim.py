"""benchmarks/engine_e2e.py's simulator side: the engine as a SimConfig, one simulation per policy,
and the per-run simulation with the step-time model's speed fitted to what the engine measured."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from engine_e2e_configs import BLOCK_SIZE, CONFIGS, KEYS, SIM_POLICIES
from presched.engine.calibrate import Calibration
from presched.metrics.summary import summarize
from presched.sim.config import EngineConfig
from presched.sim.setup import SimConfig, simulate


# --- the simulator -----------------------------------------------------------------------------
def sim_config(args, coefficients: dict[str, float], blocks: int | None, policy: str) -> SimConfig:
    """The engine as the simulator sees it: its scheduler knobs and a fitted step-time model."""
    eng = EngineConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                       block_size=BLOCK_SIZE, num_blocks=blocks or 4096)  # fmt: skip
    name, params = SIM_POLICIES.get(policy, (policy, {}))
    return SimConfig(engine=eng, policy=name, policy_params=params,
                     step_time={"kind": "fitted", "coefficients": coefficients})


def sim_one(args, reqs, estimates, coefficients, blocks, policy: str) -> dict[str, Any]:
    """The simulator's figures for one policy, and its decode seconds per token (first token to
    last, summed over requests / tokens after the first: vLLM's request_decode_time definition)."""
    res = simulate(reqs, sim_config(args, coefficients, blocks, policy), estimates=estimates)
    s = summarize(res.records, res.itl.values())
    rec = res.records
    out = {k: s.get(k) for k in KEYS if k in s}
    out["decode_s_per_token"] = float((rec.finish - rec.first_token).sum() / max(1, (rec.output_tokens - 1).sum()))
    out["output_tokens"] = int(rec.output_tokens.sum())
    return out


def simulate_all(args, reqs, estimates, cal: Calibration, blocks) -> dict[str, dict[str, Any]]:
    """The simulator with `cal`'s fitted model on `reqs`: fcfs, sjf and the policy of every
    configuration run (sjf-oracle, aging)."""
    coef = cal.model.coefficients.model_dump()
    policies = sorted({"fcfs", "sjf"} | {CONFIGS[c][1] for c in args.configs})
    return {p: sim_one(args, reqs, estimates, coef, blocks, p) for p in policies}


def simulate_runs(args, reqs, estimates, runs, cals, blocks) -> None:
    """Per run, the simulator on the arrivals the engine got (the replay's actual send times; the
    generator can be late, see send lag):

    - `sim_a_priori`: the repeat's calibrated model as it is;
    - `sim` (the headline): that model with every coefficient scaled by `speed_factor`, chosen
      so the simulated decode seconds per token equal the engine's in this run (module doc);
    - `sim_slower`: `sim` with 5 % slower steps, for the sensitivity of mean E2E to speed."""
    for r in runs:
        policy = CONFIGS[r["config"]][1]
        sent = r["sent_s"]
        here = [dataclasses.replace(q, arrival=sent[q.id]) if q.id in sent else q for q in reqs]
        coef = cals[r["repeat"]].model.coefficients.model_dump()
        at = (args, here, estimates, coef, blocks, policy)
        r["sim_a_priori"] = _scaled_sim(*at, 1.0)
        r["sim"] = fit_speed(lambda f: _scaled_sim(*at, f), r["engine_decode_s_per_token"], r["sim_a_priori"])
        r["speed_factor"] = f = r["sim"]["factor"]
        r["sim_slower"] = _scaled_sim(*at, 1.05 * f)


def fit_speed(simulate, target: float, first: dict[str, Any], tol: float = 0.005, tries: int = 12) -> dict[str, Any]:
    """The simulation (of `simulate(factor)`, `first` = factor 1) whose decode seconds per token
    is nearest `target`. Scaling every step by f scales that figure by about f, but not exactly:
    slower steps also batch more tokens per step, and with few requests the figure jumps as
    batches regroup. So: fixed-point steps f *= target / got, kept inside a bracket of factors
    known to be too fast / too slow (bisected when a step leaves it), stopping within `tol`;
    the best simulation seen is returned."""
    lo, hi, sim, best = 0.0, math.inf, first, first

    def miss(s):
        return s["decode_s_per_token"] / target - 1

    for _ in range(tries):
        f, e = sim["factor"], miss(sim)
        if abs(e) < abs(miss(best)):
            best = sim
        if abs(e) < tol:
            break
        lo, hi = (max(lo, f), hi) if e < 0 else (lo, min(hi, f))
        step = f / (1 + e)
        if not lo < step < hi:
            step = math.sqrt(lo * hi) if lo > 0 and hi < math.inf else (2 * f if e < 0 else f / 2)
        sim = simulate(step)
    return best if abs(miss(best)) <= abs(miss(sim)) else sim


def _scaled_sim(args, reqs, estimates, coef, blocks, policy, factor: float) -> dict[str, Any]:
    out = sim_one(args, reqs, estimates, {k: v * factor for k, v in coef.items()}, blocks, policy)
    return dict(out, factor=factor)
