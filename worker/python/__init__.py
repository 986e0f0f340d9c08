"""The worker's Python backend (Triton's python_backend): model.py run in the worker, and the
`triton_python_backend_utils` it imports (`install_pb_utils` puts pb_utils into `sys.modules` under that name).

    python_model    Triton's model.py (TritonPythonModel), imported and run here only
    model_namespace each model.py's own package and sibling modules (`from .utils import x`, `import utils`)
    pb_utils        `triton_python_backend_utils` as a Python model imports it: requests, responses, BLS, helpers
    pb_tensor       `pb_utils.Tensor` and the datatype helpers (TYPE_* strings and numbers, BYTES tensors)
    pb_logger       `pb_utils.Logger`: model code's log lines, naming the model the thread runs
    pb_config       `pb_utils.ModelConfig`: the config auto_complete_config reads and completes
    pb_metrics      `pb_utils.MetricFamily`: custom metrics, published for the gateways' /metrics
    pb_errors       `pb_utils.TritonError`, `TritonModelException`, `UnsupportedFeature`; http_status: a leaf
    decoupled       decoupled Python models' streams, and cancellation (the courier thread: CANCEL in)
    bls_stream      BLS to a decoupled model: exec(decoupled=True), an iterator of its responses

What every model kind shares stays in worker/: the BLS runtime and ensemble steps (bls, ensemble, calls), a
batch's requests one by one (requests), warm-up.
"""
