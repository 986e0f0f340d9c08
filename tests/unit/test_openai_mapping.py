"""OpenAI bodies -> a model's KServe v2 request (gateway/openai/): which fields become inputs, which
parameters, how a chat becomes a prompt, and the 400s that name the field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.demo_text import ECHO_CHAT_TEMPLATE, build_echo_model
from ringserve.gateway.core.errors import BadRequest
from ringserve.gateway.openai.chat import chat_prompt, default_prompt
from ringserve.gateway.openai.errors import InvalidField, error_doc
from ringserve.gateway.openai.mapping import generation_doc
from ringserve.gateway.openai.requests import read_chat, read_completion, read_embedding

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def echo_config(repo: Path, name: str = "echo", **kwargs) -> ModelConfig:
    build_echo_model(repo, name, **kwargs)
    doc = json.loads((repo / name / "config.json").read_text())
    return ModelConfig.from_json(name, doc, version=1, model_path=str(repo / name / "1" / "model.py"))


def test_declared_inputs_get_the_values_and_the_rest_go_as_parameters(tmp_path: Path):
    config = echo_config(tmp_path)
    request = read_completion({"model": "echo", "prompt": "a b", "max_tokens": 4, "stream": True, "temperature": 0.5,
                               "stop": ["x"], "token_delay_ms": 7, "user": "ignored"})

    doc = generation_doc(config, request, request.prompt)

    inputs = {i["name"]: (i["datatype"], i["shape"], i["data"]) for i in doc["inputs"]}
    assert inputs == {"text_input": ("BYTES", [1], ["a b"]), "max_tokens": ("INT32", [1], [4]),
                      "stream": ("BOOL", [1], [True])}
    assert doc["parameters"] == {"temperature": 0.5, "stop_words": '["x"]', "token_delay_ms": 7}


def test_a_chat_is_made_one_prompt_by_the_models_template_or_the_default(tmp_path: Path):
    templated = echo_config(tmp_path)
    plain = echo_config(tmp_path, "plain", chat_template=False)
    named = echo_config(tmp_path, "named", chat_template=False)
    (tmp_path / "named" / "tok").mkdir()
    (tmp_path / "named" / "tok" / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[-1]['content'] }}")
    (tmp_path / "named" / "tok" / "tokenizer_config.json").write_text('{"bos_token": {"content": "<s>"}}')
    named = ModelConfig.from_json("named", {**json.loads((tmp_path / "named" / "config.json").read_text()),
                                            "parameters": {"tokenizer": {"string_value": "tok"}}},
                                  version=1, model_path=named.model_path)

    assert chat_prompt(templated, MESSAGES) == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert chat_prompt(plain, MESSAGES) == default_prompt(MESSAGES) == "system: be brief\nuser: hi\nassistant:"
    assert chat_prompt(named, MESSAGES) == "<s>hi"
    assert "im_start" in ECHO_CHAT_TEMPLATE


def test_a_template_that_raises_refuses_the_messages_with_400(tmp_path: Path):
    config = echo_config(tmp_path, "strict", chat_template=False)
    (tmp_path / "strict" / "tokenizer").mkdir()
    (tmp_path / "strict" / "tokenizer" / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ raise_exception('no system messages') }}"}))

    with pytest.raises(BadRequest, match="no system messages"):
        chat_prompt(config, MESSAGES)


@pytest.mark.parametrize(("read", "body", "param"), [
    (read_completion, {"prompt": "x"}, "model"),
    (read_completion, {"model": "m", "prompt": [1, 2]}, "prompt"),
    (read_completion, {"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
    (read_completion, {"model": "m", "prompt": "x", "n": 3}, "n"),
    (read_completion, {"model": "m", "prompt": "x", "temperature": "hot"}, "temperature"),
    (read_chat, {"model": "m", "messages": []}, "messages"),
    (read_chat, {"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0]"),
    (read_chat, {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
    (read_embedding, {"model": "m", "input": [[1, 2]]}, "input"),
    (read_embedding, {"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format"),
])
def test_a_field_openai_defines_with_a_value_it_does_not_take_is_400_naming_it(read, body, param):
    with pytest.raises(InvalidField) as refused:
        read(body)

    assert error_doc(refused.value) == {"message": str(refused.value), "type": "invalid_request_error",
                                        "param": param, "code": None}
