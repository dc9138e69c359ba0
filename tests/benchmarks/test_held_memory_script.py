"""benchmarks/held_memory.py end to end on a small backlog (real processes: the stub upstream, a
test double, and the client; the gateway in the test's process): its figures, its JSON, and
what it shows of the gateway, that the live heap falls back once the held requests have left."""

from __future__ import annotations

import json
import subprocess
import sys

from builders import BENCHMARKS, printed_figures

SCRIPT = BENCHMARKS / "held_memory.py"


def test_a_small_backlog_is_measured_and_the_live_heap_falls_back_after_it(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--held", "200", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=180, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = printed_figures(proc.stdout)
    res = json.loads((tmp_path / "held_memory.json").read_text())
    assert figures["held_request_kb"] == round(res["traced_bytes_per_request"] / 1024, 2)
    assert 5 < figures["held_request_kb"] < 100  # a held request is some KB of heap, not bytes or MB
    owners = {o["owner"] for o in res["top_owners"]}
    assert "uvicorn" in owners and any(o.startswith("presched/serve/") for o in owners)
    b = res["drain"]["blocks"]
    held = b["held"] - b["before"]
    assert held > 100 * 200  # each held request holds blocks ...
    assert b["drained"] - b["before"] < 0.1 * held  # ... and gives them back when it has left


def test_a_bad_backlog_size_is_refused_naming_the_flag():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--held", "0"], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 2 and "--held" in proc.stderr and "Traceback" not in proc.stderr
