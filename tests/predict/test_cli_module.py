"""The predictor commands live in `presched.predict.cli` and are registered on the one `presched`
app under their names, in the order `presched --help` lists them; the command modules import
each other in neither direction, so any of them can be imported first."""

from __future__ import annotations

import subprocess
import sys


def test_every_command_is_on_the_presched_app_in_order():
    from presched.cli import app
    from presched.predict import cli as predict_cli

    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert names == ["bench", "simulate", "config", "train", "predict", "eval", "serve", "learn", "replay", "epp"]
    by_name = {c.name or c.callback.__name__: c.callback for c in app.registered_commands}
    assert by_name["train"] is predict_cli.train and by_name["eval"] is predict_cli.eval_
    assert by_name["predict"] is predict_cli.predict


def test_command_modules_do_not_import_presched_cli():
    code = ("import sys, presched.predict.cli, presched.loadgen.cli, presched.serve.cli, presched.epp.cli; "
            "assert 'presched.cli' not in sys.modules, 'a command module imported presched.cli'")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr


def test_eval_help_names_every_predictor_the_default_eval_runs():
    # `stack` ran by default but the help left it out
    import re

    from presched.predict.cli import eval_
    from presched.predict.evaluate import available_predictors

    text = eval_.__defaults__[0].help
    for name in available_predictors():
        assert re.search(rf"\b{re.escape(name)}\b", text), name
