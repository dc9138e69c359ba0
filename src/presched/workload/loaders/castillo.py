"""CASTILLO: prompts x 13 open models x 10 sampled responses, with own-tokenizer lengths.

The staged folder has `samples.csv.gz` (one row per prompt and model; `output_sizes` holds the
10 sampled response lengths, space-separated) and `prompts.jsonl.gz` (prompt text by
`prompt_id`). A load picks one model and optionally one split:

    load_castillo(model="llama-3.1-8b", split="test", sample="mean")

- `model`: a full name (`meta-llama--Llama-3.1-8B-Instruct`) or a case-insensitive substring
  matching exactly one model; `castillo_models()` lists them.
- `split`: `"train"`, `"validate"`, `"test"` or None for all rows of that model.
- `sample`: which of the 10 lengths becomes `output_tokens`: an index 0-9 (a real single
  response) or `"mean"` (the per-prompt mean, rounded; a smoother target).

Each request gets `prompt` (text), `output_samples` (the 10 lengths), `model`, and `metadata`
with `dataset`, `category`, `split`, `prompt_id`, `sample_id`. A few prompts occur in two splits
(see the data README); rows are deduplicated by `prompt_id` for the model, keeping the first
row of the file. There are no timestamps: every arrival is 0, so give the workload synthetic
arrivals (`arrivals.poisson`/`gamma`). Ids are `castillo-<model without org>-<prompt_id>`.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from presched.workload.loaders import LOADERS
from presched.workload.loaders.errors import LoadError, wrap_invalid_request
from presched.workload.loaders.fields import check_limit, parse_int, parse_int_list
from presched.workload.loaders.files import jsonl_rows, read_text, split_lines
from presched.workload.paths import data_dir
from presched.workload.request import InvalidRequestError, Request

SAMPLES = "samples.csv.gz"
PROMPTS = "prompts.jsonl.gz"
SPLITS = ("train", "validate", "test")
REQUIRED = ("sample_id", "prompt_id", "dataset", "split", "model", "input_size", "output_sizes")
_TO_COLUMN = {"prompt_tokens": "input_size", "output_tokens": "output_sizes"}


def _folder(path: str | Path | None) -> Path:
    return Path(path).expanduser() if path is not None else data_dir() / "castillo"


class _Samples:
    """samples.csv.gz, read once; rows are split lazily (only the chosen model's), which makes a
    load ~3x faster than splitting all 67k rows."""

    def __init__(self, folder: Path) -> None:
        self.file = folder / SAMPLES
        text = read_text(self.file, "CASTILLO samples file")
        if '"' in text:  # quoted fields: let the csv module split everything
            reader = csv.reader(io.StringIO(text, newline=""))
            parsed: list[tuple[int, list[str]]] = []
            prev = 0
            for row in reader:
                parsed.append((prev + 1, row))
                prev = reader.line_num
            header = parsed[0][1] if parsed else None
            self._parsed: list[tuple[int, list[str]]] | None = [(i, r) for i, r in parsed[1:] if r]
            self._lines: list[str] = []
        else:  # the staged file has no quotes: split by hand, and only the lines needed
            lines = split_lines(text)
            header = lines[0].split(",") if lines else None
            self._parsed = None
            self._lines = lines
        if not header:
            raise LoadError(self.file, "empty file", line=1)
        self.cols = {name.strip(): i for i, name in enumerate(header)}
        for name in REQUIRED:
            if name not in self.cols:
                raise LoadError(self.file, "missing column", line=1, field=name)
        self.width = len(header)

    def models(self) -> list[str]:
        i = self.cols["model"]
        if self._parsed is not None:
            return sorted({row[i] for _, row in self._parsed if len(row) > i})
        found = set()
        for line in self._lines[1:]:
            parts = line.split(",", i + 1)
            if len(parts) > i:
                found.add(parts[i])
        return sorted(found)

    def rows(self, model: str) -> Iterator[tuple[int, list[str]]]:
        """(line number, fields) of the rows of `model`, in file order."""
        i = self.cols["model"]
        if self._parsed is not None:
            candidates: Iterable[tuple[int, list[str]]] = self._parsed
        else:
            candidates = (
                (n, line.split(","))
                for n, line in enumerate(self._lines[1:], start=2)
                if model in line
            )
        for lineno, row in candidates:
            if len(row) > i and row[i] == model:
                if len(row) != self.width:
                    raise LoadError(
                        self.file, f"expected {self.width} fields, got {len(row)}", line=lineno
                    )
                yield lineno, row


def castillo_models(path: str | Path | None = None) -> list[str]:
    """The model names in `<path>/samples.csv.gz` (default: the shared `castillo/` folder)."""
    return _Samples(_folder(path)).models()


def resolve_model(name: str, models: list[str]) -> str:
    """The one model that `name` means: an exact (case-insensitive) name, else the single model
    containing `name` as a case-insensitive substring. Otherwise `ValueError` listing them."""
    want = name.strip().lower()
    exact = [m for m in models if m.lower() == want]
    if exact:
        return exact[0]
    hits = [m for m in models if want and want in m.lower()]
    if len(hits) == 1:
        return hits[0]
    listing = "\n  ".join(models)
    if hits:
        raise ValueError(
            f"model: {name!r} is ambiguous, it matches {', '.join(hits)}; known models:\n  {listing}"
        )
    raise ValueError(f"model: unknown CASTILLO model {name!r}; known models:\n  {listing}")


@LOADERS.register("castillo")
def load_castillo(
    path: str | Path | None = None,
    model: str | None = None,
    split: str | None = None,
    sample: int | str = 0,
    limit: int | None = None,
) -> list[Request]:
    """Load one model's rows from the CASTILLO folder `path` (default: shared `castillo/`).
    See the module docstring for `model`, `split` and `sample`. `limit` keeps the first N."""
    limit = check_limit(limit)
    if split is not None and split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)} or None, got {split!r}")
    if sample != "mean" and (
        isinstance(sample, bool) or not isinstance(sample, int) or not 0 <= sample <= 9
    ):
        raise ValueError(f"sample: expected an index 0-9 or 'mean', got {sample!r}")
    folder = _folder(path)
    samples = _Samples(folder)
    file = samples.file
    models = samples.models()
    if model is None:
        raise ValueError("model: choose a CASTILLO model; known models:\n  " + "\n  ".join(models))
    full = resolve_model(model, models)
    short = full.split("--", 1)[-1]

    c = {name: samples.cols[name] for name in REQUIRED}
    picked: list[tuple[int, list[str]]] = []
    seen: set[str] = set()
    for lineno, row in samples.rows(full):
        if split is not None and row[c["split"]] != split:
            continue
        pid = row[c["prompt_id"]]
        if pid in seen:
            continue
        seen.add(pid)
        picked.append((lineno, row))
        if limit is not None and len(picked) >= limit:
            break

    prompts = _read_prompts(folder / PROMPTS, seen)
    out = []
    for lineno, row in picked:
        pid = row[c["prompt_id"]]
        sizes = parse_int_list(row[c["output_sizes"]], file, lineno, "output_sizes")
        if sample == "mean":
            if not sizes:
                raise LoadError(file, "no output lengths", line=lineno, field="output_sizes")
            output = max(1, round(sum(sizes) / len(sizes)))
        elif sample < len(sizes):
            output = sizes[sample]
        else:
            raise LoadError(
                file,
                f"sample {sample} asked for, but the row has {len(sizes)} lengths",
                line=lineno,
                field="output_sizes",
            )
        if pid not in prompts:
            raise LoadError(file, f"no prompt {pid!r} in {PROMPTS}", line=lineno, field="prompt_id")
        text, category = prompts[pid]
        try:
            out.append(
                Request(
                    id=f"castillo-{short}-{pid}",
                    prompt_tokens=parse_int(row[c["input_size"]], file, lineno, "input_size"),
                    output_tokens=output,
                    model=full,
                    prompt=text,
                    output_samples=sizes,
                    metadata={
                        "dataset": row[c["dataset"]],
                        "category": category,
                        "split": row[c["split"]],
                        "prompt_id": pid,
                        "sample_id": row[c["sample_id"]],
                    },
                )
            )
        except InvalidRequestError as e:
            raise wrap_invalid_request(e, file, lineno, _TO_COLUMN) from None
    return out


def _read_prompts(file: Path, wanted: set[str]) -> dict[str, tuple[str, str]]:
    """prompt_id -> (prompt_text, category) for the wanted ids."""
    text = read_text(file, "CASTILLO prompts file")
    out: dict[str, tuple[str, str]] = {}
    for lineno, row in jsonl_rows(text, file):
        pid = row.get("prompt_id")
        if pid not in wanted:
            continue
        prompt = row.get("prompt_text")
        if not isinstance(prompt, str):
            raise LoadError(
                file, f"expected a string, got {prompt!r}", line=lineno, field="prompt_text"
            )
        out[pid] = (prompt, str(row.get("category", "")))
    return out


def castillo_prompts(path: str | Path, splits: Sequence[str]) -> list[dict]:
    """The rows of a CASTILLO prompts file (`prompts.jsonl.gz`: prompt_id, dataset, split,
    category, prompt_text) in `splits`, each prompt_id once (its first row in them), in the order
    of a hash of the id: a fixed shuffle across the seven prompt sets, so the first N are a fair
    slice and a larger N extends a smaller one."""
    file = Path(path)
    seen: dict[str, dict] = {}
    for _, row in jsonl_rows(read_text(file, "CASTILLO prompts file"), file):
        if row["split"] in splits and row["prompt_id"] not in seen:
            seen[row["prompt_id"]] = row
    return sorted(seen.values(), key=lambda r: hashlib.sha1(str(r["prompt_id"]).encode()).hexdigest())
