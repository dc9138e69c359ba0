"""Roofline step model: regimes, exact decode lines, monotonicity, TP, argument checks."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.sim.steptime import HardwareSpec, RooflineStepModel, get_hardware, get_model

M8, M70 = get_model("llama-3.1-8b"), get_model("llama-3.1-70b")
H100 = get_hardware("h100-sxm")
R8 = RooflineStepModel(M8, H100)
R70 = RooflineStepModel(M70, H100, tp=4)


def decode(model, b, c):
    return model.step_time(0, 0, 0, b, c)


def test_decode_batch_one_is_memory_bound_weights_over_bandwidth():
    r = RooflineStepModel(M8, H100, compute_efficiency=0.5, memory_efficiency=0.8,
                          step_overhead=1e-3, overhead_per_decode=0.0)
    t = decode(r, 1, 100)
    # the untied input embedding (128256 x 4096) is looked up, not read: 1.05 GB of 16.06 GB
    streamed = M8.weight_bytes - 128256 * 4096 * 2
    weights_time = streamed / (H100.mem_bandwidth * 0.8)
    assert t == pytest.approx(1e-3 + weights_time, rel=0.01)  # KV bytes of 100 tokens ~ 0.1%
    assert 6e-3 < t < 8e-3


def test_large_prefill_is_compute_bound_params_times_tokens():
    r = RooflineStepModel(M8, H100, compute_efficiency=0.5, step_overhead=0.0,
                          overhead_per_decode=0.0)
    p = 2048
    t = r.step_time(p, p * (p + 1) / 2, p, 0, 0)
    linear = 2 * (M8.num_params - 128256 * 4096) * p / (H100.peak_flops * 0.5)
    attention = 4 * 32 * 32 * 128 * p * (p + 1) / 2 / (H100.peak_flops * 0.5)
    assert t == pytest.approx(linear + attention, rel=1e-12)
    assert t == pytest.approx(linear, rel=0.05)
    assert t > M8.weight_bytes / (H100.mem_bandwidth * 0.8)  # not memory-bound


def test_a_tied_embedding_is_read_an_untied_input_table_is_only_looked_up():
    """Both hold vocab x hidden in memory; only the LM head is streamed every step."""
    untied = M8.model_copy(update={"name": "untied"})
    tied = M8.model_copy(update={"name": "tied", "tie_word_embeddings": True})
    assert untied.weight_bytes == tied.weight_bytes  # same memory (num_params is the same)
    table = 128256 * 4096
    assert untied.lookup_params == table and tied.lookup_params == 0
    kw = dict(step_overhead=0.0, overhead_per_decode=0.0)
    gap = decode(RooflineStepModel(tied, H100, **kw), 1, 100) - decode(
        RooflineStepModel(untied, H100, **kw), 1, 100)
    assert gap == pytest.approx(table * 2 / (H100.mem_bandwidth * 0.8), rel=1e-9)


def test_num_params_below_the_untied_embedding_is_refused_naming_it():
    with pytest.raises(ValueError, match="num_params.*input embedding"):
        M8.model_copy(update={"num_params": 0.5e9}).model_validate(
            M8.model_dump() | {"num_params": 0.5e9})


def test_decode_line_exact_on_both_sides_of_crossover():
    b = 512  # large enough to start compute-bound at short contexts
    cstar = R8.decode_crossover(b)
    assert 100 * b < cstar < 2000 * b
    # Compute-bound side: the compute line holds exactly up to floor(C*).
    c0 = 100 * b
    t0, slope, valid = R8.decode_line(b, c0)
    assert valid == math.floor(cstar)
    assert t0 == decode(R8, b, c0)
    assert slope == pytest.approx(4 * 32 * 32 * 128 / (H100.peak_flops * R8.compute_efficiency))
    for c in (c0, c0 + b, (c0 + valid) // 2, valid):
        assert t0 + slope * (c - c0) == pytest.approx(decode(R8, b, c), rel=1e-12)
    # ... and no further: past C* memory takes over and the compute line falls behind.
    beyond = valid + 50 * b
    assert t0 + slope * (beyond - c0) < decode(R8, b, beyond) * (1 - 1e-4)
    # Memory-bound side: the memory line (steeper) holds forever.
    c1 = math.ceil(cstar) + b
    t1, slope1, valid1 = R8.decode_line(b, c1)
    assert valid1 == math.inf
    kv_slope = M8.kv_bytes_per_token / (H100.mem_bandwidth * R8.memory_efficiency)
    assert slope1 == pytest.approx(kv_slope)
    for c in (c1, c1 + b, 10 * c1, 1000 * c1):
        assert t1 + slope1 * (c - c1) == pytest.approx(decode(R8, b, c), rel=1e-12)


def test_crossover_is_where_the_terms_meet():
    b = 512
    cstar = R8.decode_crossover(b)
    r = R8
    compute = r._t_per_token_flops * b + r._t_per_pair_flops * cstar
    memory = r._t_weights + r._t_per_kv_token * (b + cstar)
    assert compute == pytest.approx(memory, rel=1e-12)


def test_small_batch_decode_is_memory_bound_everywhere():
    for c in (8, 8_000, 800_000):
        _, slope, valid = R8.decode_line(8, c)
        assert valid == math.inf
        assert slope == pytest.approx(M8.kv_bytes_per_token / (H100.mem_bandwidth * 0.8))


@settings(max_examples=200, deadline=None)
@given(
    b=st.integers(1, 4096),
    per_req=st.integers(0, 32768),
    frac=st.floats(0, 1),
    tp_model=st.sampled_from([R8, R70, RooflineStepModel(M8, get_hardware("a100-80gb"), tp=2)]),
)
def test_decode_line_matches_step_time_until_its_limit(b, per_req, frac, tp_model):
    c = b * per_req
    t0, slope, valid = tp_model.decode_line(b, c)
    assert t0 == decode(tp_model, b, c)
    assert valid >= c
    end = valid if math.isfinite(valid) else c + 10**7
    x = c + int(frac * (end - c))
    assert t0 + slope * (x - c) == pytest.approx(decode(tp_model, b, x), rel=1e-9)



def test_decode_line_memo_gives_every_context_the_fresh_answer():
    """decode_line memoizes its context-free terms per batch size: a model that has answered
    for b before must answer any other context of b as a fresh model does (sliding windows
    included, whose line depends on the context through the kink at b * window)."""
    gemma = get_model("gemma-3-12b")
    for make in (lambda: RooflineStepModel(M8, H100), lambda: RooflineStepModel(gemma, H100)):
        used = make()
        for b in (1, 7, 300):
            for c in (0, 10 * b, 1000 * b, 5000 * b, 100_000 * b):  # gemma's kink: 1024 * b
                t0, slope, valid = got = used.decode_line(b, c)
                assert got == make().decode_line(b, c) and t0 == decode(used, b, c)
                end = valid if math.isfinite(valid) else c + 10**6
                assert valid > c  # (none of these contexts sits on a kink or crossover)
                assert t0 + slope * (end - c) == pytest.approx(decode(used, b, end), rel=1e-9)
                if math.isfinite(valid):  # ... and no further (a line that holds at c alone
                    beyond = valid + 100 * b  # would be exact too, and useless)
                    line = t0 + slope * (beyond - c)
                    assert line != pytest.approx(decode(used, b, beyond), rel=1e-9)
        assert len(used._decode_memo) == 3


shape = st.tuples(
    st.integers(0, 16384),  # prefill tokens
    st.floats(0, 2e8),  # pairs
    st.integers(0, 200_000),  # prefill context
    st.integers(0, 2048),  # decodes
    st.integers(0, 4_000_000),  # decode context
)


@settings(max_examples=300, deadline=None)
@given(base=shape, which=st.integers(0, 4), bump=st.integers(1, 100_000),
       model=st.sampled_from([R8, R70]))
def test_monotone_in_every_input(base, which, bump, model):
    bigger = list(base)
    bigger[which] += bump
    assert model.step_time(*bigger) >= model.step_time(*base)


def test_tensor_parallel_adds_the_all_reduce_term():
    fast_link = HardwareSpec(**{**H100.model_dump(), "interconnect_bandwidth": 1e30,
                                "interconnect_latency": 0.0})
    r_fast = RooflineStepModel(M70, fast_link, tp=4)
    for p, b in ((0, 64), (512, 16), (4096, 0)):
        tokens = p + b
        comm = 2 * 80 * (H100.interconnect_latency
                         + 2 * 3 / 4 * tokens * 8192 * 2 / H100.interconnect_bandwidth)
        shape_ = (p, p * (p + 1) / 2, p, b, b * 1000)
        assert R70.step_time(*shape_) - r_fast.step_time(*shape_) == pytest.approx(comm, rel=1e-9)
    # Sharding 70B over 8 GPUs instead of 4 makes small-batch decode faster.
    r8way = RooflineStepModel(M70, H100, tp=8)
    assert decode(r8way, 8, 8000) < decode(R70, 8, 8000)


def test_defaults_near_mlenergy_h100_small_batch_itl():
    """Calibration guard (docs/steptime.md): Llama-3.1-8B on one H100, a decode-only step at
    ~650 context tokens per request (~250 prompt + ~390 generated, the benchmark's mean) vs
    ML.ENERGY's median ITL (7.3 ms at 8, 11.5 ms at 64, 26.1 ms at 256). The full simulated
    comparison is benchmarks/steptime_vs_mlenergy.py."""
    assert decode(R8, 8, 8 * 650) == pytest.approx(7.3e-3, rel=0.10)
    assert decode(R8, 64, 64 * 650) == pytest.approx(11.5e-3, rel=0.10)
    assert decode(R8, 256, 256 * 650) == pytest.approx(26.1e-3, rel=0.10)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"compute_efficiency": -0.1}, "compute_efficiency"),
        ({"compute_efficiency": 1.5}, "compute_efficiency"),
        ({"memory_efficiency": 0}, "memory_efficiency"),
        ({"step_overhead": -1e-3}, "step_overhead"),
        ({"overhead_per_decode": float("nan")}, "overhead_per_decode"),
        ({"overhead_per_prefill_token": -1}, "overhead_per_prefill_token"),
        ({"tp": 3}, "tp"),
        ({"tp": 64}, "tp"),
    ],
)
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        RooflineStepModel(M8, H100, **kwargs)
