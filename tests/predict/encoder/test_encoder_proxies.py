"""Encoder proxies (s3, ssjf, encoder-l1, listmle) on a tiny real CASTILLO slice, the embedding
cache, bucket edges and the ListMLE loss. One torch thread throughout."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from presched.predict import LEVELS, PREDICTORS, load_predictor
from presched.predict.data import castillo_requests, prompt_key
from presched.predict.encoder import EmbeddingCache, MiniLMEncoder, embed_texts, listmle_loss
from presched.predict.encoder.buckets import Buckets, percentile_edges, s3_edges
from presched.predict.encoder.calibrate import pav
from presched.workload.request import Request

HEADS = ["s3", "ssjf", "encoder-l1", "listmle"]
MODELS = ["llama-3.1-8b", "gemma-3-4b", "qwen2.5-14b"]
FAST = {"finetune_epochs": 0, "head_epochs": 8, "patience": 3, "num_threads": 1, "max_length": 128}


def _first_prompts(reqs, n):
    keys = list(dict.fromkeys(prompt_key(r) for r in reqs))[:n]
    keep = set(keys)
    return [r for r in reqs if prompt_key(r) in keep]


@pytest.fixture(scope="module")
def slice_(data_dir):
    train = _first_prompts(castillo_requests("train", models=MODELS), 150)
    val = _first_prompts(castillo_requests("validate", models=MODELS), 50)
    test = _first_prompts(castillo_requests("test", models=MODELS), 25)
    return train, val, test


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("emb"))


@pytest.fixture(scope="module")
def fitted(slice_, cache_dir):
    """Each head fitted once on the slice (stage 1 off), shared by the tests below."""
    train, val, _ = slice_
    done = {}

    def get(name):
        if name not in done:
            done[name] = PREDICTORS.create(name, cache_dir=cache_dir, **FAST).fit(
                train, validation=val
            )
        return done[name]

    return get


# --- embedding and cache --------------------------------------------------------------------
def test_cache_key_depends_on_every_part():
    base = ("all-minilm", 256, "head_tail", "pretrained", "hello")
    k = EmbeddingCache.key(*base)
    assert len(k) == 64 and k == EmbeddingCache.key(*base)
    for i, other in enumerate(("x", 128, "head", "ft-abc", "hello!")):
        changed = list(base)
        changed[i] = other
        assert EmbeddingCache.key(*changed) != k


def test_embedding_cache_miss_then_hit_memory_and_disk(tmp_path):
    enc = MiniLMEncoder(max_length=64)
    texts = ["What is the capital of France?", "Write a long essay about the history of Rome.",
             "What is the capital of France?"]  # fmt: skip
    cache = EmbeddingCache(tmp_path)
    e1 = embed_texts(enc, texts, cache)
    assert e1.shape == (3, 384) and e1.dtype == np.float32
    assert np.allclose(np.linalg.norm(e1, axis=1), 1.0, atol=1e-5)  # L2-normalised
    assert np.array_equal(e1[0], e1[2])
    assert cache.misses == 3 and cache.hits == 0
    assert len(list((tmp_path / "pretrained").glob("*.npz"))) == 1
    e2 = embed_texts(enc, texts, cache)  # memory hit
    assert cache.hits == 3 and np.array_equal(e1, e2)
    fresh = EmbeddingCache(tmp_path)  # disk hit, no encoder call
    enc2 = MiniLMEncoder(max_length=64)
    e3 = embed_texts(enc2, texts, fresh)
    assert fresh.hits == 3 and fresh.misses == 0 and enc2._model is None
    assert np.array_equal(e1, e3)
    # another max_length is another key: a miss
    embed_texts(MiniLMEncoder(max_length=32), texts[:1], fresh)
    assert fresh.misses == 1
    # and the embedding is semantically sensible: paraphrase closer than an unrelated text
    e = embed_texts(enc, ["What's France's capital city?", "Bake bread with yeast."], None)
    assert e[0] @ e1[0] > e[1] @ e1[0] + 0.2


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PRESCHED_CACHE_DIR", str(tmp_path))
    assert EmbeddingCache().root == tmp_path / "embeddings"


def test_head_tail_truncation_keeps_both_ends():
    enc = MiniLMEncoder(max_length=18, truncation="head_tail")
    text = "alpha " + "filler " * 100 + "omega"
    ids = enc.tokenize([text])["input_ids"][0].tolist()
    tok = enc._tok
    words = tok.convert_ids_to_tokens(ids)
    assert len(ids) == 18 and words[0] == "[CLS]" and words[-1] == "[SEP]"
    assert words[1] == "alpha" and words[-2] == "omega"
    head = MiniLMEncoder(max_length=18, truncation="head").tokenize([text])["input_ids"][0].tolist()
    assert "omega" not in tok.convert_ids_to_tokens(head)


# --- buckets, calibration, loss -----------------------------------------------------------
def test_s3_edges_are_ten_equal_width_buckets_open_at_the_top():
    s = np.arange(1, 1001, dtype=float)  # p99 = 990.01 -> upper rounded up to 1000
    e = s3_edges(s)
    assert len(e) == 11 and e[0] == 0 and np.isinf(e[-1])
    assert np.allclose(np.diff(e[:-1]), 100.0)
    assert np.allclose(s3_edges(s, upper=500)[:-1], np.arange(10) * 50)


def test_ssjf_edges_are_training_percentiles():
    s = np.arange(1, 10001, dtype=float)
    e = percentile_edges(s)
    assert len(e) == 6 and e[0] == 0 and np.isinf(e[-1])
    assert np.allclose(e[1:5], np.percentile(s, [25, 50, 75, 99]))
    b = Buckets.fit(e, s)
    freq = b.soft_labels(s[:, None]).mean(0)
    assert np.allclose(freq, [0.25, 0.25, 0.25, 0.24, 0.01], atol=1e-3)


def test_bucket_mixture_quantiles():
    e = np.array([0, 100, 200, np.inf])
    b = Buckets.fit(
        e, np.concatenate([np.linspace(0, 100, 1001)[:-1], np.linspace(100, 200, 1001)[:-1]])
    )
    q = b.quantiles(np.array([[1.0, 0, 0], [0.5, 0.5, 0]]))
    assert np.all(np.diff(q, axis=1) >= 0)
    assert q[0, LEVELS.index(0.5)] == pytest.approx(50, abs=1)  # uniform on [0, 100)
    assert q[1, LEVELS.index(0.5)] == pytest.approx(100, abs=1)
    assert q[1, LEVELS.index(0.9)] == pytest.approx(180, abs=1)


def test_pav_is_isotonic_least_squares():
    assert np.allclose(pav(np.array([1.0, 3, 2, 4])), [1, 2.5, 2.5, 4])
    assert np.allclose(pav(np.array([3.0, 1]), np.array([1.0, 3])), [1.5, 1.5])


def test_listmle_loss_closed_form():
    # two items, true order a before b: -log P = log(e^a + e^b) - a
    s = torch.tensor([2.0, 0.5])
    assert float(listmle_loss(s, torch.tensor([5.0, 1.0]))) == pytest.approx(
        np.log(np.exp(2) + np.exp(0.5)) - 2
    )
    # three equal scores: -log(1/3 * 1/2) = log 6, whatever the order
    assert float(listmle_loss(torch.zeros(3), torch.tensor([1.0, 2, 3]))) == pytest.approx(
        np.log(6)
    )
    # perfect, very confident scores: loss -> 0; reversed: large
    lab = torch.tensor([3.0, 2, 1])
    assert float(listmle_loss(lab * 20, lab)) < 1e-6
    assert float(listmle_loss(-lab * 20, lab)) > 40


def test_listmle_training_increases_kendall_tau_on_a_separable_set():
    from scipy.stats import kendalltau

    from presched.predict.encoder.head import Head

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 384)).astype(np.float32)
    w = rng.normal(size=384)
    y = np.exp(5 + 0.5 * (x @ w) / np.sqrt(384))  # length monotone in a linear direction
    head = Head(1, 2)
    xt, m = (
        torch.from_numpy(x / np.linalg.norm(x, axis=1, keepdims=True)),
        torch.zeros(512, dtype=torch.long),
    )
    labels = torch.from_numpy(np.floor(y / 10))

    def tau():
        head.eval()
        with torch.no_grad():
            return kendalltau(head(xt, m)[:, 0].numpy(), y).statistic

    before = tau()
    opt = torch.optim.Adam(head.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        head.train()
        perm = torch.randperm(512, generator=gen)
        loss = listmle_loss(head(xt[perm], m)[:, 0].view(16, 32), labels[perm].view(16, 32), gen)
        opt.zero_grad(), loss.backward(), opt.step()
    assert tau() > max(before, 0) + 0.4


# --- the predictors on real data ----------------------------------------------------------
@pytest.mark.parametrize("name", HEADS)
def test_fit_predict_save_load_identical(name, slice_, fitted, tmp_path):
    test = slice_[2]
    pred = fitted(name)
    est = pred.predict(test)
    assert est.quantiles.shape == (len(test), len(LEVELS))
    assert np.all(np.diff(est.quantiles, axis=1) >= 0) and np.all(est.point >= 1)
    assert np.isfinite(est.rank_score).all() and np.std(est.rank_score) > 0  # it does rank
    same = load_predictor(pred.save(tmp_path / name)).predict(test)
    for f in ("quantiles", "point", "rank_score"):
        assert np.array_equal(getattr(same, f), getattr(est, f)), f


def test_stage1_finetune_changes_encoder_and_round_trips(slice_, cache_dir, tmp_path):
    train, val, test = slice_
    params = {
        **FAST,
        "finetune_epochs": 0.2,
        "finetune_batch": 4,
        "head_epochs": 2,
        "max_length": 32,
    }
    pred = PREDICTORS.create("s3", cache_dir=cache_dir, **params).fit(
        train[:20], validation=val[:10]
    )
    assert pred.finetuned and pred.encoder.fingerprint.startswith("ft-")
    assert pred.timings["stage1_steps"] >= 1
    est = pred.predict(test[:5])
    again = load_predictor(pred.save(tmp_path / "s3ft"))
    assert again.encoder.fingerprint == pred.encoder.fingerprint
    assert np.array_equal(again.predict(test[:5]).quantiles, est.quantiles)


def test_unseen_model_uses_the_unknown_slot(slice_, fitted):
    pred = fitted("encoder-l1")
    r = slice_[2][0]
    from dataclasses import replace

    est = pred.predict([r, replace(r, model="some-new-model")])
    assert np.isfinite(est.point).all()
    assert pred.vocab.index(["some-new-model"])[0] == 0


def test_ssjf_classes_and_unknown_params(slice_, fitted):
    test = slice_[2]
    pred = fitted("ssjf")
    cls = pred.predict_class(test)
    assert cls.shape == (len(test),) and set(cls) <= set(range(5))
    assert np.allclose(pred.predict_proba(test).sum(1), 1.0)
    with pytest.raises(ValueError, match="unknown parameter"):
        PREDICTORS.create("ssjf", buckets=3)
    for key, bad in (("max_length", 4096), ("head_lr", 0.0), ("dropout", 1.0), ("calib_fraction", 0.0),
                     ("head_batch", 0), ("finetune_max_seconds", 0.0)):  # fmt: skip
        with pytest.raises(ValueError, match=f"ssjf: parameter '{key}' must be in"):
            PREDICTORS.create("ssjf", **{key: bad})


@pytest.mark.parametrize("name", HEADS)
def test_empty_prompt_is_refused_naming_the_field(name, slice_, cache_dir, fitted):
    train = slice_[0]
    bad = Request(id="x", prompt_tokens=3, output_tokens=5, model=train[0].model, prompt="  ")
    with pytest.raises(ValueError, match="'prompt'"):
        PREDICTORS.create(name, cache_dir=cache_dir, **FAST).fit([*train[:5], bad])
    with pytest.raises(ValueError, match="'prompt'"):
        fitted(name).predict([bad])
