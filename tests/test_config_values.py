"""presched/config.py's base `Config` on values pydantic's lax mode would misread: a boolean
where a number is expected (`true` read as 1) is refused naming the field, in every config."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from presched.bench.config import BenchConfig
from presched.config import format_validation_error
from presched.sim.config import EngineConfig
from presched.sim.steptime.specs import ModelSpec
from presched.workload.config import WorkloadConfig

SPEC = dict(name="m", num_params=8.0e9, num_layers=32, hidden_size=4096, num_heads=32,
            num_kv_heads=8, head_dim=128, vocab_size=128256)  # fmt: skip


@pytest.mark.parametrize("make,field,kind", [
    (lambda: EngineConfig(max_num_seqs=True), "max_num_seqs", "an integer"),
    (lambda: EngineConfig(gpu_memory_utilization=True), "gpu_memory_utilization", "a number"),
    (lambda: WorkloadConfig(num_requests=True), "num_requests", "an integer"),  # int | None
    (lambda: WorkloadConfig(source="castillo", model="llama-3.1-8b", sample=True,
                            arrivals="poisson", rate=1.0), "sample", "an integer"),  # int | "mean"
    (lambda: ModelSpec(**{**SPEC, "num_layers": True}), "num_layers", "an integer"),
    (lambda: BenchConfig(loads=[0.5, True]), "loads", "[1]: expected a number"),  # list items
])  # fmt: skip
def test_a_boolean_is_not_read_as_a_number(make, field, kind):
    with pytest.raises(ValidationError) as e:
        make()
    text = format_validation_error(e.value)
    assert text.startswith(f"{field}: ") and kind in text and "not a boolean" in text, text


def test_booleans_and_numbers_where_they_belong_still_load():
    assert EngineConfig(enable_prefix_caching=True, max_num_seqs=8).max_num_seqs == 8
    assert EngineConfig(num_blocks=1.0e4).num_blocks == 10_000  # an integral float, as YAML 1.0e4
    assert WorkloadConfig(hash_prompts=True, num_requests=3).num_requests == 3
    assert BenchConfig(loads=[0.5, 1]).loads == [0.5, 1.0]
