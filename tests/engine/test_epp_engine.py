"""`presched epp` behind a real Envoy in front of a real vLLM engine (the tiny Llama on the CPU):
the stream is the engine's own answer, its usage is counted and logged, and the prediction the
picker adds to the body (vllm_xargs) and headers is accepted by vLLM."""

from __future__ import annotations

import json
import sqlite3

import httpx

from epp.conftest import fitted_predictor
from presched.epp.local import LocalStack
from presched.serve.log import RequestLog


def test_a_stream_through_envoy_and_the_picker_is_the_engines_answer(tiny_engine, tmp_path):
    addr = tiny_engine.url.removeprefix("http://")
    log = RequestLog(tmp_path / "log.sqlite")
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": 12, "temperature": 0, "seed": 1, "ignore_eos": True, "stream": True}  # fmt: skip
    direct = httpx.post(tiny_engine.url + "/v1/chat/completions", json=chat, timeout=60)
    with LocalStack({"endpoints": [{"address": addr}], "router": "least-work"}, stubs=0,
                    predictor=fitted_predictor(), log=log) as st:  # fmt: skip
        r = httpx.post(st.url + "/v1/chat/completions", json=chat, timeout=120)
        assert r.status_code == 200, r.text
        assert r.headers["x-presched-endpoint"] == addr

        def content(text: str) -> str:
            out = []
            for ev in text.split("\n\n"):
                if ev.startswith("data: {"):
                    for c in json.loads(ev[6:])["choices"]:
                        out.append(c["delta"].get("content") or "")
            return "".join(out)

        assert content(r.text) == content(direct.text) and content(r.text)
        assert '"usage"' not in r.text  # the usage event the picker asked for is not passed on
        log.flush()
        conn = sqlite3.connect(log.path)
        conn.row_factory = sqlite3.Row
        row = dict(conn.execute("SELECT status, output_tokens, pred_mean, backend FROM requests").fetchone())
        conn.close()
    assert row == {"status": 200, "output_tokens": 12, "pred_mean": row["pred_mean"], "backend": addr}
    assert row["pred_mean"] > 0
