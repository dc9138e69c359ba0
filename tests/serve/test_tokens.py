"""Prompt token counting (`serve/tokens.py`): a bad `tokenizer` file is an `error:` naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from presched.config import UserError
from presched.serve.tokens import counter, encoder


def test_a_missing_or_bad_tokenizer_file_is_a_user_error_naming_it(tmp_path):
    bad = tmp_path / "README.md"
    bad.write_text("# not a tokenizer\n")
    for load in (counter, encoder):
        with pytest.raises(UserError, match=r"^tokenizer: .*nofile\.json: file not found$"):
            load(tmp_path / "nofile.json")
        with pytest.raises(UserError, match=r"^tokenizer: .*README\.md: not a tokenizer\.json \("):
            load(bad)
        with pytest.raises(UserError, match=r"^tokenizer: .*: a folder, not a file$"):
            load(tmp_path)


@pytest.mark.parametrize("args", [["serve", "-b", "http://127.0.0.1:9001"], ["epp", "-e", "10.0.0.1:8000"]])
def test_serve_and_epp_refuse_a_bad_tokenizer_without_a_traceback(tmp_path, args):
    r = subprocess.run([sys.executable, "-m", "presched.cli", *args, "--log", "none",
                        "--set", f"tokenizer={tmp_path / 'nofile.json'}"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == f"error: tokenizer: {tmp_path / 'nofile.json'}: file not found"
