"""The in-engine scheduler's pure parts, without vllm: the version pin, config errors that name
the field, predictions read from vllm_xargs, the CLI flags."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from presched.engine.plugin.flags import plugin_from_args
from presched.engine.plugin.config import PluginConfigError, build_policy, load_plugin_config
from presched.engine.plugin.estimates import BadPrediction, from_xargs, lognormal_quantiles
from presched.engine.plugin.preflight import preflight
from presched.engine.plugin.records import record_row
from presched.engine.plugin.seq import EngineSeq, slos_of
from presched.engine.plugin.version import PINNED_VLLM, VLLMVersionError, check_vllm_version
from presched.predict.estimate import LEVELS


def test_other_vllm_versions_are_refused_naming_both():
    check_vllm_version(PINNED_VLLM)
    check_vllm_version(PINNED_VLLM + "+cpu")
    for other in ("0.31.1", "0.32.1", "0.32", "1.0.0"):
        with pytest.raises(VLLMVersionError) as e:
            check_vllm_version(other)
        assert other in str(e.value) and PINNED_VLLM in str(e.value)


def _cfg(data) -> dict:
    return {"PRESCHED_PLUGIN_CONFIG": json.dumps(data)}


@pytest.mark.parametrize("data,field", [
    ({"policy": "nope"}, "policy"),
    ({"policy": "mlfq", "params": {"num_levels": 0}}, "params.num_levels"),
    ({"policy": "kv-admission", "params": {"quantile": 2}}, "params.quantile"),
    ({"policy": "sjf", "params": {"stat": "q42"}}, "params.stat"),
    ({"policy": "sjf", "params": {"bogus": 1}}, "params.bogus"),
    ({"policy": "sjf", "parmas": {}}, "parmas"),
    ({"policy": "sjf", "predictor": "/no/such/model.npz"}, "predictor"),
    ({"policy": "sjf", "imports": ["no_such_module_xyz"]}, "imports"),
    ({"features": {"layer": -1}}, "features.layer"),
    ({"features": {"sink_tokens": "one"}}, "features.sink_tokens"),
    ({"features": {"pooling": "max"}}, "features.pooling"),
    ({"refine": "/no/such/refine.npz"}, "refine"),  # needs features first
    ({"refine": "/no/such/refine.npz", "features": {"steps": False}}, "refine"),
    ({"refine": "/no/such/refine.npz", "features": {}}, "refine"),  # not found
    ({"refine_at": []}, "refine_at"),
    ({"refine_at": [0]}, "refine_at"),
    ({"features": {"record_steps": [16, 0]}}, "features.record_steps"),
    ({"features": {"record_steps": [2**20 + 1]}}, "features.record_steps"),
    ({"features": {"record_steps": list(range(1, 66))}}, "features.record_steps"),
    ({"features": {"record_steps": ["x"]}}, "features.record_steps.0"),
    ({"features": {"record_steps": [16]}}, "features.record_steps"),  # no records: nothing recorded
    ({"features": {"record_steps": [16], "steps": False}, "records": "r.sqlite"}, "features.record_steps"),
    ({"stats": "/no/such/folder/stats.json"}, "stats"),  # was a FileNotFoundError after vLLM's start
    ({"stats": "/tmp"}, "stats"),
    ({"records": "/tmp"}, "records"),
])  # fmt: skip
def test_bad_config_names_the_field(data, field):
    with pytest.raises(PluginConfigError) as e:
        build_policy(load_plugin_config(_cfg(data)))
    assert str(e.value).startswith(field + ":") or str(e.value).startswith(field + " "), str(e.value)


def test_record_steps_default_and_bounds():
    cfg = load_plugin_config(_cfg({"features": {}}))
    assert cfg.features.record_steps == (16, 64, 256) == cfg.refine_at
    got = load_plugin_config(_cfg({"features": {"record_steps": [1, 2**20, *range(2, 64)]}, "records": "r.sqlite"}))
    assert len(got.features.record_steps) == 64 and max(got.features.record_steps) == 2**20
    assert load_plugin_config(_cfg({"features": {"record_steps": []}})).features.record_steps == ()
    # the default does not ask for records (it only applies when records are on)
    assert load_plugin_config(_cfg({"features": {"steps": False}})).features.record_steps == (16, 64, 256)


def test_config_from_a_file_and_default(tmp_path):
    assert load_plugin_config({}).policy == "fcfs"
    p = tmp_path / "plugin.yaml"
    p.write_text("policy: srpt\nparams: {c_frac: 1.0}\n")
    cfg = load_plugin_config({"PRESCHED_PLUGIN_CONFIG": str(p)})
    assert build_policy(cfg).c_frac == 1.0
    with pytest.raises(PluginConfigError, match="neither a JSON object nor an existing file"):
        load_plugin_config({"PRESCHED_PLUGIN_CONFIG": str(tmp_path / "missing.yaml")})


def test_xargs_quantiles_and_mean_q90():
    est = from_xargs({"presched_quantiles": [5] * 11})
    assert est.quantile(0.5) == 5 and est.point == 5
    assert from_xargs({}) is None
    # mean + q90 (what `presched serve --send-prediction` sends): a log-normal with both
    q = lognormal_quantiles(100.0, 200.0)
    sigma = (math.log(q[LEVELS.index(0.9)]) - math.log(q[LEVELS.index(0.5)])) / 1.2816
    mu = math.log(q[LEVELS.index(0.5)])
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(100.0, rel=1e-3)
    assert q[LEVELS.index(0.9)] == pytest.approx(200.0, rel=1e-3)
    assert q == sorted(q)
    big = lognormal_quantiles(100.0, 1000.0)  # beyond any log-normal of mean 100: the widest
    assert big[LEVELS.index(0.9)] == pytest.approx(100.0 * math.exp(1.2816**2 / 2), rel=1e-3)
    # the presched estimate built from them keeps the mean (its tail model differs slightly)
    est = from_xargs({"presched_pred_mean": 100.0, "presched_pred_q90": 200.0})
    assert est.mean == pytest.approx(100.0, rel=0.05)


@pytest.mark.parametrize("mean,q90", [(180.0, 150.0), (150.9, 60.0), (100.0, 100.0)])
def test_a_q90_at_or_below_the_mean_is_a_heavy_tailed_log_normal(mean, q90):
    # a heavy upper tail (what `presched serve` sends for an estimate with a far q99) puts the
    # mean above q90: only sigma = 1.2816 + sqrt(...) > 2.56 fits, not a point mass at the mean
    q = lognormal_quantiles(mean, q90)
    sigma = (math.log(q[LEVELS.index(0.9)]) - math.log(q[LEVELS.index(0.5)])) / 1.2816
    assert sigma > 2.56
    assert q[LEVELS.index(0.9)] == pytest.approx(q90, rel=1e-3)
    assert math.exp(math.log(q[LEVELS.index(0.5)]) + sigma**2 / 2) == pytest.approx(mean, rel=1e-3)
    est = from_xargs({"presched_pred_mean": mean, "presched_pred_q90": q90})
    assert est.quantile(0.9) == pytest.approx(q90, rel=1e-3)
    assert est.quantile(0.1) < q90 / 10  # spread out, not ~the mean at every level


@pytest.mark.parametrize("xargs,field", [
    ({"presched_quantiles": [1, 2]}, "presched_quantiles"),
    ({"presched_quantiles": [1] * 10 + ["x"]}, "presched_quantiles[10]"),
    ({"presched_quantiles": [1] * 10 + [float("nan")]}, "presched_quantiles[10]"),
    ({"presched_pred_mean": -3}, "presched_pred_mean"),
    ({"presched_pred_mean": 10, "presched_pred_q90": True}, "presched_pred_q90"),
])  # fmt: skip
def test_bad_xargs_name_the_field(xargs, field):
    with pytest.raises(BadPrediction, match=r"vllm_xargs\." + field.replace("[", r"\[").replace("]", r"\]") + ":"):
        from_xargs(xargs)


def _ns(**kw):
    base = dict(scheduler="vllm", policy=None, param=[], predictor=None, records=None,
                plugin_stats=None, plugin_config=None, features=False, feature_layer=None,
                probe=None, refine=None, refine_at=None, draft_layer=None, draft_probe=None, egtp=False,
                record_steps=None)  # fmt: skip
    return argparse.Namespace(**(base | kw))


def test_launch_flags():
    assert plugin_from_args(_ns()) is None
    with pytest.raises(ValueError, match="--policy needs --scheduler presched"):
        plugin_from_args(_ns(policy="sjf"))
    got = plugin_from_args(_ns(scheduler="presched", policy="mlfq",
                               param=["preempt=true", "within=mean", "base_quantum=64"]))  # fmt: skip
    assert got == {"policy": "mlfq", "params": {"preempt": True, "within": "mean", "base_quantum": 64}}
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        plugin_from_args(_ns(scheduler="presched", param=["preempt"]))
    with pytest.raises(ValueError, match="--features needs --scheduler presched"):
        plugin_from_args(_ns(features=True))
    with pytest.raises(ValueError, match="--feature-layer needs --features"):
        plugin_from_args(_ns(scheduler="presched", feature_layer=3))
    assert plugin_from_args(_ns(scheduler="presched", features=True, feature_layer=3)) == {
        "features": {"layer": 3}}
    assert plugin_from_args(_ns(scheduler="presched", features=True)) == {"features": {}}
    with pytest.raises(ValueError, match="--probe needs --features"):
        plugin_from_args(_ns(scheduler="presched", probe=Path("p.npz")))
    assert plugin_from_args(_ns(scheduler="presched", features=True, probe=Path("p.npz"))) == {
        "features": {}, "probe": "p.npz"}
    with pytest.raises(ValueError, match="--refine needs --features"):
        plugin_from_args(_ns(scheduler="presched", refine=Path("r.npz")))
    with pytest.raises(ValueError, match="--refine-at needs --refine"):
        plugin_from_args(_ns(scheduler="presched", features=True, refine_at=[8]))
    assert plugin_from_args(_ns(scheduler="presched", features=True, refine=Path("r.npz"), refine_at=[8, 32])) == {
        "features": {}, "refine": "r.npz", "refine_at": [8, 32]}
    with pytest.raises(ValueError, match="--draft-layer needs --scheduler presched"):
        plugin_from_args(_ns(draft_layer=3))
    with pytest.raises(ValueError, match="--draft-layer needs --features"):
        plugin_from_args(_ns(scheduler="presched", draft_layer=3))
    with pytest.raises(ValueError, match="--draft-probe needs --features"):
        plugin_from_args(_ns(scheduler="presched", draft_probe=Path("d.npz")))
    assert plugin_from_args(_ns(scheduler="presched", features=True, draft_layer=3, draft_probe=Path("d.npz"))) == {
        "features": {"draft_layer": 3}, "draft_probe": "d.npz"}
    with pytest.raises(ValueError, match="--egtp needs --features"):
        plugin_from_args(_ns(scheduler="presched", egtp=True))
    assert plugin_from_args(_ns(scheduler="presched", features=True, egtp=True)) == {"features": {"egtp": True}}
    with pytest.raises(ValueError, match="--record-steps needs --features"):
        plugin_from_args(_ns(scheduler="presched", record_steps=[8]))
    assert plugin_from_args(_ns(scheduler="presched", features=True, record_steps=[8, 40])) == {
        "features": {"record_steps": [8, 40]}}


@pytest.mark.parametrize("data", [{"policy": "slo"}, {"policy": "slo", "params": {"e2e_slo_s": 9}}])
def test_preflight_attaches_the_policy_as_the_engine_does(tmp_path, data):
    """`slo` without tpot_s passed the launcher's check and stopped the engine only after vLLM's
    minute of start-up (the engine attaches the policy; preflight only built it)."""
    with pytest.raises(PluginConfigError, match=r"^params: field 'tpot_s'"):
        preflight(data, tmp_path)
    assert preflight({"policy": "slo", "params": {"tpot_s": 0.01}}, tmp_path).policy == "slo"
    assert preflight({"policy": "kv-admission"}, tmp_path, max_num_seqs=4).policy == "kv-admission"


def _vreq(status_name: str, xargs: dict | None = None):
    return SimpleNamespace(request_id="r", prompt_token_ids=[1] * 5, max_tokens=8, arrival_time=1.0,
                           num_output_tokens=3, num_preemptions=0,
                           sampling_params=SimpleNamespace(extra_args=xargs))  # fmt: skip


@pytest.mark.parametrize("status,code,reason,error", [
    ("FINISHED_STOPPED", 200, "stop", False), ("FINISHED_LENGTH_CAPPED", 200, "length", False),
    ("FINISHED_ABORTED", 499, "abort", False), ("FINISHED_IGNORED", 200, "length", False),
    ("FINISHED_ERROR", 500, "error", True), ("FINISHED_REPETITION", 200, "repetition", False),
])  # fmt: skip
def test_record_rows_carry_vllms_finish_reason_and_the_clients_status(status, code, reason, error):
    """(vLLM's Request stood in by a namespace: EngineSeq reads only these fields; the real
    scheduler's rows are checked in test_plugin_scheduler.py.) FINISHED_ERROR was a 200 with no
    error, finish_reason 'finished_error', so its cut-short length became a training label."""
    row = record_row(EngineSeq(_vreq(status)), status, "tiny")
    assert (row["status"], row["finish_reason"], row["error"] is not None) == (code, reason, error)


def test_slos_from_vllm_xargs():
    assert slos_of({}) == ({}, [])
    assert slos_of({"presched_slo_e2e": 30, "presched_slo_ttft": "2.5"}) == (
        {"slo_e2e": 30.0, "slo_ttft": 2.5}, [])
    for bad in (0, -1, "soon", True, float("nan"), float("inf"), [1], 1e8):
        slos, errors = slos_of({"presched_slo_e2e": bad, "presched_slo_ttft": 1})
        assert slos == {"slo_ttft": 1.0}
        assert len(errors) == 1 and errors[0].startswith("vllm_xargs.presched_slo_e2e:")
    seq = EngineSeq(_vreq("WAITING"), slos=slos_of({"presched_slo_ttft": 4})[0])
    assert (seq.request.slo_e2e, seq.request.slo_ttft) == (None, 4.0)


def test_serve_first_pops_that_request_first_in_this_step_only():
    """The head preempted for starts before a victim that ranks first once back (the
    scheduler's all-or-nothing preemption, as the simulator); after `unpin` (the end of that
    schedule()) the policy's order rules again, so a head vLLM did not start blocks no one."""
    from types import SimpleNamespace

    from presched.engine.plugin.guard import Guard
    from presched.engine.plugin.queue import PolicyRequestQueue
    from presched.engine.plugin.seq import EngineSeq
    from presched.schedule import POLICIES

    seqs = {}
    for rid, t in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
        seqs[rid] = EngineSeq(SimpleNamespace(request_id=rid, prompt_token_ids=[1] * 4, max_tokens=10,
                                              arrival_time=t, num_output_tokens=0, num_preemptions=0,
                                              sampling_params=None))  # fmt: skip
    popped = []
    q = PolicyRequestQueue(POLICIES.create("fcfs"), lambda r, create=True: seqs[r.request_id], lambda: 0.0,
                           Guard(), popped.append, lambda s: None)  # fmt: skip
    for s in seqs.values():
        q.add_request(s.vreq)
    q.serve_first(seqs["c"])
    assert q.peek_request() is seqs["c"].vreq and len(q) == 3
    q.unpin()  # vLLM did not start it this step: the order again
    assert q.peek_request() is seqs["a"].vreq
    q.serve_first(seqs["c"])
    assert [q.pop_request().request_id for _ in range(2)] == ["c", "a"] and q.pinned is None
    assert [q.pop_request().request_id for _ in range(1)] == ["b"] and not q
    q.add_request(seqs["b"].vreq)
    q.serve_first(seqs["b"])
    q.remove_requests([seqs["b"].vreq])  # aborted while pinned
    assert q.pinned is None and not q
    assert [s.id for s in popped] == ["c", "a", "b"]
