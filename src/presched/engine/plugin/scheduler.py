"""`PreschedScheduler`: vLLM v1's `Scheduler` with every ordering decision taken by a presched
`Policy`, the same classes and configs as the simulator (`sim/scheduler.py`) and the gateway.

    python -m vllm.entrypoints.openai.api_server ... \\
        --scheduler-cls presched.engine.plugin.scheduler.PreschedScheduler
    # config: $PRESCHED_PLUGIN_CONFIG (see config.py); `presched.engine.launch --scheduler
    # presched --policy NAME --param k=v --predictor model.npz` sets both

Only the EngineCore process imports this module (it needs vllm). The subclass is thin; vLLM's own
`schedule()` still does the work (token budget, chunked prefill, KV allocation), and these hooks
put the policy in charge of each decision:

- waiting order: `self.waiting` is a `PolicyRequestQueue` keyed by `policy.priority` (queue.py);
- admission: during `schedule()` the queue's head must pass `policy.admit(head, running, now)`
  (vLLM then checks the batch slot and allocates its KV blocks; a refusal ends admission);
- preemption to admit: before `super().schedule()`, when vLLM would not start the head (`_fits`:
  no slot, no token budget left after the running requests, or too few free KV blocks for its
  whole prompt under vLLM's `scheduler_reserve_full_isl`, else its first chunk, once the
  running requests have taken theirs), `policy.preempt_for(head, running, now)` may name
  victims, asked again about the batch without the ones named before until the head would fit
  (the blocks the victims alone hold added to the free ones), then `admit` against that batch;
  only then are they all preempted by recompute (`_preempt_request`, as vLLM does) and the head
  popped first in this step, else none is: all or nothing, as the simulator
  (sim/scheduler.py `_victims_for`);
- KV-pressure victim: vLLM's priority mode picks `max(running, key=(priority, arrival))`; each
  running request's `priority` is a `VictimKey` whose comparison asks `policy.victim`, so that
  max is the policy's victim among all running requests (vLLM gives the token budget of an
  already served victim back); vLLM's queue of KV-block holders stays FIFO (sessions.py);
- notifications: `on_arrival` (add_request), `on_schedule` (admission), `on_tokens` (after each
  step), `on_preempt` (recompute), `on_finish` (stop or length; a streaming session whose input
  closed while it waited), `on_cancel` (an abort: the client went away; or FINISHED_ERROR).

`preempt_for` and `admit` are asked only about a head vLLM would try to start this step
(support.py `admissible`), `admit` only while a batch slot is free, its running list with the
sessions that hold KV between turns (sessions.py). A streaming-input session is one request to
the policy, its turns added up (support.py).

`policy.attach` gets the engine's real numbers: KV blocks x block size, max_num_seqs,
max_num_batched_tokens. A seq also carries `computed` (vLLM's num_computed_tokens) live.

With `features` in the plugin config, the worker hook's `StepFeatures` (worker.py) are read off
each step's ModelRunnerOutput and kept on the seqs (`features_prompt`, `features_step`); the
records get the pooled prompt state (records.py, table `prompt_features`). With `probe`,
`refine` or `draft_probe` too, those states go through the probe (probe.py), probe-refine
(refine.py) or the draft model's probe, whose estimates replace those of requests without their
own vllm_xargs prediction (consume.py: the order and the precedence).

A policy hook that raises is counted and logged (`Guard`), the FCFS decision is taken for that
call, and the engine keeps serving. The vLLM version is pinned (version.py); LoRA, KV and
encoder-cache connectors, async scheduling and pipeline parallelism are refused (support.py).
"""

from __future__ import annotations

import logging
import sqlite3
import time

import vllm
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from presched.engine.plugin.admission import victims_for, would_start
from presched.engine.plugin.config import PluginConfigError, build_policy, load_plugin_config
from presched.engine.plugin.estimates import BadPrediction, EnginePredictor, from_xargs
from presched.engine.plugin.consume import FeatureConsumer
from presched.engine.plugin.features import FEATURES_ATTR, check_engine_config
from presched.engine.plugin.guard import Guard
from presched.engine.plugin.queue import PolicyRequestQueue
from presched.engine.plugin.records import RecordWriter, record_row
from presched.engine.plugin.seq import EngineSeq, slos_of, xargs_of
from presched.engine.plugin.sessions import Sessions
from presched.engine.plugin.stats import snapshot, write_failed, write_stats
from presched.engine.plugin.support import admissible, check_supported
from presched.engine.plugin.version import check_vllm_version
from presched.engine.plugin.victim_key import VictimKey
from presched.schedule.interface import EngineInfo, Policy

log = logging.getLogger("presched.engine.plugin")
STATS_INTERVAL_S = 1.0


class PreschedScheduler(Sessions, Scheduler):  # Sessions: between a session's turns
    def __init__(self, *args, **kwargs) -> None:
        check_vllm_version(vllm.__version__)
        cfg = load_plugin_config()
        policy = build_policy(cfg)
        super().__init__(*args, **kwargs)
        check_supported(self)  # LoRA, KV/EC connectors, async scheduling, pipeline parallelism
        self.ps_cfg, self.ps = cfg, policy
        if cfg.features is not None:
            check_engine_config(self.vllm_config, cfg.features.draft_layer)
        self.guard = Guard()
        self.guard.on_error = self._error_saved
        self.counts = {"arrivals": 0, "pred_xargs": 0, "pred_predictor": 0, "pred_none": 0,
                       "bad_xargs": 0, "preempt_for": 0, "preempt_for_refused": 0, "finished": 0, "aborted": 0,
                       "errors": 0, "write_errors": 0}  # fmt: skip
        self._seqs: dict[str, EngineSeq] = {}
        self._now = time.time()
        num_blocks = int(self.kv_cache_config.num_blocks)
        # one block is vLLM's null block, never handed to a request
        self.usable_blocks = num_blocks - 1
        self.engine_info = EngineInfo(
            kv_tokens=self.usable_blocks * self.block_size, block_size=self.block_size,
            max_num_seqs=self.max_num_running_reqs,
            max_num_batched_tokens=self.max_num_scheduled_tokens,
        )  # fmt: skip
        try:
            policy.attach(self.engine_info)
        except ValueError as e:
            raise PluginConfigError(f"params: {e}") from None
        self._preemptive = type(policy).preempt_for is not Policy.preempt_for
        self._admits = type(policy).admit is not Policy.admit
        self._counts_tokens = type(policy).on_tokens is not Policy.on_tokens
        self.own_s = 0.0  # time in this class's own code (see `schedule`), in the stats
        self.steps = 0
        # vLLM's priority mode routes its KV-pressure victim through request.priority (VictimKey)
        self.policy = SchedulingPolicy.PRIORITY
        self.waiting = PolicyRequestQueue(policy, self._seq_of, self._clock, self.guard,
                                          self._admitted, self._requeued)  # fmt: skip
        mc = self.vllm_config.model_config
        self.model_name = (mc.served_model_name if isinstance(mc.served_model_name, str)
                           else (mc.served_model_name or [mc.model])[0])  # fmt: skip
        self.predictor = None
        if cfg.predictor is not None:
            self.predictor = EnginePredictor(cfg.predictor, cfg.tokenizer or mc.tokenizer,
                                             self.model_name)  # fmt: skip
        self._tokenizer = None
        if cfg.store_prompts:
            try:
                self._tokenizer = (self.predictor.tokenizer if self.predictor else
                                   _load_tokenizer(cfg.tokenizer or mc.tokenizer))  # fmt: skip
            except Exception as e:  # noqa: BLE001 - named: a bad folder or name
                raise PluginConfigError(f"tokenizer: cannot load {cfg.tokenizer or mc.tokenizer!r}: {e}") from None
        try:
            self.records = RecordWriter(cfg.records) if cfg.records is not None else None
        except (OSError, sqlite3.Error) as e:  # not a database, no permission
            raise PluginConfigError(f"records: {cfg.records}: {type(e).__name__}: {e}") from None
        self.min_free_blocks = self.usable_blocks
        # a preemption for a head that vLLM then did not start: (head id, the running ids before
        # it, requests ended by then); `_attempt` is the one in flight this step
        self._refused: tuple[str, frozenset, int] | None = None
        self._attempt: tuple[str, frozenset] | None = None
        log.info("presched in-engine scheduler: policy %s, %s KV tokens (%d usable blocks of "
                 "%d), max_num_seqs %d", policy.describe(), self.engine_info.kv_tokens, num_blocks - 1,
                 self.block_size, self.max_num_running_reqs)  # fmt: skip
        self.features = None  # the hidden-state features' consumer (consume.py)
        if cfg.features is not None:
            self.features = FeatureConsumer(cfg, self.vllm_config, self.counts, self._save_stats)
        self._save_stats()

    # --- seqs ---------------------------------------------------------------------------------
    def _clock(self) -> float:
        return self._now

    def _seq_of(self, vreq, create: bool = True) -> EngineSeq | None:
        seq = self._seqs.get(vreq.request_id)
        if seq is None and create:  # not through add_request (never expected): adopt it
            seq = self._new_seq(vreq)
        return seq

    def _new_seq(self, vreq) -> EngineSeq:
        est, source, xargs = None, None, xargs_of(vreq)
        try:
            est = from_xargs(xargs)
            source = "xargs" if est is not None else None
        except BadPrediction as e:
            self.counts["bad_xargs"] += 1
            log.warning("presched: request %s: %s; predicting it as if it had none",
                        vreq.request_id, e)  # fmt: skip
        slos, bad = slos_of(xargs)
        for msg in bad:
            self.counts["bad_xargs"] += 1
            log.warning("presched: request %s: %s; as if it had none", vreq.request_id, msg)
        if est is None and self.predictor is not None:
            est = self.guard.call("predictor", None, self.predictor.predict, vreq.request_id,
                                  vreq.prompt_token_ids)  # fmt: skip
            source = "predictor" if est is not None else None
        self.counts[f"pred_{source or 'none'}"] += 1
        seq = EngineSeq(vreq, est, source, slos)
        self._seqs[vreq.request_id] = seq
        return seq

    def _sync(self, seq: EngineSeq) -> None:
        """Bring the seq's token count up to the vLLM request's (+ a session's earlier turns)."""
        n = seq.turn_base + seq.vreq.num_output_tokens
        d = n - seq.generated
        if d > 0:
            if seq.first_token is None:
                seq.first_token = self._now
            seq.generated = n
            if self._counts_tokens:  # the per-step hot path: skip the base class's no-op
                self.guard.call("on_tokens", None, self.ps.on_tokens, seq, d, self._now)

    # --- hooks called by the queue --------------------------------------------------------------
    def _admitted(self, seq: EngineSeq) -> None:
        """The queue handed `seq` to vLLM's admission (it allocated its blocks just before)."""
        vreq = seq.vreq
        if vreq.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            return  # popped to be skipped (blocked), not admitted
        vreq.priority = VictimKey(seq, self)
        if seq.first_scheduled is None:
            seq.first_scheduled = self._now
        self.guard.call("on_schedule", None, self.ps.on_schedule, seq, self._now)

    def _requeued(self, seq: EngineSeq) -> None:
        """`seq` was preempted (recompute) and goes back to the waiting queue."""
        self._sync(seq)
        seq.preemptions = int(seq.vreq.num_preemptions)
        self.guard.call("on_preempt", None, self.ps.on_preempt, seq, self._now)

    def _gate(self, seq: EngineSeq) -> bool:
        if not self._admits or not admissible(seq.vreq):
            return True  # vLLM skips a head it cannot start now (support.py): ask for the next
        if len(self.running) + self.num_waiting_for_streaming_input >= self.max_num_active_reqs:
            return True  # no slot: vLLM's own check ends admission next; `admit` is for a head with one
        running = [self._seqs[r.request_id] for r in self.running if r.request_id in self._seqs]
        return self.guard.call("admit", True, self.ps.admit, seq, running + self._held(), self._now)

    # --- vLLM's Scheduler methods -------------------------------------------------------------
    def add_request(self, request) -> None:
        if request.request_id not in self.requests:
            t0 = time.perf_counter()
            self._now = time.time()
            seq = self._new_seq(request)
            self.counts["arrivals"] += 1
            self.guard.call("on_arrival", None, self.ps.on_arrival, seq, self._now)
            self.own_s += time.perf_counter() - t0
        super().add_request(request)

    def schedule(self, *args, **kwargs):
        """vLLM's `schedule()` with the policy's preemptions first. `own_s` adds the time spent
        here before and after vLLM's own code (and in `add_request`, `update_from_output`,
        `_finish`), not the waiting queue's methods that vLLM calls in between (they replace
        vLLM's queue): the plugin's own cost, read from the stats as `plugin_own_s`."""
        t0 = time.perf_counter()
        self.steps += 1
        self._now = time.time()
        for r in self.running:
            seq = self._seqs.get(r.request_id)
            if seq is not None:
                seq.computed = r.num_computed_tokens  # type: ignore[attr-defined]
        if self._preemptive and self.waiting:
            self._preempt_for_head()
        self.waiting.gate = self._gate
        t1 = time.perf_counter()
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            self.waiting.gate = None
            pinned = self.waiting.pinned
            self.waiting.unpin()
        if pinned is not None and self._attempt is not None:  # preempted for, and vLLM did not start it
            self._refused = (*self._attempt, self._ended())
            self.counts["preempt_for_refused"] += 1
        self._attempt = None
        t2 = time.perf_counter()
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        if free < self.min_free_blocks:
            self.min_free_blocks = free
        self.own_s += (t1 - t0) + (time.perf_counter() - t2)
        return out

    def _fits(self, head: EngineSeq, victims: list[EngineSeq]) -> bool:
        """Whether vLLM would start `head` this step were `victims` preempted (admission.py)."""
        return would_start(self, head, victims)

    def _preempt_for_head(self) -> None:
        """Preempt, all or none, the running requests the policy names for the waiting head
        (admission.py `victims_for`; module doc), then pop the head first in this step. Should
        vLLM still not start it (`_fits` cannot see everything: resumed streaming sessions, KV
        cache groups past the first), that is counted (`preempt_for_refused`)
        and nothing is preempted for that head again until a request ends or one that was not
        running then runs (the victims coming back do not count): at most one wasted
        preemption per head and batch, never a loop."""
        head_req = self.waiting.peek_request()
        head = self._seqs.get(head_req.request_id)
        if head is None or not admissible(head_req):
            return  # vLLM skips this head this step (support.py): a victim would be re-admitted
        if self._fits(head, []):
            return
        if self._refused is not None and self._refused[0] == head.id and self._refused[2] == self._ended() \
                and all(r.request_id in self._refused[1] for r in self.running):  # fmt: skip
            return  # preempted for once and not started: not again until a request ends or a new one runs
        victims = victims_for(self, head)
        if not victims:
            return
        self._attempt = (head.id, frozenset(r.request_id for r in self.running))
        for victim in victims:
            self.counts["preempt_for"] += 1
            self.running.remove(victim.vreq)
            self._preempt_request(victim.vreq, time.monotonic())
        self.waiting.serve_first(head)  # before a victim that ranks first once back (vtc ties), this step

    def _ended(self) -> int:
        return self.counts["finished"] + self.counts["aborted"] + self.counts["errors"]

    def _preempt_request(self, request, timestamp, drop_stale_output: bool = False) -> None:
        seq = self._seqs.get(request.request_id)
        if seq is not None:
            seq.recomputed_tokens += request.num_computed_tokens
        super()._preempt_request(request, timestamp, drop_stale_output=drop_stale_output)

    def update_from_output(self, scheduler_output, model_runner_output):
        t0 = time.perf_counter()
        self._now = time.time()
        sf = getattr(model_runner_output, FEATURES_ATTR, None)
        if sf is not None and self.features is not None:  # before super(): it frees the requests that finish in this step
            self.features.step(sf, self._seqs)
        t1 = time.perf_counter()
        out = super().update_from_output(scheduler_output, model_runner_output)
        t2 = time.perf_counter()
        seqs = self._seqs
        for rid in scheduler_output.num_scheduled_tokens:
            seq = seqs.get(rid)
            if seq is not None:
                self._sync(seq)
        self.own_s += (t1 - t0) + (time.perf_counter() - t2)  # + `_finish`'s, inside super()
        return out

    def _free_request(self, request, delay_free_blocks: bool = False):
        seq = self._seqs.get(request.request_id)
        if seq is not None:
            # out of the policy's queue first: a request that stops while preempted (two steps in
            # flight) is freed before vLLM asks the queue to remove it, by then without its seq
            self.waiting.remove_requests((request,))
            del self._seqs[request.request_id]
            self._finish(seq, request)
        return super()._free_request(request, delay_free_blocks=delay_free_blocks)

    def _finish(self, seq: EngineSeq, request) -> None:
        t0 = time.perf_counter()
        self._now = time.time()
        self._sync(seq)
        seq.finish = self._now
        seq.preemptions = int(request.num_preemptions)
        status = self._end_status(seq, request)  # a session closed while it waited: its last turn's
        # an abort (client gone) or an engine error (grammar, KV load): it did not complete, its
        # `generated` is no true length, so the policy hears on_cancel, not on_finish
        kind = {RequestStatus.FINISHED_ABORTED: "aborted",
                RequestStatus.FINISHED_ERROR: "errors"}.get(status, "finished")  # fmt: skip
        self.counts[kind] += 1
        if kind == "finished":
            self.guard.call("on_finish", None, self.ps.on_finish, seq, self._now)
        else:
            self.guard.call("on_cancel", None, self.ps.on_cancel, seq, self._now)
        if self.records is not None:
            prompt = None
            if self._tokenizer is not None:
                prompt = self._tokenizer.decode(list(request.prompt_token_ids or ()),
                                                skip_special_tokens=True)  # fmt: skip
            try:  # a full disk or a locked database must not stop the engine
                self.records.write(record_row(seq, status.name, self.model_name, prompt))
                if self.features is not None:
                    self.features.write(self.records, seq)
            except (OSError, sqlite3.Error) as e:
                write_failed(self.counts, "records", e)
        # the request is still in self.requests: <= 1 means the engine goes idle now
        if len(self.requests) <= 1 or self._now - self._stats_saved >= STATS_INTERVAL_S:
            self._save_stats()
        self.own_s += time.perf_counter() - t0

    def _error_saved(self) -> None:
        """After a policy error: the stats at once for the first, then at most every
        STATS_INTERVAL_S (a policy failing on every comparison of vLLM's victim `max` rewrote
        the file ~30 times a step: 85 ms steps against 1.5 ms)."""
        if self.guard.total == 1 or self._now - self._stats_saved >= STATS_INTERVAL_S:
            self._save_stats()

    def _save_stats(self) -> None:
        """Rewrite the stats file (config `stats`): at start, when a request finishes (at most
        every STATS_INTERVAL_S while others run; always when it was the last one), after a
        policy error (`_error_saved`), at shutdown. (Rewriting it at every finish cost ~0.1-0.5
        ms each.) A write that fails is counted in `write_errors` and logged; the engine goes on."""
        self._stats_saved = self._now
        path = self.ps_cfg.stats
        if path is None:
            return
        try:
            write_stats(path, snapshot(self))
        except OSError as e:
            write_failed(self.counts, "stats", e)

    def shutdown(self) -> None:
        self._save_stats()
        if self.records is not None:
            self.records.close()
        super().shutdown()


def _load_tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)
