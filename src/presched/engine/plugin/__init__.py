"""presched inside vLLM: a `--scheduler-cls` plugin that runs presched's policies in the engine.

- `config`     `PluginConfig` ($PRESCHED_PLUGIN_CONFIG): policy, params, predictor, records
- `version`    the pinned vLLM release and the check that refuses others
- `seq`        `EngineSeq`: a vLLM request as a presched `SeqView`
- `estimates`  predictions from `vllm_xargs` or an in-engine predictor
- `queue`      `PolicyRequestQueue`: vLLM's waiting queue in the policy's order
- `guard`      policy exceptions counted, FCFS decision instead
- `records`    per-request rows in the gateway's request-log schema (+ `prompt_features`)
- `features`   the hidden-state hook's row split and `StepFeatures` (numpy only)
- `scheduler`  `PreschedScheduler` (imports vllm: only the engine process loads it)
- `worker`     `PreschedCPUWorker`, the hidden-state hook (imports vllm and torch)

Everything but `scheduler` and `worker` imports without vllm. See docs/engine-plugin.md.
"""
