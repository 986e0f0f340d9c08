"""OpenAI requests -> a model's KServe v2 request document; its outputs -> text, vectors and usage.

The tensor names are Triton's OpenAI frontend's for Python, ensemble and TensorRT-LLM models
(engine/utils/triton.py there):

    text_input        BYTES   the prompt (required)
    stream            BOOL    whether the client streams (a decoupled model may send one response or many)
    max_tokens        INT32   OpenAI's max_tokens (chat: max_completion_tokens); 16 when not given
    stop_words        BYTES   OpenAI's stop, one element each
    temperature, top_p, frequency_penalty, presence_penalty  FP32;  seed  UINT64
    return_num_input_tokens, return_num_output_tokens  BOOL  true (asks for usage)
    text_output       BYTES   the answer (a decoupled model: this response's piece of it)
    num_input_tokens, num_output_tokens  (any integer type)  usage, when the model gives them

Each is an input only where the model's config declares it, with the config's datatype; a sampling value it does
not declare goes as a request parameter of the same name (`stop` as `stop_words`, JSON text), and so does any
other scalar field of the body (the openai client's extra_body). An embedding model takes `text_input` (or its
only BYTES input) and answers an FP32 vector: `embedding` (or its only FP32 output).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.gateway.core.errors import BadRequest
from ringserve.gateway.openai.errors import InvalidField
from ringserve.gateway.openai.requests import Generation

TEXT_INPUT, TEXT_OUTPUT, EMBEDDING_OUTPUT = "text_input", "text_output", "embedding"
INPUT_TOKENS, OUTPUT_TOKENS = "num_input_tokens", "num_output_tokens"
DEFAULT_MAX_TOKENS = 16  # Triton's OpenAI frontend's --default-max-tokens


def generation_doc(config: ModelConfig, request: Generation, prompt: str) -> dict[str, Any]:
    """The KServe v2 request document of a completion (`prompt` made, for a chat, by gateway/openai/chat.py)."""
    text_input = config.inputs_by_name.get(TEXT_INPUT)
    if text_input is None or text_input.datatype != "BYTES" or TEXT_OUTPUT not in config.outputs_by_name:
        raise InvalidField(
            "model",
            f"model {config.name!r} is not a text generation model: it needs a BYTES input {TEXT_INPUT!r} and an "
            f"output {TEXT_OUTPUT!r} (it takes {[t.name for t in config.inputs]}, answers "
            f"{[t.name for t in config.outputs]})",
        )
    values: dict[str, Any] = {
        TEXT_INPUT: prompt,
        "stream": request.stream,
        "max_tokens": request.max_tokens or DEFAULT_MAX_TOKENS,
        **request.sampling,
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
    }
    if request.stop:
        values["stop_words"] = request.stop
    inputs, parameters = [], dict(request.extra)
    for name, value in values.items():
        tensor = config.inputs_by_name.get(name)
        if tensor is not None:
            inputs.append(_input(config, tensor, value))
        elif not name.startswith("return_num_"):
            parameters[name] = orjson.dumps(value).decode() if isinstance(value, list) else value
    return {"inputs": inputs, "parameters": parameters}


def embedding_doc(config: ModelConfig, text: str) -> dict[str, Any]:
    embedding_output(config)  # (400 before the model runs when it answers no vector)
    return {"inputs": [_input(config, embedding_input(config), text)]}


def embedding_input(config: ModelConfig) -> TensorConfig:
    return _named_or_only(config, config.inputs, TEXT_INPUT, "BYTES", "input")


def embedding_output(config: ModelConfig) -> TensorConfig:
    return _named_or_only(config, config.outputs, EMBEDDING_OUTPUT, "FP32", "output")


def text_of(outputs: dict[str, np.ndarray]) -> str:
    """This response's text: its `text_output` elements, UTF-8."""
    array = outputs.get(TEXT_OUTPUT)
    if array is None:
        return ""
    return "".join(e.decode("utf-8", "replace") if isinstance(e, bytes) else str(e) for e in array.reshape(-1))


def count_of(outputs: dict[str, np.ndarray], name: str) -> int | None:
    array = outputs.get(name)
    if array is None or array.size == 0 or array.dtype.kind not in "iu":
        return None
    return int(array.reshape(-1)[0])


def vector_of(config: ModelConfig, outputs: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(outputs[embedding_output(config).name], dtype=np.float32).reshape(-1)


def _input(config: ModelConfig, tensor: TensorConfig, value: Any) -> dict[str, Any]:
    data = value if isinstance(value, list) else [value]
    if tensor.datatype == "BYTES":
        data = [d if isinstance(d, str) else orjson.dumps(d).decode() for d in data]
    elif tensor.datatype == "BOOL":
        data = [bool(d) for d in data]
    elif tensor.datatype.startswith(("INT", "UINT")):
        data = [int(d) for d in data]
    else:
        data = [float(d) for d in data]
    free = [k for k, d in enumerate(tensor.dims) if d == -1]
    dims = [1 if d == -1 else d for d in tensor.dims]
    if free:  # the elements along the first variable dim
        dims[free[0]] = len(data)
    if int(np.prod(dims)) != len(data):
        raise BadRequest(
            f"model {config.name!r}: input {tensor.name!r} has dims {list(tensor.dims)}, which {len(data)} "
            "value(s) from the request cannot fill"
        )
    shape = [1, *dims] if config.max_batch_size > 0 else dims
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": shape, "data": data}


def _named_or_only(
    config: ModelConfig, tensors: tuple[TensorConfig, ...], name: str, datatype: str, what: str
) -> TensorConfig:
    named = [t for t in tensors if t.name == name and t.datatype == datatype]
    typed = [t for t in tensors if t.datatype == datatype]
    if named or len(typed) == 1:
        return (named or typed)[0]
    raise InvalidField(
        "model",
        f"model {config.name!r} is not an embedding model: it needs a {datatype} {what} named {name!r} (or just one "
        f"{datatype} {what}); its {what}s: {[(t.name, t.datatype) for t in tensors]}",
    )
