"""Triton's model config (config.json, or config.pbtxt read into the same document by
common/repository/pbtxt.py) as frozen dataclasses: parsing, validation, to_json.

Field names and meanings are Triton's (`max_batch_size`, `input`/`output` with
`data_type: "TYPE_FP32"`, `dynamic_batching`, `batch_input`), plus ringserve's extensions
in dynamic_batching (padding, sequence buckets, latency target). What config.json leaves
out is auto-completed from the ONNX graph by common/repository/scan.py.
"""

from __future__ import annotations

import contextlib
import functools
import math
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ringserve.common.repository.fields import check_fields
from ringserve.common.repository.datatypes import KSERVE_DATATYPES, kserve_from_triton, numpy_dtype, triton_from_kserve
from ringserve.common.errors import ConfigError
from ringserve.common.repository.lifecycle import Lifecycle
from ringserve.common.repository import kinds as model_kinds
from ringserve.common.repository.max_shapes import parameter_text, read_max_shapes
from ringserve.common.repository.kinds import ONNX_PLATFORM, PYTHON_BACKEND, EnsembleStep, ModelKind


@contextlib.contextmanager
def naming_model(name: str) -> Iterator[None]:
    """Re-raise ConfigErrors from the per-tensor/per-section checks with the model's name."""
    try:
        yield
    except ConfigError as e:
        if e.model is not None:
            raise
        raise ConfigError(name, e.field, e.problem) from None


def as_int(value: Any, field_name: str) -> int:
    # Triton's protobuf JSON writes int64/uint64 as strings ("dims": ["-1", "3"]).
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ConfigError(None, field_name, f"must be an integer, got {value!r}")


@dataclass(frozen=True)
class TensorConfig:
    """One input or output: KServe datatype name and dims (-1 = variable)."""

    name: str
    datatype: str  # KServe name, e.g. "FP32"
    dims: tuple[int, ...]  # without the batch dim when max_batch_size > 0; -1 = variable
    # Triton's ragged input: requests may differ in length; the batch concatenates them into
    # one 1-D tensor (the model takes it 1-D) and batch_input entries describe the pieces.
    allow_ragged_batch: bool = False
    # Triton's optional input: a request may leave it out (the ONNX graph's initializer is its value).
    optional: bool = False
    # An output's class labels, one a line in <model dir>/<label_filename> (the classification
    # extension); common/repository/scan.py reads the file into `labels`.
    label_filename: str = ""
    labels: tuple[str, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError(None, "name", "tensor names must be non-empty")
        if self.datatype not in KSERVE_DATATYPES:
            raise ConfigError(None, "data_type", f"tensor '{self.name}': unknown datatype {self.datatype!r}")
        if any(d != -1 and d < 1 for d in self.dims):
            raise ConfigError(None, "dims", f"tensor '{self.name}': entries must be -1 or >= 1, got {list(self.dims)}")

    @functools.cached_property
    def np_dtype(self) -> np.dtype:
        return numpy_dtype(self.datatype)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TensorConfig:
        if "data_type" in doc:
            datatype = kserve_from_triton(doc["data_type"])
        elif "datatype" in doc:  # KServe spelling, as /v2/models/{m} metadata shows it
            datatype = doc["datatype"]
        else:
            raise ConfigError(None, "data_type", f"tensor {doc.get('name')!r}: data_type is missing")
        dims = tuple(as_int(d, "dims") for d in doc.get("dims", ()))
        optional, label_filename = doc.get("optional", False), doc.get("label_filename", "")
        if type(optional) is not bool:
            raise ConfigError(None, "optional", f"tensor {doc.get('name')!r}: must be true or false, got {optional!r}")
        if not isinstance(label_filename, str):
            raise ConfigError(
                None, "label_filename", f"tensor {doc.get('name')!r}: must be a file name, got {label_filename!r}"
            )
        return cls(
            name=str(doc.get("name", "")),
            datatype=datatype,
            dims=dims,
            allow_ragged_batch=bool(doc.get("allow_ragged_batch", False)),
            optional=optional,
            label_filename=label_filename,
        )

    def to_json(self) -> dict[str, Any]:
        doc = {"name": self.name, "data_type": triton_from_kserve(self.datatype), "dims": list(self.dims)}
        if self.allow_ragged_batch:
            doc["allow_ragged_batch"] = True
        if self.optional:
            doc["optional"] = True
        if self.label_filename:
            doc["label_filename"] = self.label_filename
        return doc


BatchInputKind = Literal[
    "BATCH_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    "BATCH_ITEM_SHAPE",
    "BATCH_ITEM_SHAPE_FLATTEN",
]
BATCH_INPUT_KINDS: frozenset[str] = frozenset(BatchInputKind.__args__)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class BatchInput:
    """Triton's batch_input: a model input the server generates from the formed batch."""

    kind: str
    target_name: str
    datatype: str  # INT32 or FP32
    source_input: str

    def __post_init__(self) -> None:
        if self.kind not in BATCH_INPUT_KINDS:
            raise ConfigError(None, "batch_input.kind", f"{self.kind!r}; accepted: {sorted(BATCH_INPUT_KINDS)}")
        if self.datatype not in ("INT32", "FP32"):
            raise ConfigError(None, "batch_input.data_type", f"must be TYPE_INT32 or TYPE_FP32, got {self.datatype}")

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> BatchInput:
        # Triton's proto has lists for target_name and source_input; one of each is what backends use.
        def one(key: str) -> str:
            value = doc.get(key)
            values = value if isinstance(value, list) else [value]
            if len(values) != 1 or not isinstance(values[0], str):
                raise ConfigError(None, f"batch_input.{key}", f"needs exactly one name, got {value!r}")
            return values[0]

        datatype = kserve_from_triton(doc.get("data_type", "TYPE_INT32"))
        return cls(
            kind=doc.get("kind", ""),
            target_name=one("target_name"),
            datatype=datatype,
            source_input=one("source_input"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "target_name": [self.target_name],
            "data_type": triton_from_kserve(self.datatype),
            "source_input": [self.source_input],
        }


TimeoutAction = Literal["REJECT", "DELAY"]


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ModelQueuePolicy: what a queue does when full or when a request times out."""

    timeout_action: TimeoutAction = "REJECT"  # REJECT: 504 at the deadline; DELAY: moves behind the unexpired
    default_timeout_us: int = 0  # 0 = none (the server's --request-timeout-s still bounds it)
    allow_timeout_override: bool = False  # a request's `timeout` parameter may only lower it
    max_queue_size: int = 0  # 0 = unbounded; full -> 503

    def __post_init__(self) -> None:
        if self.timeout_action not in ("REJECT", "DELAY"):
            raise ConfigError(
                None, "queue_policy.timeout_action", f"must be REJECT or DELAY, got {self.timeout_action!r}"
            )
        for name, value in (
            ("default_timeout_microseconds", self.default_timeout_us),
            ("max_queue_size", self.max_queue_size),
        ):
            if value < 0:
                raise ConfigError(None, f"dynamic_batching.default_queue_policy.{name}", f"must be >= 0, got {value}")

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], prefix: str) -> QueuePolicy:
        return cls(
            timeout_action=doc.get("timeout_action", "REJECT"),
            default_timeout_us=as_int(
                doc.get("default_timeout_microseconds", 0), prefix + ".default_timeout_microseconds"
            ),
            allow_timeout_override=bool(doc.get("allow_timeout_override", False)),
            max_queue_size=as_int(doc.get("max_queue_size", 0), prefix + ".max_queue_size"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "timeout_action": self.timeout_action,
            "default_timeout_microseconds": self.default_timeout_us,
            "allow_timeout_override": self.allow_timeout_override,
            "max_queue_size": self.max_queue_size,
        }


@dataclass(frozen=True)
class Padding:
    """ringserve: batch requests of different lengths by padding variable dims to the longest."""

    value: float = 0  # written into padded positions of every padded input (mask: 0)
    mask_input: str | None = None  # generated when a request omits it: 1 on real positions, 0 on padding

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Padding:
        return cls(value=doc.get("value", 0), mask_input=doc.get("mask_input"))

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "mask_input": self.mask_input}


@dataclass(frozen=True)
class DynamicBatching:
    """Triton's dynamic_batching section, same names and meaning, plus ringserve's extensions.

    Triton: preferred_batch_size, max_queue_delay_microseconds, preserve_ordering,
    priority_levels (1 = highest), default_priority_level, default_queue_policy,
    priority_queue_policy. ringserve: padding, sequence_buckets, pad_to_preferred_batch_size,
    latency_target_ms. Unknown keys refuse the model (common/repository/fields.py).
    """

    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0  # 0 = one level
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: Mapping[int, QueuePolicy] = field(default_factory=dict)
    padding: Padding | None = None
    sequence_buckets: tuple[int, ...] = ()
    pad_to_preferred_batch_size: bool = False
    latency_target_ms: float = 0.0  # 0 = off
    # Inputs whose value separates queues: requests that differ there never share a call.
    separate_by_inputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if any(size < 1 for size in self.preferred_batch_size):
            raise ConfigError(
                None,
                "dynamic_batching.preferred_batch_size",
                f"entries must be >= 1, got {list(self.preferred_batch_size)}",
            )
        if self.max_queue_delay_us < 0:
            raise ConfigError(
                None, "dynamic_batching.max_queue_delay_microseconds", f"must be >= 0, got {self.max_queue_delay_us}"
            )
        if self.priority_levels < 0 or not 0 <= self.default_priority_level <= self.priority_levels:
            raise ConfigError(
                None,
                "dynamic_batching.default_priority_level",
                f"must be within 1..priority_levels ({self.priority_levels}), got {self.default_priority_level}",
            )
        bad_levels = [lv for lv in self.priority_queue_policy if not 1 <= lv <= self.priority_levels]
        if bad_levels:
            raise ConfigError(
                None,
                "dynamic_batching.priority_queue_policy",
                f"levels {bad_levels} are outside 1..priority_levels ({self.priority_levels})",
            )
        if any(b < 1 for b in self.sequence_buckets) or list(self.sequence_buckets) != sorted(
            set(self.sequence_buckets)
        ):
            raise ConfigError(
                None,
                "dynamic_batching.sequence_buckets",
                f"must be increasing lengths >= 1, got {list(self.sequence_buckets)}",
            )
        if self.latency_target_ms < 0:
            raise ConfigError(None, "dynamic_batching.latency_target_ms", f"must be >= 0, got {self.latency_target_ms}")
        if self.priority_levels and not self.default_priority_level:
            # The middle level, as when the JSON leaves it out: unlabeled requests are neither first nor last.
            object.__setattr__(self, "default_priority_level", (self.priority_levels + 1) // 2)
        object.__setattr__(self, "priority_queue_policy", types.MappingProxyType(dict(self.priority_queue_policy)))

    # Older names, kept for callers that read the default policy directly.
    @property
    def default_timeout_us(self) -> int:
        return self.default_queue_policy.default_timeout_us

    @property
    def max_queue_size(self) -> int:
        return self.default_queue_policy.max_queue_size

    def policy_for(self, level: int) -> QueuePolicy:
        return self.priority_queue_policy.get(level, self.default_queue_policy)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DynamicBatching:
        prefix = "dynamic_batching."
        levels = as_int(doc.get("priority_levels", 0), prefix + "priority_levels")
        per_level = {
            as_int(k, prefix + "priority_queue_policy"): QueuePolicy.from_json(v, f"{prefix}priority_queue_policy.{k}")
            for k, v in (doc.get("priority_queue_policy") or {}).items()
        }
        padding = doc.get("padding")
        return cls(
            preferred_batch_size=tuple(
                as_int(size, prefix + "preferred_batch_size") for size in doc.get("preferred_batch_size", ())
            ),
            max_queue_delay_us=as_int(
                doc.get("max_queue_delay_microseconds", 0), prefix + "max_queue_delay_microseconds"
            ),
            preserve_ordering=bool(doc.get("preserve_ordering", False)),
            priority_levels=levels,
            default_priority_level=as_int(
                doc.get("default_priority_level", (levels + 1) // 2 if levels else 0), prefix + "default_priority_level"
            ),
            default_queue_policy=QueuePolicy.from_json(
                doc.get("default_queue_policy") or {}, prefix + "default_queue_policy"
            ),
            priority_queue_policy=per_level,
            padding=Padding.from_json(padding) if isinstance(padding, Mapping) else None,
            sequence_buckets=tuple(as_int(b, prefix + "sequence_buckets") for b in doc.get("sequence_buckets", ())),
            pad_to_preferred_batch_size=bool(doc.get("pad_to_preferred_batch_size", False)),
            latency_target_ms=float(doc.get("latency_target_ms", 0.0)),
            separate_by_inputs=tuple(doc.get("separate_by_inputs", ())),
        )

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "preferred_batch_size": list(self.preferred_batch_size),
            "max_queue_delay_microseconds": self.max_queue_delay_us,
            "preserve_ordering": self.preserve_ordering,
            "priority_levels": self.priority_levels,
            "default_priority_level": self.default_priority_level,
            "default_queue_policy": self.default_queue_policy.to_json(),
            "priority_queue_policy": {str(k): v.to_json() for k, v in self.priority_queue_policy.items()},
            "sequence_buckets": list(self.sequence_buckets),
            "pad_to_preferred_batch_size": self.pad_to_preferred_batch_size,
            "latency_target_ms": self.latency_target_ms,
            "separate_by_inputs": list(self.separate_by_inputs),
        }
        if self.padding is not None:
            doc["padding"] = self.padding.to_json()
        return doc


_MODEL_KEYS = {"name", "platform", "max_batch_size", "input", "output", "dynamic_batching", "batch_input"}


@dataclass(frozen=True)
class ModelConfig:
    """One servable model version; `to_json()` is what `/v2/models/{m}/config` returns."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    dynamic_batching: DynamicBatching | None
    version: int
    model_path: str  # absolute path to <repo>/<model>/<version>/model.onnx (model.py; an ensemble's: <version>/)
    platform: str = ONNX_PLATFORM  # "" for backend: "python" (Triton's spelling), "ensemble"
    batch_inputs: tuple[BatchInput, ...] = ()
    # The other top-level fields config_fields.MODEL accepts (instance_group, version_policy,
    # model_load_policy, parameters, Triton's ignored ones), kept verbatim.
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # Requests that name no version reach this one: the highest version the version_policy serves.
    default_version: bool = True
    # Read from the lifecycle keys of `extra` (common/repository/lifecycle.py), so it always agrees with them.
    lifecycle: Lifecycle = field(default=Lifecycle(), init=False)

    def __post_init__(self) -> None:
        with naming_model(self.name):
            self._validate()
            object.__setattr__(self, "lifecycle", Lifecycle.from_config_doc(self.extra))
        object.__setattr__(self, "extra", types.MappingProxyType(dict(self.extra)))

    @functools.cached_property
    def key(self) -> str:
        """Names this version's queue and state at the gateway: 'm' for the default version, else 'm/2'."""
        return self.name if self.default_version else f"{self.name}/{self.version}"

    def _validate(self) -> None:
        if not self.name:
            raise ConfigError(None, "name", "model names must be non-empty")
        model_kinds.kind_of(self.platform, self.extra.get("backend"))  # ConfigError naming what is served
        if self.max_batch_size < 0:
            raise ConfigError(None, "max_batch_size", f"must be >= 0, got {self.max_batch_size}")
        if self.version < 1:
            raise ConfigError(None, "version", f"must be >= 1, got {self.version}")
        for field_name, tensors in (("input", self.inputs), ("output", self.outputs)):
            names = [t.name for t in tensors]
            if not names:
                raise ConfigError(None, field_name, "at least one tensor is required")
            if len(set(names)) != len(names):
                raise ConfigError(None, field_name, f"tensor names must be unique, got {names}")
        inputs = {t.name: t for t in self.inputs}
        for batch_input in self.batch_inputs:
            source = inputs.get(batch_input.source_input)
            if source is None:
                raise ConfigError(
                    None,
                    "batch_input.source_input",
                    f"{batch_input.source_input!r} is not an input; inputs: {sorted(inputs)}",
                )
            if batch_input.target_name in inputs:
                raise ConfigError(
                    None,
                    "batch_input.target_name",
                    f"{batch_input.target_name!r} is generated, it cannot also be a request input",
                )
        self.max_dims  # noqa: B018 - parameters.max_shapes: refused at load, not at the first request
        if any(t.allow_ragged_batch for t in self.inputs) and self.max_batch_size == 0:
            raise ConfigError(None, "input.allow_ragged_batch", "needs max_batch_size >= 1")
        optional = [t.name for t in self.inputs if t.optional]
        if optional and self.max_batch_size > 0:
            # Triton's ONNX Runtime backend refuses the same: a batch cannot feed ONNX Runtime an
            # input for some of its rows and the graph's initializer for the others.
            raise ConfigError(
                None,
                "input.optional",
                f"optional input {optional[0]!r} is not supported for models "
                "that support batching; set max_batch_size: 0",
            )
        if self.dynamic_batching is not None:
            if self.max_batch_size == 0:
                raise ConfigError(None, "dynamic_batching", "needs max_batch_size >= 1 (0 means no batch dim)")
            padding = self.dynamic_batching.padding
            if padding is not None and padding.mask_input is not None and padding.mask_input not in inputs:
                raise ConfigError(
                    None,
                    "dynamic_batching.padding.mask_input",
                    f"{padding.mask_input!r} is not an input; inputs: {sorted(inputs)}",
                )
            unknown = [n for n in self.dynamic_batching.separate_by_inputs if n not in inputs]
            if unknown:
                raise ConfigError(None, "dynamic_batching.separate_by_inputs", f"{unknown} are not inputs")
            too_big = [s for s in self.dynamic_batching.preferred_batch_size if s > self.max_batch_size]
            if too_big:
                raise ConfigError(
                    None,
                    "dynamic_batching.preferred_batch_size",
                    f"entries must be within 1..max_batch_size ({self.max_batch_size}), got {too_big}",
                )
        self._validate_bytes_inputs()
        model_kinds.check_kind(self)

    # The kind's own (common/repository/kinds.py): onnx, python (model.py, run by the workers only) or
    # ensemble; Triton's model_transaction_policy.decoupled; an ensemble's steps in execution order.
    @functools.cached_property
    def kind(self) -> ModelKind:
        return model_kinds.kind_of(self.platform, self.extra.get("backend"))

    @functools.cached_property
    def decoupled(self) -> bool:
        return model_kinds.decoupled(self.extra)

    @functools.cached_property
    def ensemble_steps(self) -> tuple[EnsembleStep, ...]:
        return model_kinds.ensemble_steps(self.to_json()) if self.kind == "ensemble" else ()

    def _validate_bytes_inputs(self) -> None:
        """BYTES inputs reach the slot serialized, each request's elements after the previous one's:
        they stack by rows, but are never padded, concatenated as ragged, or compared by value."""
        if not self.bytes_inputs:
            return
        names = ", ".join(repr(n) for n in self.bytes_inputs)
        ragged = ", ".join(repr(n) for n in self.bytes_inputs if n in self.ragged_inputs)
        if ragged:
            raise ConfigError(
                None,
                "input.allow_ragged_batch",
                f"BYTES input(s) {ragged} cannot be ragged; ragged batching is for fixed-size inputs",
            )
        batching = self.dynamic_batching
        if batching is None:
            return
        if batching.padding is not None:
            raise ConfigError(
                None,
                "dynamic_batching.padding",
                f"BYTES input(s) {names} cannot be padded; padding is for models whose inputs are all fixed-size",
            )
        if batching.pad_to_preferred_batch_size:
            raise ConfigError(
                None,
                "dynamic_batching.pad_to_preferred_batch_size",
                f"BYTES input(s) {names} cannot be padded; padding is for models whose inputs are all fixed-size",
            )
        separating = ", ".join(repr(n) for n in batching.separate_by_inputs if n in self.bytes_inputs)
        if separating:
            raise ConfigError(
                None,
                "dynamic_batching.separate_by_inputs",
                f"BYTES input(s) {separating} cannot separate requests; name fixed-size inputs",
            )

    @classmethod
    def from_json(
        cls,
        name: str,
        doc: Mapping[str, Any],
        *,
        version: int,
        model_path: str,
        default_version: bool = True,
        source: str = "config.json",
    ) -> ModelConfig:
        """Build from Triton's JSON form (`data_type: "TYPE_FP32"`; KServe `datatype` also accepted);
        `source`: the file it came from, config.json or config.pbtxt (common/repository/pbtxt.py), named in errors."""
        with naming_model(name):
            check_fields(doc, where=source)
            if doc.get("name", name) != name:
                raise ConfigError(None, "name", f"{doc['name']!r} differs from the directory name")
            batching = doc.get("dynamic_batching")
            return cls(
                name=name,
                max_batch_size=as_int(doc.get("max_batch_size", 0), "max_batch_size"),
                inputs=tuple(TensorConfig.from_json(t) for t in doc.get("input", ())),
                outputs=tuple(TensorConfig.from_json(t) for t in doc.get("output", ())),
                dynamic_batching=None if batching is None else DynamicBatching.from_json(batching),
                version=version,
                model_path=model_path,
                platform=doc.get("platform") or ("" if doc.get("backend") == PYTHON_BACKEND else ONNX_PLATFORM),
                batch_inputs=tuple(BatchInput.from_json(b) for b in doc.get("batch_input", ())),
                extra={k: v for k, v in doc.items() if k not in _MODEL_KEYS},
                default_version=default_version,
            )

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "platform": self.platform,
            "max_batch_size": self.max_batch_size,
            "input": [t.to_json() for t in self.inputs],
            "output": [t.to_json() for t in self.outputs],
        }
        if self.dynamic_batching is not None:
            doc["dynamic_batching"] = self.dynamic_batching.to_json()
        if self.batch_inputs:
            doc["batch_input"] = [b.to_json() for b in self.batch_inputs]
        return {**doc, **self.extra}

    @functools.cached_property
    def ragged_inputs(self) -> frozenset[str]:
        return frozenset(t.name for t in self.inputs if t.allow_ragged_batch)

    @functools.cached_property
    def required_inputs(self) -> tuple[str, ...]:
        """The inputs every request must give (all but the optional ones), in config order."""
        return tuple(t.name for t in self.inputs if not t.optional)

    @functools.cached_property
    def bytes_inputs(self) -> tuple[str, ...]:
        """Names of the BYTES inputs (KServe BYTES, ONNX string); () for the usual all-fixed-size model."""
        return tuple(t.name for t in self.inputs if t.datatype == "BYTES")

    @functools.cached_property
    def max_dims(self) -> dict[str, tuple[int, ...]]:
        """Bounded inputs -> their largest dims, batch dim left out (-1: unbounded): `parameters.max_shapes`
        (common/repository/max_shapes.py); {} for the usual config."""
        text = parameter_text(self.extra.get("parameters"))
        if text is None:
            return {}
        return read_max_shapes(text, {t.name: t.dims for t in self.inputs}, self.max_batch_size)

    # Looked up per request on the gateway's hot path: computed once per config.
    @functools.cached_property
    def inputs_by_name(self) -> dict[str, TensorConfig]:
        return {t.name: t for t in self.inputs}

    @functools.cached_property
    def outputs_by_name(self) -> dict[str, TensorConfig]:
        return {t.name: t for t in self.outputs}

    @functools.cached_property
    def fixed_output_row_bytes(self) -> int:
        """Bytes one batch row of outputs takes, counting only outputs whose dims are all fixed."""
        return sum(math.prod(t.dims) * t.np_dtype.itemsize for t in self.outputs if all(d > 0 for d in t.dims))

    def input(self, name: str) -> TensorConfig:
        """The input called `name`; KeyError if there is none."""
        return self.inputs_by_name[name]

    def output(self, name: str) -> TensorConfig:
        """The output called `name`; KeyError if there is none."""
        return self.outputs_by_name[name]
