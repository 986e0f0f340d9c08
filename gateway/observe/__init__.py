"""What the gateway counts and logs, for operators and for Triton's tools.

metrics          the gateway's Prometheus metrics
stats            Triton's statistics extension, with Triton's meanings
process_metrics  the server's processes and machine: CPU, memory, GPUs, build info
access           request ids and the access log
model_metrics    Python models' custom metrics (pb_utils.MetricFamily), read from the workers' files
latencies        Triton's summaries and first-response histogram (--metrics-config), merged across gateways
triton_gauges    Triton's nv_cpu_* and nv_model_load_duration_secs gauges
"""
