"""What the processes share, and nothing that runs in one of them alone.

The wire between them: `messages` (one frozen dataclass per control message, strict decoding) and
`wire` (socket endpoints, tensor references in a slot, KServe's BYTES form). Every process's own
plumbing, the same in each: `settings` (every server setting, one default each), `errors` (the root
exception, config problems), `exits` (exit codes and the reasons a worker stops), `logfmt` and
`process` (log lines; dying with the parent), `tracing` (OpenTelemetry spans), `runtime_settings`
(Triton's log and trace settings a client changes while the server runs, and their messages), `listen` (the
gateways' TCP socket), `version`, `model_metrics` (the file a worker publishes its Python models'
custom metrics in, which the gateways read), `metrics_config` (Triton's --metrics-config). The model
repository, which the gateway and the workers both read:
`repository/` (its own map in its `__init__`).
"""
