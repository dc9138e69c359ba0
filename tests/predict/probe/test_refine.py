"""`probe-refine`: remaining length from the state at the g-th generated token (numpy only; the
states here are synthetic with a planted law, since what is tested is the head, its total-length
estimate, its file and its refusals — `encode_steps` is tested on SmolLM2 in test_features.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import kendalltau

from presched.predict import LEVELS, PREDICTORS, LengthEstimate, load_predictor
from presched.predict.probe.refine import GENERATED, design
from presched.workload.request import Request

D = 8


def _steps(n, seed):
    """Rows of a running request at g: its remaining length follows the step state's column 0
    (what the model 'knows' mid-answer); the prompt state carries only a weak prior (column 0 of
    P, which the step state's column 0 does not contain)."""
    rng = np.random.default_rng(seed)
    S, P = rng.normal(size=(n, D)), rng.normal(size=(n, D))
    g = rng.choice([16, 64, 256], size=n).astype(float)
    rem = np.maximum(np.round(np.exp(3.5 + 0.9 * S[:, 0] + 0.2 * P[:, 0] + 0.15 * rng.normal(size=n))), 1)
    return S, P, g, g + rem


@pytest.fixture(scope="module")
def fitted():
    return PREDICTORS.create("probe-refine").fit_steps(*_steps(800, 0), *_steps(2000, 1))


def test_refine_ranks_remaining_lengths_and_its_quantiles_are_calibrated(fitted):
    S, P, g, L = _steps(2000, 2)
    est = fitted.predict_steps(S, P, g)
    rem = L - g
    assert kendalltau(est.mean_remaining(g), rem).statistic > 0.7
    # rank_score is on every predictor's scale, log total = log(g + exp(mu)): it ranks the total
    # length (it was the log remaining, below an unrefined request's log total under stat: rank)
    assert kendalltau(est.rank_score, L).statistic > 0.8
    np.testing.assert_allclose(np.exp(est.rank_score) - g, np.exp(fitted.head.quantiles(
        design(S, P, g))[1]), rtol=1e-9)  # fmt: skip
    cover = (L[:, None] <= est.quantiles).mean(0)
    assert np.abs(cover[:9] - np.array(LEVELS[:9])).max() < 0.05
    # a total-length estimate given L > g: never below g + 1
    assert (est.quantiles >= g[:, None] + 1 - 1e-9).all()


def test_a_remaining_quantile_under_one_token_is_raised_to_g_plus_1():
    # short remaining lengths (a few tokens): the conformal quantiles of L - g fall below 1
    # token at the low levels; the total-length estimate given L > g still starts at g + 1
    def short(n, seed):
        rng = np.random.default_rng(seed)
        S, P = rng.normal(size=(n, 4)), rng.normal(size=(n, 4))
        g = rng.choice([16, 64], size=n).astype(float)
        rem = np.maximum(np.round(np.exp(1.0 + 0.8 * S[:, 0] + 0.3 * rng.normal(size=n))), 1)
        return S, P, g, g + rem

    pred = PREDICTORS.create("probe-refine").fit_steps(*short(400, 0), *short(400, 1))
    S, P, g, _ = short(200, 2)
    q, _ = pred.head.quantiles(design(S, P, g))
    assert (q < 1).any()  # the case at hand: the head's own remaining quantiles under 1 token
    est = pred.predict_steps(S, P, g)
    assert (est.quantiles >= g[:, None] + 1).all()
    np.testing.assert_allclose(est.quantiles, g[:, None] + np.maximum(q, 1.0))


def test_the_estimate_given_l_above_g_puts_no_mass_at_or_below_g(fitted):
    # the distribution starts at g + 1 (L > g), so what SRPT / MLFQ / quantile stats read off it,
    # L - g | L > g, is the head's remaining-length distribution and calibrated as it is (with
    # the CDF from 1 token, ~10 % of the mass sat at L <= g: mean_remaining inflated 2-5 %,
    # quantile_remaining(g, 0.1) covering ~15 %)
    S, P, g, L = _steps(2000, 2)
    est = fitted.predict_steps(S, P, g)
    rem = L - g
    np.testing.assert_array_equal(est.lower, g + 1)
    assert (est.survival(g) == 1.0).all()
    for p in (0.1, 0.2, 0.5, 0.9):
        qr = np.array([est[i].quantile_remaining(g[i], p) for i in range(len(g))])
        np.testing.assert_allclose(qr, np.maximum(est.quantile(p) - g, 1.0), rtol=1e-9)
        assert np.mean(rem <= qr) == pytest.approx(p, abs=0.03)
    own = LengthEstimate.from_quantiles(est.quantiles - g[:, None]).mean_remaining(0.0)
    np.testing.assert_allclose(est.mean_remaining(g), own, rtol=1e-9)


def test_the_step_state_is_what_it_reads():
    # the same rows with the step state shuffled across requests: the ranking is lost
    S, P, g, L = _steps(800, 0)
    cal = _steps(2000, 1)
    perm = np.random.default_rng(9).permutation(len(S))
    shuffled = PREDICTORS.create("probe-refine").fit_steps(S[perm], P, g, L, *cal)
    St, Pt, gt, Lt = _steps(2000, 2)
    assert kendalltau(shuffled.predict_steps(St, Pt, gt).mean_remaining(gt), Lt - gt).statistic < 0.3


def test_one_spread_for_every_row_by_default_so_the_mean_ranks_as_mu(fitted):
    # spread 'constant': the remaining quantiles are exp(mu) times one factor per level, so at
    # each g E[L - g | L > g] orders rows exactly as mu (rank_score) does; 'adaptive' (a ridge on
    # the in-sample residual) gives each row its own spread, which on the engine's real records
    # made the mean rank at tau ~0 (docs/predictors/probe.md)
    S, P, g, L = _steps(2000, 2)
    est = fitted.predict_steps(S, P, g)
    ratio = (est.quantiles - g[:, None]) / (np.exp(est.rank_score) - g)[:, None]
    assert np.allclose(ratio, ratio[0], rtol=1e-6)
    for at in (16, 64, 256):
        m = g == at
        assert kendalltau(est.mean_remaining(g)[m], est.rank_score[m]).statistic == pytest.approx(1.0)

    def noisy(seed):  # log-noise whose size grows with S_1
        S, P, g, L = _steps(2000, seed)
        sd = np.clip(0.8 + 0.5 * S[:, 1], 0.1, None)
        return S, P, g, g + np.ceil((L - g) * np.exp(sd * np.random.default_rng(seed).normal(size=len(L))))

    adaptive = PREDICTORS.create("probe-refine", spread="adaptive").fit_steps(*noisy(3), *noisy(4))
    S, P, g, _ = noisy(5)
    q = adaptive.predict_steps(S, P, g).quantiles - g[:, None]
    spread = np.log(q[:, 8] / q[:, 4])  # log(q90 / q50) of the remaining length, per row
    assert spread.std() > 0.05 and np.corrcoef(spread, S[:, 1])[0, 1] > 0.5


def test_requests_round_trip_and_file_round_trip(fitted, tmp_path):
    S, P, g, L = _steps(30, 3)
    step, prompt = fitted.specs(D)
    reqs = [Request(id=str(i), prompt_tokens=9, output_tokens=int(L[i]),
                    metadata={step.key(): S[i], prompt.key(): P[i], GENERATED: int(g[i])}) for i in range(30)]
    direct = fitted.predict_steps(S, P, g)
    np.testing.assert_allclose(fitted.predict(reqs).quantiles, direct.quantiles)
    back = load_predictor(fitted.save(tmp_path / "refine.npz"))
    assert type(back).__name__ == "ProbeRefine"
    np.testing.assert_array_equal(back.predict_steps(S, P, g).quantiles, direct.quantiles)
    # fit from requests: the same as from arrays
    cal = _steps(200, 4)
    cal_reqs = [Request(id=f"c{i}", prompt_tokens=9, output_tokens=int(cal[3][i]),
                        metadata={step.key(): cal[0][i], prompt.key(): cal[1][i], GENERATED: int(cal[2][i])})
                for i in range(200)]  # fmt: skip
    a = PREDICTORS.create("probe-refine").fit(reqs, validation=cal_reqs)
    b = PREDICTORS.create("probe-refine").fit_steps(S, P, g, L, *cal)
    np.testing.assert_allclose(a.predict_steps(S, P, g).quantiles, b.predict_steps(S, P, g).quantiles)


def test_bad_input_is_refused_naming_what_is_wrong(fitted):
    S, P, g, L = _steps(20, 5)
    new = PREDICTORS.create("probe-refine")
    with pytest.raises(ValueError, match="still be running"):
        new.fit_steps(S, P, g, g, S, P, g, L)  # L == g: finished, no remaining length
    with pytest.raises(ValueError, match="generated"):
        fitted.predict_steps(S, P, np.zeros(20))
    with pytest.raises(ValueError, match="width"):
        fitted.predict_steps(S[:, :4], P[:, :4], g)
    S2 = S.copy()
    S2[0, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        fitted.predict_steps(S2, P, g)
    with pytest.raises(ValueError, match="metadata has no"):
        fitted.predict([Request(id="x", prompt_tokens=3)])
    step, prompt = fitted.specs(D)  # records-style {g: state} where a vector belongs: named
    odd = [Request(id=f"r{i}", prompt_tokens=3, metadata={step.key(): S[i], prompt.key(): P[i], GENERATED: 5})
           for i in range(2)]  # fmt: skip
    odd[1].metadata[step.key()] = {16: S[1]}
    with pytest.raises(ValueError, match="request 'r1'.*vector of numbers"):
        fitted.predict(odd)
    for name in ("probe-refine", "probe"):
        with pytest.raises(ValueError, match="'spread' must be one of"):
            PREDICTORS.create(name, spread="wide")
    with pytest.raises(ValueError, match="validation"):
        new.fit([Request(id="x", prompt_tokens=3)])


def _log_requests(n, seed, prefix, at=(4, 16, 64)):
    """Requests as `load_log_requests` makes them from the engine's records: {g: step state}
    under the step key for each g of `at` the request's answer reached (g < L, as the engine
    records) plus a few states at g >= L (which `fit` must drop), the pooled prompt state under
    the mean key; the remaining length follows each step state's column 0, so a state given to
    the wrong g or request is noise."""
    rng = np.random.default_rng(seed)
    step, prompt = PREDICTORS.create("probe-refine").specs(D)
    out = []
    for i in range(n):
        L = int(rng.integers(2, 120))
        states = {}
        for g in at:
            s = rng.normal(size=D)
            s[0] = np.log(max(L - g, 1)) - 2.5 + 0.05 * rng.normal()
            states[g] = s
        states[L] = rng.normal(size=D)  # at g == L: the request was finished, never recorded
        out.append(Request(id=f"{prefix}{i}", prompt_tokens=9, output_tokens=L,
                           metadata={step.key(): states, prompt.key(): rng.normal(size=D)}))  # fmt: skip
    return out


def _expand(reqs):
    """The rows `fit` must make of log requests: one per g < L, in request order, g ascending."""
    step, prompt = PREDICTORS.create("probe-refine").specs(D)
    rows = [(r.metadata[step.key()][g], r.metadata[prompt.key()], g, r.output_tokens)
            for r in reqs if step.key() in r.metadata and prompt.key() in r.metadata
            for g in sorted(r.metadata[step.key()]) if g < r.output_tokens]  # fmt: skip
    S, P, g, L = zip(*rows)
    return np.stack(S), np.stack(P), np.array(g, dtype=float), np.array(L, dtype=float)


def test_fit_from_log_requests_is_fit_steps_on_their_rows():
    reqs, val = _log_requests(150, 20, "q"), _log_requests(200, 21, "c")
    step, prompt = PREDICTORS.create("probe-refine").specs(D)
    # without step states (a request shorter than every record_steps g) or without a prompt
    # state: skipped
    reqs.append(Request(id="short", prompt_tokens=9, output_tokens=3, metadata={prompt.key(): np.ones(D)}))
    reqs.append(Request(id="noprompt", prompt_tokens=9, output_tokens=90,
                        metadata={step.key(): {4: np.ones(D)}}))  # fmt: skip
    a = PREDICTORS.create("probe-refine").fit(reqs, validation=val)
    rows, cal = _expand(reqs), _expand(val)
    assert len(rows[0]) < 3 * 150  # the planted g >= L rows are gone (from fit too: see below)
    b = PREDICTORS.create("probe-refine").fit_steps(*rows, *cal)
    St, Pt, gt, Lt = _expand(_log_requests(300, 22, "t"))
    got, want = a.predict_steps(St, Pt, gt), b.predict_steps(St, Pt, gt)
    np.testing.assert_allclose(got.quantiles, want.quantiles, rtol=1e-12)
    # and it learnt from the right state of the right request at the right g
    assert kendalltau(got.mean_remaining(gt), Lt - gt).statistic > 0.7


def test_fit_from_log_requests_refuses_other_states_and_no_rows():
    reqs, val = _log_requests(30, 23, "q"), _log_requests(30, 24, "c")
    for k, v, have in (("layer", 14, 15), ("model", "other-model", "smollm2-135m"), ("sink", 0, 1)):
        with pytest.raises(ValueError, match=rf"^{k}: request 'q0' has step states of {have!r}, the params say {v!r}"):
            PREDICTORS.create("probe-refine", **{k: v}).fit(reqs, validation=val)
    none = [Request(id=r.id, prompt_tokens=9, output_tokens=r.output_tokens) for r in reqs]
    with pytest.raises(ValueError, match="^requests: no request has a step state"):
        PREDICTORS.create("probe-refine").fit(none, validation=val)
    with pytest.raises(ValueError, match="^validation: no request has a step state"):
        PREDICTORS.create("probe-refine").fit(reqs, validation=none)
    wide = _log_requests(30, 25, "w")
    step, _ = PREDICTORS.create("probe-refine").specs(D)
    for r in wide[:3]:  # one request's step states of another width
        r.metadata[step.key()] = {g: np.ones(D + 1) for g in r.metadata[step.key()]}
    with pytest.raises(ValueError, match=r"^features: requests mix states of widths"):
        PREDICTORS.create("probe-refine").fit(wide, validation=val)
