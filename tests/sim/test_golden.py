"""Hand-computed timelines with every step lasting exactly 1 s."""

from builders import linear_steps, make_engine, make_requests, run_engine


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
