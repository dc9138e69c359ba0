"""`WorkloadConfig` and `build_workload`: one typed description of the request stream.

    WorkloadConfig()                                              # embedded default, 2000 requests
    WorkloadConfig(source="azure-conv", rate=10.0)                # real trace, rescaled to 10 req/s
    WorkloadConfig(source="castillo", model="llama-3.1-8b", split="test",
                   arrivals="gamma", rate=4.0, cv=2.0)            # text + lengths, bursty arrivals
    WorkloadConfig(source="azure-conv", lengths_from="castillo",
                   lengths_model="llama-3.1-8b")                  # Azure timing, CASTILLO contents

`build_workload(cfg)` runs: load `source` -> order it (by arrival; sources without timestamps
are shuffled with the seed) -> keep the first `num_requests` -> attach `lengths_from` contents
(`compose`) -> arrival times (`trace`: as recorded, rescaled to `rate` if given; `poisson` /
`gamma`: generated at `rate`, default the source's own mean rate) -> cap `max_tokens` -> sort ->
optional `hash_prompts` (block hashes of prompt text) -> optional `shared_prefix` (system
prompts, conversations, block hashes: `shared_prefix.py`).
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from presched.config import Config
from presched.workload import arrivals as arr
from presched.workload.compose import compose
from presched.workload.default import default_workload
from presched.workload.loaders import LOADERS, UNTIMED
from presched.workload.prefix import hash_prompts
from presched.workload.request import Request
from presched.workload.shared_prefix import SharedPrefixConfig, add_shared_prefixes

DEFAULT = "default"
CASTILLO_OPTIONS = ("model", "split", "sample")

Sample = Annotated[int, Field(ge=0, le=9)] | Literal["mean"]


class WorkloadConfig(Config):
    """Where requests come from and when they arrive."""

    source: str = Field(
        DEFAULT,
        description="Request source: 'default' (embedded workload, no files: Azure-code-like bursty arrivals, CASTILLO Llama-3.1-8B lengths) or a "
        "loader name: azure, azure-conv, azure-code, mooncake, mooncake-conv, castillo, sharegpt, generic.",
    )
    path: Path | None = Field(
        None,
        description="File (or CASTILLO folder) to load; required by azure, mooncake, sharegpt, "
        "generic; the other loaders default to the shared data folder.",
    )
    model: str | None = Field(
        None,
        description="CASTILLO only: model name or a unique case-insensitive substring (e.g. llama-3.1-8b).",
    )
    split: Literal["train", "validate", "test"] | None = Field(
        None, description="CASTILLO only: prompt split; none = all splits."
    )
    sample: Sample = Field(
        0,
        description="CASTILLO only: which of the 10 sampled lengths is output_tokens (0-9), or 'mean'.",
    )
    lengths_from: str | None = Field(
        None,
        description="Optional second source whose prompt/output lengths, text and model are attached "
        "to the first source's arrival times (see workload.compose).",
    )
    lengths_path: Path | None = Field(
        None, description="File or folder for lengths_from (like path)."
    )
    lengths_model: str | None = Field(
        None, description="CASTILLO model for lengths_from (like model)."
    )
    lengths_split: Literal["train", "validate", "test"] | None = Field(
        None, description="CASTILLO split for lengths_from (like split)."
    )
    lengths_sample: Sample = Field(0, description="CASTILLO sample for lengths_from (like sample).")
    arrivals: Literal["trace", "poisson", "gamma"] = Field(
        "trace",
        description="Arrival process: 'trace' keeps the source's timestamps, 'poisson' or 'gamma' "
        "generates them (gamma: interarrival CV = cv).",
    )
    rate: float | None = Field(
        None,
        gt=0,
        description="Mean arrival rate in requests/s. trace: rescale target (none keeps the trace's "
        "rate); poisson/gamma: generation rate (none = the source's own mean rate).",
    )
    cv: float = Field(
        1.0,
        gt=0,
        description="Coefficient of variation of the gaps for arrivals='gamma' (1 = Poisson).",
    )
    num_requests: int | None = Field(
        None,
        ge=1,
        description="Keep only the first N requests by arrival (default: all; 2000 for 'default').",
    )
    max_tokens: int | None = Field(
        None,
        ge=1,
        description="Generation cap put on every request (min with any cap it already has).",
    )
    seed: int = Field(
        0,
        ge=0,
        description="Seed for every random choice (default lengths, shuffling, composition, arrivals).",
    )
    hash_prompts: bool = Field(
        False,
        description="Give every request with prompt text (castillo, sharegpt, generic with prompt) prefix-cache block hashes of its text's token ids (o200k_base, 16-token blocks; workload/prefix.py), as the gateway hashes prompts, cut at the request's prompt_tokens. Requests without text get none.",
    )
    shared_prefix: SharedPrefixConfig | None = Field(
        None,
        description="Shared system prompts and multi-turn conversations put in front of every prompt, with prefix-cache block hashes (fields: system_prompts, system_prompt_tokens, system_prompt_share, popularity, mean_turns, max_prompt_tokens, block_tokens; workload/shared_prefix.py). Unset: prompts as loaded.",
    )

    @field_validator("source", "lengths_from")
    @classmethod
    def _known_source(cls, v: str | None) -> str | None:
        if v is not None and v != DEFAULT and v not in LOADERS:
            raise ValueError(
                f"unknown source {v!r}; known: {', '.join([DEFAULT, *LOADERS.names()])}"
            )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadConfig:
        # an option counts as given when it differs from its default: a dumped config (every
        # field written out, `path: null`, `sample: 0`) must load back
        fields = type(self).model_fields
        set_ = {f for f in self.model_fields_set if getattr(self, f) != fields[f].default}
        _check_options(self.source, self.path, "", set_)
        if self.lengths_from is None:
            stray = [f"lengths_{o}" for o in ("path", *CASTILLO_OPTIONS) if f"lengths_{o}" in set_]
            if stray:
                raise ValueError(f"{', '.join(stray)} given without lengths_from")
        else:
            _check_options(self.lengths_from, self.lengths_path, "lengths_", set_)
        if self.arrivals == "trace" and self.source in UNTIMED:
            raise ValueError(
                f"source {self.source!r} has no timestamps, so arrivals='trace' is impossible; "
                "choose arrivals='poisson' or 'gamma' (and a rate)"
            )
        if self.arrivals != "trace" and self.rate is None and self.source in UNTIMED:
            raise ValueError(
                f"rate is required: source {self.source!r} has no timestamps to take a mean rate "
                "from; set workload.rate (--set workload.rate=R; simulate also takes --rate R)"
            )
        if "cv" in set_ and self.arrivals != "gamma":
            raise ValueError(
                f"cv is only used with arrivals='gamma' (arrivals is {self.arrivals!r})"
            )
        return self


def _check_options(source: str, path: Path | None, prefix: str, set_: set[str]) -> None:
    """Refuse options the chosen loader does not take, and a missing required path."""
    if source == DEFAULT:
        params: dict[str, inspect.Parameter] = {}
    else:
        params = dict(inspect.signature(LOADERS.get(source)).parameters)
    for opt in ("path", *CASTILLO_OPTIONS):
        if f"{prefix}{opt}" in set_ and opt not in params:
            raise ValueError(f"{prefix}{opt} is not used by source {source!r}")
    if "model" in params and params["model"].default is None and f"{prefix}model" not in set_:
        raise ValueError(f"{prefix}model is required by source {source!r} (give it with "
                         f"--set workload.{prefix}model=NAME, e.g. llama-3.1-8b); {_known_models(path)}")
    p = params.get("path")
    if p is not None and p.default is inspect.Parameter.empty and path is None:
        raise ValueError(f"{prefix}path is required by source {source!r}")


def _known_models(path: Path | None) -> str:
    from presched.workload.loaders.castillo import castillo_models

    try:
        return "known: " + ", ".join(castillo_models(path))
    except (OSError, ValueError):
        return "list them with presched.workload.loaders.castillo_models()"


def _load(
    source: str, path: Path | None, opts: dict[str, Any], n: int | None, seed: int
) -> list[Request]:
    if source == DEFAULT:
        return default_workload(n or 2000, seed=seed)
    params = inspect.signature(LOADERS.get(source)).parameters
    kwargs = {k: v for k, v in opts.items() if k in params}
    if path is not None:
        kwargs["path"] = path
    return LOADERS.create(source, **kwargs)


def _rng(seed: int, purpose: int) -> np.random.Generator:
    """Independent streams per purpose, so e.g. changing arrivals does not change composition."""
    return np.random.default_rng([purpose, seed])


def build_workload(cfg: WorkloadConfig) -> list[Request]:
    """The requests `cfg` describes, sorted by arrival (see the module docstring for the steps)."""
    opts = {"model": cfg.model, "split": cfg.split, "sample": cfg.sample}
    if cfg.source == DEFAULT:  # its own "trace": bursty gaps from its table at the trace's rate
        reqs = default_workload(cfg.num_requests or 2000, seed=cfg.seed)
    else:
        reqs = _load(cfg.source, cfg.path, opts, None, cfg.seed)
    if not reqs:  # nothing to simulate or send: a run would report zeros as if it had measured
        where = f" ({cfg.path})" if cfg.path is not None else ""
        raise ValueError(f"workload: source {cfg.source!r}{where} gave no request")

    times = arr.trace(reqs)
    timed = cfg.source not in UNTIMED and (len(reqs) < 2 or times.max() > times.min())
    if cfg.arrivals == "trace" and not timed:
        raise ValueError(
            f"source {cfg.source!r} ({cfg.path}) has no timestamps (every arrival is equal), so "
            "arrivals='trace' is impossible; choose arrivals='poisson' or 'gamma' (and a rate)"
        )
    if timed:
        order = np.argsort(times, kind="stable")
    else:  # no timestamps: a data set sorted by category must not arrive in blocks
        order = _rng(cfg.seed, 0).permutation(len(reqs))
    reqs = [reqs[i] for i in order]
    if cfg.num_requests is not None:
        reqs = reqs[: cfg.num_requests]

    if cfg.lengths_from is not None:
        lopts = {
            "model": cfg.lengths_model,
            "split": cfg.lengths_split,
            "sample": cfg.lengths_sample,
        }
        donors = _load(cfg.lengths_from, cfg.lengths_path, lopts, len(reqs), cfg.seed + 1)
        reqs = compose(reqs, donors, seed=cfg.seed)

    if cfg.arrivals == "trace":
        # the default's gaps were drawn at `rate` (CV ~12: 30 of them can span 4x (n-1)/rate);
        # rescaled like any trace, the requests kept arrive at exactly `rate`, shape unchanged
        if cfg.rate is not None and len(reqs) >= 2:
            reqs = arr.apply_arrivals(reqs, arr.rescale(arr.trace(reqs), cfg.rate))
    else:
        rate = cfg.rate
        if rate is None:
            rate = arr.mean_rate(arr.trace(reqs)) if timed and len(reqs) >= 2 else None
            if rate is None or not np.isfinite(rate):
                raise ValueError(
                    f"rate is required: source {cfg.source!r} gives no mean rate to keep; set "
                    "workload.rate (--set workload.rate=R; simulate also takes --rate R)"
                )
        rng = _rng(cfg.seed, 1)
        if cfg.arrivals == "poisson":
            new = arr.poisson(len(reqs), rate, rng)
        else:
            new = arr.gamma(len(reqs), rate, cfg.cv, rng)
        reqs = arr.apply_arrivals(reqs, new)

    if cfg.max_tokens is not None:
        cap = cfg.max_tokens
        reqs = [
            dataclasses.replace(
                r, max_tokens=cap if r.max_tokens is None else min(r.max_tokens, cap)
            )
            for r in reqs
        ]
    reqs = sorted(reqs, key=lambda r: r.arrival)
    if cfg.hash_prompts:
        reqs = hash_prompts(reqs)
    if cfg.shared_prefix is not None:  # replaces any hashes: the prompts change
        reqs = add_shared_prefixes(reqs, cfg.shared_prefix, seed=cfg.seed)
    return reqs
