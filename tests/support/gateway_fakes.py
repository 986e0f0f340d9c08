"""Fakes for driving the gateway's Dispatcher by hand: a WorkerPort that records, and the settings.

Every message the dispatcher sends goes through encode and decode (common/messages.py) on its
way into the records, so what the tests read is what a worker or the supervisor would read.
"""
from __future__ import annotations

import time
import types
from dataclasses import dataclass, field

from ringserve.common import messages, wire
from ringserve.gateway.core.settings import DispatchSettings
from ringserve.gateway.observe.stats import ModelStatistics, record_success


def dispatch_settings(**overrides) -> DispatchSettings:
    """The gateway's settings as `ringserve serve` starts it, but for `overrides`."""
    settings = dict(gateway=0, request_timeout_s=30.0, max_attempts=2, max_inflight_per_worker=2, retry_after_s=1,
                    batch_timeout_s=0.0, hold_when_unavailable_s=0.0, quarantine_poison_requests=3,
                    quarantine_window_s=60.0, active_workers=0, strict_readiness=False,
                    max_shm_regions=512)
    return DispatchSettings(**{**settings, **overrides})


def over_the_wire(message: messages.Message) -> messages.Message:
    return messages.decode(message.encode())


@dataclass
class Sent:
    """A BATCH as the worker got it."""

    identity: bytes
    batch: messages.Batch
    at: float = field(default_factory=time.monotonic)  # when the dispatcher sent it


class FakePort:
    """The scheduler's WorkerPort (gateway/dispatch/worker_port.py): records every message; identities in
    `unreachable` refuse a send, as the ROUTER does for a worker whose socket is gone."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []  # BATCH, to the workers' batch loops
        self.loader: list[tuple[bytes, messages.Load | messages.Unload]] = []  # to the loader threads
        self.supervisor: list[messages.Message] = []
        self.cancels: list[tuple[bytes, messages.Cancel]] = []  # CANCEL, to the workers' couriers
        self.unreachable: set[bytes] = set()
        self.attached: list[tuple[bytes, messages.Attach]] = []  # ATTACH, to the workers' batch loops
        self.order: list[tuple[str, bytes]] = []  # (kind, identity) of everything sent to a batch loop, in order

    def send_batch(self, index: int, generation: int, batch: messages.Batch) -> bool:
        identity = wire.worker_identity(index, generation)
        if identity in self.unreachable:
            return False
        self.sent.append(Sent(identity, over_the_wire(batch)))
        self.order.append((batch.KIND, identity))
        return True

    def send_to_worker(self, index: int, generation: int, message: messages.Attach) -> bool:
        identity = wire.worker_identity(index, generation)
        if identity in self.unreachable:
            return False
        self.attached.append((identity, over_the_wire(message)))
        self.order.append((message.KIND, identity))
        return True

    def send_to_loader(self, index: int, generation: int, message: messages.Load | messages.Unload) -> bool:
        self.loader.append((wire.control_identity(index, generation), over_the_wire(message)))
        return True

    def send_to_courier(self, index: int, generation: int, message: messages.Cancel) -> bool:
        self.cancels.append((wire.courier_identity(index, generation), over_the_wire(message)))
        return True

    def tell_supervisor(self, message: messages.Message) -> None:
        self.supervisor.append(over_the_wire(message))

    def loads(self) -> list[tuple[str, str, int]]:
        return [(i.decode(), m.model, m.version) for i, m in self.loader if isinstance(m, messages.Load)]


def count_success(stats: ModelStatistics, *, rows: int = 1, latency_ns: int, queue_ns: int = 0, input_ns: int = 0,
                  infer_ns: int = 0) -> None:
    """One request answered as the front ends count it (gateway/observe/stats.py's record_success): arrived and
    queued at T, its batch formed `queue_ns` later, then written (`input_ns`) and run by the worker
    (`infer_ns`, its RESULT received at once), and its answer sent `latency_ns` after its arrival."""
    arrived_ns = 1_000_000
    formed_ns = arrived_ns + queue_ns
    written_ns = formed_ns + input_ns
    stages = (stats, formed_ns, written_ns, infer_ns, written_ns + infer_ns)
    request = types.SimpleNamespace(stages=stages, arrived_ns=arrived_ns, queued_ns=arrived_ns, rows=rows)
    record_success(request, arrived_ns + latency_ns)
