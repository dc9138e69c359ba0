"""The load generator and the gateway meet only over HTTP (docs/architecture.md): `loadgen/`
imports nothing of `serve/` but the stateless `serve/tokens.py` and `serve/sse.py`, and `serve/` imports nothing of
`loadgen/`. Read from the source (every import statement, top level or inside a function)."""

from __future__ import annotations

import ast
from pathlib import Path

import presched

SRC = Path(presched.__file__).parent


def imported(package: str) -> dict[str, set[str]]:
    """{file name: every presched module it imports} for the files of `package`."""
    out = {}
    for path in sorted((SRC / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
        out[str(path.relative_to(SRC))] = {n for n in names if n.startswith("presched.")}
    return out


def test_loadgen_uses_only_the_token_counter_of_serve():
    files = imported("loadgen")
    assert {"loadgen/replay.py", "loadgen/wire.py", "loadgen/cli.py"} <= set(files)
    for name, mods in files.items():
        from_serve = {m for m in mods if m.startswith("presched.serve")}
        assert from_serve <= {"presched.serve.tokens", "presched.serve.tokens.counter",
                             "presched.serve.sse", "presched.serve.sse.sse_lines"}, name


def test_serve_imports_nothing_of_loadgen():
    for name, mods in imported("serve").items():
        assert not any(m.startswith("presched.loadgen") for m in mods), (name, mods)
