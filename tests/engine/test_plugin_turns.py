"""The real `PreschedScheduler` (vLLM 0.32) driven step by step (`plugin_driver_turns.py`, in the
engine venv; the workers' outputs made up as in test_plugin_scheduler.py):

- `admit` is asked only about a head with a free batch slot, as the simulator and the gateway
  ask it (docs/policies.md): the plugin asked it at every step while the batch was full, before
  vLLM's own slot check, so a refusal (kv-admission's memo) could be made about a head that
  could not have started anyway.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from presched.engine.venv import engine_env, engine_python

DRIVER = Path(__file__).with_name("plugin_driver_turns.py")
SCENARIOS = ("admit_with_a_slot",)


@pytest.fixture(scope="module")
def driven(tiny_model, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("driver-turns")
    r = subprocess.run([str(engine_python()), str(DRIVER), str(tiny_model), str(tmp), *SCENARIOS],
                       capture_output=True, text=True, timeout=600, env=engine_env())  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for name in SCENARIOS:
        assert "error" not in got[name], got[name]["error"]
    return got


def test_admit_is_asked_only_with_a_free_slot(driven):
    got = driven["admit_with_a_slot"]
    asked = [(head, slot) for _, head, slot in got["admits"]]
    assert ("short", True) in asked  # asked once the slot is free
    assert all(slot for _, slot in asked), asked  # never while 'long' held the only slot
    assert got["scheduled"] == ["long", "short"]

