"""Model folders the offline builders write (`tiny_llama`, `smollm2`): built under a temporary
name beside the target and renamed into place in one step, so an interrupted build never leaves
a folder that looks finished; a stamp file records what was built.

    with staged(out, kind="tiny-llama", version=2, params=...) as tmp:
        ...  # write config, weights and tokenizer into tmp
    is_complete(out, "tiny-llama", 2)  # -> True
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

STAMP = "presched-model.json"


def is_complete(out: Path, kind: str, version: int) -> bool:
    """True when `out` holds a finished build of `kind` at `version` (read from its stamp file)."""
    try:
        stamp = json.loads((Path(out) / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("kind") == kind and stamp.get("version") == version


@contextmanager
def staged(out: Path, **stamp) -> Iterator[Path]:
    """Yield an empty temporary folder beside `out`; when the block ends without an error, write
    `stamp` (must include kind and version) into it and replace `out` with it. On an error the
    temporary folder is removed and `out` is left as it was."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        (tmp / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)


def build_cli(build: Callable[..., Path], doc: str, argv: list[str] | None = None) -> int:
    """`python -m presched.engine.<builder> --out DIR [--force]`."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="model folder to write")
    ap.add_argument("--force", action="store_true", help="rebuild even if complete")
    args = ap.parse_args(argv)
    build(args.out, force=args.force)
    return 0
