"""Loader for ML.ENERGY leaderboard (v3) LLM files: measured vLLM deployments to compare with.

A file `<org>__<model>__<task>.json` holds {model_id, task, output_length_distribution,
configurations: [...]}; each configuration is one vLLM deployment (gpu_model, num_gpus,
parallelization, max_num_seqs) measured under a saturating closed-loop load, with its
avg_batch_size, median/p90/p99 ITL in milliseconds, output throughput (tokens/s), mean output
length and its own output-length histogram (bins: len(counts) + 1 edges, in tokens).

`load_mlenergy(path, model=..., gpu=..., task=...)` reads one file or every model file under a
directory and returns `MeasuredConfig` records in seconds. The data directory is an argument;
nothing here knows where the data lives.

Parallelism. `parallelization` must give `tensor_parallel`, `expert_parallel` and
`data_parallel` (integers >= 1; `notes` is ignored, any other key is refused). They are read
into the deployment vLLM actually ran (`vllm_tp`, `expert_parallel`, `data_parallel`):

- ep = 1: tp * dp must equal num_gpus.
- ep > 1: vLLM's expert-parallel group is every GPU, so ep must equal num_gpus. ML.ENERGY's
  data builder (ml-energy/data, records/runs.py `_load_parallelization`) records tp = 1 for an
  expert-parallel run whose config gives no tensor-parallel-size, while its launcher
  (ml-energy/benchmark, llm/benchmark.py) starts vLLM with `--tensor-parallel-size num_gpus`
  unless the config uses data parallelism; so tp = 1, dp = 1, ep = num_gpus is read as
  vllm_tp = num_gpus. Otherwise tp * dp must equal num_gpus.
- With dp > 1 the launcher splits max_num_seqs over the replicas: max_num_seqs must be divisible
  by dp (`max_num_seqs_per_rank`).

Anything else raises MLEnergyFormatError naming the field; nothing is read as tp = 1 silently.

The file must be UTF-8 JSON (a gzip-compressed or otherwise non-UTF-8 file is refused naming
it). A histogram's edges must be finite and strictly increasing and its counts sum to more than
0. The model's `weight_precision` ("bfloat16", "fp8", ...) and `architecture` ("Dense
Transformer", "MoE") are kept, when the file has them, as `weight_precision` / `architecture`;
`deployment.deployment_config` refuses a deployment whose preset disagrees with them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class MLEnergyFormatError(ValueError):
    """A file does not have the expected structure; the message names the file and field."""


@dataclass(frozen=True, slots=True)
class MeasuredConfig:
    """One measured deployment. Times in seconds, lengths in output tokens."""

    model_id: str
    task: str
    gpu_model: str
    num_gpus: int
    tensor_parallel: int
    """As recorded in the file (see the module docstring for what vLLM ran)."""
    max_num_seqs: int
    avg_batch_size: float
    median_itl: float
    p90_itl: float
    p99_itl: float
    output_throughput: float
    """Output tokens per second over the whole deployment."""
    avg_output_len: float
    output_length_bins: tuple[float, ...]
    """Histogram edges (len(counts) + 1), tokens."""
    output_length_counts: tuple[int, ...]
    source: str
    """File the record came from."""
    expert_parallel: int = 1
    data_parallel: int = 1
    vllm_tp: int = 1
    """Tensor-parallel size per data-parallel rank that vLLM ran with (module docstring)."""
    weight_precision: str | None = None
    """The file's `weight_precision` as written ("bfloat16", "fp8"); None when it has none."""
    architecture: str | None = None
    """The file's `architecture` as written ("Dense Transformer", "MoE"); None when absent."""

    @property
    def max_num_seqs_per_rank(self) -> int:
        """max_num_seqs of one data-parallel rank (the launcher splits it over dp ranks)."""
        return self.max_num_seqs // self.data_parallel


def load_mlenergy(
    path: str | Path,
    model: str | None = None,
    gpu: str | None = None,
    task: str | None = None,
) -> list[MeasuredConfig]:
    """Measured configurations from one ML.ENERGY model file, or from every model file under
    a directory (searched recursively; `index.json` is skipped).

    Filters (case-insensitive, None = all): `model` matches the full model_id
    ("meta-llama/Llama-3.1-8B-Instruct") or its part after the slash; `gpu` the gpu_model
    ("H100"); `task` the task ("lm-arena-chat"). Records keep file order; files are read in
    sorted order. Raises FileNotFoundError for a missing path, MLEnergyFormatError (naming file
    and field) for a malformed file, and LookupError when the filters match nothing (listing
    what is there).
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"ML.ENERGY data path {str(root)!r} does not exist")
    if root.is_dir():
        files = sorted(p for p in root.rglob("*.json") if p.name.count("__") == 2)
        if not files:
            raise FileNotFoundError(
                f"no ML.ENERGY model files (<org>__<model>__<task>.json) under {str(root)!r}"
            )
    else:
        files = [root]

    out: list[MeasuredConfig] = []
    seen: set[str] = set()
    for f in files:
        if root.is_dir() and not _name_may_match(f.name, model, task):
            org, name, rest = f.name.removesuffix(".json").split("__")
            seen.add(f"{org}/{name} {rest} (gpus not read)")
            continue
        for rec in _read_file(f):
            seen.add(f"{rec.model_id} {rec.task} {rec.gpu_model}")
            if model is not None and not _model_matches(rec.model_id, model):
                continue
            if task is not None and rec.task.lower() != task.lower():
                continue
            if gpu is not None and rec.gpu_model.lower() != gpu.lower():
                continue
            out.append(rec)
    if not out:
        raise LookupError(
            f"no ML.ENERGY configuration in {str(root)!r} matches model={model!r} "
            f"gpu={gpu!r} task={task!r}; present (model task gpu): {'; '.join(sorted(seen))}"
        )
    return out


def _model_matches(model_id: str, wanted: str) -> bool:
    w = wanted.lower()
    return model_id.lower() == w or model_id.rsplit("/", 1)[-1].lower() == w


def _name_may_match(filename: str, model: str | None, task: str | None) -> bool:
    """Cheap pre-filter on `<org>__<model>__<task>.json` before parsing."""
    org, name, rest = filename.removesuffix(".json").split("__")
    if model is not None and not _model_matches(f"{org}/{name}", model):
        return False
    if task is not None and rest.lower() != task.lower():
        return False
    return True


def _read_file(path: Path) -> list[MeasuredConfig]:
    where = str(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raise MLEnergyFormatError(f"{where}: gzip-compressed; expected JSON text (decompress it)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MLEnergyFormatError(f"{where}: not UTF-8 text (byte {raw[e.start:e.start + 1]!r} at "
                                  f"offset {e.start}); expected JSON text") from None  # fmt: skip
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise MLEnergyFormatError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise MLEnergyFormatError(f"{where}: expected a JSON object at top level")
    model_id = _get(data, "model_id", str, where)
    task = _get(data, "task", str, where)
    precision = _get(data, "weight_precision", str, where) if "weight_precision" in data else None
    architecture = _get(data, "architecture", str, where) if "architecture" in data else None
    configs = _get(data, "configurations", list, where)
    out = []
    for i, c in enumerate(configs):
        field = f"configurations[{i}]"
        if not isinstance(c, dict):
            raise MLEnergyFormatError(f"{where}: field {field}: expected an object")
        ctx = f"{where}: field {field}."
        num_gpus = _int(c, "num_gpus", ctx)
        max_num_seqs = _int(c, "max_num_seqs", ctx)
        tp, ep, dp, vllm_tp = _parallelism(c, ctx, num_gpus, max_num_seqs)
        bins, counts = _histogram(c, ctx)
        out.append(
            MeasuredConfig(
                model_id=model_id,
                task=task,
                gpu_model=_get(c, "gpu_model", str, ctx),
                num_gpus=num_gpus,
                tensor_parallel=tp,
                expert_parallel=ep,
                data_parallel=dp,
                vllm_tp=vllm_tp,
                max_num_seqs=max_num_seqs,
                avg_batch_size=_pos(c, "avg_batch_size", ctx),
                median_itl=_pos(c, "median_itl_ms", ctx) / 1e3,
                p90_itl=_pos(c, "p90_itl_ms", ctx) / 1e3,
                p99_itl=_pos(c, "p99_itl_ms", ctx) / 1e3,
                output_throughput=_pos(c, "output_throughput_tokens_per_sec", ctx),
                avg_output_len=_pos(c, "avg_output_len", ctx),
                output_length_bins=bins,
                output_length_counts=counts,
                source=where,
                weight_precision=precision,
                architecture=architecture,
            )
        )
    return out


PARALLEL_FIELDS = ("tensor_parallel", "expert_parallel", "data_parallel")


def _parallelism(c: dict, ctx: str, num_gpus: int, max_num_seqs: int) -> tuple[int, int, int, int]:
    """(tp as recorded, ep, dp, tp vLLM ran with); module docstring for the rules."""
    par = _get(c, "parallelization", dict, ctx)
    pctx = f"{ctx}parallelization."
    for key in par:
        if key not in PARALLEL_FIELDS and key != "notes":
            raise MLEnergyFormatError(f"{pctx}{key}: not representable (only "
                                      f"{', '.join(PARALLEL_FIELDS)} are modelled)")  # fmt: skip
    tp, ep, dp = (_int(par, k, pctx) for k in PARALLEL_FIELDS)
    if ep > 1:
        if ep != num_gpus:
            raise MLEnergyFormatError(
                f"{pctx}expert_parallel: {ep} on {num_gpus} GPUs; vLLM's expert-parallel group "
                f"is every GPU (ep = num_gpus)"
            )
        vllm_tp = num_gpus if (tp, dp) == (1, 1) else tp  # ML.ENERGY's launcher: TP = num_gpus
    else:
        vllm_tp = tp
    if vllm_tp * dp != num_gpus:
        raise MLEnergyFormatError(
            f"{pctx}tensor_parallel: tp {tp} x dp {dp} = {tp * dp} GPUs, but num_gpus is "
            f"{num_gpus} (pipeline or other parallelism is not representable)"
        )
    if max_num_seqs % dp:
        raise MLEnergyFormatError(
            f"{ctx}max_num_seqs: {max_num_seqs} is not divisible by data_parallel {dp}"
        )
    return tp, ep, dp, vllm_tp


def _fmt(where: str, key: str) -> str:
    # `where` is either "<file>" (top level) or "<file>: field configurations[i]." (nested)
    return f"{where}{key}" if where.endswith(".") else f"{where}: field {key}"


def _get(obj: dict, key: str, typ: type, where: str) -> Any:
    if key not in obj:
        raise MLEnergyFormatError(f"{_fmt(where, key)}: missing")
    v = obj[key]
    if not isinstance(v, typ) or isinstance(v, bool):
        raise MLEnergyFormatError(
            f"{_fmt(where, key)}: got {type(v).__name__} {v!r:.60}, expected {typ.__name__}"
        )
    return v


def _int(obj: dict, key: str, where: str) -> int:
    v = _get(obj, key, int, where)
    if v < 1:
        raise MLEnergyFormatError(f"{_fmt(where, key)}: got {v!r}, expected an integer >= 1")
    return v


def _pos(obj: dict, key: str, where: str) -> float:
    if key not in obj:
        raise MLEnergyFormatError(f"{_fmt(where, key)}: missing")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise MLEnergyFormatError(
            f"{_fmt(where, key)}: got {v!r:.60}, expected a finite number > 0"
        )
    return float(v)


def _histogram(c: dict, ctx: str) -> tuple[tuple[float, ...], tuple[int, ...]]:
    hist = _get(c, "output_length_distribution", dict, ctx)
    hctx = f"{ctx}output_length_distribution."
    bins = _get(hist, "bins", list, hctx)
    counts = _get(hist, "counts", list, hctx)
    if len(bins) != len(counts) + 1:
        raise MLEnergyFormatError(
            f"{hctx}bins: {len(bins)} edges for {len(counts)} counts, expected len(counts) + 1"
        )
    if not all(isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b)
               for b in bins) or any(b1 <= b0 for b0, b1 in zip(bins, bins[1:])):  # fmt: skip
        raise MLEnergyFormatError(f"{hctx}bins: expected strictly increasing finite numbers")
    if bins[0] < 0:  # output lengths in tokens (a negative edge drew negative lengths)
        raise MLEnergyFormatError(f"{hctx}bins: the first edge is {bins[0]}, expected >= 0 tokens")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        raise MLEnergyFormatError(f"{hctx}counts: expected integers >= 0")
    if sum(counts) == 0:  # nothing to draw output lengths from
        raise MLEnergyFormatError(f"{hctx}counts: all 0; expected at least one observed length")
    return tuple(float(b) for b in bins), tuple(counts)
