"""Triton's words for the conditions ringserve reports: one table, for HTTP and gRPC alike.

Code written against Triton matches its error messages (`assertIn`, `startswith`, a regex), so
every ringserve message about a condition Triton also reports starts with Triton's phrase for
it, filled as Triton fills it, and ringserve's own detail (what is accepted, the sizes, the way
out) follows after "; ". gRPC answers carry the same GatewayError text as HTTP does
(grpc_codec.grpc_code), so one table serves both.

Each entry: condition -> Triton's template (str.format fields), with where Triton says it
(core = triton-inference-server/core src/, server = triton-inference-server/server src/).
Triton prefixes some with "[request id: <id>] "; its tests match past it, so ringserve leaves it
out. A condition Triton never reports (a worker crash, a quarantine, a full slot) keeps
ringserve's own words and has no entry. To add one: a line here, then `say(condition, detail, ...)`
where the error is raised; tests/unit/test_phrases.py checks Triton's test expectations verbatim.
"""

from __future__ import annotations

PHRASES: dict[str, str] = {
    # -- models and versions (core model_repository_manager/*.cc) --------------------------------
    "unknown_model": "Request for unknown model: '{model}' is not found",
    "unknown_version": "Request for unknown model: '{model}' version {version} is not found",
    "no_available_versions": "Request for unknown model: '{model}' has no available versions",
    "version_not_ready": "Request for unknown model: '{model}' version {version} is not at ready state",
    "load_not_found": "failed to load '{model}', failed to poll from model repository",
    "load_failed": "load failed for model '{model}': {why}",
    "model_control_disabled": "explicit model load / unload is not allowed if polling is enabled",
    "model_name_empty": "Model name cannot be empty. Please enter a valid name to deploy.",
    "model_name_traversal": "invalid model name '{model}', model name must not contain path traversal characters",
    # -- a request's inputs and outputs (core infer_request.cc, model.cc) -------------------------
    "unexpected_input": "unexpected inference input '{input}' for model '{model}'",
    "unexpected_output": "unexpected inference output '{output}' for model '{model}'",
    "input_twice": "input '{input}' already exists in request",
    "output_twice": "output '{output}' already exists in request",
    "input_count": (
        "expected {expected} inputs but got {got} inputs for model '{model}'. Got input(s) {given}, but "
        "missing required input(s) {missing}. Please provide all required input(s)."
    ),
    "input_count_optional": (
        "expected number of inputs between {required} and {expected} but got {got} inputs for "
        "model '{model}'. Got input(s) {given}, but missing required input(s) {missing}. "
        "Please provide all required input(s)."
    ),
    "input_datatype": "inference input '{input}' data-type is '{got}', but model '{model}' expects '{expected}'",
    "input_shape": "unexpected shape for input '{input}' for model '{model}'. Expected {expected}, got {got}",
    "input_no_batch_dim": "input '{input}' has no shape but model requires batch dimension for '{model}'",
    "batch_mismatch": "input '{input}' batch size does not match other inputs for '{model}'",
    "batch_size": "inference request batch-size must be <= {max} for '{model}'",
    "input_byte_size": (
        "input byte size mismatch for input '{input}' for model '{model}'. Expected {expected}, got {got}"
    ),
    "string_elements": (
        "expected {expected} string elements for inference input '{input}' for model '{model}', got {got}"
    ),
    "string_elements_over": (
        "unexpected number of string elements {got} for inference input '{input}' for model '{model}', "
        "expecting {expected}"
    ),
    "raw_input_count": (
        "Raw request must only have 1 input (found 1) to be deduced but got {got} inputs in "
        "'{model}' model configuration"
    ),
    "raw_input_variable": (
        "The shape of the raw input '{input}' can not be deduced because there are more than "
        "one variable-sized dimension"
    ),
    "raw_input_bytes": "For BYTE datatype raw input '{input}', the model must have input shape [1]",
    # -- the HTTP body (server http_server.cc; common triton_json.h) ------------------------------
    "json": "failed to parse the request JSON buffer: {error}",
    "json_depth": "JSON nesting depth exceeds maximum allowed limit ({limit})",
    "shape_overflow": (
        "invalid shape for input '{input}': shape {shape} causes total element count to exceed maximum size of {max}"
    ),
    "byte_size_overflow": (
        "byte size overflow for input '{input}': element count ({count}) * data type size ({itemsize}) exceeds "
        "maximum allowed size ({max})"
    ),
    "json_size": "request JSON size of {size} bytes exceeds the maximum allowed input size of {limit} bytes",
    "json_field": "Unable to parse '{field}'",
    "json_shape": "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer",
    "json_data_count": "Unable to parse 'data': Shape does not match true shape of 'data' field",
    "input_content": (
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But {given}"
    ),
    "header_length": "Unable to parse Inference-Header-Content-Length, got: {value}",
    "binary_without_header": (
        "must specify valid 'Infer-Header-Content-Length' in request header and "
        "'binary_data_size' when passing inputs in binary data format"
    ),
    "header_length_range": "inference header size should be in range (0, {size}), got: {value}",
    "binary_past_end": "unexpected size for input '{input}', expecting {size} additional bytes for model '{model}'",
    "binary_left_over": "unexpected additional input data for model '{model}'",
    "ready_flag": "Invalid value for 'ready': expected a boolean",
    "decoupled_http": "HTTP end point doesn't support models with decoupled transaction policy",
    "decoupled_grpc": "ModelInfer RPC doesn't support models with decoupled transaction policy",
    # -- the generate extension (server http_server.cc: HandleGenerate and its converters) -------------
    "generate_encoding": "Unsupported content-encoding, only 'identity' is supported.",
    "generate_nested": "Expected JSON object for keyword: '{key}'",
    "generate_parameter_type": "parameter '{name}' has invalid type. It should be either 'int', 'bool', or 'string'.",
    "generate_shape": "The schema can not convert input '{input}' to tensor with proper shape",
    "generate_json_type": "attempt to access JSON non-{kind} as {kind}",
    "generate_one_response": (
        "generate expects model to produce exactly 1 response, use generate stream for model that generates "
        "various number of responses"
    ),
    # -- the classification extension (server http_server.cc, classification.cc) -----------------
    "classification_value": "Unable to set 'classification'",
    "classification_shm": "Output can't set both 'shared_memory_region' and 'classification'",
    "classification_type": "class result not available for output due to unsupported type '{datatype}'",
    "classification_size": "classification output tensor too large",
    "binary_and_shm": "Output can't set both 'shared_memory_region' and 'binary_data'",
    # -- gRPC's tensors (server grpc/infer_handler.cc) --------------------------------------------
    "grpc_contents_and_raw": "contents field must not be specified when using raw_input_contents for '{input}' for "
    "model '{model}'",
    "grpc_contents_type": (
        "unexpected explicit tensor data for input tensor '{input}' for model '{model}' of type "
        "'{got}', expected datatype '{expected}'"
    ),
    "grpc_no_data": "unable to find data for input tensor '{input}' for model '{model}' in request.",
    "grpc_shm_and_contents": (
        "unexpected 'content' provided when using shared memory for input tensor '{input}' for model '{model}'"
    ),
    # -- stateful sequences (core sequence_batch_scheduler.cc, sequence_utils.h, infer_request.cc,
    #    tritonserver.cc) ---------------------------------------------------------------------------
    "sequence_batch_size": (
        "inference request to model '{model}' must specify batch-size 1 due to requirements of sequence batcher"
    ),
    "sequence_no_id": "inference request to model '{model}' must specify a non-zero or non-empty correlation ID",
    "sequence_no_start": (
        "inference request for sequence {key} to model '{model}' must specify the START flag on the first "
        "request of the sequence"
    ),
    "sequence_id_type": (
        "sequence batching control '{control}' data-type is '{got}', but model '{model}' expects '{expected}'"
    ),
    "sequence_id_length": "string correlation ID cannot be longer than 128 characters",
    "sequence_backlog_timeout": "timeout of the corresponding sequence has been expired",
    # -- system shared memory (server shared_memory_manager.cc, http_server.cc) ------------------
    "shm_unknown_region": "Unable to find shared memory region: '{name}'",
    "shm_unknown_status": "Unable to find system shared memory region: '{name}'",
    "shm_offset": "Invalid offset for shared memory region: '{name}'",
    "shm_offset_size": "Invalid offset + byte size for shared memory region: '{name}'",
    "shm_overflow": (
        "Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) exceeds maximum value ({max}) "
        "for region '{name}'"
    ),
    "shm_register_bounds": "failed to register shared memory region '{name}': invalid args",
    "shm_register": "failed to register shared memory region '{name}'",
    "shm_open": "Unable to open shared memory region: '{key}'",
    "shm_registered": "shared memory region '{name}' already in manager",
    "shm_key": "cannot register shared memory region '{name}' - invalid shm key '{key}'",
    "shm_output_size": (
        "shared memory size specified with the request for output '{output}' ({given} bytes) should "
        "be at least {needed} bytes to hold the results"
    ),
    # -- the scheduler (core dynamic_batch_scheduler.cc, scheduler_utils.cc) ----------------------
    "queue_full": "Exceeds maximum queue size",
    "queue_timeout": "Request timeout expired",
    "stopping": "Server is stopping, scheduler for model has stopped accepting new inference requests",
}


def say(condition: str, detail: str = "", **fields: object) -> str:
    """Triton's phrase for `condition` filled with `fields`, then ringserve's `detail` after '; '."""
    text = PHRASES[condition].format(**fields)
    return f"{text}; {detail}" if detail else text


def names_list(names: list[str]) -> str:
    """A list of names as Triton writes it in its messages: ['a','b'] (no spaces), [] when empty."""
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


def dims_list(dims: list[int] | tuple[int, ...]) -> str:
    """A shape as Triton writes it (common's DimsListToString): [-1,16]."""
    return "[" + ",".join(str(d) for d in dims) + "]"
