"""Saving and resuming an `OnlineLearner`, atomically.

A state folder holds `online.npz` (the commit point: a JSON header with the version, counters,
drift alarm and the names of the other two files, and the recalibration scores as arrays), the
base model `base-v{version}.npz` (the ordinary `.npz` of `presched train`) and the refit buffer
`buffer-{n}.jsonl` (the generic schema). Each file is written under a temporary name in the same
folder and moved into place with `os.replace` (atomic on POSIX), the model and the buffer before
the header that names them, so a crash at any moment leaves either the old state or the new one
complete; files no header names any more are deleted after the header is replaced.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from presched.predict.base import load_predictor
from presched.predict.online.calibrate import OnlineConformal
from presched.predict.online.config import OnlineConfig
from presched.predict.online.drift import DriftAlarm
from presched.workload.loaders.generic import load_generic, save_generic
from presched.workload.request import Request

HEADER = "online.npz"
FORMAT = 1


def _replace(tmp: Path, final: Path) -> None:
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)


def save_state(learner: Any, folder: str | Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with learner._lock:
        base, version = learner.base, learner.version
        cal_arrays, cal_values = learner.conformal.state()
        alarm = learner.alarm.state()
        counts = dict(learner.counts)
        pairs = list(learner.buffer)
        saves = counts.get("saves", 0) + 1
        learner.counts["saves"] = saves
    model = folder / f"base-v{version}.npz"
    if not model.exists():
        tmp = base.save(folder / f".tmp-base-v{version}.npz")
        _replace(tmp, model)
    buf = folder / f"buffer-{saves}.jsonl"
    buffer = [dataclasses.replace(r, output_tokens=n, output_samples=()) for r, n in pairs]
    _replace(save_generic(buffer, folder / f".tmp-buffer-{saves}.jsonl"), buf)
    header = {"format": FORMAT, "version": version, "model": model.name, "buffer": buf.name, "counts": counts,
              "alarm": alarm, "conformal": cal_values}  # fmt: skip
    tmp = folder / ".tmp-online.npz"
    with open(tmp, "wb") as f:
        np.savez(f, __header__=np.array(json.dumps(header)), **cal_arrays)
    _replace(tmp, folder / HEADER)
    for old in folder.iterdir():
        if old.name not in (HEADER, model.name, buf.name) and (old.name.startswith(("base-v", "buffer-"))):
            old.unlink(missing_ok=True)
    return folder / HEADER


def load_state(cls: type, folder: str | Path, cfg: OnlineConfig, anchor: Sequence[Request], background: bool) -> Any:
    """The learner saved in `folder`, or None when there is no state there yet."""
    folder = Path(folder)
    path = folder / HEADER
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as z:
        header = json.loads(str(z["__header__"]))
        arrays = {k: z[k] for k in z.files if k != "__header__"}
    if header.get("format") != FORMAT:
        raise ValueError(f"{path}: online state format {header.get('format')}, this presched reads {FORMAT}")
    learner = cls(load_predictor(folder / header["model"]), cfg, anchor, background)
    learner.version = int(header["version"])
    learner.conformal = OnlineConformal.from_state(arrays, header["conformal"])
    learner.alarm = DriftAlarm.from_state(header["alarm"])
    learner.counts.update(header["counts"])
    learner.buffer.extend((r, int(r.output_tokens)) for r in load_generic(folder / header["buffer"]))
    return learner
