"""`PredictBatcher(inline_s=...)`: a predictor measured cheap predicts an idle gateway's request
on the event loop; a slow one (or inline off, the default) goes to the worker thread, requests
that arrive together in one batch."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from presched.predict.estimate import LEVELS, LengthEstimate
from presched.serve.predictions import PredictBatcher
from presched.workload.request import Request


class Recording:
    """A real (trivial) predictor that records the thread and batch size of each call."""

    def __init__(self, sleep_s: float = 0.0) -> None:
        self.sleep_s, self.calls = sleep_s, []

    def predict(self, requests):
        self.calls.append((threading.current_thread() is threading.main_thread(), len(requests)))
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return LengthEstimate.from_quantiles(np.full((len(requests), len(LEVELS)), 10.0))


def _req(i: int) -> Request:
    return Request(id=f"r{i}", prompt_tokens=5, model="m")


def _run(pb: PredictBatcher, batches: list[int]) -> None:
    async def main():
        n = 0
        for size in batches:  # `size` requests asking in the same loop turn
            await asyncio.wait_for(asyncio.gather(*(pb.estimate(_req(n + i)) for i in range(size))), 30)
            n += size
        pb.worker.close()

    asyncio.run(main())


def test_a_cheap_predictor_runs_inline_once_measured():
    p = Recording()
    pb = PredictBatcher(p, inline_s=0.5)
    _run(pb, [1, 1, 1, 4])
    # the first call on the worker (not measured yet), then every one at once on the loop (a
    # cheap call does not wait, so requests asking together need no batch)
    assert p.calls == [(False, 1)] + [(True, 1)] * 6
    assert pb.call_s is not None and pb.call_s < 0.5 and pb.predicted == 7


def test_a_slow_predictor_and_inline_off_stay_on_the_worker_and_batch():
    slow = Recording(sleep_s=0.005)
    _run(PredictBatcher(slow, inline_s=0.001), [1, 1, 3])
    assert [on_loop for on_loop, _ in slow.calls] == [False] * len(slow.calls)
    assert slow.calls[-1] == (False, 3)  # those that asked together: one call
    off = Recording()
    _run(PredictBatcher(off), [1, 1, 3])
    assert off.calls == [(False, 1), (False, 1), (False, 3)]
