"""The load generator (`presched replay`): a workload sent to a live OpenAI-compatible server
(vLLM, SGLang, the presched gateway) at its arrival times, measured under the simulator's metric
names. `replay.py` is the run (`ReplayConfig`, `run_replay`), `wire.py` one request on the wire,
`sse.py` SSE line splitting, `result.py` the result and its files, `cli.py` the command.

It talks to the gateway only over HTTP: nothing here imports the gateway (`serve.app`,
`serve.gateway`, ...); the one module of `serve/` it uses is `serve.tokens` (prompt token counts).
"""
