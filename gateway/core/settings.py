"""The dispatch settings of the gateway (scheduling, retries, timeouts, standby).

Every field is required: each default is written once, in common/settings.py, and
`from_settings` builds these from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringserve.common.settings import Settings


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
    state_store_prefix: str = ""  # sequence models' state stores (shm/states.py): the supervisor's prefix
    # Triton's model control (common/repository/control.py): "" ringserve's own, none, explicit or poll.
    model_control_mode: str = ""

    @classmethod
    def from_settings(cls, settings: Settings, gateway: int, max_shm_regions: int) -> DispatchSettings:
        return cls(
            gateway=gateway,
            request_timeout_s=settings.request_timeout_s,
            max_attempts=settings.max_attempts,
            max_inflight_per_worker=settings.max_inflight_per_worker,
            retry_after_s=settings.retry_after_s,
            batch_timeout_s=settings.batch_timeout_s,
            hold_when_unavailable_s=settings.hold_when_unavailable_s,
            quarantine_poison_requests=settings.quarantine_poison_requests,
            quarantine_window_s=settings.quarantine_window_s,
            active_workers=settings.active_workers(),
            strict_readiness=settings.strict_readiness,
            max_shm_regions=max_shm_regions,
            state_store_prefix=settings.state_store_prefix,
            model_control_mode=settings.model_control_mode,
        )
