"""benchmarks/probes.py end to end on real CASTILLO prompts with planted lengths and a prepared
feature cache (so no model runs: the transformers reference itself is checked against the real
SmolLM2 in tests/predict/probe/test_features.py). The planted signal is in feature column 0 only:
a bug that pairs a prompt with another prompt's vector, or scores the probe on training rows'
labels, loses it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
from builders import load_benchmark


def _dataset(data_dir: str, tmp: Path) -> tuple[Path, Path, dict[str, int]]:
    want = {"train": 60, "validate": 20, "test": 20}
    rows, rng = [], np.random.default_rng(0)
    with gzip.open(Path(data_dir) / "castillo" / "prompts.jsonl.gz", "rt") as f:
        seen = set()
        for line in f:
            r = json.loads(line)
            if r["prompt_id"] in seen or want.get(r["split"], 0) == 0:
                continue
            seen.add(r["prompt_id"])
            want[r["split"]] -= 1
            base = int(rng.integers(5, 500))
            lengths = [max(1, min(512, base + int(rng.integers(-3, 4)))) for _ in range(4)]
            rows.append({"prompt_id": r["prompt_id"], "dataset": r["dataset"], "split": r["split"],
                         "prompt_tokens": 10, "lengths": lengths, "capped": [x == 512 for x in lengths]})  # fmt: skip
    assert not any(want.values())
    lengths = tmp / "lengths.jsonl"
    lengths.write_text("\n".join(json.dumps(x) for x in [{"config": {"max_tokens": 512}}, *rows]) + "\n")
    X = rng.normal(size=(len(rows), 8))
    X[:, 0] = [np.log(np.mean(r["lengths"])) for r in rows]
    ids = [r["prompt_id"] for r in rows]
    cache = tmp / "features.npz"
    np.savez(cache, layer=15, ids=np.array(ids), mean=X, egtp=X[:, ::-1].copy())
    return lengths, cache, {s: sum(r["split"] == s for r in rows) for s in ("train", "validate", "test")}


def test_probes_run_on_the_cached_features_of_each_prompt(data_dir, tmp_path, capsys):
    lengths, cache, n = _dataset(data_dir, tmp_path)
    out = tmp_path / "probes.json"
    assert load_benchmark("probes.py").main(["--lengths", str(lengths), "--feature-cache", str(cache),
                                             "--out", str(out)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    figs = {ln.split(" = ")[0][8:]: float(ln.split(" = ")[1]) for ln in text.splitlines() if ln.startswith("figure: ")}
    assert set(figs) == {"probe_step0_tau", "textgbm_tau_same", "egtp_tau", "probe_coverage_err_pts",
                         "probes_test_prompts"}  # fmt: skip
    assert figs["probes_test_prompts"] == n["test"] == 20
    assert figs["probe_step0_tau"] > 0.8 and figs["egtp_tau"] > 0.8  # the planted column, read per prompt
    saved = json.loads(out.read_text())
    assert (saved["n_train"], saved["n_validate"], saved["n_test"]) == (n["train"], n["validate"], n["test"])
    assert saved["results"]["probe"]["n"] == 20 and out.with_suffix(".png").exists()
    assert saved["capped_fraction"] == 0.0
