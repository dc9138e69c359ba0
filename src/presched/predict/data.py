"""Datasets for training and judging predictors.

`castillo_requests(split, models=..., datasets=..., exclude_datasets=...)` loads CASTILLO rows
of several models at once (one `Request` per prompt and model, with `prompt`, `model`,
`prompt_tokens`, the 10 `output_samples` and `output_tokens` = the first sample). Each prompt
belongs to exactly one split (its first), so train, validate and test never share a prompt.
Any other source in the generic schema (prompt text, model, one or more observed output lengths)
loads with `presched.workload.loaders.load_generic`; predictors only need those fields.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Iterable, Sequence

from presched.workload.loaders.castillo import castillo_models, load_castillo
from presched.workload.loaders.files import jsonl_rows, read_text
from presched.workload.paths import data_dir
from presched.workload.request import Request


@functools.lru_cache(maxsize=4)
def _home_split(path: str | None) -> dict[str, str]:
    """prompt_id -> the one split it belongs to: the first split it was seen in (the `split`
    field of prompts.jsonl.gz). A few prompts occur in two splits of samples.csv.gz (e.g. "hi"
    in validate and test); their rows in the other split are dropped, so each prompt is in
    exactly one split."""
    file = (Path(path) if path else data_dir() / "castillo") / "prompts.jsonl.gz"
    return {str(row["prompt_id"]): str(row["split"])
            for _, row in jsonl_rows(read_text(file, "CASTILLO prompts file"), file)}  # fmt: skip


def castillo_requests(
    split: str | Sequence[str] | None = None,
    models: Iterable[str] | None = None,
    datasets: Iterable[str] | None = None,
    exclude_datasets: Iterable[str] = (),
    path: str | Path | None = None,
) -> list[Request]:
    """CASTILLO rows of `models` (default: all 13) in `split` (one name, several, or None = all),
    keeping prompt sets in `datasets` (default all) minus `exclude_datasets`."""
    splits = None if split is None else [split] if isinstance(split, str) else list(dict.fromkeys(split))
    one = splits[0] if splits is not None and len(splits) == 1 else None
    keep = set(datasets) if datasets is not None else None
    drop = set(exclude_datasets)
    home = _home_split(str(path) if path is not None else None)
    out: list[Request] = []
    for model in models if models is not None else castillo_models(path):
        # one read per model: its rows of all wanted splits, in the file's order per split
        rows = load_castillo(path, model=model, split=one, sample=0)
        for sp in [one] if splits is None or one is not None else splits:
            for r in rows:
                md = r.metadata
                ds = md.get("dataset")
                if (sp is not None and md.get("split") != sp) or (keep is not None and ds not in keep):
                    continue
                if ds not in drop and home.get(str(md.get("prompt_id")), md.get("split")) == md.get("split"):
                    out.append(r)
    return out


def prompt_key(r: Request) -> str:
    """The prompt a request belongs to (CASTILLO prompt_id, else its text): splits must keep
    all rows of one prompt on one side."""
    return str(r.metadata.get("prompt_id") or r.prompt or r.id)
