"""The model repository: which models and versions it holds, and each one's config.

`scan` (the repository scanned: versions on disk, configs read and auto-completed from the ONNX
graph, failures by model), `onnx_graph` (an ONNX graph read without its weights: a config auto-
completed from it and checked against it), `config` (ModelConfig: Triton's config.json fields, read
and validated), `tensor_config` (TensorConfig: one input or output), `batching` (dynamic_batching
and batch_input: queue policies, padding), `sequences` (sequence_batching: strategies, control
inputs, implicit state and its initial value), `fields` (which fields a config may hold, at every
level), `pbtxt` (config.pbtxt read into the same document), `kinds` (ONNX, Python and ensemble
models, and their rules), `datatypes` (the tensor datatypes, by every name they go by), `lifecycle`
(versions served, load policy, TTL, where), `max_shapes` (bounds of variable dims), `call_bounds`
(bounds on the calls into a model's code: load, warm-up, execute, finalize), `reshape` (reshape,
batch_output, is_shape_tensor: shapes the model sees that differ from the client's), `warmup`
(model_warmup's samples), `demo` (the demo models, built in code), `control` (Triton's model
control: the served repository of explicit mode, a load's overrides, poll mode's fingerprint).
"""
