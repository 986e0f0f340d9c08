"""The OpenAPI 3.1 document of the whole HTTP surface, served at /openapi.json.

Written out by hand (the routes are raw ASGI and Starlette, not a framework that derives
it); tests/integration/test_protocol.py checks that every route the app serves is here
with its methods, and nothing else is.
"""

from __future__ import annotations

import functools
from typing import Any

from ringserve.common.repository.datatypes import KSERVE_DATATYPES
from ringserve.common.version import VERSION
from ringserve.gateway.openai.openapi import openai_paths

_ERROR = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_MODEL = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
_VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}


def _json(ref_or_schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ref_or_schema}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _get(summary: str, ok: dict[str, Any], *, errors: tuple[str, ...] = (), public: bool = False) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {"200": ok, **{code: _ERROR for code in errors}}}
    if public:
        op["security"] = [{}, {"bearer": []}]
    return {"get": op}


def _post(summary: str, ok: dict[str, Any], body: dict[str, Any] | None, errors: tuple[str, ...]) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {"200": ok, **{code: _ERROR for code in errors}}}
    if body is not None:
        op["requestBody"] = body
    return {"post": op}


def _settings(summary: str, errors: tuple[str, ...]) -> dict[str, Any]:
    """GET (the settings) and POST (change some: a JSON object of the settings to set; answers them all)."""
    doc = _json({"type": "object"})
    body = {"required": False, "content": {"application/json": {"schema": {"type": "object"}}}}
    return {
        **_get(summary, doc, errors=errors),
        **_post(f"Change: {summary[0].lower()}{summary[1:]}", doc, body, errors),
    }


def _with_settings_model(item: dict[str, Any]) -> dict[str, Any]:
    return {method: {**spec, "parameters": [_MODEL]} for method, spec in item.items()}


def _with_params(op: dict[str, Any], *params: dict[str, Any]) -> dict[str, Any]:
    method, spec = next(iter(op.items()))
    return {method: {**spec, "parameters": list(params)}}


def _model_paths(suffix: str, op: dict[str, Any]) -> dict[str, Any]:
    """/v2/models/{model}<suffix> and /v2/models/{model}/versions/{version}<suffix>."""
    return {
        f"/v2/models/{{model}}{suffix}": _with_params(op, _MODEL),
        f"/v2/models/{{model}}/versions/{{version}}{suffix}": _with_params(op, _MODEL, _VERSION),
    }


_INFER_BODY = {
    "required": True,
    "description": "JSON inference request; with Inference-Header-Content-Length, the JSON header followed by "
    "the inputs' raw little-endian bytes (binary tensor extension); with a header length of 0, "
    "the body is the model's single input. Content-Encoding gzip or deflate is accepted.",
    "content": {
        "application/json": {"schema": _ref("InferenceRequest")},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
    },
}
_INFER_OK = {
    "description": "JSON response, or with binary outputs the JSON header (Inference-Header-Content-Length "
    "bytes) followed by the outputs' bytes; gzip/deflate when Accept-Encoding asks (>= 1 KiB)",
    "content": {
        "application/json": {"schema": _ref("InferenceResponse")},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
    },
}

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string", "description": "what was wrong and what is accepted"}},
    },
    "Parameters": {"type": "object", "additionalProperties": {"type": ["string", "number", "integer", "boolean"]}},
    "Datatype": {"type": "string", "enum": sorted(KSERVE_DATATYPES)},
    "RequestInput": {
        "type": "object",
        "required": ["name", "shape", "datatype"],
        "properties": {
            "name": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}},
            "datatype": _ref("Datatype"),
            "parameters": _ref("Parameters"),
            "data": {
                "type": "array",
                "description": "flat or nested, row-major; absent when binary_data_size is given",
            },
        },
    },
    "RequestOutput": {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string"}, "parameters": _ref("Parameters")},
    },
    "InferenceRequest": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": _ref("Parameters"),
            "inputs": {"type": "array", "items": _ref("RequestInput")},
            "outputs": {"type": "array", "items": _ref("RequestOutput")},
        },
    },
    "ResponseOutput": {
        "type": "object",
        "required": ["name", "shape", "datatype"],
        "properties": {
            "name": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}},
            "datatype": _ref("Datatype"),
            "parameters": _ref("Parameters"),
            "data": {"type": "array"},
        },
    },
    "InferenceResponse": {
        "type": "object",
        "required": ["model_name", "outputs"],
        "properties": {
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "id": {"type": "string"},
            "outputs": {"type": "array", "items": _ref("ResponseOutput")},
        },
    },
    "TensorMetadata": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "datatype": _ref("Datatype"),
            "shape": {"type": "array", "items": {"type": "integer"}},
        },
    },
    "ModelMetadata": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "versions": {"type": "array", "items": {"type": "string"}},
            "platform": {"type": "string"},
            "inputs": {"type": "array", "items": _ref("TensorMetadata")},
            "outputs": {"type": "array", "items": _ref("TensorMetadata")},
        },
    },
    "ModelConfig": {"type": "object", "description": "Triton's JSON model config (data_type: TYPE_FP32, dims ...)"},
    "Duration": {"type": "object", "properties": {"count": {"type": "integer"}, "ns": {"type": "integer"}}},
    "ModelStatistics": {
        "type": "object",
        "properties": {
            "model_stats": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "version": {"type": "string"},
                        "last_inference": {"type": "integer"},
                        "inference_count": {"type": "integer"},
                        "execution_count": {"type": "integer"},
                        "inference_stats": {"type": "object", "additionalProperties": _ref("Duration")},
                        "batch_stats": {"type": "array", "items": {"type": "object"}},
                    },
                },
            }
        },
    },
    "SystemSharedMemoryRegister": {
        "type": "object",
        "required": ["key", "byte_size"],
        "properties": {
            "key": {"type": "string", "description": "shm_open key of the client's segment"},
            "offset": {"type": "integer", "minimum": 0},
            "byte_size": {"type": "integer", "minimum": 1},
        },
    },
    "SharedMemoryRegion": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "key": {"type": "string"},
            "offset": {"type": "integer"},
            "byte_size": {"type": "integer"},
        },
    },
    "RepositoryIndex": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "state": {"type": "string", "enum": ["READY", "UNAVAILABLE"]},
                "reason": {"type": "string"},
            },
        },
    },
}


_REGION = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}


def _shm_paths(prefix: str, kind: str, register_body: dict[str, Any]) -> dict[str, Any]:
    """Triton's shared-memory extension: status, register, unregister (all or one region)."""
    status = _json({"type": "array", "items": _ref("SharedMemoryRegion")})
    # 501: client shared memory is off (--allow-client-shm not given).
    unregister = _post(f"Unregister every {kind} shared-memory region", _json({"type": "object"}), None, ("400", "501"))
    return {
        f"/v2/{prefix}/status": _get(f"Registered {kind} shared-memory regions", status),
        f"/v2/{prefix}/region/{{name}}/status": _with_params(
            _get(f"One {kind} shared-memory region", status, errors=("404",)), _REGION
        ),
        f"/v2/{prefix}/region/{{name}}/register": _with_params(
            _post(
                f"Register a {kind} shared-memory region",
                _json({"type": "object"}),
                {"required": True, "content": {"application/json": {"schema": register_body}}},
                ("400", "501"),
            ),
            _REGION,
        ),
        f"/v2/{prefix}/unregister": unregister,
        f"/v2/{prefix}/region/{{name}}/unregister": _with_params(unregister, _REGION),
    }


@functools.cache
def openapi_document() -> dict[str, Any]:
    ready = _json({"type": "object", "properties": {"ready": {"type": "boolean"}}})
    repo_body = {
        "required": False,
        "content": {
            "application/json": {"schema": {"type": "object", "properties": {"parameters": _ref("Parameters")}}}
        },
    }
    paths: dict[str, Any] = {
        "/v2/health/live": _get(
            "Liveness", _json({"type": "object", "properties": {"live": {"type": "boolean"}}}), public=True
        ),
        "/v2/health/ready": _get(
            "Readiness: some worker is ready and the server is not draining", ready, errors=("503",), public=True
        ),
        "/v2": _get("Server metadata (name, version, extensions)", _json({"type": "object"})),
        "/v2/models/stats": _get("Statistics of every model", _json(_ref("ModelStatistics"))),
        **_model_paths("", _get("Model metadata", _json(_ref("ModelMetadata")), errors=("400", "404"))),
        **_model_paths("/ready", _get("Model readiness", ready, errors=("400", "404", "503"))),
        **_model_paths(
            "/config",
            _get(
                "Model config in force (auto-completed fields included)",
                _json(_ref("ModelConfig")),
                errors=("400", "404"),
            ),
        ),
        **_model_paths("/stats", _get("Model statistics", _json(_ref("ModelStatistics")), errors=("400", "404"))),
        **_model_paths(
            "/infer",
            _post(
                "Inference (KServe v2, binary tensor extension)",
                _INFER_OK,
                _INFER_BODY,
                ("400", "401", "404", "408", "413", "415", "500", "503", "504"),
            ),
        ),
        "/v2/repository/index": _post(
            "Models in the repository, READY or UNAVAILABLE with why",
            _json(_ref("RepositoryIndex")),
            {
                "required": False,
                "content": {
                    "application/json": {"schema": {"type": "object", "properties": {"ready": {"type": "boolean"}}}}
                },
            },
            ("400",),
        ),
        "/v2/repository/models/{model}/load": _with_params(
            _post(
                "Serve the model again: re-read its config.json, lift unload and quarantine",
                _json({"type": "object"}),
                repo_body,
                ("400", "404"),
            ),
            _MODEL,
        ),
        "/v2/repository/models/{model}/unload": _with_params(
            _post(
                "Stop serving the model (503 until loaded again)", _json({"type": "object"}), repo_body, ("400", "404")
            ),
            _MODEL,
        ),
        **_shm_paths("systemsharedmemory", "system", _ref("SystemSharedMemoryRegister")),
        **_shm_paths("cudasharedmemory", "CUDA (not supported: register answers 400)", {"type": "object"}),
        "/metrics": _get(
            "Prometheus metrics",
            {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}},
            public=True,
        ),
        "/admin/status": _get("Workers (pid, generation, state, restarts), queues, slots", _json({"type": "object"})),
        "/openapi.json": _get("This document", _json({"type": "object"}), public=True),
        **openai_paths(),  # /v1: OpenAI's routes
        "/v2/logging": _settings("Log settings of every process (Triton's logging extension)", ("400", "501")),
        "/v2/trace/setting": _settings("Trace settings (Triton's trace extension, OpenTelemetry)", ("400", "501")),
        "/v2/models/{model}/trace/setting": _with_settings_model(
            _settings("A model's trace settings (its own, else the global ones)", ("400", "501"))
        ),
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ringserve",
            "version": VERSION,
            "description": "KServe v2 / Open Inference Protocol model server. With an API key configured, "
            "every route but health, metrics and this document needs "
            "'Authorization: Bearer <key>' (401 otherwise).",
        },
        "paths": paths,
        "components": {"schemas": _SCHEMAS, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{}, {"bearer": []}],
    }
