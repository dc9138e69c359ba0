"""The load generator (`presched replay`): a workload sent to a live OpenAI-compatible server
(vLLM, SGLang, the presched gateway) at its arrival times, measured under the simulator's metric
names. `replay.py` is the run (`ReplayConfig`, `run_replay`), `wire.py` one request on the wire
(its SSE lines split by `serve/sse.py`), `result.py` the result and its files, `cli.py` the command.

It talks to the gateway only over HTTP: nothing here imports the gateway (`serve.app`,
`serve.gateway`, ...); the modules of `serve/` it uses are the stateless `serve.tokens` (prompt token counts) and
`serve.sse` (SSE line splitting, shared with the gateway's relay and `engine/calibrate.py`).
"""
