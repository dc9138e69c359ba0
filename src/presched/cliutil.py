"""Helpers shared by the command modules (`presched.cli`, `presched.predict.cli`): a
comma-separated option read as a list, the progress bar (or progress lines when stderr is not a
terminal), the error-message cleaner, and the stderr console; importing it makes typer's help show
boolean flags as flags (no `<bool>` value).

It imports no command module, so each command module can import it without importing the others.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from typer.core import TyperOption

from presched.config import UserError

err = Console(stderr=True, soft_wrap=True)  # messages keep paths whole (no hard wraps at 80 columns)


def csv_list(text: Optional[str], cast=str, option: str = "") -> Optional[list]:
    """`"a, b,,c"` -> `["a", "b", "c"]` (each item through `cast`); None stays None.
    Raises UserError naming `option` (e.g. "--loads") and the item when an item does not convert."""
    if text is None:
        return None
    out = []
    for x in (x.strip() for x in text.split(",")):
        if not x:
            continue
        try:
            out.append(cast(x))
        except ValueError:
            kind, kinds = {float: ("a number", "numbers"), int: ("an integer", "integers")}.get(cast, ("a value", "values"))
            where = f"{option}: " if option else ""
            raise UserError(f"{where}expected a comma-separated list of {kinds}, e.g. 0.5,0.9; "
                            f"{x!r} is not {kind}") from None  # fmt: skip
    return out


def output_folder(path: Path, option: str) -> Path:
    """`path` as an output folder (made later): refused naming `option` when it exists as a
    file, before a run of minutes ends in FileExistsError."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{option}: {path} is a file; give a folder for the results")
    return path


def output_file(path: Path, option: str) -> Path:
    """`path` as an output file (its folders made later): refused naming `option` when it is a
    folder, before the run."""
    if path.is_dir():
        raise UserError(f"{option}: {path} is a folder; give a file name")
    return path


def os_error_message(e: OSError) -> str:
    """`{filename}: {strerror}` for an OSError from the file system (`adir: Is a directory`);
    its own text for one without a file name."""
    if e.filename is not None and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return str(e)


def clean_message(text: str) -> str:
    """An error message without pydantic's noise: its "Value error, " prefix and the whole-input
    dumps `(got {...})` / `(got [...])` that repeat what the user wrote."""
    text = text.replace("Value error, ", "")
    return re.sub(r" \(got [\[{].*?[\]}]\)$", "", text, flags=re.M)


def _flag_type(self, ctx):
    """typer shows a flag as taking a value (`--json <bool>`); a flag takes none: show no type."""
    return None if getattr(self, "is_flag", False) else _display_type_rich(self, ctx)


_display_type_rich = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_type


def progress_bar(console: Console, quiet: bool, lines: bool = False) -> Progress:
    """A transient rich progress bar (description, bar, done/total, elapsed); off when `quiet` or
    when `console` is not a terminal, unless `lines`: then, off a terminal, one line per step on
    stderr (`[2/9] cross-model / text-gbm (41 s)`), so a long run in a log or a pipe shows it is alive."""
    if lines and not quiet and not console.is_terminal:
        return _Lines()
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, disable=quiet or not console.is_terminal, transient=True,
    )  # fmt: skip


class _Lines:
    """The part of rich's Progress the commands use, printing a line per update on stderr."""

    def __enter__(self) -> "_Lines":
        self._start, self._done, self._total = time.perf_counter(), 0, 0
        return self

    def __exit__(self, *exc) -> None:
        return None

    def add_task(self, description: str, total: int) -> int:
        self._total = total
        err.print(f"{description}: {total} steps", highlight=False, soft_wrap=True)
        return 0

    def update(self, task: int, advance: int = 0, description: str = "") -> None:
        self._done += advance
        took = time.perf_counter() - self._start
        err.print(f"[{self._done}/{self._total}] {description} ({took:.0f} s)", highlight=False, soft_wrap=True)
