"""The real `PreschedScheduler` (vLLM 0.32) driven step by step (`plugin_driver_turns.py`, in the
engine venv; the workers' outputs made up as in test_plugin_scheduler.py):

- `admit` is asked only about a head with a free batch slot, as the simulator and the gateway
  ask it (docs/policies.md): the plugin asked it at every step while the batch was full, before
  vLLM's own slot check, so a refusal (kv-admission's memo) could be made about a head that
  could not have started anyway;
- a streaming-input session (vLLM's resumable request) is one request to the policy: its next
  turn starts from vLLM's own queue of KV-block holders (never the policy's), and the policy
  hears the tokens of every turn: vLLM clears a session's output at each new chunk, and the
  policy heard the second turn's 4 tokens as 1 (only past the first turn's count of 3);
- a session whose input closes while it waits for more completed its last turn: vLLM ends it
  FINISHED_ABORTED, the plugin reported it aborted (`on_cancel`, a 499 record); it is now
  finished as that turn ended (`on_finish`, 'length'); a client's abort still reads as one;
- between turns a session holds its KV blocks outside vLLM's running list: `admit` is asked
  with it (kv-admission admitted past its limit while it was paused);
- vLLM's queue of those holders is FIFO under --scheduling-policy priority too: it was a heap
  on the `VictimKey`s, asking `policy.victim` with no KV pressure and resuming tied sessions
  last paused first;
- an encoder-cache connector (`ec_transfer_config`) is refused at start, naming the field: its
  skip of a head whose encoder outputs are in transit popped it through the policy's queue
  while WAITING, heard as an admission (`on_schedule`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import run_engine_driver


DRIVER = Path(__file__).with_name("plugin_driver_turns.py")
SCENARIOS = ("admit_with_a_slot", "session_turns", "paused_session_holds_kv", "holders_fifo",
             "ec_connector_refused")  # fmt: skip


@pytest.fixture(scope="module")
def driven(tiny_model, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("driver-turns")
    got = run_engine_driver(DRIVER, str(tiny_model), str(tmp), *SCENARIOS)
    for name in SCENARIOS:
        assert "error" not in got[name], got[name]["error"]
    return got


def test_admit_is_asked_only_with_a_free_slot(driven):
    got = driven["admit_with_a_slot"]
    asked = [(head, slot) for _, head, slot in got["admits"]]
    assert ("short", True) in asked  # asked once the slot is free
    assert all(slot for _, slot in asked), asked  # never while 'long' held the only slot
    assert got["scheduled"] == ["long", "short"]


def test_a_streaming_session_is_one_request_whose_turns_add_up(driven):
    got = driven["session_turns"]
    paused = got["paused"]
    assert paused == {"status": "WAITING_FOR_STREAMING_REQ", "policy_queue": [], "vllm_holders": ["S"]}
    calls = got["calls"]
    kinds = [c[0] for c in calls]
    assert kinds.count("on_arrival") == kinds.count("on_schedule") == kinds.count("admit") == 1
    tokens = [c for c in calls if c[0] == "on_tokens"]
    # 3 tokens in turn 1, 4 in turn 2: one on_tokens each, `generated` counting on
    assert [c[2] for c in tokens] == [1, 2, 3, 4, 5, 6, 7]
    # the second chunk's 3 tokens join the prompt (10) when it arrives
    assert [c[3] for c in tokens] == [10, 10, 10, 13, 13, 13, 13]
    # vLLM ends a session whose input closes while it waits for more as FINISHED_ABORTED; its
    # last turn completed (4 tokens, length-capped): finished, not aborted
    assert kinds[-1] == "on_finish" and calls[-1][2] == 7
    assert got["records"]["S"] == [200, "length", 7]
    # a paused session whose client goes away is still an abort
    assert got["s2_end"] == "on_cancel" and got["records"]["S2"][:2] == [499, "abort"]
    assert got["counts"] == {"finished": 1, "aborted": 1}


def test_admit_counts_the_kv_a_paused_session_holds(driven):
    got = driven["paused_session_holds_kv"]
    assert got["held_blocks"] == 7  # S holds 112 tokens of KV between its turns
    assert got["while_held"] == [[], []]  # R (112 predicted) does not fit beside it in 192
    assert got["after_close"] == ["R"] and got["policy_errors"] == {}


def test_block_holders_resume_in_the_order_they_paused(driven):
    got = driven["holders_fifo"]
    assert got["paused"] == got["resumed"] == ["A", "B", "C"]
    assert got["victim_asked"] == []  # no KV pressure: the policy's victim is not asked


def test_an_encoder_cache_connector_is_refused_naming_the_field(driven):
    refused = driven["ec_connector_refused"]["refused"]
    assert refused.startswith("PluginConfigError:") and "ec_transfer_config" in refused
