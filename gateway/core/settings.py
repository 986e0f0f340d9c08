"""The dispatch settings of the gateway (scheduling, retries, timeouts, standby).

Every field is required: each default is written once, where the settings are built from
the command line, not here as well.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DispatchSettings:
    gateway: int  # this gateway's index (0..G-1): named in ATTACH and WORKER_RETIRED
    request_timeout_s: float
    max_attempts: int  # a batch that killed this many workers is bisected
    max_inflight_per_worker: int  # pipelining: the next batch is in the slot while one computes
    retry_after_s: int
    batch_timeout_s: float  # 0 = off; else a batch running longer gets its worker killed
    hold_when_unavailable_s: float  # 0 = 503 at once while no worker is ready
    quarantine_poison_requests: int  # this many requests isolated as poison...
    quarantine_window_s: float  # ...within this window quarantine their model
    active_workers: int  # 0: every ready worker serves; N: N serve, the other ready ones stand by
    strict_readiness: bool  # /v2/health/ready: every model of the repository serves, not just some
    max_shm_regions: int  # client shared-memory regions held at most (its share of the open-files budget)
