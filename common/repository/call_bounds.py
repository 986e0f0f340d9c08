"""Bounds on the calls into a model's code: the model parameters `load_timeout_s`, `warmup_timeout_s`,
`execute_timeout_s` and `finalize_timeout_s`.

A call past its bound is a wedged worker: the supervisor kills it (restart reason `load_timeout`,
`warmup_timeout`, `execute_timeout`, `finalize_timeout`) and the gateway replays its batches on the
successor (worker/progress.py records the calls; supervision/workers.py judges them). Each bound's
default is a server flag (common/settings.py: `load_timeout_s`, ...); a model overrides it in its
`parameters`, as config.pbtxt can carry them too:

    parameters { key: "execute_timeout_s" value: { string_value: "10" } }

A value is seconds, 0 = unbounded for that model. `execute`'s flag bounds Python models and ensembles
(their code may loop in Python, where the heartbeat thread still beats); an ONNX model's execute is
bounded only by its parameter (ONNX Runtime holds no Python loop; `--batch-timeout-s` bounds any batch).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from ringserve.common.errors import ConfigError

Hook = Literal["load", "warmup", "execute", "finalize"]
HOOKS: tuple[Hook, ...] = ("load", "warmup", "execute", "finalize")


def parameter_name(hook: Hook) -> str:
    return f"{hook}_timeout_s"


def read_call_bounds(parameters: Any) -> dict[Hook, float]:
    """hook -> the model's own bound in seconds (0 = unbounded), for the hooks its `parameters` name."""
    if not isinstance(parameters, Mapping):
        return {}
    bounds: dict[Hook, float] = {}
    for hook in HOOKS:
        name = parameter_name(hook)
        if name not in parameters:
            continue
        value = parameters[name]
        text = value.get("string_value") if isinstance(value, Mapping) else value
        try:
            seconds = float(text)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            seconds = -1.0
        if isinstance(text, bool) or not (math.isfinite(seconds) and seconds >= 0):
            raise ConfigError(
                None, f"parameters.{name}", f'must be seconds >= 0 (0 = unbounded), e.g. "30", got {value!r}'
            )
        bounds[hook] = seconds
    return bounds
