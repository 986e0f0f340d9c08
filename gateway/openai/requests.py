"""The bodies OpenAI's clients send to /v1/completions, /v1/chat/completions and /v1/embeddings, read and
checked: a wrong field is a 400 that names it (`param`), before any model is asked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from ringserve.gateway.core.errors import echo
from ringserve.gateway.openai.errors import InvalidField

# Triton's OpenAI frontend's sampling parameters for Python and TensorRT-LLM models, with the datatype it gives
# each when the model declares it as an input (engine/utils/triton.py: _create_trtllm_generate_request).
SAMPLING_INPUTS: dict[str, str] = {
    "temperature": "FP32",
    "top_p": "FP32",
    "frequency_penalty": "FP32",
    "presence_penalty": "FP32",
    "seed": "UINT64",
}
# Fields of OpenAI's bodies with no effect here (accepted, as clients send them by default).
IGNORED = frozenset({"user", "store", "metadata", "service_tier", "logit_bias", "parallel_tool_calls", "suffix"})
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@dataclass
class Generation:
    """A completion or chat completion request: one prompt (chat: the messages, made one by gateway/openai/chat.py)."""

    model: str
    prompt: str = ""
    messages: list[dict[str, str]] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    sampling: dict[str, float | int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # other scalar fields (extra_body): request parameters


@dataclass
class Embedding:
    model: str
    texts: list[str]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


def load_json(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidField("body", f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidField("body", "request body must be a JSON object")
    return doc


def read_completion(doc: dict[str, Any]) -> Generation:
    request = _generation(doc, {"prompt", "echo", "logprobs", "best_of"})
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidField("prompt", f"'prompt' must be a string (or a list of one string), got {echo(prompt)}")
    if doc.get("echo"):
        raise InvalidField("echo", "'echo' is not supported")
    if doc.get("logprobs") is not None:
        raise InvalidField("logprobs", "'logprobs' is not supported")
    if doc.get("best_of") not in (None, 1):
        raise InvalidField("best_of", "'best_of' must be 1")
    request.prompt = prompt
    return request


def read_chat(doc: dict[str, Any]) -> Generation:
    request = _generation(doc, {"messages", "logprobs", "top_logprobs", "max_completion_tokens"})
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidField("messages", "'messages' must be a non-empty list of {role, content} objects")
    request.messages = [_message(k, m) for k, m in enumerate(messages)]
    if doc.get("logprobs"):
        raise InvalidField("logprobs", "'logprobs' is not supported")
    limit = doc.get("max_completion_tokens")
    if limit is not None:  # (OpenAI's newer name; max_tokens is its deprecated one)
        request.max_tokens = _positive_int("max_completion_tokens", limit)
    return request


def read_embedding(doc: dict[str, Any]) -> Embedding:
    model = _model(doc)
    texts = doc.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise InvalidField(
            "input",
            f"'input' must be a string or a non-empty list of strings (token arrays are not taken), got {echo(texts)}",
        )
    encoding = doc.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise InvalidField("encoding_format", f"'encoding_format' must be 'float' or 'base64', got {echo(encoding)}")
    dimensions = doc.get("dimensions")
    if dimensions is not None:
        dimensions = _positive_int("dimensions", dimensions)
    return Embedding(model, texts, "base64" if encoding == "base64" else "float", dimensions)


def _generation(doc: dict[str, Any], own: set[str]) -> Generation:
    request = Generation(_model(doc))
    stream = doc.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise InvalidField("stream", f"'stream' must be true or false, got {echo(stream)}")
    request.stream = bool(stream)
    options = doc.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise InvalidField("stream_options", "'stream_options' must be an object")
        request.include_usage = bool(options.get("include_usage"))
    if doc.get("max_tokens") is not None:
        request.max_tokens = _positive_int("max_tokens", doc["max_tokens"])
    if doc.get("n") not in (None, 1):
        raise InvalidField("n", f"'n' must be 1 (one choice per request), got {echo(doc.get('n'))}")
    stop = doc.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise InvalidField("stop", f"'stop' must be a string or a list of strings, got {echo(stop)}")
    request.stop = stop or []
    for name in SAMPLING_INPUTS:
        value = doc.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidField(name, f"{name!r} must be a number, got {echo(value)}")
        if name == "seed" and (not isinstance(value, int) or value < 0):
            raise InvalidField(name, f"'seed' must be a non-negative integer, got {echo(value)}")
        request.sampling[name] = value
    known = own | set(SAMPLING_INPUTS) | IGNORED | {"model", "stream", "stream_options", "max_tokens", "n", "stop"}
    for name, value in doc.items():
        if name not in known and isinstance(value, (str, int, float, bool)):
            request.extra[name] = value
    return request


def _model(doc: dict[str, Any]) -> str:
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidField("model", f"'model' must name a model of the repository, got {echo(model)}")
    return model


def _message(index: int, message: Any) -> dict[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise InvalidField(where, f"{where} must be an object with a 'role' (one of {sorted(ROLES)}) and 'content'")
    content = message.get("content")
    if content is None:
        content = ""
    if isinstance(content, list):  # content parts: only text ones can make a prompt
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise InvalidField(f"{where}.content", f"{where}.content: only parts of type 'text' are taken")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise InvalidField(f"{where}.content", f"{where}.content must be a string, got {echo(content)}")
    return {"role": message["role"], "content": content}


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidField(name, f"{name!r} must be a positive integer, got {echo(value)}")
    return value
