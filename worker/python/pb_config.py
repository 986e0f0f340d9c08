"""`pb_utils.ModelConfig`: the config a model.py's `auto_complete_config` reads and completes.

Triton's semantics (python_backend src/resources/triton_python_backend_utils.py, BSD-3), written
again here rather than copied: `as_dict`, `set_max_batch_size`, `set_dynamic_batching`,
`add_input`, `add_output`, `set_model_transaction_policy`, each refusing with ValueError what
Triton refuses. Runs in the worker only, at start-up, before the model's first load
(worker/python/python_model.py: complete_config).
"""

from __future__ import annotations

import json
from typing import Any

_INPUT_PROPERTIES = ("name", "data_type", "dims", "optional")
_OUTPUT_PROPERTIES = ("name", "data_type", "dims")


class AutoCompleteConfig:
    """The model's config document, as Triton's JSON, with the few changes auto-complete may make."""

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        doc = json.loads(model_config) if isinstance(model_config, str) else dict(model_config)
        doc.setdefault("max_batch_size", 0)
        doc.setdefault("input", [])
        doc.setdefault("output", [])
        self._model_config = doc

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        """The config document (Triton calls it read-only access; it is the document itself)."""
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """ValueError when the config already says a larger one (a config may lower, never raise it)."""
        current = int(self._model_config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._name}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Dynamic batching with its defaults, unless another scheduler is configured (ValueError)."""
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's parameter name
        self._add("input", input, _INPUT_PROPERTIES)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, _OUTPUT_PROPERTIES)

    def _add(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        """Add a tensor, or fill in the one of that name the config declares; ValueError where they disagree."""
        name = tensor.get("name", "")
        extra = [key for key in tensor if key not in allowed]
        if extra:
            raise ValueError(
                f"{kind} '{name}' in auto-complete-config function for model '{self._name}' contains "
                f"property other than {', '.join(repr(p) for p in allowed)}: {extra}"
            )
        for required in ("name", "data_type", "dims"):
            if required not in tensor:
                raise ValueError(
                    f"{kind} '{name}' in auto-complete-config function for model '{self._name}' is "
                    f"missing '{required}' property."
                )
        for current in self._model_config[kind]:
            if current.get("name") != name:
                continue
            declared = current.get("data_type", "TYPE_INVALID")
            if declared not in ("TYPE_INVALID", tensor["data_type"]):
                raise ValueError(
                    f"unable to load model '{self._name}', configuration expects datatype {declared} "
                    f"for {kind} '{name}', model provides {tensor['data_type']}"
                )
            if current.get("dims") and list(current["dims"]) != list(tensor["dims"]):
                raise ValueError(
                    f"model '{self._name}', tensor '{name}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims "
                    f"{list(current['dims'])}"
                )
            if "optional" in current and "optional" in tensor and current["optional"] != tensor["optional"]:
                raise ValueError(
                    f"model '{self._name}', tensor '{name}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional "
                    f"{current['optional']}"
                )
            current.update({k: tensor[k] for k in ("data_type", "dims", "optional") if k in tensor})
            return
        self._model_config[kind].append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        extra = [key for key in transaction_policy_dict if key != "decoupled"]
        if extra:
            raise ValueError(
                f"model transaction property in auto-complete-config function for model "
                f"'{self._name}' contains property other than 'decoupled'."
            )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
