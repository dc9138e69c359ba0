"""Hand-computed timelines with every step lasting exactly 1 s (unless a test says otherwise)."""

import numpy as np
from builders import StepChecks, fed_tokens, linear_steps, make_engine, make_requests, run_engine

from presched.schedule import POLICIES
from presched.sim.steptime import FittedStepModel


def times(seq):
    return (seq.first_scheduled, seq.first_token, seq.finish)


def test_two_requests_continuous_batching():
    # A: arrives 0, prompt 4, 3 tokens. B: arrives 0.5, prompt 4, 2 tokens.
    # t0-1: A prefill -> A tok1 @1. t1-2: A decode + B prefill (B joins at the next step,
    # not mid-step) -> A tok2, B tok1 @2. t2-3: both decode -> A tok3 (done), B tok2 (done) @3.
    reqs = make_requests([(4, 3), (4, 2)], arrivals=[0.0, 0.5])
    a, b = run_engine(make_engine(), reqs)
    assert times(a) == (0.0, 1.0, 3.0)
    assert times(b) == (1.0, 2.0, 3.0)
    assert (a.generated, b.generated) == (3, 2)


def test_chunked_prefill_splits_prompt_across_steps():
    # Budget 3 tokens/step. A (prompt 4, 2 tokens), B (prompt 4, 1 token), both at t=0.
    # s0: A 3 prompt tokens. s1: A last prompt token (-> tok1 @2) + B 2 tokens.
    # s2: A decode (-> tok2 @3, done) + B last 2 tokens (-> tok1 @3, done).
    reqs = make_requests([(4, 2), (4, 1)], arrivals=[0.0, 0.0])
    a, b = run_engine(make_engine(max_num_batched_tokens=3), reqs)
    assert times(a) == (0.0, 2.0, 3.0)
    assert times(b) == (1.0, 3.0, 3.0)


def test_no_chunking_waits_for_room_in_the_budget():
    # Budget 5, chunking off: B (prompt 4) does not fit beside A's prompt (4) in step 0.
    reqs = make_requests([(4, 2), (4, 1)], arrivals=[0.0, 0.0])
    a, b = run_engine(make_engine(max_num_batched_tokens=5, enable_chunked_prefill=False), reqs)
    assert times(a) == (0.0, 1.0, 2.0)
    assert times(b) == (1.0, 2.0, 2.0)


def test_max_num_seqs_makes_requests_queue():
    reqs = make_requests([(2, 3), (2, 1)], arrivals=[0.0, 0.0])
    a, b = run_engine(make_engine(max_num_seqs=1), reqs)
    assert times(a) == (0.0, 1.0, 3.0)
    assert times(b) == (3.0, 4.0, 4.0)


def test_kv_pressure_preempts_latest_admitted_and_recomputes():
    # 3 blocks of 2 tokens. A (prompt 2, 3 tokens) and B (prompt 2, 3 tokens) start together
    # (2 blocks). Step 1 needs a 2nd block for each: only 1 free -> A gets it, B (the latest
    # admitted, FCFS victim) is preempted; it restarts after A finishes and recomputes
    # its prompt + its generated token.
    reqs = make_requests([(2, 3), (2, 3)], arrivals=[0.0, 0.0])
    inst = make_engine(num_blocks=3, block_size=2)
    a, b = run_engine(inst, reqs)
    assert b.preemptions == 1 and a.preemptions == 0
    assert b.recomputed_tokens == 2  # B's prompt had been computed once
    assert times(a) == (0.0, 1.0, 3.0)
    assert b.first_token == 1.0 and b.finish > a.finish
    assert (a.generated, b.generated) == (3, 3)
    assert inst.sched.kv.free == inst.sched.kv.num_blocks


def test_step_that_preempts_everything_it_tried_is_empty_and_the_run_goes_on():
    # Regression, found by hypothesis: SJF's KV victim is the request with most tokens left,
    # which can be the first running request itself; the step then schedules nothing (as vLLM
    # does) and the next step carries on from the new state instead of stopping.
    reqs = make_requests(n=21, seed=14, rate=20.0)
    inst = make_engine("sjf-oracle", num_blocks=2600, block_size=1, max_num_seqs=7,
                       max_num_batched_tokens=130, enable_chunked_prefill=False,
                       long_prefill_token_threshold=64, step_model=linear_steps())  # fmt: skip
    seqs = run_engine(inst, reqs)
    assert all(s.generated == s.target for s in seqs)
    assert sum(s.preemptions for s in seqs) >= 1


def test_a_request_that_exactly_fills_the_kv_cache_runs():
    # 8 tokens of KV hold prompt 4 + 5 output tokens: the 5th token is sampled, never stored.
    (r,) = run_engine(make_engine(num_blocks=4, block_size=2), make_requests([(4, 5)], arrivals=[0.0]))
    assert r.generated == 5 and r.finish == 5.0


def preemptive_mlfq():
    """test_mlfq.py's MLFQ: quanta 4, 8, 16, 32 tokens, a prompt token costs one, preemption
    whenever the victim sits at a lower level (no recompute guard)."""
    return POLICIES.create("mlfq", num_levels=4, base_quantum=4, prompt_weight=1.0, preempt=True,
                           recompute_weight=0.0)  # fmt: skip


def checked_run(requests, policy="fcfs", **engine):
    """`run_engine` with the per-step checks of `builders.StepChecks` on (budget, exact blocks,
    batch shape, KV balance) and the token count of every request checked at the end
    (`fed_tokens`: prompt + output - 1 + recomputed); returns the seqs and the checker."""
    inst = make_engine(policy, **engine)
    checks = StepChecks(inst)
    seqs = run_engine(inst, requests)
    fed_tokens([checks], seqs)
    return seqs, checks


def test_partial_blocks_are_whole_blocks():
    # 3 blocks of 4 tokens. A and B (prompt 5, 2 tokens) at t=0: a 5-token prompt needs 2 blocks,
    # so B does not fit beside A (1 free) and waits; A's second token (KV for 6 tokens) fits in
    # its 2 blocks. B starts when A has finished and freed them.
    (a, b), checks = checked_run(make_requests([(5, 2), (5, 2)], arrivals=[0.0, 0.0]),
                                 num_blocks=3, block_size=4)  # fmt: skip
    assert times(a) == (0.0, 1.0, 2.0)
    assert times(b) == (2.0, 3.0, 4.0)
    assert checks.peak_used == 2 and a.preemptions == b.preemptions == 0


def test_a_decode_crossing_a_block_boundary_takes_a_block_and_preempts_for_it():
    # 2 blocks of 4. A (prompt 4, 3 tokens) and B (prompt 1, 2 tokens) take one block each at
    # t=0. Step 1: A's first decode stores its 5th token: a 2nd block, none free -> B (FCFS
    # victim: the latest admitted) is preempted and A gets B's block; no admission in that step
    # (anti-thrash), and B cannot come back while A holds both blocks (steps 1-2). B restarts
    # at t=3 and recomputes prompt + first token in one step.
    (a, b), checks = checked_run(make_requests([(4, 3), (1, 2)], arrivals=[0.0, 0.0]),
                                 num_blocks=2, block_size=4)  # fmt: skip
    assert times(a) == (0.0, 1.0, 3.0) and a.preemptions == 0
    assert (b.first_scheduled, b.first_token, b.finish) == (0.0, 1.0, 4.0)
    assert b.preemptions == 1 and b.recomputed_tokens == 1
    assert checks.peak_used == 2
    assert checks.fed == {"r0": 4 + 2, "r1": 1 + 1 + 1}  # B computed its prompt twice


def test_no_admission_in_a_step_that_preempted():
    # vLLM's anti-thrash rule. 4 blocks of 2, sjf-oracle, two slots. A (prompt 2, 3 tokens: 1
    # block) and B (prompt 4, 4 tokens: 2 blocks) start at t=0; C (prompt 1, 1 token) arrives at
    # 0.5 and waits for a slot. Step 1 (t=1): A's decode takes the last block, B's needs a 3rd
    # and B is preempted (its own victim), which frees a slot and 2 blocks that C, the shortest
    # waiting request, would fit in; but nothing is admitted in a step that preempted, so C
    # starts at t=2 (beside A's last decode). B, needing 3 blocks for prompt + its generated
    # token, starts again at t=3, when A and C have finished: one step for 5 tokens, 2 decodes.
    reqs = make_requests([(2, 3), (4, 4), (1, 1)], arrivals=[0.0, 0.0, 0.5])
    (a, b, c), _ = checked_run(reqs, "sjf-oracle", num_blocks=4, block_size=2, max_num_seqs=2)
    assert times(a) == (0.0, 1.0, 3.0)
    assert times(c) == (2.0, 3.0, 3.0)
    assert times(b) == (0.0, 1.0, 6.0) and b.preemptions == 1 and b.recomputed_tokens == 4


def test_a_running_prefill_chunk_is_capped_by_the_step_budget():
    # Budget 3: an 8-token prompt, alone, is prefilled 3 + 3 + 2 (the last chunk samples).
    (a,), checks = checked_run(make_requests([(8, 2)], arrivals=[0.0]), max_num_batched_tokens=3)
    assert times(a) == (0.0, 3.0, 4.0) and checks.steps == 4


def test_a_victim_served_earlier_in_the_step_is_taken_out_of_its_shape(monkeypatch):
    # mlfq with preemption (test_mlfq.py's LONG case): at t=6 r0 (demoted to level 1) has been
    # given its decode in phase A when r1 (level 0) preempts it for the only slot: Batch.remove
    # takes r0's decode back out of the step's shape (StepChecks recomputes the shape from the
    # batch's requests), and that step is r1's prefill alone.
    from presched.sim.scheduler import Batch

    removed = []
    remove = Batch.remove
    def spy(self, seq):  # the real method, recording who it took out
        removed.append(seq.id)
        return remove(self, seq)

    monkeypatch.setattr(Batch, "remove", spy)
    pol = preemptive_mlfq()
    reqs = make_requests([(1, 10), (1, 2), (1, 1)], [0.0, 1.5, 5.5])
    (r0, r1, r2), _ = checked_run(reqs, pol, max_num_seqs=1)
    assert removed == ["r0"] and r0.preemptions == 1
    assert (r1.first_scheduled, r1.finish, r2.finish, r0.finish) == (6.0, 8.0, 9.0, 13.0)


def test_a_running_prefill_chunk_is_capped_by_the_threshold_unless_it_is_alone():
    # long_prefill_token_threshold 2: a 5-token prompt alone takes the whole budget (vLLM 0.32:
    # the cap only binds with more than one running or waiting request: nobody to starve)
    (a,), _ = checked_run(make_requests([(5, 2)], arrivals=[0.0]), long_prefill_token_threshold=2)
    assert times(a) == (0.0, 1.0, 2.0)
    # beside a running request (prompt 1, 12 tokens), a 9-token prompt arriving at 0.5 is
    # prefilled 2 + 2 + 2 + 2 + 1 in steps 1..5
    (a, b), _ = checked_run(make_requests([(1, 12), (9, 2)], arrivals=[0.0, 0.5]), long_prefill_token_threshold=2)
    assert b.first_token == 6.0  # steps 1..5 carry its chunks of 2, 2, 2, 2, 1 beside a's decodes


def test_recompute_prefills_prompt_and_generated_tokens_again():
    # A budget of 3 tokens, 2 blocks of 2. A (prompt 2, 3 tokens) and B (prompt 1,
    # 3 tokens) start at t=0 (a block each). Step 1: A's decode needs a 2nd block: B (FCFS
    # victim) is preempted after 1 token. A finishes at 3; B then recomputes prompt + its token
    # (2 tokens, one step: tok2 @4) and decodes its 3rd @5. Recompute that kept `computed`
    # would also finish B at 5 here with 1 s steps: the token count (fed_tokens) tells them apart.
    reqs = make_requests([(2, 3), (1, 3)], arrivals=[0.0, 0.0])
    (a, b), checks = checked_run(reqs, num_blocks=2, block_size=2, max_num_batched_tokens=3)
    assert times(a) == (0.0, 1.0, 3.0)
    assert (b.first_token, b.finish, b.preemptions, b.recomputed_tokens) == (1.0, 5.0, 1, 1)
    assert checks.fed["r1"] == 1 + 1 + 2  # prompt, then prompt + token 1 again, then token 2


def test_itl_log_of_a_decode_run_grows_with_the_context():
    # decode step = 1 s + 0.25 s per context token; prefill 1 s. One request, prompt 1, 4 tokens:
    # tok1 @1, then decodes at context 2, 3, 4: gaps 1.5, 1.75, 2.0, both modes alike
    model = FittedStepModel(dict(a_prefill=1.0, b_prefill=0, c_prefill=0,
                                 a_decode=1.0, b_decode=0.25, c_decode=0))  # fmt: skip
    for ff in (True, False):
        inst = make_engine(step_model=model, fast_forward=ff)
        (a,) = run_engine(inst, make_requests([(1, 4)], arrivals=[0.0]))
        v, w = inst.itl.values()
        assert sorted(np.repeat(v, w).tolist()) == [1.5, 1.75, 2.0], ff
        assert (a.first_token, a.finish, a.max_itl) == (1.0, 6.25, 2.0)


def test_a_decode_run_that_exactly_fills_the_kv_is_one_fast_forwarded_run():
    # 3 blocks of 4 = 12 tokens = prompt 4 + 9 tokens - 1. After the prefill, the 8 decodes run
    # as one closed-form run: the KV limit allows every step up to the last free block
    inst = make_engine(num_blocks=3, block_size=4)
    (a,) = run_engine(inst, make_requests([(4, 9)], arrivals=[0.0]))
    assert a.finish == 9.0 and inst.num_steps == 9 and inst.num_runs == 1


def test_a_fast_forwarded_run_cut_by_an_arrival_holds_the_blocks_of_its_tokens():
    # One slot, blocks of 4. r0 (prompt 4, 9 tokens) decodes from t=1 as one planned run; r1
    # arrives at 5.5 and cuts it after the 5 steps that start before 5.5: r0 has computed 9
    # tokens and must hold 3 blocks (StepChecks checks it there). r1 waits for the slot.
    (r0, r1), checks = checked_run(make_requests([(4, 9), (1, 1)], arrivals=[0.0, 5.5]),
                                   num_blocks=4, block_size=4, max_num_seqs=1)  # fmt: skip
    assert r0.finish == 9.0 and times(r1) == (9.0, 10.0, 10.0)
    assert checks.runs >= 2


def test_a_victim_taken_out_of_the_step_gives_its_budget_back():
    # The case above with a 2-token budget and r1's prompt 2 tokens (level 0 all the same). At
    # t=6 r0's decode (1 token) leaves 1 token of budget; r1 preempts r0 for the slot, and the
    # token r0 gives back lets r1's whole prompt in: tok1 @7, done @8; r2 @9; r0 then recomputes
    # 1 + 6 tokens in chunks of 2 (tok7 @13) and decodes 3 more: done @16.
    pol = preemptive_mlfq()
    reqs = make_requests([(1, 10), (2, 2), (1, 1)], [0.0, 1.5, 5.5])
    (r0, r1, r2), _ = checked_run(reqs, pol, max_num_seqs=1, max_num_batched_tokens=2)
    assert times(r1) == (6.0, 7.0, 8.0) and r2.finish == 9.0
    assert (r0.preemptions, r0.recomputed_tokens, r0.finish) == (1, 6, 16.0)


def _timeline(seqs):
    return [(s.id, s.first_scheduled, s.finish, s.preemptions) for s in seqs]


def test_a_preempted_request_resumes_before_the_waiting_ones_that_arrived_with_it():
    # vLLM 0.32 puts a preempted request at the front of the waiting queue; presched's queue
    # pushed it behind every waiting request of the same arrival time (a new FIFO tie). Six
    # requests (prompt 20, 30 tokens) at t = 0, 3 slots, 100 one-token blocks; the times are
    # vLLM 0.32's own Scheduler run on 1 s steps (a reviewer's harness), which presched now
    # matches: r2 is preempted and resumes before r3 (it resumed last: r3 finished at 64, not 60)
    seqs, _ = checked_run(make_requests([(20, 30)] * 6, arrivals=[0.0] * 6), num_blocks=100,
                          max_num_seqs=3, block_size=1, max_num_batched_tokens=512)  # fmt: skip
    assert _timeline(seqs) == [("r0", 0.0, 30.0, 0), ("r1", 0.0, 30.0, 0), ("r2", 0.0, 46.0, 1),
                               ("r3", 30.0, 60.0, 0), ("r4", 30.0, 67.0, 1), ("r5", 46.0, 84.0, 1)]  # fmt: skip


def test_a_request_starts_only_when_its_whole_sequence_fits_not_its_first_chunk():
    # vLLM 0.32 admits a waiting request only if blocks for all its tokens are free
    # (scheduler_reserve_full_isl, on by default). 100 blocks of 16, a 512-token budget: A
    # (prompt 1000, 40 tokens) at 0 holds 63 blocks; B (prompt 1000, 5) at 0.5 needs 63 more and
    # waits for A (vLLM: first scheduled at 41, finished at 47). presched started B on its first
    # chunk and preempted it 19 times (finish 46).
    (a, b), _ = checked_run(make_requests([(1000, 40), (1000, 5)], arrivals=[0.0, 0.5]), num_blocks=100,
                            block_size=16, max_num_batched_tokens=512)  # fmt: skip
    assert _timeline([a, b]) == [("r0", 0.0, 41.0, 0), ("r1", 41.0, 47.0, 0)]
