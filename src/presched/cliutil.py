"""Helpers shared by the command modules (`presched.cli`, `presched.predict.cli`): a
comma-separated option read as a list, the progress bar, and the stderr console.

It imports no command module, so each command module can import it without importing the others.
"""

from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from presched.config import UserError

err = Console(stderr=True)


def csv_list(text: Optional[str], cast=str) -> Optional[list]:
    """`"a, b,,c"` -> `["a", "b", "c"]` (each item through `cast`); None stays None.
    Raises UserError when an item does not convert."""
    if text is None:
        return None
    try:
        return [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"could not read {text!r} as a comma-separated list") from None


def progress_bar(console: Console, quiet: bool) -> Progress:
    """A transient rich progress bar (description, bar, done/total, elapsed); off when `quiet` or
    when `console` is not a terminal."""
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, disable=quiet or not console.is_terminal, transient=True,
    )  # fmt: skip
