"""Roofline on MoE, FP8, MLA, sliding-window and SSM models: closed forms of the limits,
expected distinct experts, EP/DP terms, and exact decode lines across the sliding-window kink."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.sim.steptime import HardwareSpec, RooflineStepModel, get_hardware, get_model
from presched.sim.steptime.moe import expected_distinct_experts
from presched.sim.steptime.specs import ModelSpec

H100, B200 = get_hardware("h100-sxm"), get_hardware("b200")
BARE = dict(step_overhead=0.0, overhead_per_decode=0.0, compute_efficiency=1.0,
            memory_efficiency=1.0)  # fmt: skip
NO_LINK = HardwareSpec(**{**H100.model_dump(), "interconnect_bandwidth": 1e30,
                          "interconnect_latency": 0.0})  # fmt: skip


def decode(r, b, c):
    return r.step_time(0, 0, 0, b, c)


# ---- expected distinct experts ---------------------------------------------------------------
def test_distinct_experts_closed_form_and_limits():
    E, k = 128, 8
    assert expected_distinct_experts(E, k, 0) == 0
    assert expected_distinct_experts(E, k, 1) == pytest.approx(k, rel=1e-12)
    for t in (2, 7, 64, 300):
        assert expected_distinct_experts(E, k, t) == pytest.approx(E * (1 - (1 - k / E) ** t))
    values = [expected_distinct_experts(E, k, t) for t in range(0, 400)]
    assert all(b > a for a, b in zip(values, values[1:]))  # strictly more with more tokens
    assert values[-1] == pytest.approx(E, rel=1e-6)  # a big batch reads (almost) every expert
    assert expected_distinct_experts(8, 8, 3) == 8


def test_distinct_experts_matches_uniform_routing_by_sampling():
    rng = np.random.default_rng(0)
    E, k = 64, 4
    for tokens in (1, 5, 20, 80):
        seen = [len({e for _ in range(tokens) for e in rng.choice(E, k, replace=False)})
                for _ in range(2000)]  # fmt: skip
        assert np.mean(seen) == pytest.approx(expected_distinct_experts(E, k, tokens), rel=0.02)


@pytest.mark.parametrize("args,field", [((0, 1, 1), "num_experts"), ((8, 9, 1), "experts_per_token"),
                                        ((8, 2, -1), "tokens"), ((8, 2, math.nan), "tokens")])
def test_distinct_experts_bad_input(args, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        expected_distinct_experts(*args)


# ---- weight-bound decode: bytes / bandwidth ----------------------------------------------------
def test_moe_decode_reads_dense_plus_expected_distinct_experts():
    m = get_model("qwen3-30b-a3b")
    r = RooflineStepModel(m, H100, **BARE)
    expert_bytes = m.moe_layers * m.routed_expert_params * 2
    kv = m.kv_bytes_per_token / H100.mem_bandwidth
    for b in (1, 4, 32):
        c = 100 * b
        want = (m.streamed_params * 2 + expert_bytes * expected_distinct_experts(128, 8, b)
                + m.kv_bytes_per_token * (c + b)) / H100.mem_bandwidth  # fmt: skip
        assert decode(r, b, c) == pytest.approx(want, rel=1e-12)
    # batch 1 reads exactly the active parameters; a batch reads more, but not all experts
    assert decode(r, 1, 0) == pytest.approx(
        (m.active_params - m.lookup_params) * 2 / H100.mem_bandwidth + kv)
    t32 = decode(r, 32, 0) - 32 * kv
    assert m.active_params * 2 / H100.mem_bandwidth < t32 < m.weight_bytes / H100.mem_bandwidth


def test_fp8_halves_the_weight_bound_decode_time():
    bf16, fp8 = get_model("qwen3-235b-a22b"), get_model("qwen3-235b-a22b-fp8")
    r16 = RooflineStepModel(bf16, NO_LINK, tp=8, **BARE)
    r8 = RooflineStepModel(fp8, NO_LINK, tp=8, **BARE)
    w16 = decode(r16, 1, 0) - bf16.kv_bytes_per_token_per_gpu(8) / H100.mem_bandwidth
    w8 = decode(r8, 1, 0) - fp8.kv_bytes_per_token_per_gpu(8) / H100.mem_bandwidth
    assert w8 == pytest.approx(w16 / 2, rel=1e-12)
    # FP8 GEMMs on FP8 tensor cores: compute-bound prefill is also ~2x faster
    p = 8192
    assert r8.step_time(p, 0, 0, 0, 0) == pytest.approx(r16.step_time(p, 0, 0, 0, 0) / 2, rel=0.01)


def test_attention_computes_at_the_kv_cache_formats_rate():
    """FP8 weights with a BF16 KV cache: the linear layers use FP8 tensor cores, attention
    (activations x BF16 KV) the BF16 ones; an FP8 KV cache moves attention to FP8 too."""
    bf16 = get_model("llama-3.1-405b")
    fp8 = get_model("llama-3.1-405b-fp8")
    fp8_kv = fp8.model_copy(update={"kv_dtype": "fp8"})
    p, pairs = 8192, 8192 * 8193 / 2  # compute-bound prefill of one long prompt

    def attention(spec):  # the pair term alone: the same step with and without its pairs
        r = RooflineStepModel(spec, NO_LINK, tp=8, **BARE)
        return r.step_time(p, pairs, p, 0, 0) - r.step_time(p, 0, p, 0, 0)

    per_pair = bf16.attention_flops_per_pair * bf16.attention_layers / 8
    assert attention(bf16) == pytest.approx(per_pair * pairs / H100.peak_flops, rel=1e-9)
    assert attention(fp8) == pytest.approx(attention(bf16), rel=1e-9)
    assert attention(fp8_kv) == pytest.approx(per_pair * pairs / H100.peak_flops_fp8, rel=1e-9)


def test_expert_parallel_splits_experts_and_adds_all_to_all():
    m = get_model("qwen3-30b-a3b")
    r = RooflineStepModel(m, NO_LINK, tp=4, ep=4, **BARE)
    b = 16
    d = expected_distinct_experts(128, 8, b)
    want = (m.streamed_params * 2 / 4 + m.moe_layers * d * m.routed_expert_params * 2 / 4
            + m.kv_bytes_per_token_per_gpu(4) * b) / H100.mem_bandwidth  # fmt: skip
    assert decode(r, b, 0) == pytest.approx(want, rel=1e-12)
    real = RooflineStepModel(m, H100, tp=4, ep=4, **BARE)
    comm = (2 * 48 * (H100.interconnect_latency + 2 * 3 / 4 * b * 2048 * 2 / H100.interconnect_bandwidth)
            + 2 * 48 * (H100.interconnect_latency
                        + b / 4 * 8 * 2048 * 2 * 3 / 4 / H100.interconnect_bandwidth))  # fmt: skip
    assert decode(real, b, 0) - decode(r, b, 0) == pytest.approx(comm, rel=1e-9)


def test_data_parallel_ranks_share_the_experts():
    m = get_model("qwen3-30b-a3b")
    one = RooflineStepModel(m, NO_LINK, tp=1, ep=4, dp=4, **BARE)
    # a rank's 8 tokens meet 3 x 8 more at the experts: the step reads D(32) experts
    assert one.distinct_experts(8) == pytest.approx(expected_distinct_experts(128, 8, 32))
    want = (m.streamed_params * 2 + m.moe_layers * expected_distinct_experts(128, 8, 32)
            * m.routed_expert_params * 2 / 4 + m.kv_bytes_per_token * 8) / H100.mem_bandwidth
    assert decode(one, 8, 0) == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="^ep: 4 != tp \\* dp = 2"):
        RooflineStepModel(m, H100, tp=1, ep=4, dp=2)


def test_mla_kv_slope_from_the_latent_not_split_by_tp():
    m = get_model("deepseek-v3")
    r = RooflineStepModel(m, H100, tp=8, ep=8, **BARE)
    _, slope, valid = r.decode_line(4, 4 * 2000)
    assert valid == math.inf
    assert slope == pytest.approx(61 * 576 * 2 / H100.mem_bandwidth, rel=1e-12)


def test_sliding_window_line_kinks_at_batch_times_window():
    m = get_model("gemma-3-27b")
    r = RooflineStepModel(m, H100)
    b, w = 8, 1024
    t, slope, valid = r.decode_line(b, 100 * b)
    assert valid == b * w  # the line holds up to the kink ...
    for c in (100 * b, 500 * b, b * w):
        assert t + slope * (c - 100 * b) == pytest.approx(decode(r, b, c), rel=1e-12)
    t2, slope2, valid2 = r.decode_line(b, b * w + 1)  # ... and past it only full layers grow
    full = m.kv_bytes_per_layer * (62 - 52) / (H100.mem_bandwidth * r.memory_efficiency)
    assert valid2 == math.inf and slope2 == pytest.approx(full, rel=1e-12)
    assert slope2 < slope


def test_ssm_layers_read_and_write_their_state():
    base = dict(name="hybrid", num_params=9e9, num_layers=56, hidden_size=4480, num_heads=40,
                num_kv_heads=8, head_dim=128, vocab_size=131072)  # fmt: skip
    hybrid = ModelSpec(**base, num_ssm_layers=52, ssm_state_bytes=2.7e6)
    r = RooflineStepModel(hybrid, H100, **BARE)
    assert hybrid.attention_layers == 4 and hybrid.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2
    b = 32
    state = 2 * b * 52 * 2.7e6 / H100.mem_bandwidth
    weights = (9e9 - 131072 * 4480) * 2 / H100.mem_bandwidth  # untied: input table looked up
    kv = hybrid.kv_bytes_per_token * (b * 500 + b) / H100.mem_bandwidth
    assert decode(r, b, b * 500) == pytest.approx(weights + kv + state, rel=1e-12)


def test_golden_step_times():
    """Regression values (seconds) with the default knobs; recompute only on purpose."""
    cases = {
        ("qwen3-30b-a3b", "h100-sxm", 1, 1): (0, 64, 64 * 600),
        ("llama-4-scout", "h100-sxm", 4, 4): (0, 128, 128 * 600),
        ("deepseek-v3", "b200", 8, 8): (512, 32, 32 * 900),
    }
    got = {k: RooflineStepModel(get_model(k[0]), get_hardware(k[1]), tp=k[2], ep=k[3]).step_time(
        s[0], s[0] * (s[0] + 1) / 2, s[0], s[1], s[2]) for k, s in cases.items()}
    assert got == pytest.approx({
        ("qwen3-30b-a3b", "h100-sxm", 1, 1): GOLDEN[0],
        ("llama-4-scout", "h100-sxm", 4, 4): GOLDEN[1],
        ("deepseek-v3", "b200", 8, 8): GOLDEN[2],
    }, rel=1e-9)


# 2026-12-07: the untied input tables (151936 x 2048, 202048 x 5120, 129280 x 7168) no longer
# read every step (-232 us, -193 us at tp 4, -18 us in FP8 at tp 8), and the default overheads
# refit to that (step 0.68 -> 1.04 ms, per decode 47.8 -> 49.0 us)
GOLDEN = (0.027791885816579355, 0.030063306236778435, 0.019943258476892906)

FAMILY = [
    RooflineStepModel(get_model("gemma-3-12b"), H100),
    RooflineStepModel(get_model("gpt-oss-120b"), B200, tp=2, ep=2),
    RooflineStepModel(get_model("qwen3-235b-a22b-fp8"), H100, tp=4, ep=8, dp=2),
    RooflineStepModel(get_model("deepseek-v3"), B200, tp=8, ep=8),
]


@settings(max_examples=150, deadline=None)
@given(b=st.integers(1, 2048), per_req=st.integers(0, 20000), frac=st.floats(0, 1),
       r=st.sampled_from(FAMILY))
def test_decode_line_exact_until_its_limit_for_every_family(b, per_req, frac, r):
    c = b * per_req
    t0, slope, valid = r.decode_line(b, c)
    assert t0 == decode(r, b, c) and valid >= c
    end = valid if math.isfinite(valid) else c + 10**7
    x = c + int(frac * (end - c))
    assert t0 + slope * (x - c) == pytest.approx(decode(r, b, x), rel=1e-9)


@settings(max_examples=150, deadline=None)
@given(p=st.integers(0, 8192), b=st.integers(0, 1024), bump=st.integers(1, 5000),
       which=st.integers(0, 1), r=st.sampled_from(FAMILY))
def test_monotone_in_tokens_for_every_family(p, b, bump, which, r):
    shape = [p, p * (p + 1) / 2, p, b, b * 700]
    bigger = list(shape)
    if which:
        bigger[3] += bump
    else:
        bigger[0] += bump
    assert r.step_time(*bigger) >= r.step_time(*shape)


def test_fixed_cost_knobs_add_their_closed_forms():
    m = get_model("llama-3.1-70b")
    base = RooflineStepModel(m, H100, tp=4)
    layer = RooflineStepModel(m, H100, tp=4, overhead_per_layer=10e-6)
    slow = RooflineStepModel(m, H100, tp=4, collective_latency=25e-6)
    for shape in ((0, 0, 0, 16, 16 * 500), (512, 512 * 513 / 2, 512, 8, 8 * 900)):
        assert layer.step_time(*shape) - base.step_time(*shape) == pytest.approx(80 * 10e-6)
        # two all-reduces per layer, each 20 us slower
        assert slow.step_time(*shape) - base.step_time(*shape) == pytest.approx(2 * 80 * 20e-6)
    with pytest.raises(ValueError, match="^collective_latency: got -1"):
        RooflineStepModel(m, H100, tp=4, collective_latency=-1)
