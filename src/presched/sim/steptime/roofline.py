"""Roofline step-time model: a step takes as long as the slower of its FLOPs and its bytes.

For a step of shape (P prefill tokens, `pairs` causal attention pairs, prefill context Cp,
B decoding requests, decode context C) on one GPU of a deployment with tensor parallelism tp,
expert parallelism ep and dp data-parallel attention ranks (specs.py for the model terms),
T = P + B tokens, and S = ep if ep > 1 else tp (ways the routed experts are split):

    FLOPs  = 2 * dense_params * T / tp                              linear layers, 2 FLOP/MAC
             + 2 * L_moe * k * routed_expert_params * T * dp / S     routed experts (T * dp
                                                                     tokens reach the EP group)
             + attn_flops_per_pair * (L_full * (pairs + C)
                                      + L_slide * (pairs + min(C, B * w))) / tp
    bytes  = dense_params * b(weight_dtype) / tp                    weights read once
             + L_moe * D(T * dp) * routed_expert_params * b(expert_dtype) / S
                                                                    distinct experts read (moe.py)
             + kv_layer * (L_attn * (Cp + T) + L_full * C + L_slide * min(C, B * w)) / kv_shards
                                                                    KV read and written
             + 2 * B * L_ssm * ssm_state_bytes / tp                 SSM state read and written

    t_compute = dense FLOPs / (flops_for(weight_dtype) * compute_efficiency)
                + attention FLOPs / (flops_for(kv_dtype) * compute_efficiency)
                + expert FLOPs / (flops_for(expert_dtype) * compute_efficiency)
    t_memory  = bytes / (mem_bandwidth * memory_efficiency)
    t_comm    = 2 * L * (interconnect_latency                       tp > 1: two ring all-reduces
                + 2 (tp-1)/tp * T * hidden_size * 2 / interconnect_bandwidth)     per layer
              + 2 * L_moe * (interconnect_latency                   ep > 1: dispatch + combine
                + T * dp / ep * k * hidden_size * 2 * (ep-1)/ep / interconnect_bandwidth)

    step_time = step_overhead + overhead_per_decode * B + overhead_per_prefill_token * P
                + t_comm + max(t_compute, t_memory)

`collective_latency`, when given, replaces the hardware's interconnect_latency, and
`overhead_per_layer` * L (0 by default) adds per-layer fixed costs (launches, synchronisation)
to t_comm. For a dense GQA model without sliding windows (all Llama-3.x presets) this is the
original formula: FLOPs = 2 * num_params * T / tp + 4 * L * H * d * (pairs + C) / tp, bytes =
weight_bytes / tp + kv_tok * (Cp + C + T).

Simplifications: the step sees only sums of contexts, so a sliding-window layer's decode reads
are taken as min(C, B * w) (>= the true sum of min(c_i, w)) and prefill chunks are not capped;
the SSM state of prefilling sequences is not counted (prefill is compute-bound); routing is
uniform across experts and DP ranks are balanced. The overheads stand for what a roofline
misses (scheduler and sampling CPU time, launches, imperfect overlap) and sit outside the max.

Decode-only steps (P = pairs = Cp = 0) with fixed B are piecewise linear in C (a kink at
C = B * w when there are sliding layers), so their duration is the larger of two lines on each
piece; `decode_line` returns the line that wins at C and the context where the other line
overtakes it or the piece ends (or infinity), which is what the simulator's fast-forward needs.
"""

from __future__ import annotations

import math

from presched.sim.steptime.base import StepTimeModel
from presched.sim.steptime.dtypes import ACTIVATION_BYTES
from presched.sim.steptime.moe import expected_distinct_experts
from presched.sim.steptime.specs import HardwareSpec, ModelSpec

# Defaults. The two overheads are fitted (benchmarks/steptime_vs_mlenergy.py, docs/steptime.md)
# to ML.ENERGY's measured median ITL and throughput of Llama-3.1-8B-Instruct on one H100 (vLLM,
# lm-arena-chat) at max_num_seqs 8..768; the efficiencies are round values.
DEFAULT_COMPUTE_EFFICIENCY = 0.5
"""Fraction of dense peak FLOP/s that large GEMMs + FlashAttention reach in serving (MFU)."""
DEFAULT_MEMORY_EFFICIENCY = 0.8
"""Fraction of datasheet HBM bandwidth that decode GEMV/GEMM + paged attention reach."""
DEFAULT_STEP_OVERHEAD = 1.04e-3
"""Seconds per step outside the GPU roofline: scheduling, input prep, launches, sampling."""
DEFAULT_OVERHEAD_PER_DECODE = 49.0e-6
"""Seconds per decoding request per step: per-sequence CPU work (sampling, output processing,
detokenisation) and attention inefficiency that the bandwidth term does not capture."""
DEFAULT_OVERHEAD_PER_PREFILL_TOKEN = 0.0
"""Seconds per prefill token outside the roofline (off by default)."""


class RooflineStepModel(StepTimeModel):
    """Analytical step time from a `ModelSpec` and a `HardwareSpec`; formulas in the module
    docstring. Arguments are validated and a ValueError names the bad argument."""

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareSpec,
        tp: int = 1,
        compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY,
        memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY,
        step_overhead: float = DEFAULT_STEP_OVERHEAD,
        overhead_per_decode: float = DEFAULT_OVERHEAD_PER_DECODE,
        overhead_per_prefill_token: float = DEFAULT_OVERHEAD_PER_PREFILL_TOKEN,
        ep: int = 1,
        dp: int = 1,
        collective_latency: float | None = None,
        overhead_per_layer: float = 0.0,
    ) -> None:
        model.check_parallel(tp, ep, dp)
        for name, value in (
            ("compute_efficiency", compute_efficiency),
            ("memory_efficiency", memory_efficiency),
        ):
            if not (isinstance(value, (int, float)) and 0 < value <= 1):
                raise ValueError(f"{name}: got {value!r}, expected a number in (0, 1]")
        for name, value in (
            ("step_overhead", step_overhead),
            ("overhead_per_decode", overhead_per_decode),
            ("overhead_per_prefill_token", overhead_per_prefill_token),
            ("collective_latency", 0.0 if collective_latency is None else collective_latency),
            ("overhead_per_layer", overhead_per_layer),
        ):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: got {value!r}, expected a finite number of seconds >= 0")
        self.model, self.hardware = model, hardware
        self.tp, self.ep, self.dp = tp, ep, dp
        self.compute_efficiency = float(compute_efficiency)
        self.memory_efficiency = float(memory_efficiency)
        self.step_overhead = float(step_overhead)
        self.overhead_per_decode = float(overhead_per_decode)
        self.overhead_per_prefill_token = float(overhead_per_prefill_token)
        self.overhead_per_layer = float(overhead_per_layer)

        m, eff = model, self.compute_efficiency
        dense_rate = hardware.flops_for(m.weight_dtype) * eff  # FLOP/s per GPU
        memory_rate = hardware.mem_bandwidth * self.memory_efficiency  # bytes/s per GPU
        shards = ep if ep > 1 else tp  # ways the routed experts are split
        # Seconds per unit, per GPU (dense parts: the original Llama terms):
        self._t_per_token_flops = 2.0 * m.streamed_params / tp / dense_rate  # per P or B token
        # attention multiplies activations by the KV cache, at its format's rate (BF16 KV:
        # BF16 tensor cores, whatever format the weights are in)
        attn_rate = hardware.flops_for(m.kv_dtype) * eff
        attn = m.attention_flops_per_pair / tp / attn_rate  # per pair, per attention layer
        self._t_per_pair_flops = attn * m.attention_layers  # prefill pairs, every layer
        full_layers = m.attention_layers - m.num_sliding_layers
        self._t_per_ctx_flops = attn * full_layers  # decode context, full-attention layers
        self._t_per_win_flops = attn * m.num_sliding_layers  # per min(C, B*w)
        self._window = m.sliding_window if m.num_sliding_layers else None
        dense_weight_bytes = m.streamed_params * m.weight_bytes_per_param
        self._t_weights = dense_weight_bytes / tp / memory_rate
        kv_layer = m.kv_bytes_per_layer / m.kv_shards(tp) / memory_rate
        self._t_per_kv_token = kv_layer * m.attention_layers  # prefill context and new tokens
        self._t_per_ctx_kv = kv_layer * full_layers
        self._t_per_win_kv = kv_layer * m.num_sliding_layers
        self._t_per_ssm_seq = 2.0 * m.num_ssm_layers * m.ssm_state_bytes / tp / memory_rate
        # routed experts: FLOPs per token reaching the group, bytes per distinct expert
        if m.is_moe:
            expert_rate = hardware.flops_for(m.expert_dtype or m.weight_dtype) * eff
            self._t_expert_flops = (2.0 * m.moe_layers * m.experts_per_token
                                    * m.routed_expert_params * dp / shards / expert_rate)
            self._t_per_expert = (m.moe_layers * m.routed_expert_params
                                  * m.expert_bytes_per_param / shards / memory_rate)
        else:
            self._t_expert_flops = self._t_per_expert = 0.0
        # communication
        bw = hardware.interconnect_bandwidth
        lat = hardware.interconnect_latency if collective_latency is None else collective_latency
        self.collective_latency = float(lat)
        self._decode_memo: dict[int, tuple] = {}  # decode_line's terms per batch size
        self._t_comm_fixed = self.overhead_per_layer * m.num_layers
        self._t_comm_per_token = 0.0
        if tp > 1:
            n_allreduce = 2 * m.num_layers
            self._t_comm_fixed += n_allreduce * lat
            self._t_comm_per_token += (
                n_allreduce * 2.0 * (tp - 1) / tp * m.hidden_size * ACTIVATION_BYTES / bw
            )
        if ep > 1:
            n_a2a = 2 * m.moe_layers
            self._t_comm_fixed += n_a2a * lat
            self._t_comm_per_token += (n_a2a * dp / ep * m.experts_per_token * m.hidden_size
                                       * ACTIVATION_BYTES * (ep - 1) / ep / bw)  # fmt: skip

    # ---- pieces --------------------------------------------------------------------------
    def distinct_experts(self, tokens: float) -> float:
        """Expected distinct routed experts per MoE layer a step of `tokens` tokens (on this DP
        rank; dp * tokens reach the expert group) reads, over the whole group (moe.py)."""
        if not self.model.is_moe:
            return 0.0
        m = self.model
        return expected_distinct_experts(m.num_experts, m.experts_per_token, tokens * self.dp)

    def _token_terms(self, tokens: int) -> tuple[float, float]:
        """(compute, memory) seconds that depend on the step's token count only."""
        t_c = (self._t_per_token_flops + self._t_expert_flops) * tokens
        t_m = self._t_weights + self._t_per_kv_token * tokens
        if self._t_per_expert and tokens:
            t_m += self._t_per_expert * self.distinct_experts(tokens)
        return t_c, t_m

    def _overheads(self, prefill_tokens: int, num_decode: int) -> float:
        tokens = prefill_tokens + num_decode
        return (
            self.step_overhead
            + self.overhead_per_decode * num_decode
            + self.overhead_per_prefill_token * prefill_tokens
            + self._t_comm_fixed + self._t_comm_per_token * tokens
        )

    def step_time(
        self,
        prefill_tokens: int,
        prefill_pairs: float,
        prefill_context: int,
        num_decode: int,
        decode_context: int,
    ) -> float:
        tokens = prefill_tokens + num_decode
        t_c, t_m = self._token_terms(tokens)
        c = decode_context
        win = c if self._window is None else min(c, num_decode * self._window)
        t_c += (self._t_per_pair_flops * prefill_pairs + self._t_per_ctx_flops * c
                + self._t_per_win_flops * win)  # fmt: skip
        t_m += (self._t_per_kv_token * prefill_context + self._t_per_ctx_kv * c
                + self._t_per_win_kv * win + self._t_per_ssm_seq * num_decode)  # fmt: skip
        return self._overheads(prefill_tokens, num_decode) + (t_m if t_m > t_c else t_c)  # max

    def _decode_lines(self, b: int, c: int) -> tuple[float, float, float, float, float]:
        """Compute and memory terms of a decode-only step as lines in C on the piece holding
        `c`: (c0, c1, m0, m1, last context of the piece)."""
        c0, m0 = self._token_terms(b)
        m0 += self._t_per_ssm_seq * b
        c1, m1 = self._t_per_ctx_flops, self._t_per_ctx_kv
        end = math.inf
        if self._window is not None:
            kink = b * self._window
            if c < kink:  # min(C, B w) = C up to the kink
                c1, m1 = c1 + self._t_per_win_flops, m1 + self._t_per_win_kv
                end = float(kink)
            else:  # constant past it
                c0, m0 = c0 + self._t_per_win_flops * kink, m0 + self._t_per_win_kv * kink
        return c0, c1, m0, m1, end

    def decode_line(self, num_decode: int, decode_context: int) -> tuple[float, float, float]:
        b, c = num_decode, decode_context
        d = self._decode_memo.get(b)
        if d is None:
            d = self._decode_memo[b] = self._decode_terms(b)
        lines = d[6] if d[6] is not None else self._decode_lines(b, c)
        c0, c1, m0, m1, end = lines
        t_c, t_m = c0 + c1 * c, m0 + m1 * c
        if t_c > t_m or (t_c == t_m and c1 >= m1):
            d0, d1, o0, o1 = c0, c1, m0, m1  # compute-bound at C
        else:
            d0, d1, o0, o1 = m0, m1, c0, c1  # memory-bound at C
        if o1 > d1:
            # The other line overtakes at C* = (d0 - o0) / (o1 - d1) >= C; contexts are
            # integers, so the line is exact for every integer context up to floor(C*).
            valid_until = float(max(c, math.floor((d0 - o0) / (o1 - d1))))
        else:
            valid_until = math.inf
        # the step's time: `step_time(0, 0, 0, b, c)`, the same operations on the memoized terms
        tc, tm, overheads, zero_c, zero_m, ssm, _ = d
        win = c if self._window is None else min(c, b * self._window)
        tc += zero_c + self._t_per_ctx_flops * c + self._t_per_win_flops * win
        tm += zero_m + self._t_per_ctx_kv * c + self._t_per_win_kv * win + ssm
        t0 = overheads + (tm if tm > tc else tc)  # max(tc, tm)
        return t0, d1, valid_until if end == math.inf else min(valid_until, max(float(c), end))

    def _decode_terms(self, b: int) -> tuple:
        """The terms of a decode-only step of `b` requests that do not depend on its context,
        as `step_time` computes them, and its lines when they do not either (no sliding
        window): memoized per b, since fast-forwarded runs ask again and again."""
        tc, tm = self._token_terms(b)
        lines = self._decode_lines(b, 0) if self._window is None else None
        return (tc, tm, self._overheads(0, b), self._t_per_pair_flops * 0,
                self._t_per_kv_token * 0, self._t_per_ssm_seq * b, lines)  # fmt: skip

    def decode_crossover(self, num_decode: int) -> float:
        """Decode context C* where a decode-only step of `num_decode` requests turns from
        compute- to memory-bound (or back), on the piece at C = 0; may be negative or inf."""
        c0, c1, m0, m1, _ = self._decode_lines(num_decode, 0)
        if c1 == m1:
            return math.inf
        return (m0 - c0) / (c1 - m1)

    def describe(self) -> str:
        par = f"{self.tp}x" if self.ep == 1 and self.dp == 1 else (
            f"tp{self.tp} ep{self.ep} dp{self.dp} ")
        return (
            f"roofline {self.model.name} on {par}{self.hardware.name} "
            f"(eff_c {self.compute_efficiency:g}, eff_m {self.memory_efficiency:g}, "
            f"overhead {self.step_overhead * 1e3:g} ms + {self.overhead_per_decode * 1e6:g} us/seq)"
        )
