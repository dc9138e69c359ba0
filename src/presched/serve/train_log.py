"""Train an output-length predictor on the gateway's own request log: the serving loop closes.

    path, report = train_from_log("requests.db", "text-gbm", "model.npz")

Who calls it: `presched train --from-log LOG`; the gateway then loads the model file
(`presched.predict.load_predictor`). The labels are the true output lengths the backends reported
(`output_tokens` from usage) of the requests the gateway served; `load_log_requests` says which
rows are used (status 200, known length, not cut by max_tokens unless `keep_censored`).

Prompt text is in the log only when prompt logging was on. Predictors that read only
`prompt_tokens`, `model` and `tenant` (model-median, linear-prompt, ...) train on any log. A
predictor that reads prompt text trains on the rows that have it; if none has, the error says to
enable prompt logging.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from presched.serve.log_read import load_log_requests
from presched.workload.request import Request

_NEEDS_TEXT = "reads prompt text"
"""What `predict.base.check_requests` says when a predictor is given a request without text."""


class LogTrainingError(ValueError):
    """The log cannot train this predictor (no usable rows, no prompt text for a text predictor)."""


def _predictor(name: str, params: dict[str, Any]):
    from presched.predict import PREDICTORS
    from presched.predict.evaluate import ensure_registered

    missing = ensure_registered([name])
    if name not in PREDICTORS:
        hint = (
            f" (not importable here: {'; '.join(f'{m}: {w}' for m, w in missing.items())})"
            if missing
            else ""
        )
        raise LogTrainingError(f"predictor: unknown predictor {name!r}; known: "
                               f"{', '.join(PREDICTORS.names())}{hint}")  # fmt: skip
    if getattr(PREDICTORS.get(name), "oracle", False):
        raise LogTrainingError(
            f"predictor: {name!r} is an oracle (reads the true lengths); it cannot serve"
        )
    try:
        return PREDICTORS.create(name, **params)
    except TypeError as e:
        raise LogTrainingError(f"params: {name} does not take these arguments ({e})") from None


def train_from_log(
    log_path: str | Path,
    predictor_name: str,
    out_path: str | Path,
    params: dict[str, Any] | None = None,
    validation_fraction: float = 0.25,
    seed: int = 0,
    *,
    model: str | None = None,
    keep_censored: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Fit `predictor_name` (constructor arguments `params`) on the log's labelled requests and
    save it to `out_path` (.npz). A seeded `validation_fraction` of the prompts (grouped by prompt
    text, else by request) is held out and passed to `fit` as validation data (early stopping,
    conformal calibration); 0 = none. `model`: only that served model's rows.

    Returns (the written path, a report): rows read, used, dropped by reason, how many were left
    out for lacking prompt text, requests per model, fit and validation sizes, fit seconds.
    Raises `LogFileError` for a file that is not a request log and `LogTrainingError` (a
    ValueError naming the field) for anything else the log cannot do."""
    from presched.predict.evaluate import group_split

    if not 0 <= validation_fraction < 1:
        raise LogTrainingError(
            f"validation_fraction: expected a number in [0, 1), got {validation_fraction}"
        )
    params = dict(params or {})
    pred = _predictor(predictor_name, params)
    loaded = load_log_requests(log_path, model=model, keep_censored=keep_censored)
    reqs = loaded.requests
    if not reqs:
        hint = ("; every usable row was cut (censored): --keep-censored (keep_censored=True) trains on "
                "them, taking the cut length as the truth (a lower bound of it: forced lengths, e.g. "
                "replayed with ignore_eos, are exact)") if loaded.dropped.get("censored") else ""  # fmt: skip
        raise LogTrainingError(f"{log_path}: no row to train on ({loaded.summary()}); rows need "
                               f"status 200 and output_tokens{hint}")  # fmt: skip

    def fit(use: list[Request]) -> tuple[list[Request], list[Request], float]:
        fit_on, validation = group_split(use, validation_fraction, seed)
        if not fit_on:
            raise LogTrainingError(f"validation_fraction: {validation_fraction} leaves nothing to "
                                   f"fit on ({len(use)} requests)")  # fmt: skip
        t0 = time.perf_counter()
        pred.fit(fit_on, validation=validation or None)
        return fit_on, validation, time.perf_counter() - t0

    with_text = [r for r in reqs if r.prompt is not None and r.prompt.strip()]
    left_out = 0
    try:
        fit_on, validation, took = fit(reqs)
    except ValueError as e:
        if _NEEDS_TEXT not in str(e) or len(with_text) == len(reqs):
            raise
        if not with_text:
            raise LogTrainingError(
                f"{log_path}: predictor {predictor_name!r} reads prompt text, but no usable row "
                f"of the log has any (prompt logging was off). Enable prompt logging in the "
                f"gateway and collect again, or train a predictor that reads only prompt_tokens "
                f"and model (e.g. model-median, linear-prompt)."
            ) from None
        left_out = len(reqs) - len(with_text)
        pred = _predictor(predictor_name, params)
        reqs = with_text
        fit_on, validation, took = fit(reqs)
    path = pred.save(out_path)
    summary = loaded.summary() + (f"; {left_out:,} left out: no prompt text" if left_out else "")
    report = {
        "predictor": predictor_name, "params": params, "log": str(log_path), "out": str(path),
        "bytes": path.stat().st_size, "rows": loaded.rows, "used": len(reqs),
        "dropped": dict(loaded.dropped), "censored_kept": loaded.censored_kept,
        "censored_share": round(loaded.censored_share, 4),
        "without_prompt_left_out": left_out,
        "without_prompt_used": sum(r.prompt is None for r in reqs),
        "fit_requests": len(fit_on), "validation_requests": len(validation),
        "models": dict(Counter(r.model for r in reqs).most_common()), "fit_s": round(took, 3),
        "summary": summary,
    }  # fmt: skip
    return path, report
