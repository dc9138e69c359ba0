"""Saving and resuming an `OnlineLearner`, atomically.

A state folder holds `online.npz` (the commit point: a JSON header with the version, counters,
drift alarm, refit schedule, the tenants' label buckets, the caller's position (`OnlineLearner.position`: `presched learn`'s
log and last row, written with the state it describes) and the names of the other two files, and
the recalibration scores as arrays), the base model `base-v{version}-{n}.npz` (the ordinary
`.npz` of `presched train`) and the refit buffer `buffer-{n}.jsonl` (the generic schema), `n`
numbering the saves. Each save writes both files afresh under names no file in the folder has
(never one the live header names, nor one left by a save that crashed), each under a temporary
name first and moved into place with `os.replace` (atomic on POSIX), then the header that names
them, the same way; so a crash at any moment leaves either the old state or the new one
complete. Files no header names any more (and a crashed save's leftovers) are deleted after the
header is replaced. Saves in one process run one at a time, and one process at a time uses a
folder: a learner with a `state_dir` claims it (`claim`, an advisory lock held until the process
exits), and a second process's learner is refused naming `state_dir` (two gateways on one
folder deleted each other's files mid-save and overwrote each other's learning).

Resuming takes the data from the state and every setting from the config it is given (a gateway's
`learn:` or `presched learn --set` changed since the save applies at once): the recalibration's
windows keep their newest `window` rows, and at most `max_groups` groups; the alarm keeps its
sums, change points and the newest `alarm_window` coverage entries (none if `alarm_level`
changed); the buffer its newest `buffer` rows; the refit interval is brought within `min_refit`
and `refit_every`. A state whose groups were keyed the other way (`per_tenant` changed) keeps only
the pooled rows. A state of other quantile levels is refused, naming the field.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from presched.predict.base import load_predictor
from presched.predict.estimate import LEVELS
from presched.predict.online.calibrate import OnlineConformal
from presched.predict.online.config import OnlineConfig
from presched.predict.online.drift import DriftAlarm
from presched.workload.loaders.generic import load_generic, save_generic
from presched.workload.request import Request

HEADER = "online.npz"
OWNER = ".presched-online.lock"  # the claim's lock file (not one of _OURS: never cleaned up)
FORMAT = 1
_OURS = ("base-v", "buffer-", ".tmp-base-v", ".tmp-buffer-", f".tmp-{HEADER}")
_SAVING = threading.Lock()


_CLAIMS: dict[str, Any] = {}  # resolved folder -> the open lock file this process holds


def claim(folder: str | Path) -> None:
    """Make this process the only one using the state folder (an exclusive `flock` on its lock
    file, held until the process exits; learners of one process share it). ValueError naming
    `state_dir` when another process holds it."""
    folder = Path(folder)
    key = str(folder.resolve())
    with _SAVING:
        if key in _CLAIMS:
            return
        folder.mkdir(parents=True, exist_ok=True)
        f = open(folder / OWNER, "a+b")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise ValueError(f"state_dir: {folder} is in use by another process (presched serve --learn "
                             f"or presched learn); give each process its own folder") from None
        _CLAIMS[key] = f


def _replace(tmp: Path, final: Path) -> None:
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)


def _fresh(folder: Path, n: int, version: int) -> int:
    """The first save number from `n` on whose file names are not taken in `folder`."""
    while (folder / f"buffer-{n}.jsonl").exists() or (folder / f"base-v{version}-{n}.npz").exists():
        n += 1
    return n


def save_state(learner: Any, folder: str | Path) -> Path:
    folder = Path(folder)
    claim(folder)
    with _SAVING:
        with learner._lock:
            base, version = learner.base, learner.version
            cal_arrays, cal_values = learner.conformal.state()
            alarm = learner.alarm.state()
            pairs = list(learner.buffer)
            per_tenant = learner.cfg.per_tenant  # how the groups are keyed
            position = learner.position  # the caller's mark of the last completion this state holds
            schedule = {"since_refit": learner._since_refit, "interval": learner._interval,
                        "since_change": learner._since_change}  # fmt: skip
            rng = {"seed": learner.cfg.seed, "state": learner._rng.bit_generator.state}  # the anchor draws
            caps = learner.caps.state()  # the tenants' label buckets
            n = learner.counts["saves"] = _fresh(folder, learner.counts["saves"] + 1, version)
            counts = dict(learner.counts)
        model = folder / f"base-v{version}-{n}.npz"
        _replace(base.save(folder / f".tmp-{model.name}"), model)
        buf = folder / f"buffer-{n}.jsonl"
        buffer = [dataclasses.replace(r, id=i, output_tokens=k, output_samples=()) for (r, k), i in zip(pairs, _unique_ids(pairs))]
        _replace(save_generic(buffer, folder / f".tmp-{buf.name}"), buf)
        header = {"format": FORMAT, "version": version, "model": model.name, "buffer": buf.name, "counts": counts,
                  "alarm": alarm, "conformal": cal_values, "schedule": schedule, "per_tenant": per_tenant,
                  "position": position, "rng": rng, "caps": caps}  # fmt: skip
        tmp = folder / f".tmp-{HEADER}"
        with open(tmp, "wb") as f:
            np.savez(f, __header__=np.array(json.dumps(header)), **cal_arrays)
        _replace(tmp, folder / HEADER)
        for old in folder.iterdir():  # what no header names now, and what crashed saves left
            if old.name not in (HEADER, model.name, buf.name) and old.name.startswith(_OURS):
                old.unlink(missing_ok=True)
    return folder / HEADER


def read_header(folder: str | Path) -> dict | None:
    """The header of the state saved in `folder` (None when there is none yet)."""
    path = Path(folder) / HEADER
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as z:
        header = json.loads(str(z["__header__"]))
    if header.get("format") != FORMAT:
        raise ValueError(f"{path}: online state format {header.get('format')}, this presched reads {FORMAT}")
    return header


def load_state(cls: type, folder: str | Path, cfg: OnlineConfig, anchor: Sequence[Request], background: bool) -> Any:
    """The learner saved in `folder`, or None when there is no state there yet."""
    folder = Path(folder)
    path = folder / HEADER
    header = read_header(folder)
    if header is None:
        return None
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != "__header__"}
    if tuple(header["conformal"]["levels"]) != tuple(LEVELS):
        raise ValueError(f"{path}: field 'levels': the state's quantile levels {header['conformal']['levels']} "
                         f"are not this presched's {list(LEVELS)}")  # fmt: skip
    c = cfg
    learner = cls(load_predictor(folder / header["model"]), c, anchor, background)
    learner.version = int(header["version"])
    learner.conformal = OnlineConformal.from_state(arrays, header["conformal"], c.window, c.min_group,
                                                   c.recalibrate_every, c.max_groups)  # fmt: skip
    if header.get("per_tenant", c.per_tenant) != c.per_tenant:  # groups keyed the other way: the pool's rows only
        learner.conformal.groups.clear()
    learner.alarm = DriftAlarm.from_state(header["alarm"], c.alarm_k, c.alarm_h, c.alarm_window, c.alarm_level,
                                          c.alarm_band)  # fmt: skip
    learner.counts.update(header["counts"])
    learner.position = header.get("position")
    learner.buffer.extend((r, int(r.output_tokens)) for r in load_generic(folder / header["buffer"]))
    sched = header.get("schedule")  # the refit schedule (a state saved before it was kept: restarted)
    if sched is not None:
        learner._since_refit = int(sched["since_refit"])
        interval = max(int(sched["interval"]), c.min_refit)  # within this config's bounds
        learner._interval = min(interval, max(c.refit_every, c.min_refit)) if c.refit_every else interval
        learner._since_change = None if sched["since_change"] is None else int(sched["since_change"])
    if header.get("caps") is not None:  # (a state saved before they were kept: full buckets)
        learner.caps.restore(header["caps"])
    rng = header.get("rng")  # the anchor rows' draws go on where they stopped (a new seed starts over)
    if rng is not None and rng["seed"] == c.seed:
        learner._rng.bit_generator.state = rng["state"]
    return learner


def _unique_ids(pairs) -> list[str]:
    """The buffer rows' ids, a repeat made unique (`<id>~<row>`): clients may reuse request ids,
    and the generic loader that reads the buffer back refuses a repeated id. The first keeps its
    own, so a resumed buffer's ids stay the same from save to save."""
    taken = {r.id for r, _ in pairs}  # a made-up id must not be one a later row brings
    seen: set[str] = set()
    out = []
    for i, (r, _) in enumerate(pairs):
        rid, j = r.id, i
        if rid in seen:
            rid = f"{r.id}~{j}"
            while rid in seen or rid in taken:
                j += len(pairs)
                rid = f"{r.id}~{j}"
        seen.add(rid)
        out.append(rid)
    return out
