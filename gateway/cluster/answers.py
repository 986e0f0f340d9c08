"""What another gateway's /admin/status?scope=gateway holds that the merge reads, as frozen dataclasses.

A peer's document is decoded once, where it arrives (`peer_status`): a document that is not shaped
as ours is named there (the peer is then listed as unreachable, with why) and never reaches the
merge (gateway/cluster/merge.py: merge_status), which reads these fields only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ringserve.gateway.cluster.peers import PeerAnswer

# What a document that is not shaped as ours raises while it is decoded (or merged).
UNREADABLE = (KeyError, TypeError, AttributeError, ValueError)


def cannot_merge(exc: Exception) -> str:
    return f"answered a document that cannot be merged ({type(exc).__name__}: {exc})"


def _count(doc: Mapping[str, Any], name: str) -> int:
    value = doc[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} is {value!r}, not a count")
    return value


@dataclass(frozen=True)
class ModelShare:
    """One model's queue in one gateway."""

    queue_depth: int
    requeued_batches: int
    poison_requests: tuple[dict[str, Any], ...] = ()  # the requests it isolated as poison, each with its `time`

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ModelShare:
        poison = tuple(dict(p) for p in doc.get("poison_requests") or ())
        for p in poison:
            if not isinstance(p["time"], int | float):
                raise ValueError(f"a poison request's time is {p['time']!r}")
        return cls(_count(doc, "queue_depth"), _count(doc, "requeued_batches"), poison)


@dataclass(frozen=True)
class WorkerShare:
    """One worker process's batches through one gateway."""

    worker_index: int
    generation: int
    in_flight_batches: int
    in_flight_requests: int
    batches_done: int
    busy_s: float = 0.0  # its executions' seconds through this gateway

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> WorkerShare:
        busy_s = doc.get("busy_s", 0.0)  # (a gateway of a release before it: none)
        if not isinstance(busy_s, (int, float)) or isinstance(busy_s, bool):
            raise ValueError(f"busy_s is {busy_s!r}, not a number of seconds")
        return cls(
            _count(doc, "index"),
            _count(doc, "generation"),
            _count(doc, "in_flight_batches"),
            _count(doc, "in_flight_requests"),
            _count(doc, "batches_done"),
            float(busy_s),
        )


@dataclass(frozen=True)
class PeerStatus:
    """A peer gateway's own share of the server's status, and its own entry (shown as it answered it)."""

    gateway: dict[str, Any]  # its `gateway` entry: index, pid, queue depth, in-flight, ...
    models: dict[str, ModelShare]
    workers: tuple[WorkerShare, ...]
    slots_total: int
    slots_free: int

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> PeerStatus:
        """The status of a peer's JSON object; KeyError, TypeError or ValueError when it is not one."""
        slots = doc["slots"]
        return cls(
            gateway=dict(doc["gateway"]),
            models={str(name): ModelShare.from_dict(m) for name, m in doc["models"].items()},
            workers=tuple(WorkerShare.from_dict(w) for w in doc["workers"]),
            slots_total=_count(slots, "total"),
            slots_free=_count(slots, "free"),
        )

    @classmethod
    def read(cls, doc: dict[str, Any] | str) -> PeerStatus | str:
        """The status of a peer's JSON object, or why there is none (`doc` already a why: as it is)."""
        if isinstance(doc, str):
            return doc
        try:
            return cls.from_dict(doc)
        except UNREADABLE as exc:
            return cannot_merge(exc)


def peer_status(answer: PeerAnswer) -> PeerStatus | str:
    """What a peer answered to /admin/status?scope=gateway, or why it cannot be merged."""
    return PeerStatus.read(answer.json_object())
