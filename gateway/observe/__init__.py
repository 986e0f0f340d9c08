"""What the gateway counts and logs, for operators and for Triton's tools.

metrics          the gateway's Prometheus metrics
stats            Triton's statistics extension, with Triton's meanings
process_metrics  the server's processes and machine: CPU, memory, GPUs, build info
access           request ids and the access log
"""
