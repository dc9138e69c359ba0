"""presched inside vLLM: a `--scheduler-cls` plugin that runs presched's policies in the engine.

- `config`     `PluginConfig` ($PRESCHED_PLUGIN_CONFIG): policy, params, predictor, records
- `version`    the pinned vLLM release and the check that refuses others
- `seq`        `EngineSeq`: a vLLM request as a presched `SeqView`
- `estimates`  predictions from `vllm_xargs` or an in-engine predictor
- `queue`      `PolicyRequestQueue`: vLLM's waiting queue in the policy's order
- `guard`      policy exceptions counted, FCFS decision instead
- `records`    per-request rows in the gateway's request-log schema (+ `prompt_features`,
               `draft_features`)
- `features`   the hidden-state hook's row split and `StepFeatures` (numpy only)
- `probe`, `refine`  the probe / draft probe and probe-refine run in the engine core
- `consume`    `FeatureConsumer`: each step's features onto the seqs, through those, counted
- `scheduler`  `PreschedScheduler` (imports vllm: only the engine process loads it)
- `worker`     `PreschedCPUWorker`, the hidden-state hook (imports vllm and torch)
- `draft`      `DraftHook`: the draft model's hook, in the worker (imports torch)
- `layout`     where the hooks attach: decoder layers, the residual stream (imports torch)

Everything but `scheduler`, `worker`, `draft` and `layout` imports without vllm or torch. See docs/engine-plugin.md.
"""
