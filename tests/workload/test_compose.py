"""compose: timing from one list, contents from another, deterministic per seed."""

from __future__ import annotations

import pytest

from presched.workload import Request, compose


def _timed(n):
    return [Request(id=f"t{i}", prompt_tokens=1, arrival=i * 0.5, output_tokens=1, tenant="default",
                    metadata={"hash_ids": (i,)}, block_hashes=(i,), hash_block_tokens=1)
            for i in range(n)]  # fmt: skip


def _donors(m):
    return [
        Request(id=f"d{j}", prompt_tokens=100 + j, output_tokens=10 + j, prompt=f"p{j}", model="m",
                output_samples=(j, j + 1), tenant="gold" if j % 2 else "default", metadata={"k": j},
                block_hashes=(7, j) if j % 2 else (), hash_block_tokens=16 if j % 2 else 0)
        for j in range(m)
    ]  # fmt: skip


def test_keeps_timing_takes_contents():
    out = compose(_timed(50), _donors(7), seed=3)
    assert [r.id for r in out] == [f"t{i}" for i in range(50)]
    assert [r.arrival for r in out] == [i * 0.5 for i in range(50)]
    donors = {d.id: d for d in _donors(7)}
    for r in out:
        d = donors[r.metadata["length_source"]]
        assert (r.prompt_tokens, r.output_tokens, r.prompt, r.model, r.output_samples) == (
            d.prompt_tokens, d.output_tokens, d.prompt, d.model, d.output_samples)  # fmt: skip
        assert r.tenant == d.tenant  # the timing request had the default tenant
        assert "hash_ids" not in r.metadata and r.metadata["k"] == int(d.id[1:])
        # the prompt is the donor's, so are its block hashes (the timing request's are dropped)
        assert (r.block_hashes, r.hash_block_tokens) == (d.block_hashes, d.hash_block_tokens)


def test_tenant_of_timing_request_wins_when_set():
    timed = [Request(id="a", prompt_tokens=1, tenant="free")]
    assert compose(timed, _donors(3), seed=0)[0].tenant == "free"


def test_deterministic_per_seed_and_differs_across_seeds():
    a = compose(_timed(200), _donors(30), seed=11)
    b = compose(_timed(200), _donors(30), seed=11)
    c = compose(_timed(200), _donors(30), seed=12)
    assert a == b
    assert [r.prompt_tokens for r in a] != [r.prompt_tokens for r in c]


def test_without_replacement_uses_each_donor_once_per_cycle():
    out = compose(_timed(25), _donors(10), seed=4, replace=False)
    ids = [r.metadata["length_source"] for r in out]
    assert sorted(ids[:10]) == sorted(f"d{j}" for j in range(10))
    assert ids[10:20] == ids[:10] and ids[20:] == ids[:5]  # cycles the same permutation
    assert ids[:10] != [f"d{j}" for j in range(10)]  # shuffled


def test_edge_cases():
    assert compose([], _donors(3), seed=0) == []
    with pytest.raises(ValueError, match="lengths_from"):
        compose(_timed(2), [], seed=0)
    with pytest.raises(TypeError, match="seed"):
        compose(_timed(2), _donors(2), seed=1.5)
