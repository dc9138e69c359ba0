"""scripts/smollm2_lengths.py's data plumbing (no model run: generation needs the engine venv and
minutes per batch here): CASTILLO's split kept, a deterministic prompt order, and the cache
refusing a run with another sampling config."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "smollm2_lengths.py"


@pytest.fixture(scope="module")
def mod():
    spec = importlib.util.spec_from_file_location("smollm2_lengths", SCRIPT)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_prompts_keep_their_castillo_split_in_a_fixed_order(mod, data_dir):
    path = Path(data_dir) / "castillo" / "prompts.jsonl.gz"
    test = mod.load_prompts(path, ["test"])
    both = mod.load_prompts(path, ["validate", "test"])
    assert test and all(p["split"] == "test" for p in test)
    assert len({p["prompt_id"] for p in both}) == len(both)  # each prompt once
    assert [p["prompt_id"] for p in both if p["split"] == "test"] == [p["prompt_id"] for p in test]
    assert len({p["dataset"] for p in test[:40]}) >= 5  # the hash order mixes the prompt sets


def test_cache_resumes_its_own_config_and_refuses_another(mod, tmp_path):
    cfg = {"model": "m", "temperature": 0.7, "top_p": 0.9, "max_tokens": 512, "samples": 4, "seed": 0,
           "max_model_len": 2048}
    out = tmp_path / "c.jsonl"
    assert mod.read_cache(out, cfg) == set()
    with out.open("a") as f:
        f.write(json.dumps({"prompt_id": "a", "lengths": [1, 2, 3, 4], "capped": [False] * 4}) + "\n")
    assert mod.read_cache(out, cfg) == {"a"}
    with pytest.raises(SystemExit, match="written with config"):
        mod.read_cache(out, {**cfg, "temperature": 1.0})
