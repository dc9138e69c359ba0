"""`PredictBatcher`: predicts the lengths of requests that arrive together in one call.

Predictors are batch-first (a LightGBM call costs about the same for 1 row as for 50), so the
gateway does not predict per request: every request that asks in the same event-loop turn joins
one `predict` call, made on the next turn. Under load this amortises the predictor's fixed cost;
when idle it adds one loop turn (microseconds).
"""

from __future__ import annotations

import asyncio
from typing import Any

from presched.workload.request import Request


class PredictBatcher:
    def __init__(self, predictor: Any) -> None:
        self.predictor = predictor
        self._pending: list[tuple[Request, asyncio.Future]] = []
        self.calls = 0
        self.predicted = 0

    async def estimate(self, request: Request):
        """The request's `RequestEstimate` (raises what the predictor raised)."""
        fut = asyncio.get_running_loop().create_future()
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append((request, fut))
        return await fut

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        self.calls += 1
        self.predicted += len(batch)
        try:
            est = self.predictor.predict([r for r, _ in batch])
        except Exception as e:  # noqa: BLE001 - handed to every waiting request
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        for i, (_, fut) in enumerate(batch):
            if not fut.done():
                fut.set_result(est[i])
