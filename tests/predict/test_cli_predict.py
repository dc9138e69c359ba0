"""`presched train` / `predict` / `eval` as a user runs them (real subprocesses), on a small log
in the generic schema written here, with the baselines (no optional dependencies)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from presched.predict import LEVELS


def presched(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "presched.cli", *args], capture_output=True, check=False,
                          text=True, cwd=cwd, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    """240 requests over 2 models: longer prompts get longer answers; 3 samples each, one
    request with every sample at the generation cap (not usable as a label)."""
    rng = np.random.default_rng(1)
    path = tmp_path_factory.mktemp("log") / "my_log.jsonl"
    rows = []
    for i in range(120):
        words = int(rng.integers(3, 80))
        prompt = f"question {i}: " + " ".join(["word"] * words)
        for model, scale in (("small-model", 3.0), ("big-model", 5.0)):
            mean = 20 + scale * words
            samples = [max(1, int(rng.normal(mean, 0.1 * mean))) for _ in range(3)]
            rows.append({"id": f"{model}-{i}", "model": model, "prompt": prompt,
                         "output_tokens": samples[0], "output_samples": samples})  # fmt: skip
    rows.append({"id": "capped", "model": "small-model", "prompt": "loop forever",
                 "output_tokens": 15000, "output_samples": [15000, 15001]})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_train_predict_eval_round_trip(log, tmp_path):
    model = tmp_path / "lp.npz"
    r = presched("train", "--predictor", "linear-prompt", "--data", str(log), "--out", str(model))
    assert r.returncode == 0, r.stderr
    assert model.exists() and "trained linear-prompt" in r.stdout

    out = tmp_path / "pred.jsonl"
    r = presched("predict", "-m", str(model), "-i", str(log), "-o", str(out), "--thresholds", "100,300")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 241
    first = rows[0]
    assert set(first) == {"id", "model", "point", "rank_score", "quantiles", "p_longer"}
    q = list(first["quantiles"].values())
    assert list(first["quantiles"]) == [f"q{round(lv * 100)}" for lv in LEVELS] and q == sorted(q)
    assert set(first["p_longer"]) == {"100", "300"} and first["p_longer"]["100"] >= first["p_longer"]["300"]
    # longer prompts are predicted longer
    by_id = {row["id"]: row for row in rows}
    assert by_id["big-model-0"]["model"] == "big-model"

    res = tmp_path / "res"
    r = presched("eval", "--data", str(log), "-p", "global-median,model-median,linear-prompt", "-o", str(res))
    assert r.returncode == 0, r.stderr
    doc = json.loads((res / "predictors.json").read_text())
    got = {row["predictor"]: row for row in doc["rows"]}
    assert set(got) == {"global-median", "model-median", "linear-prompt"}
    assert all(row["status"] == "ok" and row["view"] == "in-dist" for row in got.values())
    assert got["linear-prompt"]["kendall_tau_b"] > 0.5 > got["model-median"]["kendall_tau_b"]
    assert got["linear-prompt"]["mae"] < got["global-median"]["mae"]
    assert len(got["linear-prompt"]["coverage"]) == len(LEVELS)
    assert (res / "predictors-calibration-in-dist.png").exists()
    assert (res / "predictors-scatter-in-dist.png").exists()
    assert "linear-prompt" in r.stdout

    # a saved model scored on a file
    r = presched("eval", "--data", str(log), "--model-file", str(model), "-o", str(tmp_path / "res2"), "-q")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "res2" / "predictors.json").read_text())
    assert doc["rows"][0]["n"] == 240 and doc["rows"][0]["n_unlabelled"] == 1


def run_main(args, capsys, monkeypatch):
    """`presched ARGS` in this process (fast); returns (exit code, stderr)."""
    from presched.cli import main

    monkeypatch.setattr(sys, "argv", ["presched", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    return exc.value.code, capsys.readouterr().err


def test_bad_input_names_the_field_without_traceback(log, tmp_path, capsys, monkeypatch):
    no_labels = tmp_path / "nolabels.jsonl"
    no_labels.write_text('{"prompt": "hi", "model": "m"}\n{"prompt": "hello there", "model": "m"}\n')
    bad_row = tmp_path / "bad.jsonl"
    bad_row.write_text('{"prompt": "hi", "output_tokens": 0}\n')
    not_model = tmp_path / "not_a_model.npz"
    not_model.write_text("garbage")
    model = tmp_path / "gm.npz"
    code, _ = run_main(["train", "-p", "global-median", "-d", str(log), "-o", str(model)], capsys, monkeypatch)
    assert code in (0, None) and model.exists()
    cases = [
        (["train", "-p", "nope", "-d", str(log), "-o", str(model)], "unknown predictor 'nope'"),
        (["train", "-p", "global-median", "-d", str(no_labels), "-o", str(model)], "output_tokens"),
        (["train", "-p", "global-median", "-d", str(bad_row), "-o", str(model)], "output_tokens"),
        (["train", "-p", "global-median", "-d", str(tmp_path / "missing.jsonl"), "-o", str(model)], "missing.jsonl"),
        (["train", "-p", "global-median", "-d", str(log), "-o", str(model), "--validation-fraction", "1.5"],
         "--validation-fraction"),
        (["train", "-p", "global-median", "-d", str(log), "-o", str(model), "--split", "train"], "split"),
        (["train", "-p", "global-median", "-o", str(model), "--split", "dev"], "--split"),
        (["train", "-p", "global-median", "-d", str(log), "-o", str(model), "--param", "oops"], "--param"),
        (["train", "-p", "global-median", "-d", str(log), "-o", str(model), "--param", "q=1"],
         "global-median: unknown parameter(s) ['q'] (it takes no parameters)"),
        (["predict", "-m", str(not_model), "-i", str(log)], "not a presched model file"),
        (["predict", "-m", str(tmp_path / "none.npz"), "-i", str(log)], "none.npz"),
        (["predict", "-m", str(model), "-i", str(log), "--thresholds", "a,b"], "comma-separated"),
        (["eval", "-d", str(log), "-p", "global-median,nope"], "unknown predictor 'nope'"),
        (["eval", "-d", str(log), "--view", "cross-model"], "--view"),
        (["eval", "--view", "sideways", "-p", "global-median"], "--view"),
        (["eval", "-d", str(no_labels), "-p", "global-median"], "output_tokens"),
        (["eval", "-d", str(log), "--quick", "3"], "--quick"),
    ]
    monkeypatch.chdir(tmp_path)
    for args, needle in cases:
        code, stderr = run_main(args, capsys, monkeypatch)
        assert code == 2, (args, stderr)
        assert needle in stderr, (args, stderr)
        assert "Traceback" not in stderr, (args, stderr)


def test_predict_ignores_output_lengths(tmp_path, capsys, monkeypatch):
    """Its help says output lengths are ignored: a bad or odd one is not read, let alone refused."""
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"p{i}", "output_tokens": 10 + i}) + "\n" for i in range(20)))
    model = tmp_path / "gm.npz"
    code, _ = run_main(["train", "-p", "global-median", "-d", str(train), "-o", str(model)], capsys, monkeypatch)
    assert code in (0, None)
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"prompt": "hi", "output_tokens": 0}\n{"prompt": "yo", "output_tokens": "x", "output_samples": "a b"}\n')
    out = tmp_path / "pred.jsonl"
    code, stderr = run_main(["predict", "-m", str(model), "-i", str(odd), "-o", str(out)], capsys, monkeypatch)
    assert code in (0, None), stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and rows[0]["point"] == rows[1]["point"] > 0


def test_train_default_trains_the_recommended_predictor(log, tmp_path):
    from presched.predict import load_predictor
    from presched.predict.evaluate import DEFAULT

    out = tmp_path / "d.npz"
    r = presched("train", "-p", "default", "-d", str(log), "-o", str(out), "--param", "max_rounds=20",
                 "--param", "svd=4", "--param", "folds=2", "--param", "scale_folds=2")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"trained {DEFAULT}" in r.stdout and load_predictor(out).name == DEFAULT


def test_eval_of_a_saved_model_matches_served_model_names_as_predict_does(log, tmp_path, capsys, monkeypatch):
    """`eval --model-file` predicted the raw names: a file naming its models `org/name` (as
    clients do) was scored with the all-model fallback, not the numbers `predict` writes for it.
    And a view that trains predictors is refused with a saved model, not silently in-dist."""
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    for r in rows:
        r["model"] = "org--" + r["model"]
    fitted = tmp_path / "fitted.jsonl"
    fitted.write_text("".join(json.dumps(r) + "\n" for r in rows))
    served = tmp_path / "served.jsonl"
    served.write_text("".join(json.dumps(r | {"model": r["model"].replace("--", "/")}) + "\n" for r in rows))
    model = tmp_path / "lp.npz"
    assert run_main(["train", "-p", "linear-prompt", "-d", str(fitted), "-o", str(model)], capsys, monkeypatch)[0] in (0, None)
    mae = {}
    for name, data in (("fitted", fitted), ("served", served)):
        code, err = run_main(["eval", "-d", str(data), "-m", str(model), "-o", str(tmp_path / name), "-q"], capsys, monkeypatch)
        assert code in (0, None), err
        assert "not fitted on" not in err
        mae[name] = json.loads((tmp_path / name / "predictors.json").read_text())["rows"][0]["mae"]
    assert mae["served"] == mae["fitted"]
    code, err = run_main(["eval", "-d", "castillo", "-m", str(model), "--view", "loso", "-o", str(tmp_path / "x")],
                         capsys, monkeypatch)  # fmt: skip
    assert code == 2 and "--view" in err and "drop --model-file" in err
