"""Triton's `response_cache { enable: true }` of a model's config, and the models it may not be set on.

The server's cache is asked for with --cache-config local,size=N (common/settings.py); a model uses it only
when its config also enables it (Triton's rule: "by default, no model uses response caching even if the
response cache is enabled globally"). Triton refuses the field on a decoupled model and on a sequence
model at load (core src/model_config_utils.cc), with the words below; so does ringserve.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ringserve.common.errors import ConfigError


def enabled(extra: Mapping[str, Any]) -> bool:
    """Does the config (its top-level fields beyond the tensors) enable the response cache?"""
    field = extra.get("response_cache")
    if field is None:
        return False
    if not isinstance(field, Mapping) or not isinstance(field.get("enable", False), bool):
        raise ConfigError(None, "response_cache", f"must be {{'enable': true|false}}, got {field!r}")
    return bool(field.get("enable", False))


def check(name: str, extra: Mapping[str, Any], *, decoupled: bool, sequence: bool) -> None:
    """Triton's refusals of a cache on a model whose responses it cannot store."""
    if not enabled(extra):
        return
    if sequence:
        raise ConfigError(
            None,
            "response_cache",
            f"Response Cache does not currently support model {name} with sequence batching scheduler. "
            "Please disable the response cache.",
        )
    if decoupled:
        raise ConfigError(
            None,
            "response_cache",
            f"Response Cache does not currently support model {name} with 'decoupled' transaction policy. "
            "Please disable the response cache.",
        )
