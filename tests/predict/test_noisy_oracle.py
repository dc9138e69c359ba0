"""The label-reading oracles of the policy benchmark: `noisy_oracle` (true length, controlled
error) and `prompt_oracle` (the prompt's other observed generations)."""

from __future__ import annotations

import numpy as np
import pytest

from presched.predict.estimate import LEVELS
from presched.predict.noisy_oracle import noisy_oracle, prompt_oracle
from presched.workload.request import Request


def _req(i, out, samples):
    return Request(id=f"r{i}", prompt_tokens=10, arrival=0.0, output_tokens=out, output_samples=samples)


def test_noisy_oracle_at_zero_sigma_is_the_true_length():
    reqs = [_req(i, n, (n,)) for i, n in enumerate([5, 50, 500])]
    est = noisy_oracle(reqs, 0.0)
    assert est.point.tolist() == [5, 50, 500] and (est.quantiles == est.point[:, None]).all()
    with pytest.raises(ValueError, match="sigma"):
        noisy_oracle(reqs, -1)


def test_prompt_oracle_leaves_the_served_sample_out_once():
    # served 100 is one of the samples: the estimate must come from the other four only, and a
    # repeated value (100 twice) loses only one copy
    r = _req(0, 100, (100, 100, 10, 20, 30))
    est = prompt_oracle([r])
    assert est.point[0] == pytest.approx(np.mean([100, 10, 20, 30]))
    assert est.quantiles[0].tolist() == pytest.approx(np.quantile([100, 10, 20, 30], LEVELS).tolist())
    # quantiles are monotone and within the samples' range
    assert np.all(np.diff(est.quantiles[0]) >= 0) and est.quantiles[0, -1] <= 100


def test_prompt_oracle_is_calibrated_on_exchangeable_samples():
    # 2,000 prompts, each with 10 draws from its own log-normal: the served draw is as likely as
    # any other, so it falls below the estimate's q50 about half the time (9 others: ~0.5 +- 0.03)
    rng = np.random.default_rng(0)
    reqs = []
    for i in range(2000):
        s = np.maximum(rng.lognormal(rng.uniform(3, 7), 0.6, 10).astype(int), 1)
        reqs.append(_req(i, int(s[0]), tuple(int(x) for x in s)))
    est = prompt_oracle(reqs)
    y = np.array([r.output_tokens for r in reqs])
    below_median = np.mean(y <= est.quantiles[:, LEVELS.index(0.5)])
    assert 0.45 < below_median < 0.55


def test_prompt_oracle_needs_another_sample_and_names_the_field():
    with pytest.raises(ValueError, match="r0.*output_samples"):
        prompt_oracle([_req(0, 100, (100,))])
    with pytest.raises(ValueError, match="output_samples"):
        prompt_oracle([_req(0, 100, None)])
