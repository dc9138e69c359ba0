"""The answer-so-far pool: A_g, the mean of a request's per-step states at generated tokens
1..g (numpy only).

`probe-refine` with `answer` on reads it next to the state at token g (`features_step`): one
token's state is noisy, the mean over the answer so far says what kind of answer it is. The
engine core sums the per-step states the worker hook already ships (no worker change), on each
seq (`EngineSeq.features_answer`), when the records keep step states (`features.record_steps`)
or the refine model reads it.
"""

from __future__ import annotations

import numpy as np


def add_answer(step_ids, seqs: dict) -> None:
    """After `deliver`: add each delivered per-step state at a generated token g >= 1 to its
    seq's answer sum (`features_answer`, float64), once per g: only a g after the last one
    added counts (a recompute after preemption ships the next token's state, never an old one;
    a repeat would be skipped). The answer-so-far pool is features_answer / features_answer_g
    when every token's state arrived (speculative decoding ships only the last verified one:
    the pool then averages fewer states than g; `answer_mean` divides by what it summed)."""
    for rid in step_ids:
        seq = seqs.get(rid)
        if seq is None or seq.features_step_g < 1 or seq.features_step_g <= seq.features_answer_g:
            continue
        if seq.features_answer is None:
            seq.features_answer = [seq.features_step.astype(np.float64), 1]
        else:
            seq.features_answer[0] += seq.features_step
            seq.features_answer[1] += 1
        seq.features_answer_g = seq.features_step_g


def answer_mean(seq) -> np.ndarray | None:
    """A_g: the mean of the states summed into `seq.features_answer` (float32), None before any."""
    if seq.features_answer is None:
        return None
    total, n = seq.features_answer
    return (total / n).astype(np.float32)
