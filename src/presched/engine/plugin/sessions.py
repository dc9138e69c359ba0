"""What `PreschedScheduler` (scheduler.py) does about vLLM's requests that hold KV blocks while
they are not running: streaming-input sessions between turns (support.py's module doc), and
vLLM's queue of them. A mixin ahead of vLLM's `Scheduler` in the class's bases; it reads the
scheduler's `_seqs` and `_sync`. Only the engine process imports it.

- vLLM's queue of block holders (`kv_holding_waiting`) is FIFO, whatever `--scheduling-policy`
  says: vLLM made it a heap on `request.priority` under `priority`, which the plugin sets to a
  `VictimKey` at admission; each push and pop then asked `policy.victim` about paused sessions
  (no KV pressure, none of them running), and the order was no order: a victim tie answers
  both ways (`later > earlier`), so tied sessions resumed last paused first, and a victim that
  moves with time (hrrn, aging) can break the heap. FIFO is vLLM's default order for them.
"""

from __future__ import annotations

from vllm.v1.core.sched.request_queue import FCFSRequestQueue


class Sessions:
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kv_holding_waiting = FCFSRequestQueue()  # empty yet: vLLM's default order (module doc)

    def _update_request_as_session(self, session, update) -> None:
        """A streaming-input session's next chunk: vLLM clears its output tokens; the ended
        turn's are counted first, the next turn's on top (`turn_base`)."""
        seq = self._seqs.get(session.request_id)
        if seq is not None:
            self._sync(seq)
        super()._update_request_as_session(session, update)
        if seq is not None:
            seq.turn_base = seq.generated
            seq.prompt_tokens += len(update.prompt_token_ids or ())
