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
- `_held()`: the seqs of the sessions that hold KV blocks but are not in `self.running`
  (paused, or their next chunk waiting in `kv_holding_waiting`). `admit` gets them with the
  running requests (the policy counts a session admitted until it ends): `kv-admission` summed
  its footprint without them while one was paused, and admitted past its limit.
- a session whose input closes while it waits for more: vLLM ends it FINISHED_ABORTED
  (`Scheduler.add_request`: the finished sentinel for a session in WAITING_FOR_STREAMING_REQ);
  its last turn did complete, so `_end_status` gives that turn's end (FINISHED_STOPPED,
  FINISHED_LENGTH_CAPPED, ...): the policy hears `on_finish`, it counts as finished and its
  record carries that finish reason. A client's abort still reads as an abort (it does not come
  through `add_request`).
"""

from __future__ import annotations

from itertools import chain

from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.request import RequestStatus, StreamingUpdate


class Sessions:
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kv_holding_waiting = FCFSRequestQueue()  # empty yet: vLLM's default order (module doc)
        self._closing: str | None = None  # the session whose input is closing while it waits

    def _held(self) -> list:
        """The seqs of requests that hold KV blocks and are not running: those in vLLM's queue
        of holders, and those its admission loop popped from it and skips this step (paused
        sessions: `deferred_waiting`, which also holds requests without blocks)."""
        found = {}
        for r in chain(self.kv_holding_waiting, self.deferred_waiting):
            seq = self._seqs.get(r.request_id)
            if seq is not None and r.status != RequestStatus.RUNNING and self._holds_kv_blocks(r):
                found[r.request_id] = seq
        return sorted(found.values(), key=lambda s: (s.arrival, s.id))

    def add_request(self, request) -> None:
        old = self.requests.get(request.request_id)
        if (old is None or old.status != RequestStatus.WAITING_FOR_STREAMING_REQ
                or StreamingUpdate.from_request(request) is not None):  # fmt: skip
            super().add_request(request)
            return
        self._closing = request.request_id  # vLLM frees it in there, FINISHED_ABORTED
        try:
            super().add_request(request)
        finally:
            self._closing = None

    def _handle_stopped_request(self, request) -> bool:
        seq = self._seqs.get(request.request_id)
        if seq is not None and request.resumable:
            seq.turn_status = request.status  # the turn's end, before vLLM sets the next turn's
        return super()._handle_stopped_request(request)

    def _end_status(self, seq, request) -> RequestStatus:
        """vLLM's status of a request being freed; for a session whose input closed while it
        waited, its last turn's end (module doc)."""
        if request.request_id == self._closing and seq.turn_status is not None:
            return seq.turn_status
        return request.status

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
