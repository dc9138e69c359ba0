"""`Picker.admit` with a text predictor (a real lexical-gbm), over real gRPC: a request without
prompt text (token ids, chat content null, a blank prompt) is refused 400 naming `prompt`, as
`presched serve` refuses it, before it is predicted (before the fix: 500 "length predictor
failed: ... field 'prompt' is empty"); a request with text is routed."""

from __future__ import annotations

import json
import random

from epp.test_grpc import _exchange, _started
from presched.predict.base import PREDICTORS
from presched.workload.request import Request

WORDS = "explain write list why code short summary of the and because python".split()


def _lexical():
    rng = random.Random(0)
    reqs = []
    for i in range(300):
        p = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))
        reqs.append(Request(id=f"t{i}", prompt=p, prompt_tokens=len(p) // 4, output_tokens=rng.randint(5, 300),
                            model="tiny"))  # fmt: skip
    return PREDICTORS.create("lexical-gbm").fit(reqs)


def test_a_request_without_prompt_text_is_refused_400_naming_prompt_by_a_text_predictor(stack):
    from presched.epp.config import EppConfig
    from presched.epp.local import free_port
    from presched.epp.server import EppServer

    st = stack.st
    cfg = EppConfig(endpoints=st.picker.cfg.endpoints, port=free_port(), log={"path": None})
    server = st.call(_started(EppServer, cfg, _lexical()))
    try:
        for body in ({"prompt": [1, 2, 3]}, {"prompt": " \t "}):
            out = _exchange(server.port, {"model": "tiny", "max_tokens": 2, **body}, announce="buffered")
            assert [o.WhichOneof("response") for o in out] == ["request_headers", "immediate_response"]
            imm = out[1].immediate_response
            err = json.loads(imm.body)["error"]
            assert (imm.status.code, err["type"], err["param"]) == (400, "invalid_request_error", "prompt"), err
            assert "lexical-gbm" in err["message"] and "reads prompt text" in err["message"]
        out = _exchange(server.port, {"model": "tiny", "max_tokens": 2, "prompt": "explain why"}, announce="buffered")
        assert [o.WhichOneof("response") for o in out] == ["request_headers", "request_body"]
        assert server.picker.predict.predicted == 1  # the refused ones were never predicted
    finally:
        st.call(server.stop(0))
    stack.idle()


def test_the_objectives_targets_reach_the_engine_less_the_time_held_in_the_picker():
    """The engine times a request's deadlines from when it gets it: a target sent whole would
    give the engine the time the request already waited in the picker's queue again. A real
    Picker (no server); its gateway clock is moved on by hand."""
    from presched.epp.config import EppConfig
    from presched.epp.core import MIN_SLO_S, Admission, Picker
    from presched.serve.seq import GatewaySeq

    cfg = EppConfig(endpoints=[{"address": "127.0.0.1:9", "model": "tiny"}], log={"path": None})
    picker = Picker(cfg)
    now = [100.0]
    picker.gw.now = lambda: now[0]
    req = Request(id="r1", prompt_tokens=5, tenant="t1", slo_ttft=0.5, slo_e2e=30.0)
    adm = Admission(GatewaySeq(req, 98.0, 0.0, None, None), {"model": "tiny", "prompt": "hi"}, False, "hi", None)
    xa = json.loads(picker.upstream_body(adm)[0])["vllm_xargs"]
    assert xa == {"presched_slo_ttft": MIN_SLO_S, "presched_slo_e2e": 28.0, "presched_tenant": "t1"}
    now[0] = 98.0  # released at once
    assert json.loads(picker.upstream_body(adm)[0])["vllm_xargs"]["presched_slo_ttft"] == 0.5
