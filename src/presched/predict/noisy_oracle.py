"""`noisy_oracle`: predictions made from the TRUE lengths with a controlled error, to map
predictor accuracy to scheduling gain (the noise sweep). Not a predictor: it reads labels.

For each request with true length L and a standard normal draw Z (seeded):

    point  = L * exp(sigma * Z)                       (the median guess, log-normal error)
    q_p    = point * exp(sigma * z_p),  z_p = Phi^-1(p)   for every level p in LEVELS

so sigma = 0 gives the true length at every quantile, and for sigma > 0 the quantiles are
calibrated when log L is a priori flat (L given the guess is log-normal around it).

`prompt_oracle`: the request's own length distribution from the OTHER generations observed for
its prompt (CASTILLO has 10 per prompt and model), the served one left out. No predictor that
reads only the prompt can know more, so it is the realistic ceiling for text predictors (the
true-length oracle also knows how this one sampling will go).
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Sequence

import numpy as np

from presched.predict.estimate import LEVELS, LengthEstimate
from presched.workload.request import Request

_Z = np.array([NormalDist().inv_cdf(p) for p in LEVELS])


def noisy_oracle(requests: Sequence[Request], sigma: float, seed: int = 0) -> LengthEstimate:
    """One row per request, in order (see the module doc). `sigma` >= 0: log-scale error."""
    if sigma < 0:
        raise ValueError(f"field 'sigma': must be >= 0, got {sigma}")
    true = np.array([r.target_tokens for r in requests], dtype=float)
    z = np.random.default_rng(seed).standard_normal(len(true))
    point = true * np.exp(sigma * z)
    q = point[:, None] * np.exp(sigma * _Z)[None, :]
    return LengthEstimate(q, point, point)


def prompt_oracle(requests: Sequence[Request]) -> LengthEstimate:
    """The request's OWN length distribution, from the other generations observed for its prompt
    (`output_samples` minus the one it is served with, `output_tokens`): what a predictor that
    knew the prompt perfectly, but not the sampling, could say. The ceiling of any predictor
    that reads only the prompt (CASTILLO: 10 samples per prompt and model). Quantiles are the
    empirical ones of those samples (linear interpolation), point and rank score their mean."""
    q, point = np.empty((len(requests), len(LEVELS))), np.empty(len(requests))
    for i, r in enumerate(requests):
        others = list(r.output_samples or ())
        if r.output_tokens in others:
            others.remove(r.output_tokens)
        if not others:
            raise ValueError(
                f"request {r.id!r}: field 'output_samples' needs another observed length besides "
                "output_tokens for the prompt oracle"
            )
        s = np.asarray(others, dtype=float)
        q[i], point[i] = np.quantile(s, LEVELS), s.mean()
    return LengthEstimate(q, point, point)
