"""Config errors are refused at start with the field named; the endpoints file is re-read."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from presched.epp.config import EppConfig
from presched.epp.core import Picker
from presched.epp.endpoints import Pool, read_endpoints


def _err(**kw) -> str:
    with pytest.raises(ValidationError) as e:
        EppConfig.model_validate(kw)
    return str(e.value)


def test_bad_configs_name_the_field():
    ep = [{"address": "127.0.0.1:8000"}]
    assert "at least one endpoint" in _err()
    msg = _err(endpoints=[{"address": "localhost:8000"}])
    assert "address" in msg and "IP address" in msg
    assert "expected ip:port" in _err(endpoints=[{"address": "10.0.0.1"}])
    assert "fairness_header" in _err(endpoints=ep, fairness_header="X Bad")
    assert "unknown policy 'nope'" in _err(endpoints=ep, policy="nope")
    assert "unknown router" in _err(endpoints=ep, router="nope")
    assert "listed twice" in _err(endpoints=ep * 2)


def test_body_and_drain_limits_are_bounded_naming_the_field():
    """max_body_bytes had no upper bound: from ~2 GiB grpc.max_*_message_length (C ints)
    overflowed with a traceback when the server was made."""
    ep = [{"address": "127.0.0.1:8000"}]
    assert "max_body_bytes" in _err(endpoints=ep, max_body_bytes=2**31 + 5)
    msg = _err(endpoints=ep, max_body_bytes=2**30, max_event_bytes=2**30)
    assert "max_body_bytes" in msg and "under 2 GiB" in msg
    assert "drain_s" in _err(endpoints=ep, drain_s=-1) and "drain_s" in _err(endpoints=ep, drain_s=301)
    EppConfig(endpoints=ep, max_body_bytes=2**30)  # with the default max_event_bytes: fits


def test_the_endpoints_file_is_reread_and_a_bad_edit_keeps_the_last_good_list(tmp_path):
    f = tmp_path / "pool.yaml"
    f.write_text("endpoints:\n  - {address: 127.0.0.1:18001}\n  - {address: 127.0.0.1:18002}\n")
    cfg = EppConfig(endpoints_file=f, log={"path": None})
    picker = Picker(cfg, endpoints=read_endpoints(f))
    pool = Pool(cfg, picker)
    gw = picker.gw
    live = lambda: sorted(b.name for b in gw.backends if b.index not in gw.retired)  # noqa: E731
    assert live() == ["127.0.0.1:18001", "127.0.0.1:18002"]
    f.write_text("endpoints:\n  - {address: 127.0.0.1:18002}\n  - {address: 127.0.0.1:18003}\n")
    os.utime(f, ns=(1, 2))  # a changed mtime even on a coarse clock
    pool.reload()
    assert live() == ["127.0.0.1:18002", "127.0.0.1:18003"]
    f.write_text("endpoints:\n  - {address: nothost}\n")
    os.utime(f, ns=(3, 4))
    pool.reload()  # logged; the list in force stays
    assert live() == ["127.0.0.1:18002", "127.0.0.1:18003"]
    with pytest.raises(ValueError, match=r"endpoints\.0\.address"):
        read_endpoints(f)
    picker.close()


def test_the_kubernetes_example_configures_a_valid_picker():
    import yaml
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
    docs = {d["kind"]: d for f in sorted(root.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())}
    cfg = EppConfig.model_validate(yaml.safe_load(docs["ConfigMap"]["data"]["epp.yaml"]))
    pool = docs["InferencePool"]["spec"]
    svc = docs["Service"]
    assert pool["endpointPickerRef"]["name"] == svc["metadata"]["name"]
    assert pool["endpointPickerRef"]["port"]["number"] == svc["spec"]["ports"][0]["port"] == cfg.port
    probes = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert probes["readinessProbe"]["grpc"]["service"] == "readiness"
    assert docs["HTTPRoute"]["spec"]["rules"][0]["backendRefs"][0]["name"] == docs["InferencePool"]["metadata"]["name"]
