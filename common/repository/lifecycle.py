"""Model lifecycle settings from config.json: which versions are served, when they load, where.

Triton's names where Triton has the setting:
    "version_policy": {"latest": {"num_versions": 2}} | {"all": {}} | {"specific": {"versions": [1, 3]}}
    "instance_group": [{"count": 1, "kind": "KIND_GPU", "gpus": [0, 1]}]
ringserve's own (Triton loads every model at start and keeps it):
    "model_load_policy": "eager" | "lazy"   eager: loaded before the worker reports ready
    "warmup": true                          one inference on zeros right after each load
    "ttl_s": 600                            unloaded after this long unused (0 = never)
    "eviction_priority": 0                  under --model-memory-budget, idle versions with a
                                            higher number are evicted first; lower = evicted
                                            later (as Triton's priority levels: 1 outranks 2);
                                            least recently used first among equals

All of them stay in ModelConfig.extra verbatim (so /config shows what was written);
`Lifecycle.from_config_doc` reads and validates them when the config is built.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ringserve.common.errors import ConfigError
from ringserve.common.vocabulary import LOAD_POLICIES, LoadPolicy

# KIND_MODEL (Triton: the model places its instances itself, as vLLM's and TRT-LLM's do) is served as KIND_AUTO.
InstanceKind = Literal["KIND_AUTO", "KIND_CPU", "KIND_GPU", "KIND_MODEL"]
INSTANCE_KINDS: tuple[str, ...] = ("KIND_AUTO", "KIND_CPU", "KIND_GPU", "KIND_MODEL")
VersionPolicyKind = Literal["latest", "all", "specific"]


def _int(value: Any, field: str, minimum: int) -> int:
    # Triton's protobuf JSON writes 64-bit ints as strings.
    if isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(None, field, f"must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class VersionPolicy:
    """Triton's version_policy. Default: the highest numbered version only."""

    kind: VersionPolicyKind = "latest"
    num_versions: int = 1  # latest
    versions: tuple[int, ...] = ()  # specific

    def __post_init__(self) -> None:
        if self.kind not in ("latest", "all", "specific"):
            raise ConfigError(None, "version_policy", f"must be latest, all or specific, got {self.kind!r}")
        if self.kind == "latest" and self.num_versions < 1:
            raise ConfigError(None, "version_policy.latest.num_versions", f"must be >= 1, got {self.num_versions}")
        if self.kind == "specific" and not self.versions:
            raise ConfigError(None, "version_policy.specific.versions", "needs at least one version")

    @classmethod
    def from_json(cls, doc: Any) -> VersionPolicy:
        if not isinstance(doc, Mapping) or len(doc) != 1:
            raise ConfigError(
                None,
                "version_policy",
                'must hold exactly one of {"latest": {"num_versions": N}}, {"all": {}}, '
                f'{{"specific": {{"versions": [...]}}}}; got {doc!r}',
            )
        ((kind, body),) = doc.items()
        body = body or {}
        if kind == "latest":
            return cls(
                "latest", num_versions=_int(body.get("num_versions", 1), "version_policy.latest.num_versions", 1)
            )
        if kind == "all":
            return cls("all")
        if kind == "specific":
            versions = body.get("versions", [])
            if not isinstance(versions, list):
                raise ConfigError(None, "version_policy.specific.versions", f"must be a list, got {versions!r}")
            return cls(
                "specific", versions=tuple(sorted({_int(v, "version_policy.specific.versions", 1) for v in versions}))
            )
        raise ConfigError(None, "version_policy", f"unknown policy {kind!r}; accepted: latest, all, specific")

    def to_json(self) -> dict[str, Any]:
        if self.kind == "latest":
            return {"latest": {"num_versions": self.num_versions}}
        if self.kind == "all":
            return {"all": {}}
        return {"specific": {"versions": list(self.versions)}}

    def select(self, available: Sequence[int]) -> list[int]:
        """The versions this policy serves out of those on disk, ascending."""
        ordered = sorted(set(available))
        if self.kind == "latest":
            return ordered[-self.num_versions :]
        if self.kind == "all":
            return ordered
        return [v for v in ordered if v in self.versions]


@dataclass(frozen=True)
class InstanceGroup:
    """Triton's instance_group entry. ringserve: `count` instances per listed GPU (or in all)."""

    count: int = 1
    kind: InstanceKind = "KIND_AUTO"
    gpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in INSTANCE_KINDS:
            raise ConfigError(
                None, "instance_group.kind", f"must be one of {', '.join(INSTANCE_KINDS)}, got {self.kind!r}"
            )
        if self.gpus and self.kind == "KIND_CPU":
            raise ConfigError(None, "instance_group.gpus", "a KIND_CPU group cannot name gpus")

    @classmethod
    def from_json(cls, doc: Any) -> InstanceGroup:
        if not isinstance(doc, Mapping):
            raise ConfigError(None, "instance_group", f"entries must be objects, got {doc!r}")
        gpus = doc.get("gpus", [])
        if not isinstance(gpus, list):
            raise ConfigError(None, "instance_group.gpus", f"must be a list of device ids, got {gpus!r}")
        return cls(
            count=_int(doc.get("count", 1), "instance_group.count", 1),
            kind=doc.get("kind", "KIND_AUTO"),
            gpus=tuple(_int(g, "instance_group.gpus", 0) for g in gpus),
        )


@dataclass(frozen=True)
class Lifecycle:
    """When and where one model's versions load, and when they go again."""

    load_policy: LoadPolicy = "eager"
    warmup: bool = False
    ttl_s: float = 0.0  # 0 = never unloaded for idleness
    eviction_priority: int = 0  # lower = evicted later; may be negative
    version_policy: VersionPolicy = VersionPolicy()
    instance_groups: tuple[InstanceGroup, ...] = ()

    def __post_init__(self) -> None:
        if self.load_policy not in LOAD_POLICIES:
            raise ConfigError(None, "model_load_policy", f"must be eager or lazy, got {self.load_policy!r}")
        if not (math.isfinite(self.ttl_s) and self.ttl_s >= 0):
            raise ConfigError(None, "ttl_s", f"must be a number of seconds >= 0 (0 = never), got {self.ttl_s!r}")

    @classmethod
    def from_config_doc(cls, doc: Mapping[str, Any]) -> Lifecycle:
        warmup = doc.get("warmup", False)
        if not isinstance(warmup, bool):
            raise ConfigError(None, "warmup", f"must be true or false, got {warmup!r}")
        ttl_s = doc.get("ttl_s", 0.0)
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)):
            raise ConfigError(None, "ttl_s", f"must be a number of seconds, got {ttl_s!r}")
        groups = doc.get("instance_group", [])
        if not isinstance(groups, list):
            raise ConfigError(None, "instance_group", f"must be a list, got {groups!r}")
        return cls(
            load_policy=doc.get("model_load_policy", "eager"),
            warmup=warmup,
            ttl_s=float(ttl_s),
            eviction_priority=_int(doc.get("eviction_priority", 0), "eviction_priority", -(2**31)),
            version_policy=VersionPolicy.from_json(doc.get("version_policy", {"latest": {"num_versions": 1}})),
            instance_groups=tuple(InstanceGroup.from_json(g) for g in groups),
        )

    @property
    def instance_count(self) -> int:
        """How many workers may hold this model at once; 0 = every worker (no instance_group)."""
        return sum(g.count * max(1, len(g.gpus)) for g in self.instance_groups)

    @property
    def gpus(self) -> tuple[int, ...]:
        """CUDA devices the model is placed on, ascending; empty: each worker's own device."""
        return tuple(sorted({g for group in self.instance_groups for g in group.gpus}))

    @property
    def cpu_only(self) -> bool:
        """Every instance group asks for KIND_CPU: run on the CPU provider even where CUDA works."""
        return bool(self.instance_groups) and all(g.kind == "KIND_CPU" for g in self.instance_groups)

    def device_for(self, worker_index: int, worker_device: int) -> int:
        """The CUDA device of this model in one worker: instance_group's gpus dealt to the workers
        in turn (worker i gets gpus[i % len(gpus)]), else the worker's own device (--gpus)."""
        return self.gpus[worker_index % len(self.gpus)] if self.gpus else worker_device

    def eager_on(self, worker_index: int) -> bool:
        """Eager models load at start on the first `instance_count` workers (all when 0)."""
        return self.load_policy == "eager" and (not self.instance_count or worker_index < self.instance_count)
