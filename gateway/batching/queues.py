"""A model's queue: priority lanes, groups that may share a batch, Triton's queue policy.

A model's queue has one lane per priority level (Triton's priority_levels, 1 = highest)
and, within it, one FIFO per group of requests that may share a network call: equal
non-batch shapes (Triton's rule) or, for padded models, one length bucket
(gateway/batching/padding.py). Batches that a dead worker held come back to the head of their
model's queue (`requeued`) and keep their slot: inputs are never copied twice.

Sizes are counted with the same rules as the 413 check (gateway/codec/parse.py, request.py), so a request
that passed it always fits a batch of its own.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ringserve.common.repository.batching import DynamicBatching, QueuePolicy
from ringserve.common.repository.config import ModelConfig
from ringserve.gateway.batching.padding import group_key, padded_rows, padded_shapes
from ringserve.gateway.batching.ragged import batch_inputs_nbytes
from ringserve.gateway.batching.sizing import LatencyTargetSizer
from ringserve.gateway.core.errors import GatewayError, Unavailable
from ringserve.gateway.core.phrases import say
from ringserve.gateway.core.request import InferRequest, alignment_slack_bytes, input_slot_bytes

if TYPE_CHECKING:
    from ringserve.gateway.batching.slots import SlotBatch


@dataclass(eq=False)
class Group:
    """Requests that may share a batch, in arrival order; `delayed` ones (DELAY timeouts) go last."""

    live: deque[InferRequest] = field(default_factory=deque)
    delayed: deque[InferRequest] = field(default_factory=deque)

    def head(self) -> InferRequest | None:
        return self.live[0] if self.live else (self.delayed[0] if self.delayed else None)

    def __len__(self) -> int:
        return len(self.live) + len(self.delayed)


class ModelQueue:
    """Pending requests of one model: per priority level (1 = highest), per shape group or bucket.

    Batches that a dead worker held wait in `requeued` and always go first.
    """

    # Requests wait in the lanes in arrival order, so a lane's head has its earliest deadline
    # (gateway/batching/deadlines.py); a SequenceQueue's steps mostly wait outside the lanes.
    deadlines_in_lanes = True

    def __init__(self, config: ModelConfig, slot_capacity_bytes: int, batching: DynamicBatching | None = None) -> None:
        self.config = config
        self.batching = batching or config.dynamic_batching or DynamicBatching()
        self.slot_capacity_bytes = slot_capacity_bytes
        self.levels = list(range(1, self.batching.priority_levels + 1)) or [0]
        self.groups: dict[int, dict[tuple, Group]] = {level: {} for level in self.levels}
        self.level_depth = dict.fromkeys(self.levels, 0)
        self.requeued: deque[SlotBatch] = deque()
        self.depth = 0
        self.flush_timer = None
        # The scheduler's deadline watch (gateway/batching/deadlines.py): the lanes' heads, a heap
        # of (deadline, seq, request) for the exceptions, one loop timer for the earliest.
        self.deadlines: list[tuple[float, int, InferRequest]] = []
        self.deadline_timer = None
        self.deadline_at = float("inf")
        self.max_queue_delay_s = self.batching.max_queue_delay_us / 1e6
        self.preferred = sorted(s for s in self.batching.preferred_batch_size if s <= max(config.max_batch_size, 1))
        target_s = self.batching.latency_target_ms / 1e3
        self.sizer = LatencyTargetSizer(target_s, max(config.max_batch_size, 1)) if target_s else None
        # Whether a batch that max_rows allows may still overflow the slot: padded batches grow with
        # their longest request, BYTES and ragged inputs differ in size from request to request, and
        # generated batch_input tensors come on top (max_rows estimates from the head request only).
        self.checks_fit = bool(
            self.batching.padding is not None
            or self.batching.pad_to_preferred_batch_size
            or config.bytes_inputs
            or config.ragged_inputs
            or config.batch_inputs
        )

    # -- membership -------------------------------------------------------------------
    def level_of(self, request: InferRequest) -> int:
        return request.priority or self.batching.default_priority_level or self.levels[0]

    def policy_of(self, request: InferRequest) -> QueuePolicy:
        return self.batching.policy_for(self.level_of(request))

    def submit(self, request: InferRequest) -> None:
        """Queue it; 503 when its priority level's queue is full (Triton: max_queue_size)."""
        level = self.level_of(request)
        limit = self.batching.policy_for(level).max_queue_size
        if limit and self.level_depth[level] >= limit:
            raise Unavailable(
                say(
                    "queue_full",
                    f"model {self.config.name!r} already has {limit} request(s) waiting "
                    f"at priority level {level}; retry later",
                )
            )
        key = group_key(self.config, request.inputs, request.shape_key)
        group = self.groups[level].get(key)
        if group is None:
            group = self.groups[level][key] = Group()
        group.live.append(request)
        request.group = key
        self.level_depth[level] += 1
        self.depth += 1

    def _group_of(self, request: InferRequest) -> Group | None:
        return self.groups[self.level_of(request)].get(request.group)

    def discard(self, request: InferRequest) -> bool:
        group = self._group_of(request)
        for lane in (group.live, group.delayed) if group else ():
            if request in lane:
                lane.remove(request)
                self._forget(request)
                return True
        return False

    def delay(self, request: InferRequest) -> bool:
        """DELAY timeout action: move an expired request behind every unexpired one of its group."""
        group = self._group_of(request)
        if group is None or request not in group.live:
            return False
        group.live.remove(request)
        group.delayed.append(request)
        return True

    def expiry_error(self, request: InferRequest) -> GatewayError | None:
        """The error of a request whose deadline passed while queued, where it is not the usual 504."""
        return None

    def _forget(self, request: InferRequest) -> None:
        self.level_depth[self.level_of(request)] -= 1
        self.depth -= 1

    # -- forming batches -------------------------------------------------------------
    def head_key(self) -> tuple | None:
        """The group to serve next: in the highest level that has requests, the oldest head's.

        Unexpired requests rank before delayed ones (DELAY): a group whose only requests
        timed out waits until no other group of its level has a live one.
        """
        for level in self.levels:
            groups = self.groups[level]
            for lane in ("live", "delayed"):
                heads = [(getattr(g, lane)[0].enqueued_at, key) for key, g in groups.items() if getattr(g, lane)]
                if heads:
                    return min(heads, key=lambda pair: pair[0])[1]
        return None

    def live_lanes(self) -> Iterator[deque[InferRequest]]:
        """Every group's FIFO of unexpired requests, in every priority level."""
        for groups in self.groups.values():
            for group in groups.values():
                yield group.live

    def drain_all(self) -> list[InferRequest]:
        """Empty the queue (requeued batches aside) and return what was waiting."""
        waiting = []
        for groups in self.groups.values():
            for group in groups.values():
                waiting += [*group.live, *group.delayed]
            groups.clear()
        self.level_depth = dict.fromkeys(self.levels, 0)
        self.depth = 0
        return waiting

    def _candidates(self, key: tuple):
        """Requests of one group key across priority levels, highest level first, FIFO within."""
        for level in self.levels:
            group = self.groups[level].get(key)
            if group:
                yield from group.live
                yield from group.delayed

    def max_rows(self, sample: InferRequest) -> int:
        """Rows per batch: max_batch_size (or the latency cap), fewer when a slot can't hold them."""
        if self.config.max_batch_size == 0:
            return 1
        row_bytes = self.config.fixed_row_bytes
        if sample.serialized is None:
            for array in sample.inputs.values():
                # (a request of 0 rows has a row size all the same: its group's other requests have it)
                row_bytes += (
                    array.nbytes // array.shape[0] if sample.rows else array.itemsize * math.prod(array.shape[1:])
                )
        else:  # BYTES rows differ in size: the sample's average (_fits checks each batch)
            row_bytes += -(-input_slot_bytes(sample) // max(sample.rows, 1))
        spare = self.slot_capacity_bytes - alignment_slack_bytes(self.config)
        cap = self.sizer.cap if self.sizer else self.config.max_batch_size
        return max(1, min(cap, spare // max(row_bytes, 1)))

    def flush_due(self, now: float) -> float | None:
        """None when the next batch should go now, else when it becomes due (max_queue_delay)."""
        key = self.head_key()
        if key is None or self.max_queue_delay_s <= 0:
            return None
        candidates = list(self._candidates(key))
        rows = sum(r.rows for r in candidates)
        # Triton: a batch of any preferred size goes at once; otherwise wait up to the delay.
        if rows >= self.max_rows(candidates[0]) or (self.preferred and rows >= self.preferred[0]):
            return None
        due = min(r.enqueued_at for r in candidates) + self.max_queue_delay_s
        return None if now >= due else due

    def collect_batch(self, prune: Callable[[InferRequest], bool] = lambda r: False) -> list[InferRequest]:
        """Requests of the next group, highest priority first, as many as fit one batch.

        `prune` is asked about each candidate first; those it returns True for (client gone,
        deadline passed) leave the queue without costing inference.
        """
        key = self.head_key()
        if key is None:
            return []
        taken: list[InferRequest] = []
        rows = 0
        limit = 0
        for request in list(self._candidates(key)):
            if prune(request):
                self.discard(request)
                continue
            if not taken:
                limit = self._fit_limit(request)
                if not self._fits([request], request.rows):
                    limit = request.rows  # alone it fits only unpadded: no batch-dim padding then
            elif rows + request.rows > limit or not self._fits(taken + [request], rows + request.rows):
                break
            taken.append(request)
            rows += request.rows
            if self.config.max_batch_size == 0:
                break
        taken = self._trim_to_preferred(taken, rows)
        for request in taken:
            self.discard(request)
        return taken if taken or not self.depth else self.collect_batch(prune)

    def _fit_limit(self, head: InferRequest) -> int:
        # The head always goes: it passed the 413 check, which uses the same rule as max_rows.
        return max(head.rows, self.max_rows(head))

    def _fits(self, requests: list[InferRequest], rows: int) -> bool:
        """Does the slot hold this batch as write_batch lays it out? Padded batches grow with their
        longest request (and to a preferred batch size), BYTES inputs with their strings, ragged
        inputs with every request's length, and generated batch_input tensors with the batch."""
        if not self.checks_fit:
            return True
        config = self.config
        needed = alignment_slack_bytes(config)
        if config.batch_inputs:
            needed += batch_inputs_nbytes(config, [r.inputs for r in requests])
        if config.bytes_inputs:  # never padded (common/repository/config.py)
            needed += rows * config.fixed_row_bytes
            return needed + sum(input_slot_bytes(r) for r in requests) <= self.slot_capacity_bytes
        rows = padded_rows(config, rows)
        needed += rows * config.fixed_row_bytes
        for (name, sample), shape in zip(requests[0].inputs.items(), padded_shapes(requests, rows)):
            if name in config.ragged_inputs:  # concatenated, as _plan_inputs writes it
                needed += sum(r.inputs[name].nbytes for r in requests)
            else:
                needed += sample.itemsize * math.prod(shape)
        return needed <= self.slot_capacity_bytes

    def _trim_to_preferred(self, taken: list[InferRequest], rows: int) -> list[InferRequest]:
        """With preferred sizes: send the largest preferred size that is reachable, rest stays."""
        if not self.preferred or rows <= self.preferred[0] or rows in self.preferred:
            return taken
        target = max(p for p in self.preferred if p <= rows)
        kept, kept_rows = [], 0
        for request in taken:
            if kept_rows + request.rows > target:
                break
            kept.append(request)
            kept_rows += request.rows
        return kept or taken[:1]
