"""Triton's batching sections of a model config as frozen dataclasses: `dynamic_batching` (its
queue policies, and ringserve's padding, sequence buckets and latency target) and `batch_input`
(inputs the server generates from the formed batch). ModelConfig (common/repository/config.py)
holds them; gateway/batching/ acts on them.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ringserve.common.errors import ConfigError
from ringserve.common.repository.datatypes import kserve_from_triton, triton_from_kserve
from ringserve.common.repository.fields import as_int

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


# Triton bounds priority_levels by nothing; ringserve's queue keeps a lane per level and goes through
# them, on the event loop, for every batch it forms: 1.35 us a level on the shared 2 vCPUs (a request
# at the lowest of 1,000 levels: 1 ms per look; 3,000,000 levels took 5.3 s per request). Configs seen
# use 2 to 10; 64 keeps the worst look under 0.1 ms.
MAX_PRIORITY_LEVELS = 64


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
        if self.priority_levels > MAX_PRIORITY_LEVELS:
            raise ConfigError(
                None,
                "dynamic_batching.priority_levels",
                f"must be at most {MAX_PRIORITY_LEVELS} (ringserve's bound: a model's queue keeps a lane per level "
                f"and looks through them for each batch), got {self.priority_levels}",
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
