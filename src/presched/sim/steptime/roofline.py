"""Roofline step-time model: a step takes as long as the slower of its FLOPs and its bytes.

For a step of shape (P prefill tokens, `pairs` causal attention pairs, prefill context Cp,
B decoding requests, decode context C) on a tp-way tensor-parallel group, per GPU:

    FLOPs  = [2 * num_params * (P + B)                          (all linear layers, 2 FLOP/MAC)
              + 4 * num_layers * num_heads * head_dim * (pairs + C)]  (QK^T and PV)   / tp
    bytes  = weight_bytes / tp                                   (every weight read once)
             + kv_tok * (Cp + C)                                 (KV cache read by attention)
             + kv_tok * (P + B)                                  (KV written for new tokens)
    with kv_tok = kv_bytes_per_token / min(tp, num_kv_heads)     (bytes per token per GPU)

    t_compute = FLOPs / (peak_flops * compute_efficiency)                  seconds
    t_memory  = bytes / (mem_bandwidth * memory_efficiency)                seconds
    t_comm    = 2 * num_layers * (interconnect_latency                     (tp > 1 only; two
                + 2 (tp-1)/tp * (P + B) * hidden_size * dtype_bytes         all-reduces per
                  / interconnect_bandwidth)                                  layer, ring)

    step_time = step_overhead + overhead_per_decode * B + overhead_per_prefill_token * P
                + t_comm + max(t_compute, t_memory)

The overheads stand for what a roofline misses (scheduler and sampling CPU time, kernel
launches, imperfect overlap); they sit outside the max. `2 * num_params` per token slightly
overcounts prefill (vLLM computes logits only for the last token of a prompt and the embedding
lookup is not a matmul); for Llama-3.1-8B that is ~13% of prefill FLOPs.

Decode-only steps (P = pairs = Cp = 0) with fixed B are linear in C in both terms, so their
duration is the larger of two lines; `decode_line` returns the line that wins at C and the
context where the other line overtakes it (or infinity), which is exactly what the simulator's
decode fast-forward needs.
"""

from __future__ import annotations

import math

from presched.sim.steptime.base import StepTimeModel
from presched.sim.steptime.specs import HardwareSpec, ModelSpec

# Defaults. The two overheads are fitted (benchmarks/steptime_vs_mlenergy.py, docs/steptime.md)
# to ML.ENERGY's measured median ITL and throughput of Llama-3.1-8B-Instruct on one H100 (vLLM,
# lm-arena-chat) at max_num_seqs 8..768; the efficiencies are round values.
DEFAULT_COMPUTE_EFFICIENCY = 0.5
"""Fraction of dense peak FLOP/s that large GEMMs + FlashAttention reach in serving (MFU)."""
DEFAULT_MEMORY_EFFICIENCY = 0.8
"""Fraction of datasheet HBM bandwidth that decode GEMV/GEMM + paged attention reach."""
DEFAULT_STEP_OVERHEAD = 0.68e-3
"""Seconds per step outside the GPU roofline: scheduling, input prep, launches, sampling."""
DEFAULT_OVERHEAD_PER_DECODE = 47.8e-6
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
    ) -> None:
        model.check_tp(tp)
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
        ):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: got {value!r}, expected a finite number of seconds >= 0")
        self.model = model
        self.hardware = hardware
        self.tp = tp
        self.compute_efficiency = float(compute_efficiency)
        self.memory_efficiency = float(memory_efficiency)
        self.step_overhead = float(step_overhead)
        self.overhead_per_decode = float(overhead_per_decode)
        self.overhead_per_prefill_token = float(overhead_per_prefill_token)

        compute_rate = hardware.peak_flops * self.compute_efficiency  # FLOP/s per GPU
        memory_rate = hardware.mem_bandwidth * self.memory_efficiency  # bytes/s per GPU
        # Seconds per unit, per GPU:
        self._t_per_token_flops = 2.0 * model.num_params / tp / compute_rate  # per P or B token
        self._t_per_pair_flops = (
            4.0 * model.num_layers * model.num_heads * model.head_dim / tp / compute_rate
        )  # per attention pair / context token
        self._t_weights = model.weight_bytes / tp / memory_rate
        self._t_per_kv_token = model.kv_bytes_per_token_per_gpu(tp) / memory_rate
        if tp > 1:
            n_allreduce = 2 * model.num_layers
            self._t_comm_fixed = n_allreduce * hardware.interconnect_latency
            self._t_comm_per_token = (
                n_allreduce * 2.0 * (tp - 1) / tp * model.hidden_size * model.dtype_bytes
                / hardware.interconnect_bandwidth
            )
        else:
            self._t_comm_fixed = 0.0
            self._t_comm_per_token = 0.0

    def step_time(
        self,
        prefill_tokens: int,
        prefill_pairs: float,
        prefill_context: int,
        num_decode: int,
        decode_context: int,
    ) -> float:
        tokens = prefill_tokens + num_decode
        t_compute = (
            self._t_per_token_flops * tokens
            + self._t_per_pair_flops * (prefill_pairs + decode_context)
        )
        t_memory = self._t_weights + self._t_per_kv_token * (
            prefill_context + decode_context + tokens
        )
        t_comm = self._t_comm_fixed + self._t_comm_per_token * tokens  # 0 when tp == 1
        return (
            self.step_overhead
            + self.overhead_per_decode * num_decode
            + self.overhead_per_prefill_token * prefill_tokens
            + t_comm
            + max(t_compute, t_memory)
        )

    def decode_line(self, num_decode: int, decode_context: int) -> tuple[float, float, float]:
        b, c = num_decode, decode_context
        # Both terms as lines in C: t = x0 + x1 * C.
        c0, c1 = self._t_per_token_flops * b, self._t_per_pair_flops
        m0, m1 = self._t_weights + self._t_per_kv_token * b, self._t_per_kv_token
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
        return self.step_time(0, 0, 0, b, c), d1, valid_until

    def decode_crossover(self, num_decode: int) -> float:
        """Decode context C* where a decode-only step of `num_decode` requests turns from
        compute- to memory-bound (or back); may be negative or inf when there is none."""
        c0, c1 = self._t_per_token_flops * num_decode, self._t_per_pair_flops
        m0, m1 = self._t_weights + self._t_per_kv_token * num_decode, self._t_per_kv_token
        if c1 == m1:
            return math.inf
        return (m0 - c0) / (c1 - m1)

    def describe(self) -> str:
        return (
            f"roofline {self.model.name} on {self.tp}x{self.hardware.name} "
            f"(eff_c {self.compute_efficiency:g}, eff_m {self.memory_efficiency:g}, "
            f"overhead {self.step_overhead * 1e3:g} ms + {self.overhead_per_decode * 1e6:g} us/seq)"
        )
