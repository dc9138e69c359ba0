"""engine/folder.py: a model folder appears whole or not at all (no engine needed, though this
folder's tests carry the `engine` marker)."""

from __future__ import annotations

import pytest

from presched.engine import folder


def test_a_finished_build_replaces_the_old_folder_and_is_stamped(tmp_path):
    out = tmp_path / "models" / "m"
    out.mkdir(parents=True)
    (out / "old.bin").write_text("old")
    with folder.staged(out, kind="k", version=2, params=3) as tmp:
        assert tmp.parent == out.parent and tmp != out and not any(tmp.iterdir())
        (tmp / "weights.bin").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == [folder.STAMP, "weights.bin"]
    assert folder.is_complete(out, "k", 2)
    assert not folder.is_complete(out, "k", 1) and not folder.is_complete(out, "other", 2)
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]  # no temporary folder left


def test_a_failed_build_leaves_the_old_folder_as_it_was(tmp_path):
    out = tmp_path / "m"
    with folder.staged(out, kind="k", version=1) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(RuntimeError, match="conversion failed"):
        with folder.staged(out, kind="k", version=2) as tmp:
            (tmp / "half").write_text("x")
            raise RuntimeError("conversion failed")
    assert folder.is_complete(out, "k", 1) and (out / "a").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert not folder.is_complete(tmp_path / "missing", "k", 1)
    (out / folder.STAMP).write_text("{not json")
    assert not folder.is_complete(out, "k", 1)


def test_the_builder_command_line(tmp_path):
    calls = []

    def build(out, force=False):
        calls.append((out, force))
        return out

    assert folder.build_cli(build, "Build a thing.\n\nMore.", ["--out", str(tmp_path), "--force"]) == 0
    assert calls == [(tmp_path, True)]
    with pytest.raises(SystemExit):
        folder.build_cli(build, "Build a thing.", [])  # --out is required
