"""The three kinds of model a repository holds, and the config rules that belong to each.

    kind      config says                         a version is                 runs as
    --------  ----------------------------------  ---------------------------  -------------------------------
    onnx      platform: "onnxruntime_onnx"        <m>/<v>/model.onnx           an ONNX Runtime session
              (or backend: "onnxruntime", or no config at all)
    python    backend: "python"                   <m>/<v>/model.py             Triton's TritonPythonModel, in
              (or no config, and a model.py)                                   the worker only (worker/python/)
    ensemble  platform: "ensemble"                <m>/<v>/ (empty)             its ensemble_scheduling steps, one
              with ensemble_scheduling { step }                                after the other in one worker

Kept out of common/repository/config.py so that the ONNX path reads as it did; ModelConfig asks this
module for its kind (`kind_of`) and for the kind's checks (`check_kind`) when it is built.
Steps of an ensemble name other models of the repository: `check_ensemble` runs once every
config of a scan is built (common/repository/scan.py).
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ringserve.common.errors import ConfigError

if TYPE_CHECKING:
    from ringserve.common.repository.batching import BatchInput, DynamicBatching
    from ringserve.common.repository.tensor_config import TensorConfig

ModelKind = Literal["onnx", "python", "ensemble"]
ONNX_PLATFORM = "onnxruntime_onnx"
ENSEMBLE_PLATFORM = "ensemble"
PYTHON_BACKEND = "python"
ONNX_BACKEND = "onnxruntime"
# The file each kind's version folder holds (an ensemble's holds none).
MODEL_FILE: dict[str, str | None] = {"onnx": "model.onnx", "python": "model.py", "ensemble": None}
# Triton's per-model conda environment for the Python backend: not served (docs/models.md says how
# to install a model's packages instead).
EXECUTION_ENV_PATH = "EXECUTION_ENV_PATH"


def kind_of(platform: str, backend: str | None) -> ModelKind:
    """The kind a config's `platform` and `backend` name; ConfigError naming what is served otherwise."""
    if backend == PYTHON_BACKEND:
        if platform:
            raise ConfigError(
                None, "platform", f'a backend: "python" model names no platform (Triton\'s rule), got {platform!r}'
            )
        return "python"
    if platform == ENSEMBLE_PLATFORM and not backend:
        return "ensemble"
    if platform in ("", ONNX_PLATFORM) and backend in (None, "", ONNX_BACKEND):
        return "onnx"  # (Triton's `backend: "onnxruntime"` alone names the ONNX platform too)
    what = f"platform {platform!r}" + (f" with backend {backend!r}" if backend else "")
    raise ConfigError(
        None,
        "platform",
        f"{what} is not served; served: platform {ONNX_PLATFORM!r} (ONNX "
        f"Runtime), backend {PYTHON_BACKEND!r} (model.py), platform "
        f"{ENSEMBLE_PLATFORM!r}",
    )


@dataclass(frozen=True)
class EnsembleStep:
    """One step of Triton's ensemble_scheduling: a model of the repository and how its tensors are named."""

    model_name: str
    model_version: int  # -1: the model's default version
    input_map: Mapping[str, str]  # the step model's input -> the ensemble tensor it reads
    output_map: Mapping[str, str]  # the step model's output -> the ensemble tensor it makes

    @classmethod
    def from_json(cls, doc: Any) -> EnsembleStep:
        if not isinstance(doc, Mapping) or not isinstance(doc.get("model_name"), str) or not doc["model_name"]:
            raise ConfigError(None, "ensemble_scheduling.step", f"each step needs a model_name, got {doc!r}")
        maps = {}
        for key in ("input_map", "output_map"):
            value = doc.get(key) or {}
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise ConfigError(
                    None, f"ensemble_scheduling.step.{key}", f"must map tensor names to tensor names, got {value!r}"
                )
            maps[key] = types.MappingProxyType(dict(value))
        version = doc.get("model_version", -1)
        version = int(version) if isinstance(version, str) and version.lstrip("-").isdigit() else version
        if type(version) is not int or (version < 1 and version != -1):
            raise ConfigError(
                None,
                "ensemble_scheduling.step.model_version",
                f"must be -1 (the default version) or a version >= 1, got {version!r}",
            )
        return cls(doc["model_name"], version, maps["input_map"], maps["output_map"])


def ensemble_steps(doc: Mapping[str, Any]) -> tuple[EnsembleStep, ...]:
    """The steps of a config document's ensemble_scheduling, in execution order (each step after the
    steps that make the tensors it reads). ConfigError for a step that reads a tensor nothing makes."""
    scheduling = doc.get("ensemble_scheduling")
    steps = scheduling.get("step") if isinstance(scheduling, Mapping) else None
    if not isinstance(steps, list) or not steps:
        raise ConfigError(
            None, "ensemble_scheduling", 'a platform: "ensemble" model needs ensemble_scheduling with at least one step'
        )
    pending = [EnsembleStep.from_json(s) for s in steps]
    known = {t["name"] for t in doc.get("input", ()) if isinstance(t, Mapping)}
    ordered: list[EnsembleStep] = []
    while pending:
        runnable = [s for s in pending if set(s.input_map.values()) <= known]
        if not runnable:
            missing = sorted({t for s in pending for t in s.input_map.values()} - known)
            raise ConfigError(
                None,
                "ensemble_scheduling.step.input_map",
                f"tensor(s) {missing} are neither ensemble inputs nor made by another step",
            )
        for step in runnable:
            pending.remove(step)
            ordered.append(step)
            known |= set(step.output_map.values())
    return tuple(ordered)


def decoupled(extra: Mapping[str, Any]) -> bool:
    policy = extra.get("model_transaction_policy") or {}
    return bool(isinstance(policy, Mapping) and policy.get("decoupled", False))


class KindedConfig(Protocol):
    """What the kinds' rules read of a model's config: common/repository/config.py's ModelConfig, which calls
    check_kind on itself (so this module names what it reads instead of importing config.py back)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> ModelKind: ...
    @property
    def extra(self) -> Mapping[str, Any]: ...
    @property
    def decoupled(self) -> bool: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def inputs(self) -> tuple[TensorConfig, ...]: ...
    @property
    def outputs(self) -> tuple[TensorConfig, ...]: ...
    @property
    def inputs_by_name(self) -> dict[str, TensorConfig]: ...
    @property
    def outputs_by_name(self) -> dict[str, TensorConfig]: ...
    @property
    def ragged_inputs(self) -> frozenset[str]: ...
    @property
    def batch_inputs(self) -> tuple[BatchInput, ...]: ...
    @property
    def dynamic_batching(self) -> DynamicBatching | None: ...
    @property
    def ensemble_steps(self) -> tuple[EnsembleStep, ...]: ...


def check_kind(config: KindedConfig) -> None:
    """The rules of the config's kind (ModelConfig._validate calls this); ConfigError naming the field."""
    kind = config.kind
    params = config.extra.get("parameters") or {}
    if EXECUTION_ENV_PATH in params:
        raise ConfigError(
            None,
            f"parameters.{EXECUTION_ENV_PATH}",
            "Triton's per-model execution environments are not supported: a model's Python runs in "
            "the worker's own interpreter; install the packages it imports into ringserve's "
            "environment (pip install ... with the same python), see docs/models.md",
        )
    if config.decoupled and kind != "python":
        raise ConfigError(None, "model_transaction_policy.decoupled", 'only backend: "python" models may be decoupled')
    if "ensemble_scheduling" in config.extra and kind != "ensemble":
        raise ConfigError(
            None,
            "ensemble_scheduling",
            "Triton's field 'ensemble_scheduling' is for platform: \"ensemble\" models only",
        )
    if kind == "onnx":
        return
    if config.batch_inputs:
        raise ConfigError(
            None, "batch_input", f"a {kind} model gets each request's own tensors; batch_input is for ONNX models"
        )
    batching = config.dynamic_batching
    if batching is not None and (batching.padding is not None or batching.pad_to_preferred_batch_size):
        raise ConfigError(
            None,
            "dynamic_batching.padding",
            f"a {kind} model gets each request's own tensors; padding is for ONNX models",
        )
    if kind == "ensemble":
        config.ensemble_steps  # noqa: B018 - parsed (and checked) now, not at the first batch
        if config.ragged_inputs:
            raise ConfigError(None, "input.allow_ragged_batch", "ensemble inputs cannot be ragged")


def check_ensemble(
    config: KindedConfig,
    served: Mapping[str, KindedConfig],
    versions: Mapping[tuple[str, int], KindedConfig],
    pending: Set[str] = frozenset(),
) -> None:
    """The ensemble's steps against the models they name (`served`: default versions by name;
    `versions`: every served version). A step model whose config a worker completes (a Python
    model with auto_complete_config: its key in `pending`) is checked only by name here, in full
    in the worker, which has its config."""
    made = {t.name for t in config.inputs}
    for step in config.ensemble_steps:
        target = (
            served.get(step.model_name)
            if step.model_version == -1
            else versions.get((step.model_name, step.model_version))
        )
        key = step.model_name if step.model_version == -1 else f"{step.model_name}/{step.model_version}"
        if target is None and (key in pending or step.model_name in pending):
            made |= set(step.output_map.values())
            continue
        if target is None:
            which = "" if step.model_version == -1 else f" version {step.model_version}"
            raise ConfigError(
                config.name,
                "ensemble_scheduling.step.model_name",
                f"step model {step.model_name!r}{which} is not served by this repository",
            )
        if target.kind == "ensemble":
            raise ConfigError(
                config.name,
                "ensemble_scheduling.step.model_name",
                f"step model {step.model_name!r} is an ensemble itself; nest its steps instead",
            )
        for key, names in (("input_map", target.inputs_by_name), ("output_map", target.outputs_by_name)):
            unknown = sorted(set(getattr(step, key)) - set(names))
            if unknown:
                raise ConfigError(
                    config.name,
                    f"ensemble_scheduling.step.{key}",
                    f"{unknown} are not {key.split('_')[0]}s of model {step.model_name!r} (it has {sorted(names)})",
                )
        if config.max_batch_size > 0 and target.max_batch_size < config.max_batch_size:
            raise ConfigError(
                config.name,
                "max_batch_size",
                f"{config.max_batch_size} is more than step model {step.model_name!r} takes "
                f"({target.max_batch_size}); an ensemble's batch goes to every step whole",
            )
        made |= set(step.output_map.values())
    missing = sorted({t.name for t in config.outputs} - made)
    if missing:
        raise ConfigError(config.name, "output", f"ensemble output(s) {missing} are made by no step")
