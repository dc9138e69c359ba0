"""The `presched replay` command: a workload (as `presched simulate` builds it) sent to a live
OpenAI-compatible server at its arrival times; prints the simulator's metrics, writes replay.json,
replay.csv (one row per request) and replay.png.

This module is a typer command FUNCTION, registered by `presched.cli`:

    from presched.loadgen.cli import replay
    app.command("replay")(replay)

It does not import `presched.cli` (so either may be imported first, and `python -m presched.cli`
does not load cli.py twice): bad input is printed here and ends with exit code 2, an unreachable
server or a run in which every request failed with exit code 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from pydantic import Field, ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from presched.config import Config, apply_overrides, format_validation_error
from presched.loadgen.replay import ReplayConfig, ReplayError, run_replay
from presched.loadgen.result import nan_to_none
from presched.metrics.summary import GoodputSLO
from presched.serve.tokens import counter
from presched.workload.config import WorkloadConfig


class ReplayRunConfig(Config):
    """Everything one `presched replay` run reads: `--set SECTION.FIELD=VALUE` sets any of it."""

    workload: WorkloadConfig = Field(
        default_factory=WorkloadConfig,
        description="The request stream (as in `presched simulate`).",
    )
    replay: ReplayConfig = Field(
        default_factory=ReplayConfig, description="Where and how to send it."
    )
    slo: GoodputSLO = Field(
        default_factory=GoodputSLO, description="Objectives for request goodput."
    )


def _h(model, name: str) -> str:
    return model.model_fields[name].description or ""


def _fail(console: Console, msg: str, code: int) -> typer.Exit:
    console.print(f"[red]error:[/red] {msg}", highlight=False)
    return typer.Exit(code)


def build_run_config(flags: dict[str, Any], sets: list[str]) -> ReplayRunConfig:
    """Flags (dotted path -> value, None = not given), then `--set` items, validated. Raises
    ValueError with a message naming the field."""
    data = apply_overrides({}, flags, sets, "replay.time_scale=2")
    try:
        return ReplayRunConfig.model_validate(data)
    except ValidationError as e:
        raise ValueError("invalid configuration:\n" + format_validation_error(e)) from None


def replay(
    url: Optional[str] = typer.Option(None, "--url", "-u", help=_h(ReplayConfig, "url")),
    endpoint: Optional[str] = typer.Option(None, "--endpoint", "-e", help=_h(ReplayConfig, "endpoint")),
    model: Optional[str] = typer.Option(None, "--model", "-m", help=_h(ReplayConfig, "model")),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="PRESCHED_API_KEY", help=_h(ReplayConfig, "api_key") + " Also read from $PRESCHED_API_KEY."),
    workload: Optional[str] = typer.Option(None, "--workload", "-w", help=_h(WorkloadConfig, "source")),
    path: Optional[Path] = typer.Option(None, "--path", help=_h(WorkloadConfig, "path")),
    num_requests: Optional[int] = typer.Option(None, "--num-requests", "-n", help=_h(WorkloadConfig, "num_requests")),
    rate: Optional[float] = typer.Option(None, "--rate", help=_h(WorkloadConfig, "rate")),
    arrivals: Optional[str] = typer.Option(None, "--arrivals", help=_h(WorkloadConfig, "arrivals")),
    seed: Optional[int] = typer.Option(None, "--seed", help=_h(WorkloadConfig, "seed") + " Also seeds the synthetic prompts."),
    time_scale: Optional[float] = typer.Option(None, "--time-scale", help=_h(ReplayConfig, "time_scale")),
    max_concurrency: Optional[int] = typer.Option(None, "--max-concurrency", help=_h(ReplayConfig, "max_concurrency")),
    stream: bool = typer.Option(True, "--stream/--no-stream", help=_h(ReplayConfig, "stream")),
    force_lengths: bool = typer.Option(True, "--force-lengths/--no-force-lengths", help=_h(ReplayConfig, "force_lengths")),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="The served model's tokenizer.json: synthetic prompts (requests without text) are fitted to exactly prompt_tokens of it. Default: one common English word per token (exact for o200k/cl100k, ~20% more tokens with small vocabularies)."),
    out: Path = typer.Option(Path("presched-results/replay"), "--out", "-o", help="Folder for replay.json (config and summary), replay.csv (one row per request) and replay.png (latency CDFs, send lag)."),
    set_: list[str] = typer.Option([], "--set", "-s", metavar="PATH=VALUE", help="Set any field by dotted path: workload.*, replay.* or slo.*, e.g. --set workload.max_tokens=128 --set replay.extra_body='{temperature: 0}' --set slo.ttft_ms=500."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no table; still writes the files."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON (standard output) instead of a table."),
) -> None:
    """Send a workload to a live OpenAI-compatible server (vLLM, SGLang, the presched gateway) at
    its arrival times, open loop, and report the simulator's metrics (TTFT, TPOT, ITL, E2EL,
    goodput, ...) plus failures and the generator's own send lag."""
    from presched.workload.config import build_workload

    err = Console(stderr=True, soft_wrap=True)
    flags = {
        "workload.source": workload, "workload.path": str(path) if path else None,
        "workload.num_requests": num_requests, "workload.rate": rate,
        "workload.arrivals": arrivals, "workload.seed": seed, "replay.seed": seed,
        "replay.url": url, "replay.endpoint": endpoint, "replay.model": model,
        "replay.api_key": api_key, "replay.time_scale": time_scale,
        "replay.max_concurrency": max_concurrency, "replay.stream": stream,
        "replay.force_lengths": force_lengths,
    }  # fmt: skip
    try:
        cfg = build_run_config(flags, set_)
        reqs = build_workload(cfg.workload)
    except (ValueError, FileNotFoundError) as e:  # loader errors name the file, line and field
        raise _fail(err, str(e), 2) from None
    if out.exists() and not out.is_dir():  # found now, not after the whole replay
        raise _fail(err, f"--out: {out} is a file; give a folder for the results", 2)
    count_tokens = None
    if tokenizer is not None:
        if not tokenizer.is_file():
            raise _fail(err, f"--tokenizer: file not found: {tokenizer}", 2)
        try:
            count_tokens = counter(tokenizer)[0]
        except Exception as e:  # noqa: BLE001 - any parse error of the user's file
            raise _fail(err, f"--tokenizer: cannot read {tokenizer}: {e}", 2) from None

    console = Console(stderr=as_json)
    prog = Progress(
        TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, disable=quiet or not console.is_terminal, transient=True,
    )  # fmt: skip
    with prog:
        task = prog.add_task("replaying", total=len(reqs))

        def advance(done: int, total: int) -> None:
            prog.update(task, completed=done)

        try:
            res = run_replay(reqs, cfg.replay, advance, count_tokens, cfg.slo)
        except ReplayError as e:
            raise _fail(err, str(e), 1) from None
    res.meta = {
        "workload": json.loads(cfg.workload.model_dump_json()),
        "slo": json.loads(cfg.slo.model_dump_json()),
    }

    out.mkdir(parents=True, exist_ok=True)
    paths = [
        res.to_json(out / "replay.json"),
        res.to_csv(out / "replay.csv"),
        res.plot(out / "replay.png"),
    ]
    s = res.summary
    if as_json:
        print(json.dumps(nan_to_none(s), indent=2, default=str))
    elif not quiet:
        if not console.is_terminal and console.width < 100:
            console.width = 100
        console.print(res.table())
    console.print("wrote " + ", ".join(str(p) for p in paths), highlight=False)
    if s["failed"]:
        errors = ", ".join(f"{k} x{v}" for k, v in s["errors_by_status"].items())
        first = next(r["error"] for r in res.rows if not r["ok"])
        msg = f"{s['failed']} of {s['requests']} requests failed ({errors}); first: {first}"
        if s["failed"] == s["requests"]:
            hint = f"is {cfg.replay.url} up and serving {res.model!r}?"
            raise _fail(err, f"every request failed — {hint} {msg}", 1)
        err.print(f"[yellow]warning:[/yellow] {msg}", highlight=False)
