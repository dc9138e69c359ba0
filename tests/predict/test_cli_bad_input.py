"""`presched predict` / `eval` on input they used to crash on or silently misread: a NaN
threshold (IndexError), a `split` column whose values are not train/validate/test (ignored for a
random split), and fractions out of range (a message that did not match the rule). Real
subprocesses on a small generic log; errors are `error: ...`, exit code 2, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from presched.predict.evaluate import generic_split
from presched.workload.request import Request


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


@pytest.mark.parametrize("splits,bad", [
    (["train", "train", "train", "val", "test"], "request 'r3' has 'val'"),
    (["train", "TEST"], "request 'r1' has 'TEST'"),
    (["train", None, "test"], "request 'r1' has no value"),  # a row without one, beside rows with one
    (["train", "validate"], "no row is 'test'"),
])  # fmt: skip
def test_eval_refuses_a_split_column_it_cannot_use(tmp_path, splits, bad):
    log = write_log(tmp_path / "log.jsonl", splits)
    r = presched("eval", "-p", "model-median", "-d", str(log), "-o", "ev", "-q", cwd=tmp_path)
    refused(r, "field 'split'", bad)
    assert not (tmp_path / "ev").exists()  # refused before any predictor ran


def test_eval_uses_a_valid_split_column(tmp_path):
    log = write_log(tmp_path / "log.jsonl", ["train", "train", "validate", "test"])
    r = presched("eval", "-p", "model-median", "-d", str(log), "-o", "ev", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "ev" / "predictors.json").read_text())
    assert doc["views"]["in-dist"]["description"] == "the file's own split column"


@pytest.mark.parametrize("args,message", [
    (("--test-fraction", "0"), "--test-fraction: expected a number in (0, 1), got 0"),
    (("--test-fraction", "nan"), "--test-fraction: expected a number in (0, 1), got nan"),
    (("--validation-fraction", "1"), "--validation-fraction: expected a number in [0, 1), got 1"),
    (("--test-fraction", "0.5", "--validation-fraction", "0.5"), "expected below 1, got 0.5 + 0.5"),
])  # fmt: skip
def test_eval_fraction_messages_match_the_rule(tmp_path, args, message):
    log = write_log(tmp_path / "log.jsonl")
    refused(presched("eval", "-p", "model-median", "-d", str(log), "-o", "ev", "-q", *args, cwd=tmp_path), message)


def test_generic_split_message_matches_its_rule():
    reqs = [Request(id=str(i), prompt_tokens=3, output_tokens=5) for i in range(10)]
    with pytest.raises(ValueError, match=r"test_fraction must be in \(0, 1\) and calibration_fraction in \[0, 1\)"):
        generic_split(reqs, test_fraction=0.0)
