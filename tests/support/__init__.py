"""What the tests share and that is not a test: the real stack (stack), the models they build
(models, protocol_models, python_models, pbtxt_models, triton_rule_models, lifecycle_models), raw
HTTP (rawhttp), a network namespace (netns), an OTLP sink (otlp), the bench's quick run
(bench_quick) and the gateway's fakes for unit tests (gateway_fakes)."""
