"""Measure a running vLLM engine's step times and fit the simulator's step-time model to them.

    cal = calibrate(eng.url, "tiny", max_num_seqs=8, max_num_batched_tokens=2048)
    cal.model            # a FittedStepModel: SimConfig(step_time={"kind": "fitted",
                         #   "coefficients": cal.model.coefficients})
    cal.mape, cal.decode_tok_s(8), cal.to_dict()

Who calls it: benchmarks/engine_e2e.py (the simulator against the engine it models) and
tests/engine/test_calibrate.py. The engine must be idle while it runs (it reads cumulative
counters), and should run with prefix caching off (`--no-enable-prefix-caching`): every probe
prompt is fresh random token ids, so a cache would not change these probes, but the simulator
does not model one either.

Times come from vLLM's own Prometheus histograms on /metrics, which the engine core stamps,
so HTTP, tokenization and streaming costs are outside them (`client_overhead_s` measures those
apart). One probe = one or a few requests sent together; the difference of the histograms'
_sum and _count before and after it gives:

- decode steps: B requests with `prompt` random token ids each and `decode_tokens` forced output
  tokens (`ignore_eos`), sent at once. They prefill together and then decode in lockstep, so the
  mean of `request_decode_time_seconds` / (tokens - 1) is the length of one decode-only step of
  B requests with total context B * (prompt + tokens / 2) (the mean over the run). B prompts
  fit one step's token budget (prompt <= max_num_batched_tokens // B), so the batch prefills in
  one step and starts decoding together.
- prefill steps: one request of L prompt tokens and max_tokens 1 on an idle engine:
  `request_prefill_time_seconds` (SCHEDULED to first token) is one step with L prefill tokens
  (L <= max_num_batched_tokens, so it is not chunked).
- mixed steps: the same prefill request while B decoders run (started first, seen decoding): the
  probe's prefill time is one step with L prefill tokens and B decodes. Only the probe finishes
  inside the window (the decoders record their times when they end), which is checked.

Not measured: steps with several prompts, chunked prompts (the fitted form extrapolates them
through its per-token and pairs terms), decode contexts above the probes' (the fitted line
extends linearly), and the wait between a request's arrival at the HTTP
server and its first scheduling step (part of `client_overhead_s`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from presched.serve.sse import sse_lines
from presched.sim.steptime.fitted import FittedStepModel, StepSample

DECODE = "vllm:request_decode_time_seconds"
PREFILL = "vllm:request_prefill_time_seconds"


class CalibrationError(RuntimeError):
    """The engine answered wrongly (HTTP error, wrong token count) or its metrics are missing."""


def parse_histograms(text: str, names: Sequence[str] = (DECODE, PREFILL)) -> dict[str, tuple[float, float]]:
    """{histogram name: (sum, count)} from Prometheus exposition text, summed over label sets
    (vLLM labels by engine and model). A histogram that is absent is (0, 0)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {n: [0.0, 0.0] for n in names}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            for n in names:
                if s.name == f"{n}_sum":
                    out[n][0] += s.value
                elif s.name == f"{n}_count":
                    out[n][1] += s.value
    return {n: (v[0], v[1]) for n, v in out.items()}


@dataclass
class Probe:
    """One measurement: its kind, shape, the engine-side step time and the client's view."""

    kind: str  # "decode", "prefill" or "mixed"
    prefill_tokens: int
    num_decode: int
    decode_context: int
    step_s: float
    client_s: float  # client time of the probe request(s): first send to last reply

    def sample(self) -> StepSample:
        p = self.prefill_tokens
        return StepSample(p, p * (p + 1) / 2, p, self.num_decode, self.decode_context, self.step_s)


@dataclass
class Calibration:
    """What `calibrate` measured and the step-time model fitted to it."""

    probes: list[Probe]
    model: FittedStepModel
    mape: float  # mean absolute percentage error of the fit on the probes (fraction)
    client_overhead_s: float  # median over idle prefill probes of client latency - engine step
    wall_s: float
    meta: dict[str, Any] = field(default_factory=dict)

    def step_s(self, num_decode: int, context_per_seq: int = 256) -> float:
        """Fitted length of a decode-only step of `num_decode` requests."""
        return self.model.step_time(0, 0, 0, num_decode, num_decode * context_per_seq)

    def decode_tok_s(self, num_decode: int, context_per_seq: int = 256) -> float:
        """Output tokens per second of a full decode batch (the engine's decode capacity)."""
        return num_decode / self.step_s(num_decode, context_per_seq)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.to_dict(), "mape": self.mape,
            "client_overhead_s": self.client_overhead_s, "wall_s": self.wall_s,
            "meta": self.meta, "probes": [p.__dict__ for p in self.probes],
        }  # fmt: skip


class _Engine:
    """The HTTP side: histogram snapshots and forced-length requests with random token ids."""

    def __init__(self, client, model: str, token_ids: tuple[int, int], rng: random.Random) -> None:
        self.client, self.model, self.ids, self.rng = client, model, token_ids, rng

    async def hist(self) -> dict[str, tuple[float, float]]:
        r = await self.client.get("/metrics")
        if r.status_code != 200:
            raise CalibrationError(f"GET /metrics answered HTTP {r.status_code} (not a vLLM server?)")
        if DECODE not in r.text:
            raise CalibrationError(f"/metrics has no {DECODE} histogram (not a vLLM server?)")
        return parse_histograms(r.text)

    async def delta(self, before: dict, want: dict[str, int], timeout: float = 5.0) -> dict:
        """Histogram deltas once each name in `want` counted at least that many more requests
        (the frontend records a request just after its last byte is sent)."""
        deadline = time.monotonic() + timeout
        while True:
            now = await self.hist()
            d = {n: (now[n][0] - before[n][0], now[n][1] - before[n][1]) for n in now}
            if all(d[n][1] >= k for n, k in want.items()) or time.monotonic() > deadline:
                return d
            await asyncio.sleep(0.02)

    def prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(*self.ids) for _ in range(n)]

    async def generate(self, n_prompt: int, n_out: int, started: asyncio.Event | None = None,
                       seen: list[int] | None = None) -> float:  # fmt: skip
        """Stream one request; returns the client's seconds to the end. `started` is set at the
        second content event (the request is decoding); `seen[0]` counts content events."""
        body = {"model": self.model, "prompt": self.prompt(n_prompt), "max_tokens": n_out,
                "ignore_eos": True, "stream": True, "temperature": 0,
                "stream_options": {"include_usage": True}}  # fmt: skip
        t0 = time.perf_counter()
        events, usage = 0, None
        async with self.client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                raise CalibrationError(f"probe request: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
            async for line in sse_lines(r.aiter_bytes()):
                if not line.startswith("data: {"):
                    continue
                ev = json.loads(line[6:])
                if ev.get("usage"):
                    usage = ev["usage"]
                if ev.get("choices"):
                    events += 1
                    if seen is not None:
                        seen[0] = events
                    if events == 2 and started is not None:
                        started.set()
        if started is not None:
            started.set()
        got = (usage or {}).get("completion_tokens")
        if got != n_out:
            raise CalibrationError(f"probe request: asked for {n_out} tokens, the engine reported {got}")
        return time.perf_counter() - t0


async def _decode_probe(e: _Engine, batch: int, prompt: int, tokens: int) -> Probe:
    before = await e.hist()
    t0 = time.perf_counter()
    await asyncio.gather(*(e.generate(prompt, tokens) for _ in range(batch)))
    client = time.perf_counter() - t0
    d = await e.delta(before, {DECODE: batch})
    s, c = d[DECODE]
    if c != batch:
        raise CalibrationError(f"decode probe: expected {batch} new {DECODE} records, got {c:g}")
    step = s / c / (tokens - 1)
    return Probe("decode", 0, batch, batch * (prompt + tokens // 2), step, client)


async def _prefill_probe(e: _Engine, length: int, decoders: int, decoder_prompt: int,
                         decoder_tokens: int) -> Probe | None:  # fmt: skip
    tasks, seen = [], []
    if decoders:
        events = [asyncio.Event() for _ in range(decoders)]
        seen = [[0] for _ in range(decoders)]
        tasks = [asyncio.create_task(e.generate(decoder_prompt, decoder_tokens, ev, sn))
                 for ev, sn in zip(events, seen)]  # fmt: skip
        await asyncio.gather(*(ev.wait() for ev in events))
    before = await e.hist()
    context = sum(decoder_prompt + sn[0] for sn in seen)
    client = await e.generate(length, 1)
    d = await e.delta(before, {PREFILL: 1})
    if tasks:
        await asyncio.gather(*tasks)
    s, c = d[PREFILL]
    if c != 1:  # a decoder finished inside the window: its prefill time is mixed in
        return None
    return Probe("mixed" if decoders else "prefill", length, decoders, context, s, client)


def median_samples(probes: Sequence[Probe]) -> list[StepSample]:
    """One StepSample per probe shape (kind, prefill tokens, batch, context rounded to 64
    tokens per request): the median step time and context over its repeats."""
    groups: dict[tuple, list[Probe]] = {}
    for p in probes:
        per_seq = round(p.decode_context / max(1, p.num_decode) / 64)
        groups.setdefault((p.kind, p.prefill_tokens, p.num_decode, per_seq), []).append(p)
    out = []
    for ps in groups.values():
        m = dataclasses.replace(ps[0], step_s=statistics.median(p.step_s for p in ps),
                                decode_context=round(statistics.median(p.decode_context for p in ps)))  # fmt: skip
        out.append(m.sample())
    return out


def default_batches(max_num_seqs: int) -> list[int]:
    """1, 2, 4, ... below max_num_seqs, and max_num_seqs itself."""
    out, b = [], 1
    while b < max_num_seqs:
        out.append(b)
        b *= 2
    return out + [max_num_seqs]


PROBE_TRIES = 3  # a spoiled mixed probe (a decoder ended inside its window) is retried


async def calibrate_async(
    url: str,
    model: str,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    *,
    batches: Sequence[int] | None = None,
    decode_prompts: Sequence[int] = (32, 1024),
    decode_tokens: int = 192,
    prefill_lengths: Sequence[int] = (16, 64, 256, 512, 1024, 2048),
    mixed_lengths: Sequence[int] = (64, 512, 2048),
    repeats: int = 3,
    token_ids: tuple[int, int] = (100, 1000),
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> Calibration:
    """Probe the idle engine at `url` serving `model` and fit a FittedStepModel (module doc).

    batches: decode batch sizes (default `default_batches(max_num_seqs)`); decode_prompts: prompt
    lengths of the decode probes, each cut to max_num_batched_tokens // batch so that the batch
    prefills in one step (the long one sets the context the fit sees: give the workload's);
    prefill_lengths / mixed_lengths: prompt lengths of the prefill probes alone and beside
    max_num_seqs - 1 decoders (lengths above max_num_batched_tokens are dropped: they would be
    chunked); repeats: each probe this many times, in rotated order (the fit uses each shape's
    median, robust to a probe slowed by other work on the machine); token_ids: range of the
    random prompt ids (inside the vocabulary, no special tokens). `progress(done, total)` after
    each probe."""
    import httpx

    if max_num_seqs < 1 or decode_tokens < 2 or repeats < 1:
        raise ValueError("max_num_seqs >= 1, decode_tokens >= 2 and repeats >= 1 are required")
    batches = list(batches or default_batches(max_num_seqs))
    if any(b < 1 or b > max_num_seqs for b in batches):
        raise ValueError(f"batches: each must be in 1..max_num_seqs={max_num_seqs}, got {batches}")
    budget = max_num_batched_tokens
    plans: list[tuple] = [("decode", b, p) for b in batches
                          for p in sorted({min(x, budget // b) for x in decode_prompts})]  # fmt: skip
    plans += [("prefill", n) for n in prefill_lengths if n <= budget]
    if max_num_seqs > 1:
        plans += [("mixed", n) for n in mixed_lengths if n + max_num_seqs - 1 <= budget]
    total = len(plans) * repeats
    probes: list[Probe] = []
    rng = random.Random(seed)
    t0 = time.perf_counter()
    limits = httpx.Limits(max_connections=max_num_seqs + 4)
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=600, limits=limits) as client:
        e = _Engine(client, model, token_ids, rng)
        await e.hist()  # a server without vLLM's metrics fails here, before any probe
        await e.generate(16, 4)  # warm the path
        done = 0
        for rep in range(repeats):
            k = rep * len(plans) // repeats
            for plan in plans[k:] + plans[:k]:
                if plan[0] == "decode":
                    probes.append(await _decode_probe(e, plan[1], plan[2], decode_tokens))
                else:
                    dec = max_num_seqs - 1 if plan[0] == "mixed" else 0
                    # decoders run long enough to cover the probe (its prefill + HTTP); on a busy
                    # machine one may still finish inside it: tried again with twice as long
                    for attempt in range(PROBE_TRIES):
                        p = await _prefill_probe(e, plan[1], dec, 32, (96 + plan[1] // 8) << attempt)
                        if p is not None:
                            probes.append(p)
                            break
                done += 1
                if progress is not None:
                    progress(done, total)
    samples = median_samples(probes)
    if not any(s.prefill_tokens for s in samples) or all(s.prefill_tokens for s in samples):
        raise CalibrationError("calibration needs both decode and prefill probes")
    fitted, mape = FittedStepModel.fit(samples, source=f"calibrated on {url} ({model})")
    idle = [p.client_s - p.step_s for p in probes if p.kind == "prefill"]
    meta = {"url": url, "model": model, "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens, "batches": batches,
            "decode_prompts": list(decode_prompts), "decode_tokens": decode_tokens,
            "repeats": repeats}  # fmt: skip
    return Calibration(probes, fitted, mape, statistics.median(idle) if idle else float("nan"),
                       time.perf_counter() - t0, meta)  # fmt: skip


def calibrate(url: str, model: str, max_num_seqs: int, max_num_batched_tokens: int,
              **kwargs: Any) -> Calibration:  # fmt: skip
    """`calibrate_async` in a fresh event loop."""
    return asyncio.run(calibrate_async(url, model, max_num_seqs, max_num_batched_tokens, **kwargs))
