"""Task type of a prompt (code or text) and model verbosity offsets per task type, for
`text-gbm`'s `task_offsets` parameter.

Why: a served model's verbosity is not one number. On CASTILLO, ranking the 13 models by their
mean length over all training prompts ranks them *backwards* on the natural-language sources a
fit never saw (tau-b -0.04 / -0.05 / -0.06 on Alpaca, Dolly and ShareGPT held out): the models
that write long code write short chat answers. Offsets fitted per task type keep that apart
(docs/predictors/text-gbm.md, "Task offsets").

- `code_task(cues)`: a fixed rule on `features.lexical_cues` (nothing fitted, so it cannot
  memorise a prompt source): code density > 3 % of characters, a code fence, three or more code lines, a
  programming keyword (`kw_code`), or a programming-problem phrase (`kw_test`: "sample input",
  "input format", asserts). On CASTILLO it marks 100 % of BigCodeBench, DS1000 and Mbpp prompts,
  99.8 % of Apps, 6 % of Alpaca, 5 % of Dolly and 30 % of ShareGPT (which holds coding chats).
- `TaskOffsets`: per task type, the two-way additive fit log y ~ t_p + b_m (`model_offsets`) on
  that type's rows, and each model's residual spread s_m; a model without rows of a type, or
  never seen, takes that type's family mean, else that type's mean over models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from presched.predict import features as F

_CODE_CHARS, _FENCES, _CODE_LINES, _KW_CODE, _KW_TEST = (F.CUE_NAMES.index(n) for n in (
    "frac_code_chars", "code_fences", "log_code_lines", "kw_code", "kw_test"))  # fmt: skip
TASKS = ("text", "code")
_THREE_LINES = float(np.log1p(2))  # log_code_lines is log1p(count): three or more code lines


def code_task(cues: np.ndarray) -> np.ndarray:
    """1 where a prompt (a row of `lexical_cues`) asks for code, else 0 (module doc)."""
    c = np.asarray(cues)
    return ((c[:, _CODE_CHARS] > 0.03) | (c[:, _FENCES] > 0) | (c[:, _CODE_LINES] > _THREE_LINES)
            | (c[:, _KW_CODE] > 0) | (c[:, _KW_TEST] > 0)).astype(np.int8)  # fmt: skip


class TaskOffsets:
    """b_m and s_m per task type (`TASKS`); `stats[t, m] = (b, s)`, nan where type t has no
    rows of model m."""

    def __init__(self, models: Sequence[str], stats: np.ndarray) -> None:
        self.models = list(models)
        self.index = {m: i for i, m in enumerate(self.models)}
        self.stats = np.asarray(stats, dtype=float)

    @classmethod
    def fit(cls, models: Sequence[str], prompt_idx: np.ndarray, model_idx: np.ndarray, ly: np.ndarray,
            task: np.ndarray, offsets: Callable) -> TaskOffsets:  # fmt: skip
        """`offsets` is text_gbm.model_offsets (prompt_idx, model_idx, ly, n) -> (u, t_p, b);
        `task` is each row's prompt task type."""
        stats = np.full((len(TASKS), len(models), 2), np.nan)
        for t in range(len(TASKS)):
            sel = task == t
            if not sel.any():
                continue
            mi, pi = model_idx[sel], prompt_idx[sel]
            u, tp, b = offsets(pi, mi, ly[sel], len(models))
            resid = ly[sel] - tp[np.searchsorted(u, pi)] - b[mi]
            cnt = np.bincount(mi, minlength=len(models))
            s = np.sqrt(np.bincount(mi, resid**2, minlength=len(models)) / np.maximum(cnt, 1))
            stats[t] = np.where((cnt > 0)[:, None], np.column_stack([b, s]), np.nan)
        return cls(models, stats)

    def rows(self, models: Sequence[str], task: np.ndarray) -> np.ndarray:
        """(n, 2): (b, s) of each request's model for its prompt's task type (fallbacks: module doc)."""
        out = np.empty((len(models), 2))
        cache: dict[tuple[str, int], np.ndarray] = {}
        for i, (m, t) in enumerate(zip(models, task.tolist())):
            row = cache.get((m, t))
            if row is None:
                row = cache[(m, t)] = self._row(m, t)
            out[i] = row
        return out

    def _row(self, model: str, t: int) -> np.ndarray:
        st = self.stats[t]
        j = self.index.get(model)
        if j is not None and np.isfinite(st[j]).all():
            return st[j]
        same = [k for n, k in self.index.items() if F.same_family(model, n) and np.isfinite(st[k]).all()]
        pool = st[same] if same else st[np.isfinite(st).all(axis=1)]
        return pool.mean(axis=0) if len(pool) else np.zeros(2)
