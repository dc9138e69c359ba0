"""`LocalStack` (what `presched epp --envoy-port` runs): Envoy's cluster holds the endpoints the
picker has, those of the endpoints file included."""

from __future__ import annotations

import json

import httpx

from presched.epp.local import LocalStack, free_port


def test_the_local_envoys_cluster_has_the_endpoints_files_hosts(tmp_path):
    """The bootstrap was built from cfg.endpoints only: with `--endpoints-file` alone Envoy's
    cluster had no hosts and every request got Envoy's 503."""
    dead = f"127.0.0.1:{free_port()}"
    f = tmp_path / "pool.yaml"
    f.write_text(f"endpoints:\n  - {{address: '{dead}', model: tiny}}\n")
    with LocalStack({"endpoints_file": str(f)}, stubs=1) as st:  # the stub in `endpoints`, one more in the file
        boot = json.loads((st.workdir / "envoy.json").read_text())
        pool = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "gie_pool")
        hosts = {e["endpoint"]["address"]["socket_address"]["port_value"]
                 for lb in pool["load_assignment"]["endpoints"] for e in lb["lb_endpoints"]}  # fmt: skip
        stub = st.picker.cfg.endpoints[0].address
        assert hosts == {int(stub.rpartition(":")[2]), int(dead.rpartition(":")[2])}
        assert st.envoy_hosts() == [stub, dead]
        r = httpx.post(f"{st.url}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, timeout=30)
        assert r.status_code == 200 and r.headers["x-presched-endpoint"] == stub  # the dead one is down
