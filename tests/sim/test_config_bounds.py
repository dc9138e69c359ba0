"""Every count and size of the simulator's configs is bounded and every float finite: a value
past the bound is refused naming the field, where it used to end in a MemoryError (100 million
instances), an OverflowError (mem_capacity .inf) or step times that collapse to the overhead
(peak_flops .inf)."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from presched.config import format_validation_error
from presched.sim.config import DisaggConfig, EngineConfig
from presched.sim.setup import SimConfig
from presched.sim.steptime import StepTimeConfig, get_hardware, get_model, kv_cache_blocks
from presched.sim.steptime.specs import HardwareSpec

H100 = get_hardware("h100-sxm").model_dump()


@pytest.mark.parametrize("make,field", [
    (lambda: SimConfig(num_instances=100_000_000), "num_instances"),
    (lambda: DisaggConfig(num_decode=5000), "num_decode"),
    (lambda: EngineConfig(max_num_seqs=2**21), "max_num_seqs"),
    (lambda: EngineConfig(num_blocks=2**41), "num_blocks"),
    (lambda: EngineConfig(max_num_batched_tokens=2**31), "max_num_batched_tokens"),
    (lambda: StepTimeConfig(tp=8192), "tp"),
    (lambda: StepTimeConfig(step_overhead=1e300), "step_overhead"),
    (lambda: HardwareSpec(**{**H100, "mem_capacity": 1e300}), "mem_capacity"),
])  # fmt: skip
def test_a_count_or_size_past_its_bound_is_refused(make, field):
    with pytest.raises(ValidationError) as e:
        make()
    assert format_validation_error(e.value).startswith(f"{field}: Input should be less than or equal")


@pytest.mark.parametrize("field", ["peak_flops", "mem_bandwidth", "mem_capacity",
                                   "interconnect_bandwidth", "interconnect_latency"])  # fmt: skip
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_hardware_numbers_must_be_finite(field, value):
    with pytest.raises(ValidationError) as e:
        HardwareSpec(**{**H100, field: value})
    assert format_validation_error(e.value).startswith(f"{field}: Input should be a finite number")
    with pytest.raises(ValidationError) as e:  # inline in a config: one clean line, no union noise
        StepTimeConfig(hardware={**H100, field: value})
    assert format_validation_error(e.value) == f"hardware: {field}: Input should be a finite number"


def test_kv_sizing_of_a_spec_built_past_validation_names_the_field():
    bad = HardwareSpec.model_construct(**{**H100, "mem_capacity": math.inf})  # no validation
    with pytest.raises(ValueError, match="mem_capacity: .*not finite"):
        kv_cache_blocks(get_model("llama-3.1-8b"), bad)


def test_the_bounds_leave_real_and_idiomatic_values_alone():
    assert SimConfig(num_instances=4096).num_instances == 4096
    free_link = HardwareSpec(**{**H100, "interconnect_bandwidth": 1e30})  # a link that costs nothing
    assert free_link.interconnect_bandwidth == 1e30
    assert EngineConfig(max_num_seqs=1024, num_blocks=10**9).num_blocks == 10**9
