"""The transformers reference for hidden-state features: pooling without the sink token(s), the
EGTP entropy weighting in closed form, and real SmolLM2-135M states (shapes, the massive
first-token activation left out). Needs torch + transformers (the `encoder` extra or the engine
venv); the real-model tests also need SmolLM2 converted (built in the engine venv)."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="hidden-state features need torch (pip install 'presched[encoder]')")
pytest.importorskip("transformers", reason="hidden-state features need transformers")
torch.set_num_threads(1)

from presched.predict.probe.features import PromptFeaturizer, pool_entropy, pool_mean, token_entropy


def test_pool_mean_leaves_out_the_sink_of_each_row_under_left_and_right_padding():
    s = torch.arange(2 * 4 * 1, dtype=torch.float32).reshape(2, 4, 1)  # row0: 0..3, row1: 4..7
    s[:, :, 0] += torch.tensor([[1000.0, 0, 0, 0], [0, 1000.0, 0, 0]])  # the sinks are huge
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])  # row0 right padded, row1 left padded
    out = pool_mean(s, mask, sink=1)
    assert out.shape == (2, 1)
    assert out[:, 0].tolist() == [1.5, 6.5]  # mean of (1, 2) and (6, 7): pads and sinks excluded
    assert pool_mean(s, mask, sink=0)[0, 0] == pytest.approx((1000 + 1 + 2) / 3)


def test_pool_refuses_a_prompt_with_nothing_after_the_sink():
    with pytest.raises(ValueError, match="sink"):
        pool_mean(torch.ones(1, 2, 3), torch.tensor([[1, 0]]), sink=1)


def test_entropy_weighting_in_closed_form():
    # logits (0, 0) -> H = ln 2; (0, -inf-ish) -> H ~ 0; uniform over 4 -> ln 4 = 2 ln 2
    logits = torch.tensor([[[5.0, 5, 5, 5], [0.0, 0, -1e4, -1e4], [0.0, -1e4, -1e4, -1e4], [0.0, 0, 0, 0]]])
    H = token_entropy(logits)
    assert H[0].tolist() == pytest.approx([math.log(4), math.log(2), 0.0, math.log(4)], abs=1e-5)
    states = torch.tensor([[[100.0], [1.0], [7.0], [4.0]]])
    out = pool_entropy(states, H, torch.ones(1, 4), sink=1)  # weights ln2 : 0 : 2ln2 = 1/3, 0, 2/3
    assert out.item() == pytest.approx(1 / 3 * 1 + 2 / 3 * 4, rel=1e-5)


def test_entropy_weighting_falls_back_to_uniform_when_all_entropies_are_zero():
    out = pool_entropy(torch.tensor([[[9.0], [2.0], [4.0]]]), torch.zeros(1, 3), torch.ones(1, 3), sink=1)
    assert out.item() == pytest.approx(3.0)


@pytest.fixture(scope="module")
def smollm2():
    from presched.engine import models, smollm2
    from presched.engine.venv import cache_dir

    out = cache_dir() / "smollm2-135m"
    if not smollm2.is_complete(out):
        from builders import require_engine

        require_engine()  # the conversion runs in the engine venv
        out = models.ensure_smollm2()
    return PromptFeaturizer(out, layer=15, sink=1, batch=2)


def test_real_smollm2_features_shapes_and_the_sink_token_left_out(smollm2):
    prompts = ["What is 2 + 2?", "Write a long essay about the history of the Roman empire, in detail."]
    out = smollm2.encode(prompts)
    assert out["mean"].shape == out["egtp"].shape == (2, 576)
    assert np.isfinite(out["mean"]).all() and np.isfinite(out["egtp"]).all()
    ids = smollm2.token_ids(prompts)
    assert out["n_tokens"].tolist() == [len(i) for i in ids]
    # the reference: layer 15's output for the first prompt alone, positions 1.. averaged
    with torch.inference_mode():
        hs = smollm2.model(input_ids=torch.tensor([ids[0]]), output_hidden_states=True).hidden_states[16][0]
    norms = hs.norm(dim=-1)
    assert norms[0] > 20 * norms[1:].max()  # the massive first-token activation
    np.testing.assert_allclose(out["mean"][0], hs[1:].mean(0).numpy(), rtol=1e-4, atol=1e-3)  # padded batch = alone
    assert np.linalg.norm(out["mean"][0]) < norms[1:].max()  # sink excluded: no 25,000-norm token inside
    assert smollm2.spec("egtp").key() == "hidden:smollm2-135m:L15:egtp:s1"


def test_featurizer_refuses_a_layer_the_model_does_not_have(smollm2):
    with pytest.raises(ValueError, match="layer: 30 is not in 0..29"):
        PromptFeaturizer(smollm2.model_dir, layer=30)


def test_probe_with_a_model_dir_computes_missing_vectors_with_the_featurizer(smollm2):
    from presched.predict import PREDICTORS
    from presched.workload.request import Request

    texts = ["Say hi.", "Name a colour.", "Explain relativity in depth.", "Write a poem about rain.",
             "List three fruits.", "Describe a cat."]
    reqs = [Request(id=str(i), prompt_tokens=5, prompt=t, output_tokens=10 + 40 * i) for i, t in enumerate(texts)]
    pred = PREDICTORS.create("egtp", model_dir=str(smollm2.model_dir), model="smollm2-135m")
    pred._featurizer = smollm2  # the module's loaded model (the same folder, layer and sink)
    pred.fit(reqs[:4], validation=reqs[4:])
    assert pred.spec.key() == "hidden:smollm2-135m:L15:egtp:s1" and pred.spec.hidden == 576
    attached = [Request(id="a", prompt_tokens=5, prompt="Describe a cat.",
                        metadata={pred.spec.key(): smollm2.encode(["Describe a cat."])["egtp"][0]})]
    np.testing.assert_allclose(pred.predict(attached).point, pred.predict(reqs[5:]).point, rtol=1e-6)


def test_step_states_are_the_layer_output_at_the_gth_answer_token(smollm2):
    ids = smollm2.token_ids(["Name a colour.", "Write a poem about rain."])
    answers = [list(range(300, 340)), list(range(500, 505))]  # 40 and 5 tokens
    out = smollm2.encode_steps(list(zip(ids, answers)), steps=[16, 4, 32])
    assert out.shape == (2, 3, 576)  # steps sorted: 4, 16, 32
    with torch.inference_mode():
        for g_i, g in enumerate((4, 16, 32)):
            seq = torch.tensor([ids[0] + answers[0][:g]])
            ref = smollm2.model(input_ids=seq, output_hidden_states=True).hidden_states[16][0, -1]
            np.testing.assert_allclose(out[0, g_i], ref.numpy(), rtol=1e-4, atol=1e-3)  # batch = alone
    # the 5-token answer was running after 4 tokens only (it had stopped before 16 and 32)
    assert np.isfinite(out[1, 0]).all() and np.isnan(out[1, 1:]).all()
    with pytest.raises(ValueError, match="steps"):
        smollm2.encode_steps(list(zip(ids, answers)), steps=[0])
