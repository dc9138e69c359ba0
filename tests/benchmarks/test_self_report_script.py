"""benchmarks/self_report.py end to end against a TEST DOUBLE of the served model behind real
HTTP (`--base-url`: a Starlette app that "reports" each prompt's planted mean length, read from
the dataset file, or no number for every 5th prompt), on real CASTILLO prompts with planted
lengths. The real SmolLM2 is what the script starts by default."""

from __future__ import annotations

import json
from pathlib import Path

from builders import load_benchmark, printed_figures, smollm2_dataset
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route


def test_self_report_runs_on_the_dataset_and_reports_what_the_model_said(data_dir, tmp_path, capsys, asgi_server):
    lengths, _, n = smollm2_dataset(data_dir, tmp_path)
    sr = load_benchmark("self_report.py")
    _, rows = sr.load_dataset(lengths, Path(data_dir) / "castillo")  # with the prompts' text
    by_text = {r["prompt"]: None if i % 5 == 0 else round(sum(r["lengths"]) / 4) for i, r in enumerate(rows)}

    async def chat(request):
        body = await request.json()
        prompt = body["messages"][0]["content"].split("\n\nDo not answer yet.")[0]
        rep = by_text[prompt]
        return JSONResponse({"choices": [{"message": {"content": "no idea" if rep is None else f"{rep} words"}}]})

    url = asgi_server(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))
    out = tmp_path / "sr.json"
    assert sr.main(["--lengths", str(lengths), "--base-url", url, "--out", str(out)]) == 0
    figs = printed_figures(capsys.readouterr().out)
    assert figs["self_report_parsed_fraction"] == 0.8  # every 5th prompt of 100 said no number
    # the raw numbers are the planted means; over all prompts the unparsed fifth shares one estimate
    assert figs["self_report_raw_tau"] > 0.9 and figs["self_report_tau"] > 0.35
    saved = json.loads(out.read_text())
    assert (saved["n_train"], saved["n_validate"], saved["n_test"]) == (n["train"], n["validate"], n["test"])
    assert saved["asked"] == len(rows) and saved["errors"] == 0
