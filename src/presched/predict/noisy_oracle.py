"""`noisy_oracle`: predictions made from the TRUE lengths with a controlled error, to map
predictor accuracy to scheduling gain (the noise sweep). Not a predictor: it reads labels.

For each request with true length L and a standard normal draw Z (seeded):

    point  = L * exp(sigma * Z)                       (the median guess, log-normal error)
    q_p    = point * exp(sigma * z_p),  z_p = Phi^-1(p)   for every level p in LEVELS

so sigma = 0 gives the true length at every quantile, and for sigma > 0 the quantiles are
calibrated when log L is a priori flat (L given the guess is log-normal around it).
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
