"""How many distinct experts a step reads: the expected coverage of top-k routing.

With E experts per MoE layer, each of T tokens routed to k distinct experts and routing taken as
uniform and independent across tokens, one expert is missed by one token with probability
1 - k/E, so it is read by the step with probability 1 - (1 - k/E)^T and

    expected distinct experts  D(T) = E * (1 - (1 - k/E)^T)

D(0) = 0, D(1) = k (one token reads exactly its k experts), D grows concavely and tends to E:
a decode step of a few requests reads little more than the active experts, a large batch or a
prefill chunk reads nearly all of them. Real routers are skewed (popular experts), which makes
coverage lower than uniform at the same T; this is an upper bound in that sense.
"""

from __future__ import annotations

import math


def expected_distinct_experts(num_experts: int, experts_per_token: int, tokens: float) -> float:
    """E * (1 - (1 - k/E)^tokens); ValueError naming the argument for a bad value."""
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts: got {num_experts!r}, expected an integer >= 1")
    if not (isinstance(experts_per_token, int) and 1 <= experts_per_token <= num_experts):
        raise ValueError(f"experts_per_token: got {experts_per_token!r}, expected "
                         f"1..{num_experts}")  # fmt: skip
    if not (isinstance(tokens, (int, float)) and math.isfinite(tokens) and tokens >= 0):
        raise ValueError(f"tokens: got {tokens!r}, expected a finite number >= 0")
    if experts_per_token == num_experts:
        return float(num_experts) if tokens > 0 else 0.0
    # -expm1(T * log1p(-k/E)) is 1 - (1 - k/E)^T without cancellation at small T
    return num_experts * -math.expm1(tokens * math.log1p(-experts_per_token / num_experts))
