"""Load-aware routers.

- `least-requests`: the instance with the fewest outstanding (waiting + running) requests
  (Vidur's `lor`, vLLM production-stack's default).
- `least-work`: the instance with the least outstanding work, in tokens:

      work(i) = sum over its unfinished requests r of
                prompt_weight * (prompt tokens of r, until its first token) + max(E[L_r] - g_r, 1)

  where g_r is the tokens r generated so far and E[L_r] its expected output length: the point
  estimate of its length distribution when a predictor set one (`seq.estimate.point`), else the
  running mean of completed requests' lengths at this router (prior `prior_output_tokens`).
  `prompt_weight` converts prefill tokens into decode-token equivalents (a prefill token costs
  far less than a decode step: default 0.1).
- `least-work-oracle`: the same with the true length (`seq.target`): a bound, not deployable.
"""

from __future__ import annotations

from presched.schedule.routers.interface import ROUTERS, Router


@ROUTERS.register("least-requests")
class LeastRequests(Router):
    name = "least-requests"
    needs_progress = False

    def route(self, seq, instances, now) -> int:
        return min(range(len(instances)), key=lambda i: instances[i].num_outstanding)


@ROUTERS.register("least-work")
class LeastWork(Router):
    name = "least-work"

    def __init__(self, prompt_weight: float = 0.1, prior_output_tokens: float = 256.0) -> None:
        if prompt_weight < 0:
            raise ValueError(f"field 'prompt_weight': must be >= 0, got {prompt_weight}")
        if prior_output_tokens <= 0:
            raise ValueError(f"field 'prior_output_tokens': must be > 0, got {prior_output_tokens}")
        self.prompt_weight = prompt_weight
        self._sum = prior_output_tokens
        self._n = 1

    def expected_length(self, seq) -> float:
        est = getattr(seq, "estimate", None)
        if est is not None:
            return float(est.point)
        return self._sum / self._n

    def work(self, inst) -> float:
        w = 0.0
        pw = self.prompt_weight
        for s in inst.outstanding():
            if s.first_token is None:
                w += pw * s.prompt_tokens
            w += max(self.expected_length(s) - s.generated, 1.0)
        return w

    def route(self, seq, instances, now) -> int:
        return min(range(len(instances)), key=lambda i: self.work(instances[i]))

    def on_finish(self, seq, instance, now) -> None:
        self._sum += seq.generated
        self._n += 1


@ROUTERS.register("least-work-oracle")
class LeastWorkOracle(LeastWork):
    name = "least-work-oracle"
    oracle = True

    def expected_length(self, seq) -> float:
        return seq.target
