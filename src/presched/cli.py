"""`presched` command line: `bench` (the main job), `simulate` (one run), `config` (every option),
here; the commands that live beside their packages are registered on the same app at the end:
`train`, `eval`, `predict` (`predict/cli.py`), `serve` (`serve/cli.py`), `replay` (`loadgen/cli.py`),
`epp` (`epp/cli.py`).

Every option's help text comes from the typed configs (`BenchConfig` and the configs it holds),
so `presched config` and `--help` say the same thing the code checks. Bad input ends with a
message naming the field and exit code 2, never a traceback.
"""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path
from typing import Any, Optional

import typer
import yaml
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.table import Table

from presched.bench.config import BenchConfig
from presched.cliutil import csv_list as _csv
from presched.cliutil import clean_message, err, os_error_message, output_file, output_folder
from presched.cliutil import progress_bar as _progress
from presched.config import UserError, apply_overrides, format_validation_error, load_file
from presched.schedule import POLICIES
from presched.schedule.params import params_model
from presched.schedule.params_docs import describe_params
from presched.sim.config import EngineConfig
from presched.sim.setup import SimConfig
from presched.sim.steptime import StepTimeConfig
from presched.workload.config import WorkloadConfig

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,
    help="presched: predict LLM output lengths and schedule requests with that knowledge.\n\n"
    "Run `presched bench` to replay a workload through a simulated engine under several policies.",
)


def _h(model: type[BaseModel], field: str) -> str:
    return model.model_fields[field].description or ""


_D = BenchConfig()  # the defaults the options fall back to, shown in --help


def _hd(text: str, default: Any) -> str:
    """Help text with the value used when the option is not given (from BenchConfig's defaults)."""
    return f"{text} Default: {default}."


def _shown(value: Any) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) if isinstance(value, list) else str(value)


# --- building a config from a file, flags and --set overrides ----------------------------------
# fields a command does not read, with what to use instead (a --set of one is refused, and so is
# an experiment file's value other than the default: a dumped config, which holds them all, loads)
BENCH_IGNORES = {
    "sim.policy": "bench compares the policies in `policies`: use --policies (-p)",
    "sim.policy_params": "bench takes parameters per policy: use policy_params.NAME.FIELD, e.g. "
                         "--set policy_params.mlfq.base_quantum=64",
}
SIMULATE_IGNORES = {
    "policies": "simulate runs one policy: use --policy (sim.policy)",
    "policy_params": "simulate reads the policy's parameters from sim.policy_params: use "
                     "sim.policy_params.FIELD, e.g. --set sim.policy_params.base_quantum=64",
    "loads": "simulate runs at the workload's own rate: use --rate (workload.rate)",
    "capacity_requests": "simulate measures no capacity (it is a bench field)",
    "out_dir": "simulate writes no result folder: use --records FILE",
}  # fmt: skip


def _get_path(d: Any, keys: list[str]) -> tuple[bool, Any]:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return False, None
        d = d[k]
    return True, d


def _refuse_ignored(command: str, ignores: dict[str, str], file_data: dict, flags: dict[str, Any],
                    sets: list[str]) -> None:
    """UserError naming the first field `command` would silently ignore."""
    given = [k for k, v in flags.items() if v is not None]
    given += [item.split("=", 1)[0].strip() for item in sets if "=" in item]
    default = json.loads(BenchConfig().model_dump_json())
    for field, instead in ignores.items():
        for key in given:
            if key == field or key.startswith(field + "."):
                raise UserError(f"--set {key}: {command} does not use {field}; {instead}")
        found, value = _get_path(file_data, field.split("."))
        if found and value != _get_path(default, field.split("."))[1]:
            raise UserError(f"{field} (in the experiment file): {command} does not use it; {instead}")


def build_config(config: Optional[Path], flags: dict[str, Any], sets: list[str],
                 command: str = "") -> BenchConfig:
    data = load_file(config) if config else {}
    ignores = {"bench": BENCH_IGNORES, "simulate": SIMULATE_IGNORES}.get(command)
    if ignores:
        _refuse_ignored(command, ignores, data, flags, sets)
    apply_overrides(data, flags, sets, "sim.engine.max_num_seqs=64")
    try:
        return BenchConfig.model_validate(data)
    except ValidationError as e:
        raise UserError("invalid configuration:\n" + format_validation_error(e)) from None


# --- shared options ------------------------------------------------------------------------------
ConfigOpt = typer.Option(None, "--config", "-c", help="YAML/JSON experiment file; flags and --set override it. `presched config --dump FILE` writes one with every default.")
WorkloadOpt = typer.Option(None, "--workload", "-w", help=_hd(_h(WorkloadConfig, "source"), _D.workload.source))
PathOpt = typer.Option(None, "--path", help=_h(WorkloadConfig, "path"))
NumOpt = typer.Option(None, "--num-requests", "-n", help=_h(WorkloadConfig, "num_requests"))
ArrivalsOpt = typer.Option(None, "--arrivals", help=_hd(_h(WorkloadConfig, "arrivals"), _D.workload.arrivals))
SeedOpt = typer.Option(None, "--seed", help=_hd(_h(WorkloadConfig, "seed"), str(_D.workload.seed)))
InstOpt = typer.Option(None, "--instances", "-i", help=_hd(_h(SimConfig, "num_instances"), str(_D.sim.num_instances)))
RouterOpt = typer.Option(None, "--router", help=_hd(_h(SimConfig, "router"), _D.sim.router))
ModelOpt = typer.Option(None, "--model", help=_hd(_h(StepTimeConfig, "model"), str(_D.sim.step_time.model)))
HwOpt = typer.Option(None, "--hardware", help=_hd(_h(StepTimeConfig, "hardware"), str(_D.sim.step_time.hardware)))
SeqsOpt = typer.Option(None, "--max-num-seqs", help=_hd(_h(EngineConfig, "max_num_seqs"), str(_D.sim.engine.max_num_seqs)))
SetOpt = typer.Option([], "--set", "-s", metavar="PATH=VALUE", help="Set any config field by dotted path, e.g. --set sim.engine.block_size=32 --set slo.ttft_ms=500. `presched config` lists them all.")


def _common(workload, path, num, arrivals, seed, instances, router, model, hardware, seqs) -> dict:
    return {
        "workload.source": workload, "workload.path": str(path) if path else None,
        "workload.num_requests": num, "workload.arrivals": arrivals, "workload.seed": seed,
        "sim.num_instances": instances, "sim.router": router,
        "sim.step_time.model": model, "sim.step_time.hardware": hardware,
        "sim.engine.max_num_seqs": seqs,
    }  # fmt: skip


@app.command()
def bench(
    config: Optional[Path] = ConfigOpt,
    workload: Optional[str] = WorkloadOpt,
    path: Optional[Path] = PathOpt,
    num_requests: Optional[int] = NumOpt,
    arrivals: Optional[str] = ArrivalsOpt,
    seed: Optional[int] = SeedOpt,
    policies: Optional[str] = typer.Option(None, "--policies", "-p", help=_hd("Comma-separated. " + _h(BenchConfig, "policies"), _shown(_D.policies))),
    loads: Optional[str] = typer.Option(None, "--loads", "-l", help=_hd("Comma-separated. " + _h(BenchConfig, "loads"), _shown(_D.loads))),
    instances: Optional[int] = InstOpt,
    router: Optional[str] = RouterOpt,
    model: Optional[str] = ModelOpt,
    hardware: Optional[str] = HwOpt,
    max_num_seqs: Optional[int] = SeqsOpt,
    out: Optional[Path] = typer.Option(None, "--out", "-o", help=_hd(_h(BenchConfig, "out_dir"), str(_D.out_dir))),
    set_: list[str] = SetOpt,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no table; still writes the files."),
) -> None:
    """Replay a workload through the simulated deployment under several policies and loads:
    prints a table, writes bench.json, bench.csv and bench.png (latency vs load per policy).
    With no arguments: the embedded default workload (no files needed; bursty Azure-code-like
    arrivals, CASTILLO's heavy-tailed lengths), one Llama-3.1-8B on an H100 (64 slots), FCFS vs
    the recommended predictive policy (mlfq-preempt+sjf, on a noisy oracle at text-gbm's measured
    accuracy) vs the oracle SJF/SRPT bounds at loads 0.5-0.95 of capacity."""
    from presched.bench.report import render_table, write_files
    from presched.bench.runner import run_bench

    flags = _common(workload, path, num_requests, arrivals, seed, instances, router, model, hardware, max_num_seqs)
    flags.update({"policies": _csv(policies, option="--policies"), "loads": _csv(loads, float, "--loads"),
                  "out_dir": str(out) if out else None})  # fmt: skip
    cfg = build_config(config, flags, set_, "bench")
    output_folder(cfg.out_dir, "--out")
    console = Console()
    past = [f"{x:g}" for x in cfg.loads if x > 1]
    if past:
        err.print(f"[yellow]warning:[/yellow] loads {', '.join(past)} are past capacity: the queue "
                  "grows for the whole run there, and latencies measure its length", highlight=False,
                  soft_wrap=True)  # fmt: skip
    total = 1 + len(cfg.policies) * len(cfg.loads)
    with _progress(console, quiet) as prog:
        task = prog.add_task("simulating", total=total)
        result = run_bench(cfg, on_run=lambda label: prog.update(task, advance=1, description=label))
    if not quiet:
        render_table(result, console)
    paths = write_files(result, cfg.out_dir)
    console.print(f"wrote {paths['json']}, {paths['csv']}, {paths['png']}  ({result.wall_seconds:.1f} s)",
                  soft_wrap=True, highlight=False)  # fmt: skip


@app.command()
def simulate(
    config: Optional[Path] = ConfigOpt,
    workload: Optional[str] = WorkloadOpt,
    path: Optional[Path] = PathOpt,
    num_requests: Optional[int] = NumOpt,
    arrivals: Optional[str] = ArrivalsOpt,
    seed: Optional[int] = SeedOpt,
    rate: Optional[float] = typer.Option(None, "--rate", help=_hd(_h(WorkloadConfig, "rate"), "the source's own")),
    policy: Optional[str] = typer.Option(None, "--policy", help=_hd(_h(SimConfig, "policy"), _D.sim.policy)),
    instances: Optional[int] = InstOpt,
    router: Optional[str] = RouterOpt,
    model: Optional[str] = ModelOpt,
    hardware: Optional[str] = HwOpt,
    max_num_seqs: Optional[int] = SeqsOpt,
    records: Optional[Path] = typer.Option(None, "--records", help="Write one row per request (CSV, or JSONL if the name ends in .jsonl)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON instead of a table."),
    set_: list[str] = SetOpt,
) -> None:
    """Simulate one workload under one policy (at the workload's own rate) and print every metric."""
    from presched.metrics.overload import overload_warning
    from presched.metrics.summary import summarize
    from presched.predict.source import predictions_for
    from presched.sim.setup import simulate as run_sim
    from presched.workload.config import build_workload

    flags = _common(workload, path, num_requests, arrivals, seed, instances, router, model, hardware, max_num_seqs)
    flags.update({"workload.rate": rate, "sim.policy": policy})
    cfg = build_config(config, flags, set_, "simulate")
    if records is not None:
        output_file(records, "--records")
    reqs = build_workload(cfg.workload)
    res = run_sim(reqs, cfg.sim, estimates=predictions_for(reqs, cfg.predictions))
    summary = summarize(res.records, res.itl.values(), cfg.slo)
    warning = overload_warning(res.records)
    if warning:
        err.print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)
    summary.update({"sim_wall_s": res.wall_seconds, "sim_steps": res.num_steps,
                    "realtime_factor": res.realtime_factor})  # fmt: skip
    if res.prefix_queried_tokens:  # prefix caching on
        summary.update({"prefix_hit_rate": res.prefix_hit_rate,
                        "prompt_hit_rate": res.prompt_hit_rate,
                        "prefill_tokens_saved": res.prefix_hit_tokens})  # fmt: skip
    if records is not None:
        df = res.records.to_frame()
        records.parent.mkdir(parents=True, exist_ok=True)  # as predict -o and bench -o do
        if records.suffix == ".jsonl":
            df.to_json(records, orient="records", lines=True)
        else:
            df.to_csv(records, index=False)
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    table = Table(title=f"{cfg.sim.policy} — {len(reqs)} requests from {cfg.workload.source}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in summary.items():
        table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    Console().print(table)


@app.command("config")
def show_config(
    dump: Optional[Path] = typer.Option(None, "--dump", help="Write every field with its default to this YAML/JSON file."),
    policy: Optional[str] = typer.Option(None, "--policy", "-p", help="Show only the parameters of this policy (what sim.policy_params, policy_params.NAME in bench, or the gateway's policy_params accept)."),
) -> None:
    """List every configuration field (dotted path, type, default, meaning), then every policy's
    parameters."""
    cfg = BenchConfig()
    if dump is not None:
        data = json.loads(cfg.model_dump_json())
        text = json.dumps(data, indent=2) if dump.suffix == ".json" else yaml.safe_dump(data, sort_keys=False)
        dump.write_text(text)
        Console().print(f"wrote {dump}")
        return
    console = Console()
    if not console.is_terminal:  # logs and pipes: rows on fewer lines; a terminal keeps its width
        console.width = max(console.width, 140)
    if policy is not None:
        console.print(_policy_table([policy]))
        return
    table = Table(title="presched configuration (set in an experiment file, or with --set PATH=VALUE)")
    table.add_column("field", overflow="fold")  # a dotted path folds, never cut
    table.add_column("default", overflow="fold", max_width=28)
    table.add_column("meaning", overflow="fold")
    for path, default, desc in _fields(cfg):
        table.add_row(path, default, desc)
    console.print(table)
    console.print(_policy_table(POLICIES.names()))


def _policy_table(names: list[str]) -> Table:
    """The parameters of each policy in `names` (from its model; UnknownNameError if unknown)."""
    what = f"policy {names[0]!r}" if len(names) == 1 else "every policy"
    table = Table(title=f"parameters of {what} (sim.policy_params, e.g. --set sim.policy_params."
                        "base_quantum=64; policy_params.NAME in bench; policy_params in the gateway)")
    for col in ("policy", "parameter", "type", "default"):
        table.add_column(col, overflow="fold", max_width=30)
    table.add_column("meaning", overflow="fold")
    for name in names:
        rows = describe_params(params_model(name)) or [("(none)", "", "", "")]
        for i, (field, kind, default, desc) in enumerate(rows):
            table.add_row(name if i == 0 else "", field, kind, default, desc)
    return table


def _optional_model(annotation):
    """An instance of the BaseModel in `X | None`, if it can be built from defaults alone."""
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            try:
                return arg()
            except ValidationError:
                return None
    return None


def _fields(obj: BaseModel, prefix: str = ""):
    """(dotted path, default, meaning) of every field, descending into sub-configs, including
    optional ones that default to None (e.g. sim.disaggregated: listed as null, then its fields)."""
    for name, info in type(obj).model_fields.items():
        value = getattr(obj, name)
        path = f"{prefix}{name}"
        sub = value if isinstance(value, BaseModel) else (
            _optional_model(info.annotation) if value is None else None)  # fmt: skip
        if sub is not None:
            yield path, "null" if value is None else "", info.description or ""
            yield from _fields(sub, path + ".")
        else:
            yield path, json.dumps(value, default=str), info.description or ""


# the commands defined beside their packages, in the order `presched --help` lists them
from presched.loadgen.cli import replay as _replay  # noqa: E402
from presched.predict.cli import eval_ as _eval  # noqa: E402
from presched.predict.cli import predict as _predict  # noqa: E402
from presched.predict.cli import train as _train  # noqa: E402
from presched.serve.cli import learn as _learn  # noqa: E402
from presched.serve.cli import serve as _serve  # noqa: E402
from presched.epp.cli import epp as _epp  # noqa: E402 (grpc and Envoy's protos load when it runs)

app.command("train")(_train)
app.command("predict")(_predict)
app.command("eval")(_eval)
app.command("serve")(_serve)
app.command("learn")(_learn)
app.command("replay")(_replay)
app.command("epp")(_epp)


def main() -> None:
    try:
        app()
    except (UserError, ValueError) as e:
        # loader errors name file, line and field; config and registry errors name the field
        err.print(f"[red]error:[/red] {clean_message(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except OSError as e:  # a path that cannot be read or written: `adir: Is a directory`
        err.print(f"[red]error:[/red] {os_error_message(e)}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
