"""The gateways of one server together: what each asks the others and how their numbers merge.

peers           the other gateways, asked over their Unix sockets
answers         a peer's status document, decoded once into dataclasses where it arrives
merge           one server's /metrics, /admin/status and statistics from every gateway's own
triton_metrics  Triton's per-model nv_inference_* metrics from the statistics
runtime_settings  Triton's log and trace settings: the checks, the answers, the change the supervisor makes everywhere
"""
