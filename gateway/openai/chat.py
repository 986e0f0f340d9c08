"""Chat messages -> one prompt, as Triton's OpenAI frontend makes it: the model's tokenizer chat template
(Hugging Face's `chat_template`, rendered by Jinja2 in a sandbox as transformers' apply_chat_template renders
it, with add_generation_prompt) when the model ships one; otherwise the default template below.

Where a model's template is found, first that found wins:
    parameters.tokenizer (string_value)   a folder, absolute or relative to the model's folder
    <model folder>/tokenizer/             Triton's OpenAI examples' layout
in which chat_template.jinja, or tokenizer_config.json's "chat_template" (a string, or a list of named ones:
"default"), is the template; its bos_token and eos_token are given to it.

The default template, for a model that ships none: one line per message, `<role>: <content>`, then
`assistant:` (the model's cue to answer).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from ringserve.common.repository.config import ModelConfig
from ringserve.gateway.core.errors import BadRequest, GatewayError

TOKENIZER_FOLDER = "tokenizer"


class TemplateFailed(GatewayError):
    """The model's chat template could not be read or rendered (500: the model's files, not the request)."""


def default_prompt(messages: list[dict[str, str]]) -> str:
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def chat_prompt(config: ModelConfig, messages: list[dict[str, str]]) -> str:
    """The prompt the model gets for `messages`."""
    folder = tokenizer_folder(config)
    if folder is None:
        return default_prompt(messages)
    template = _template(str(folder))
    if template is None:
        return default_prompt(messages)
    compiled, specials = template
    try:
        return compiled.render(messages=messages, add_generation_prompt=True, **specials)
    except _TemplateRaised as exc:  # the template's raise_exception: the messages are what it refuses
        raise BadRequest(f"model {config.name!r}'s chat template refused the messages: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any error of the model's own template is its, not the request's
        raise TemplateFailed(f"model {config.name!r}'s chat template failed: {type(exc).__name__}: {exc}") from None


def tokenizer_folder(config: ModelConfig) -> Path | None:
    """The model's tokenizer folder (see the module's doc), or None."""
    version_path = Path(config.model_path)
    model_folder = version_path.parent if version_path.is_dir() else version_path.parent.parent
    parameters = config.extra.get("parameters") or {}
    named = parameters.get("tokenizer") if isinstance(parameters, dict) else None
    if isinstance(named, dict):
        named = named.get("string_value")
    if isinstance(named, str) and named:
        folder = model_folder / named
        return folder if folder.is_dir() else None
    folder = model_folder / TOKENIZER_FOLDER
    return folder if folder.is_dir() else None


class _TemplateRaised(Exception):
    pass


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


@functools.lru_cache(maxsize=64)
def _template(folder: str) -> tuple[Any, dict[str, str]] | None:
    """(compiled template, its special tokens) of a tokenizer folder, or None when it has no chat template."""
    path = Path(folder)
    settings: dict[str, Any] = {}
    try:
        if (path / "tokenizer_config.json").is_file():
            settings = json.loads((path / "tokenizer_config.json").read_text())
        source = settings.get("chat_template")
        if (path / "chat_template.jinja").is_file():
            source = (path / "chat_template.jinja").read_text()
        if isinstance(source, list):  # named templates: the default one
            source = next((t.get("template") for t in source if t.get("name") == "default"), None)
        if not isinstance(source, str):
            return None
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415 - only for models that ship one

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = _raise_exception
        compiled = environment.from_string(source)
    except Exception as exc:  # noqa: BLE001 - unreadable JSON, a template that does not compile: the model's fault
        raise TemplateFailed(f"the chat template in {folder} cannot be read: {type(exc).__name__}: {exc}") from None
    specials = {name: _token_text(settings.get(name)) for name in ("bos_token", "eos_token")}
    return compiled, specials


def _token_text(token: Any) -> str:
    if isinstance(token, dict):  # tokenizer_config.json's AddedToken form
        token = token.get("content")
    return token if isinstance(token, str) else ""
