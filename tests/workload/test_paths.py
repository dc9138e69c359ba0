"""data_dir: env var first, then <repo>/../shared/data, then shared/data above the cwd."""

from __future__ import annotations

import pytest

from presched.workload import paths


def test_finds_shared_data(data_dir):
    assert (data_dir / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv").is_file()


def test_env_var_wins(monkeypatch, tmp_path):
    monkeypatch.setenv(paths.ENV_VAR, str(tmp_path))
    assert paths.data_dir() == tmp_path


def test_env_var_must_be_a_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(paths.ENV_VAR, str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="PRESCHED_DATA_DIR"):
        paths.data_dir()


def test_walks_up_from_cwd(monkeypatch, tmp_path):
    monkeypatch.delenv(paths.ENV_VAR, raising=False)
    fake_src = tmp_path / "elsewhere" / "a" / "b" / "c" / "paths.py"  # no shared/ beside it
    monkeypatch.setattr(paths, "__file__", str(fake_src))
    (tmp_path / "proj" / "shared" / "data").mkdir(parents=True)
    deep = tmp_path / "proj" / "x" / "y"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert paths.data_dir() == (tmp_path / "proj" / "shared" / "data").resolve()


def test_not_found_tells_to_set_env(monkeypatch, tmp_path):
    monkeypatch.delenv(paths.ENV_VAR, raising=False)
    monkeypatch.setattr(paths, "__file__", str(tmp_path / "a" / "b" / "c" / "d" / "paths.py"))
    monkeypatch.chdir(tmp_path)
    if any((p / "shared" / "data").is_dir() for p in (tmp_path, *tmp_path.parents)):
        pytest.fail("a shared/data folder exists above the temp dir; this test needs a clean tree")
    with pytest.raises(FileNotFoundError, match="set the environment variable PRESCHED_DATA_DIR"):
        paths.data_dir()
