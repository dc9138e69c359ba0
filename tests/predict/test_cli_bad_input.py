"""`presched predict` / `eval` on input they used to crash on or silently misread: a NaN
threshold (IndexError). Real subprocesses on a small generic log; errors are `error: ...`, exit
code 2, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest



def presched(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "presched.cli", *args], capture_output=True, check=False,
                          text=True, cwd=cwd, timeout=300)  # fmt: skip


def refused(r, *phrases):
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.startswith("error:"), r.stderr
    for phrase in phrases:
        assert phrase in r.stderr, (phrase, r.stderr)


def write_log(path, splits=None):
    """40 requests with text, model and a length; `splits`, when given, cycles as their split."""
    rows = []
    for i in range(40):
        row = {"id": f"r{i}", "model": "m", "prompt": f"question {i} " + "word " * (i % 7),
               "output_tokens": 10 + 3 * (i % 7)}  # fmt: skip
        if splits is not None:
            row["split"] = splits[i % len(splits)]
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("thresholds", ["nan", "256,nan", "inf", "-1"])
def test_predict_thresholds_must_be_finite_and_not_negative(tmp_path, thresholds):
    log = write_log(tmp_path / "log.jsonl")
    assert presched("train", "-p", "model-median", "-d", str(log), "-o", "m.npz", "-q",
                    "--validation-fraction", "0", cwd=tmp_path).returncode == 0  # fmt: skip
    r = presched("predict", "-m", "m.npz", "-i", str(log), "--thresholds", thresholds, cwd=tmp_path)
    refused(r, "--thresholds: token counts must be finite numbers >= 0", repr(thresholds))
