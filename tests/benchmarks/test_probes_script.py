"""benchmarks/probes.py end to end on real CASTILLO prompts with planted lengths and a prepared
feature cache (so no model runs: the transformers reference itself is checked against the real
SmolLM2 in tests/predict/probe/test_features.py). The planted signal is in feature column 0 only:
a bug that pairs a prompt with another prompt's vector, or scores the probe on training rows'
labels, loses it."""

from __future__ import annotations

import json

import numpy as np
from builders import load_benchmark, printed_figures, smollm2_dataset


def test_probes_run_on_the_cached_features_of_each_prompt(data_dir, tmp_path, capsys):
    lengths, cache, n = smollm2_dataset(data_dir, tmp_path)
    out = tmp_path / "probes.json"
    assert load_benchmark("probes.py").main(["--lengths", str(lengths), "--feature-cache", str(cache),
                                             "--answers", str(tmp_path / "none.jsonl"),
                                             "--out", str(out)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    figs = {ln.split(" = ")[0][8:]: float(ln.split(" = ")[1]) for ln in text.splitlines() if ln.startswith("figure: ")}
    assert set(figs) == {"probe_step0_tau", "textgbm_tau_same", "egtp_tau", "draft_probe_tau",
                         "probe_coverage_err_pts", "coverage_noise_floor_pts", "probes_test_prompts"}  # fmt: skip
    assert 12 < figs["coverage_noise_floor_pts"] < 20  # 20 test prompts: sampling noise alone
    assert figs["probes_test_prompts"] == n["test"] == 20
    assert figs["probe_step0_tau"] > 0.8 and figs["egtp_tau"] > 0.8  # the planted column, read per prompt
    # self-draft at the probe's layer: the draft's vectors are the probe's, so the same ranking
    assert figs["draft_probe_tau"] == figs["probe_step0_tau"]
    saved = json.loads(out.read_text())
    assert (saved["n_train"], saved["n_validate"], saved["n_test"]) == (n["train"], n["validate"], n["test"])
    assert saved["results"]["probe"]["n"] == 20 and out.with_suffix(".png").exists()
    assert saved["capped_fraction"] == 0.0
    assert saved["refine"] is None and "probe-refine: no answer token ids" in text


def test_probe_refine_reads_each_answers_own_state_at_each_step(data_dir, tmp_path, capsys):
    # answers of one prompt differ a lot here; the planted state at step g is log(L - g) of that
    # very answer (column 0), which the prompt alone cannot know: refinement must beat the
    # step-0 priors, and a bug pairing an answer with another's state (or step) loses it
    lengths, cache, n = smollm2_dataset(data_dir, tmp_path)
    lines = lengths.read_text().splitlines()
    rows = [json.loads(x) for x in lines[1:]]
    rng = np.random.default_rng(1)
    steps = load_benchmark("probes.py").probes_refine.STEPS
    keys, states, answers = [], [], []
    for r in rows:
        r["lengths"] = [int(x) for x in rng.integers(2, 512, size=4)]
        answers.append({"prompt_id": r["prompt_id"], "answers": [[7] * L for L in r["lengths"]]})
        for j, L in enumerate(r["lengths"]):
            st = rng.normal(size=(len(steps), 8)).astype(np.float32)
            for k, g in enumerate(steps):
                st[k, 0] = np.log(L - g) if L > g else np.nan
            keys.append(f"{r['prompt_id']}/{j}")
            states.append(st)
    lengths.write_text("\n".join([lines[0], *map(json.dumps, rows)]) + "\n")
    ans = tmp_path / "answers.jsonl"
    ans.write_text("\n".join(map(json.dumps, answers)) + "\n")
    step_cache = tmp_path / "steps.npz"
    np.savez(step_cache, layer=15, steps=np.array(steps), keys=np.array(keys), states=np.stack(states))
    out = tmp_path / "probes.json"
    assert load_benchmark("probes.py").main(["--lengths", str(lengths), "--feature-cache", str(cache),
                                             "--answers", str(ans), "--step-cache", str(step_cache),
                                             "--out", str(out)]) == 0  # fmt: skip
    figs = printed_figures(capsys.readouterr().out)
    for g in steps:
        assert figs[f"probe_refine{g}_tau"] > 0.85, (g, figs)
        assert figs[f"probe_prior{g}_tau"] < 0.4, (g, figs)  # the prompt's prior knows little here
    saved = json.loads(out.read_text())["refine"]
    assert saved["prompts_with_ids"] == len(rows)
    want = sum(L > 64 for r in rows if r["split"] == "test" for L in r["lengths"])
    assert saved["steps"]["64"]["test_answers"] == figs["probe_refine64_test_answers"] == want
