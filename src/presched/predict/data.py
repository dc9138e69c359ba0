"""Datasets for training and judging predictors.

`castillo_requests(split, models=..., datasets=..., exclude_datasets=...)` loads CASTILLO rows
of several models at once (one `Request` per prompt and model, with `prompt`, `model`,
`prompt_tokens`, the 10 `output_samples` and `output_tokens` = the first sample).
Any other source in the generic schema (prompt text, model, one or more observed output lengths)
loads with `presched.workload.loaders.load_generic`; predictors only need those fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from presched.workload.loaders.castillo import castillo_models, load_castillo
from presched.workload.request import Request


def castillo_requests(
    split: str | Sequence[str] | None = None,
    models: Iterable[str] | None = None,
    datasets: Iterable[str] | None = None,
    exclude_datasets: Iterable[str] = (),
    path: str | Path | None = None,
) -> list[Request]:
    """CASTILLO rows of `models` (default: all 13) in `split` (one name, several, or None = all),
    keeping prompt sets in `datasets` (default all) minus `exclude_datasets`."""
    splits = [split] if split is None or isinstance(split, str) else list(split)
    keep = set(datasets) if datasets is not None else None
    drop = set(exclude_datasets)
    out: list[Request] = []
    for model in models if models is not None else castillo_models(path):
        for sp in splits:
            for r in load_castillo(path, model=model, split=sp, sample=0):
                ds = r.metadata.get("dataset")
                if (keep is None or ds in keep) and ds not in drop:
                    out.append(r)
    return out


def prompt_key(r: Request) -> str:
    """The prompt a request belongs to (CASTILLO prompt_id, else its text): splits must keep
    all rows of one prompt on one side."""
    return str(r.metadata.get("prompt_id") or r.prompt or r.id)
