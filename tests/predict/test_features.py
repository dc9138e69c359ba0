from __future__ import annotations

import math

import numpy as np
import pytest
import toktok

from presched.predict import features as F


def test_encode_gives_exact_o200k_ids_and_counts_in_one_call():
    texts = ["hello world", "How many tokens is this sentence?", "日本語のテキスト", "", "hello world"]
    ids, off = F.encode(texts)
    assert np.diff(off).tolist() == toktok.batch_count(texts, "o200k_base")  # exact counts
    enc = toktok._encoding(F.ENCODING)
    for i, t in enumerate(texts):
        assert ids[off[i]:off[i + 1]].tolist() == enc.encode_batch_to_numpy([t], 1)[0].tolist()
    ids, off = F.encode([])
    assert ids.size == 0 and off.tolist() == [0]


def test_lexical_cues_shape_and_meaning():
    texts = ["Write a 500 word essay about cats?", "Answer in one word: capital of France",
             "```python\ndef f(x):\n    return x\n```\nFix this code.", "x"]  # fmt: skip
    c = F.lexical_cues(texts)
    assert c.shape == (4, len(F.CUE_NAMES)) and np.isfinite(c).all()
    col = {n: i for i, n in enumerate(F.CUE_NAMES)}
    assert c[0, col["count_request"]] == 1 and math.isclose(c[0, col["log_requested"]], math.log1p(650))
    assert c[0, col["ends_question"]] == 1 and c[0, col["kw_long_form"]] == 1 and c[0, col["kw_write"]] == 1
    assert c[1, col["kw_short"]] == 1 and c[1, col["count_request"]] == 1
    assert c[2, col["code_fences"]] == 2 and c[2, col["log_code_lines"]] > 0 and c[2, col["kw_code"]] == 1
    assert c[3, col["log_chars"]] == math.log1p(1)
    assert F.lexical_cues([]).shape == (0, len(F.CUE_NAMES))


def test_requested_length_parsing():
    cues = F.lexical_cues(["in 3 sentences", "give me five bullet points", "no numbers here"])
    col = F.CUE_NAMES.index("log_requested")
    assert np.allclose(np.expm1(cues[:, col]), [75, 125, 0])


def test_ngram_hasher_rows_are_normalised_deterministic_and_bounded():
    h = F.NgramHasher(bits=12, order=2, head=32, tail=16)
    texts = ["Explain quantum computing", "explain QUANTUM computing", "word " * 5000, ""]
    X = h(texts)
    assert X.shape == (4, 2**12)
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    assert np.allclose(norms[:3], 1, atol=1e-5) and norms[3] == 0
    assert (X[0] != X[1]).nnz > 0  # case kept: "QUANTUM" is other tokens than "quantum"
    assert X[2].nnz <= 2 * (32 + 16)  # only head + tail tokens are read
    assert (h(texts) != X).nnz == 0
    with pytest.raises(ValueError, match="'bits'"):
        F.NgramHasher(bits=30)


def test_model_features_parse_family_and_size():
    m = F.model_features(["meta-llama--Llama-3.1-8B-Instruct", "mistralai--Mixtral-8x7B-Instruct-v0.1",
                          "Qwen--Qwen2.5-7B-Instruct-1M", "acme/unknown-model"])  # fmt: skip
    assert [F.FAMILIES[int(f)] for f in m[:, 0]] == ["llama", "mistral", "qwen", "other"]
    assert np.allclose(np.exp(m[:3, 1]), [8, 56, 7]) and math.isnan(m[3, 1])
    assert m[:3, 2].tolist() == [1, 1, 1]


def test_ngram_hasher_counts_each_ngram_once_per_row_in_canonical_csr():
    # the hasher builds its CSR by hand (sorted keys, no scipy COO pass): the same matrix as the
    # plain construction, log1p of each n-gram's count, rows l2-normalised, indices sorted
    h = F.NgramHasher(bits=10, order=2, head=64, tail=16)
    texts = ["to be or not to be", "", "a a a a b", "Explain quantum computing\nin detail", "", "x"]
    X = h(texts)
    assert X.has_canonical_format and X.shape == (6, 2**10)
    enc = toktok._encoding(F.ENCODING)  # the tokenizer the hasher reads (no public encode)
    for i, t in enumerate(texts):
        ids = enc.encode_batch_to_numpy([t], 1)[0].tolist()
        ids = ids if len(ids) <= 80 else ids[:64] + ids[-16:]
        grams = [(g,) for g in ids] + [tuple(ids[k : k + 2]) for k in range(len(ids) - 1)]
        row = X.getrow(i)
        assert row.nnz <= len(set(grams)) and (row.nnz > 0) == bool(ids)
        if ids:  # log1p counts, normalised: a repeated n-gram weighs more than a single one
            assert math.isclose(float((row.multiply(row)).sum()), 1.0, rel_tol=1e-5)
    # no tokens at all, or no texts: empty rows, not an error
    assert h([""]).shape == (1, 2**10) and h(["", ""]).nnz == 0 and h([]).shape == (0, 2**10)
    # "a a a a b": the unigram "a" (4x) outweighs "b" (1x)
    r = X.getrow(2)
    assert r.data.max() / r.data.min() >= np.log1p(3) / np.log1p(1) - 1e-6


def test_keyword_phrases_need_the_whole_phrase_and_words_need_the_whole_word():
    col = {n: i for i, n in enumerate(F.CUE_NAMES)}
    c = F.lexical_cues(["What are the pros and cons of Rust?", "The pros: speed. The cons: none.",
                        "Which of the following is a prime?", "Rewriting history", "REWRITE this, please"])  # fmt: skip
    assert c[0, col["kw_compare"]] == 1 and c[1, col["kw_compare"]] == 0  # phrase, not its words apart
    assert c[2, col["kw_classify"]] == 1
    assert c[3, col["kw_rewrite"]] == 0 and c[4, col["kw_rewrite"]] == 1 and c[4, col["kw_chat"]] == 1


def test_line_and_character_cues_count_what_they_name():
    col = {n: i for i, n in enumerate(F.CUE_NAMES)}
    texts = ["- first\n• second\n12) third\nnot a bullet - here", "x = 1;\n    return x\nplain line\nint y;",
             "日本語 text", "Ünïcödé and ASCII"]  # fmt: skip
    c = F.lexical_cues(texts)
    # bullets at the very start of the text count, as does the non-ASCII bullet "•"
    assert np.isclose(np.expm1(c[0, col["log_bullets"]]), 3)
    # code lines: "...;" (also on the last line, with no newline after it) and an indented line
    assert np.isclose(np.expm1(c[1, col["log_code_lines"]]), 3)
    # fractions of characters (counted on UTF-8 bytes: a non-ASCII character counts once)
    assert np.isclose(c[2, col["frac_cjk"]], 3 / len(texts[2])) and np.isclose(c[2, col["frac_nonascii"]], 3 / len(texts[2]))
    assert c[3, col["frac_cjk"]] == 0 and np.isclose(c[3, col["frac_nonascii"]], 4 / len(texts[3]))
    assert np.isclose(np.expm1(c[0, col["log_first_line"]]), len("- first"))
    assert np.isclose(np.expm1(c[1, col["log_last_line"]]), len("int y;"))


def test_same_family_needs_a_named_family():
    from presched.predict.features import same_family

    assert same_family("meta-llama/Llama-9.9-70B", "meta-llama--Llama-3.1-8B-Instruct")
    assert same_family("mistralai/Mixtral-8x7B", "mistralai--Ministral-8B")
    assert not same_family("zeta/Terse-7B", "acme--Chatty-7B")  # both 'other': unrelated
    assert not same_family("Qwen/Qwen3-8B", "google--gemma-3-4b-it")
