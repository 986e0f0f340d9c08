"""The /v1 routes' entries in /openapi.json (gateway/http/openapi.py puts them in its document). Their bodies
are OpenAI's (its API reference); these entries say what ringserve takes of them."""

from __future__ import annotations

from typing import Any

_ERROR = {
    "description": "error, in OpenAI's shape",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "error": {
                        "type": "object",
                        "properties": {k: {} for k in ("message", "type", "param", "code")},
                    }
                },
            }
        }
    },
}
_OBJECT = {"type": "object"}


def _ok(streams: bool) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": _OBJECT}}
    if streams:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    return {
        "description": "OK" + (" (with stream: true, server-sent events ending 'data: [DONE]')" if streams else ""),
        "content": content,
    }


def _post(summary: str, streams: bool) -> dict[str, Any]:
    errors = ("400", "401", "404", "500", "503", "504")
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _OBJECT}}},
            "responses": {"200": _ok(streams), **{code: _ERROR for code in errors}},
        }
    }


def openai_paths() -> dict[str, Any]:
    model = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
    return {
        "/v1/models": {"get": {"summary": "OpenAI: the models served", "responses": {"200": _ok(False)}}},
        "/v1/models/{model}": {
            "get": {
                "summary": "OpenAI: one model",
                "parameters": [model],
                "responses": {"200": _ok(False), "404": _ERROR},
            }
        },
        "/v1/completions": _post("OpenAI: completion of a prompt (text_input -> text_output)", True),
        "/v1/chat/completions": _post("OpenAI: chat completion (messages through the model's chat template)", True),
        "/v1/embeddings": _post("OpenAI: embeddings (text_input -> an FP32 vector)", False),
    }
