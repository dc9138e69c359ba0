"""`presched serve`: the gateway in front of real engines (registered in `presched.cli`).

    presched serve --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002 \
                   --policy sjf --predictor model.npz --max-in-flight 16
    presched serve -c serve.yaml --set mode=passthrough
    presched learn --from-log records.sqlite --state learn-state --predictor model.npz
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError

from presched.serve.config import BackendConfig, LogConfig, ServeConfig

_F = ServeConfig.model_fields


def _d(text: str | None, default) -> str:
    """Help text with the value used when neither the option nor the file gives one."""
    return f"{text or ''} Default: {default}."


def serve(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML/JSON file with the gateway's settings (ServeConfig: backends, mode, policy, router, predictor, tenants, log, limits); flags and --set override it."),
    backend: list[str] = typer.Option([], "--backend", "-b", metavar="URL", help="Backend base URL (repeatable), e.g. http://127.0.0.1:8001; replaces the file's backends."),
    max_in_flight: Optional[int] = typer.Option(None, "--max-in-flight", help=_d("max_in_flight of each backend: " + (BackendConfig.model_fields["max_in_flight"].description or ""), BackendConfig.model_fields["max_in_flight"].default)),
    mode: Optional[str] = typer.Option(None, "--mode", help=_d(_F["mode"].description, _F["mode"].default)),
    policy: Optional[str] = typer.Option(None, "--policy", "-p", help=_d(_F["policy"].description, _F["policy"].default)),
    router: Optional[str] = typer.Option(None, "--router", help=_d(_F["router"].description, _F["router"].default)),
    predictor: Optional[Path] = typer.Option(None, "--predictor", "-m", help=_F["predictor"].description),
    host: Optional[str] = typer.Option(None, "--host", help=_d(_F["host"].description, _F["host"].default)),
    port: Optional[int] = typer.Option(None, "--port", help=_d(_F["port"].description, _F["port"].default)),
    log: Optional[str] = typer.Option(None, "--log", help=_d((LogConfig.model_fields["path"].description or "").replace("null disables it", "'none' disables it"), LogConfig.model_fields["path"].default)),
    store_prompts: bool = typer.Option(False, "--store-prompts", help=LogConfig.model_fields["store_prompts"].description),
    learn: bool = typer.Option(False, "--learn", help="Learn from completed requests: recalibrate the predictor's quantiles, raise a drift alarm, refit it in the background (learn.* fields; --set learn.state_dir=DIR saves and resumes it)."),
    set_: list[str] = typer.Option([], "--set", "-s", metavar="PATH=VALUE", help="Set any ServeConfig field by dotted path, e.g. --set max_queue=500 --set policy_params.starvation_s=30."),
) -> None:
    """Run the OpenAI-compatible gateway: predict each request's length, order and route by
    policy, relay the engines' answers, log every request (SQLite) and export /metrics."""
    from presched.config import UserError, apply_overrides, load_file, set_path

    if config is not None and not config.exists():
        raise UserError(f"--config: serve config file not found: {config}")
    data = load_file(config) if config else {}
    if backend:
        data["backends"] = [{"url": u, **({"max_in_flight": max_in_flight} if max_in_flight is not None else {})}
                            for u in backend]  # fmt: skip
    elif max_in_flight is not None:
        for b in data.get("backends") or []:
            if isinstance(b, dict):
                b["max_in_flight"] = max_in_flight
    flags = {"mode": mode, "policy": policy, "router": router, "host": host, "port": port,
             "predictor": str(predictor) if predictor else None,
             "log.store_prompts": True if store_prompts else None,
             "learn.enabled": True if learn else None}  # fmt: skip
    if log is not None:
        set_path(data, "log.path", None if log.lower() == "none" else log)
    apply_overrides(data, flags, set_, "max_queue=500")
    if not data.get("backends"):
        raise UserError("backends: at least one --backend URL (or backends: in --config) is required")
    try:
        cfg = ServeConfig.model_validate(data)
    except ValidationError as e:
        from presched.config import format_validation_error

        raise UserError("invalid configuration:\n" + format_validation_error(e)) from None
    run_server(cfg)


def load_parts(cfg: ServeConfig):
    """(predictor or None, RequestLog or None) for a config; errors name the field."""
    pred = None
    if cfg.predictor is not None:
        from presched.predict.base import ModelFileError, load_predictor

        try:
            pred = load_predictor(cfg.predictor)
        except (ModelFileError, FileNotFoundError, ValueError) as e:
            raise ValueError(f"predictor: {e}") from None
        why = pred.front_refusal()
        if why is not None:  # it would fail every request with a 500
            raise ValueError(f"predictor: {cfg.predictor}: {why}")
    if cfg.learn.enabled:
        from presched.serve.learn import make_learner

        pred = make_learner(cfg, pred)
    log = None
    if cfg.log.path is not None:
        from presched.serve.log import RequestLog

        try:
            log = RequestLog(cfg.log.path, store_prompts=cfg.log.store_prompts)
        except Exception as e:  # noqa: BLE001 - named below
            raise ValueError(f"log.path: {e}") from None
    return pred, log


def run_server(cfg: ServeConfig) -> None:
    from rich.console import Console

    from presched.serve.app import build_app

    pred, log = load_parts(cfg)
    app = build_app(cfg, pred, log)
    g = app.state.gateway
    Console(stderr=True, soft_wrap=True).print(
        f"presched gateway on http://{cfg.host}:{cfg.port}  mode={cfg.mode} policy={cfg.policy} "
        f"router={cfg.router} predictor={cfg.predictor or 'none'}{' (learning)' if cfg.learn.enabled else ''} tokens={g.count_how} "
        f"log={cfg.log.path or 'off'}; backends: " + ", ".join(b.url for b in cfg.backends),
        highlight=False,
    )
    gateway_server(app, cfg).run()


def gateway_server(app, cfg: ServeConfig):
    """The uvicorn server of `build_app(cfg)`'s app. On shutdown (SIGTERM, Ctrl-C, or
    `should_exit`) it stops accepting, tells the gateway to drain (`GatewayApp.begin_drain`:
    requests in flight get `drain_timeout_s`, then end with 503 and their log row) and exits once
    they have ended; uvicorn's own limit, 5 s later, is the backstop."""
    import uvicorn

    g = app.state.gateway

    class _Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            g.begin_drain()
            await super().shutdown(sockets)

    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=cfg.drain_timeout_s + 5)  # fmt: skip
    return _Server(config)


def learn(
    from_log: Path = typer.Option(..., "--from-log", help="A request log in the gateway's schema: the gateway's log.path, or the engine plugin's records file (its `records` option; `python -m presched.engine.launch --records FILE`). Read-only; may be written meanwhile."),
    state: Path = typer.Option(..., "--state", help="The learner's state folder (a gateway's learn.state_dir reads it): resumed when it holds a learner; saved after each pass and within one (every save_every rows, after each refit), each save naming the last row it holds, so a run stopped anywhere resumes after it."),
    predictor: Optional[Path] = typer.Option(None, "--predictor", "-m", help="The model to start from (a file from `presched train`) when --state holds no learner yet."),
    set_: list[str] = typer.Option([], "--set", "-s", metavar="FIELD=VALUE", help="Set a learn: field (OnlineConfig, in src/presched/predict/online/config.py with their meanings; docs/gateway.md, Online learning, lists them), e.g. --set refit_every=1000."),
    follow: Optional[float] = typer.Option(None, "--follow", metavar="SECONDS", help="Keep reading the rows appended to the log, every SECONDS, until interrupted (Ctrl-C; each pass is saved as it ends, and the next run resumes after the last row saved)."),
) -> None:
    """Teach the online learner from a request log (the engine plugin's records or the
    gateway's log): recalibration, drift alarm and refits, as `presched serve --learn` does live;
    the rows learned are remembered in --state, so each run reads only what was appended."""
    import time

    from rich.console import Console

    from presched.config import UserError, apply_overrides, format_validation_error
    from presched.predict.online import OnlineConfig, OnlineLearner
    from presched.serve.learn_log import POSITION, feed, read_position
    from presched.serve.log_format import LogFileError

    data = apply_overrides({"enabled": True}, {}, set_, "refit_every=1000")
    try:
        cfg = OnlineConfig.model_validate({**data, "state_dir": str(state)})
    except ValidationError as e:
        raise UserError("invalid learn settings:\n" + format_validation_error(e, "learn")) from None
    if follow is not None and not follow > 0:
        raise UserError(f"--follow: expected a number of seconds > 0, got {follow}")
    anchor = []
    if cfg.anchor_data is not None:
        from presched.workload.loaders.generic import load_generic

        anchor = load_generic(cfg.anchor_data)
    learner = OnlineLearner.resume(str(state), cfg, anchor, background=False)
    if learner is None:
        if predictor is None:
            raise UserError(f"--predictor: {state} holds no learner yet; give the model to start from")
        from presched.predict.base import ModelFileError, load_predictor

        try:
            learner = OnlineLearner(load_predictor(predictor), cfg, anchor, background=False)
        except (ModelFileError, FileNotFoundError, ValueError) as e:
            raise UserError(f"--predictor: {e}") from None
    out = Console()
    after = read_position(state, from_log)
    try:
        while True:
            try:
                after, counts = feed(learner, from_log, after)
            except LogFileError as e:
                raise UserError(f"--from-log: {e}") from None
            learner.save(str(state))  # the position with it (learner.position, set by feed)
            (state / POSITION).unlink(missing_ok=True)  # an older presched's position file: superseded
            s = learner.status()
            out.print(f"{sum(counts.values()):,} new rows ({', '.join(f'{k} {n:,}' for k, n in counts.items() if n) or 'none'}); "
                      f"predictor version {s['predictor_version']}, drift alarm {'RAISED' if s['drift_alarm'] else 'off'} "
                      f"({s['drift_alarms']} raised so far); state saved in {state}", highlight=False)  # fmt: skip
            if counts.get("no_text"):
                out.print(f"{counts['no_text']:,} rows without prompt text taught nothing: this predictor reads prompt "
                          "text (the engine plugin stores it with store_prompts on)", highlight=False)  # fmt: skip
            if follow is None:
                break
            time.sleep(follow)
    except KeyboardInterrupt:  # the last save (a pass's end, or one within it) names the last row it holds
        return
