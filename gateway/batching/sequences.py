"""Triton's sequence batcher: stateful sequences, one step of each ready sequence per batch.

A model with `sequence_batching` (common/repository/sequences.py) gets a SequenceQueue instead of a
plain ModelQueue. Each sequence (a client's `sequence_id`) keeps its own FIFO of steps; only its head
step, once the sequence holds a candidate slot (an entry of the state store, shm/states.py) and the
entry's step lock, sits in the ModelQueue's lanes, where the usual batch forming (oldest first, equal
shapes, preferred sizes, queue delay, deadlines) picks it. So a batch never holds two steps of one
sequence, and a sequence's steps run one after the other, in order. When a step is answered, the
next one of its sequence takes its place in the lanes.

    step arrives  --->  its sequence's FIFO  ---(head, entry, lock)--->  the lanes  ---> a batch
                        no entry free: the backlog (oldest START first), until one frees

The state: the batch's slot gets, beside the requests' own inputs, the control tensors (START, END,
READY, CORRID) and each state input, copied from the sequence's entry (one copy, store -> slot; a
START step gets the initial state). The model's state outputs come back in the slot; on the live
worker's RESULT the gateway copies each row into its sequence's entry (one copy, slot -> store:
`commit_states`) before it answers the step. A worker's death requeues the batch over the same
slot bytes, so the step runs again from the same state; a failed step commits nothing. The entry
lock is held by one gateway from the step's promotion to its answer, so with several gateways a
sequence's next step waits wherever it arrives (and a dead gateway's locks go with it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ringserve.common.repository.batching import DynamicBatching
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.sequences import SequenceBatching
from ringserve.common.wire import TensorRef, serialize_bytes_tensor
from ringserve.gateway.batching.queues import ModelQueue
from ringserve.gateway.batching.state_stores import StateStores
from ringserve.gateway.batching.steps import StateLost, Step, commit_states, unknown_sequence
from ringserve.gateway.core.errors import GatewayError, Unavailable
from ringserve.gateway.core.phrases import say
from ringserve.gateway.core.request import InferRequest
from ringserve.shm.segment import Segment
from ringserve.shm.states import StateStore, key_words

log = logging.getLogger(__name__)

REAP_SLACK_S = 0.002  # a loop timer may fire up to a millisecond early
BLOCKED_RETRY_S = 0.002  # a sequence's entry locked by another gateway, or the backlog: look again this soon


@dataclass(eq=False)
class Sequence:
    """One live sequence at this gateway: its waiting steps and its entry in the store."""

    key: int | str
    words: np.ndarray
    steps: deque[InferRequest] = field(default_factory=deque)
    entry: int = -1  # -1: no candidate slot yet (backlog) or released
    owner: int = 0
    locked: bool = False  # this gateway holds the entry's step lock
    promoted: InferRequest | None = None  # the head step, in the lanes or running


def as_dynamic_batching(sequence: SequenceBatching) -> DynamicBatching:
    """What the lanes need of the strategy: Oldest's preferred sizes, delay and ordering; Direct's delay
    only where a minimum slot utilization asks to wait for it (Triton ignores it otherwise)."""
    if sequence.strategy == "oldest":
        return DynamicBatching(
            preferred_batch_size=sequence.preferred_batch_size,
            max_queue_delay_us=sequence.max_queue_delay_us,
            preserve_ordering=sequence.preserve_ordering,
        )
    delay_us = sequence.max_queue_delay_us if sequence.minimum_slot_utilization > 0 else 0
    return DynamicBatching(max_queue_delay_us=delay_us)


class SequenceQueue(ModelQueue):
    """A sequence model's queue: per-sequence FIFOs in front of the lanes, candidate slots, the backlog."""

    # Every step's deadline goes to the deadline heap: most steps wait outside the lanes.
    deadlines_in_lanes = False

    def __init__(self, config: ModelConfig, slot_capacity_bytes: int, stores: StateStores) -> None:
        self.sequence = config.sequences
        super().__init__(config, slot_capacity_bytes, as_dynamic_batching(self.sequence))
        self.stores = stores
        self._store: StateStore | None = None
        self.sequences: dict[int | str, Sequence] = {}
        self.backlog: deque[Sequence] = deque()
        self.blocked: set[Sequence] = set()  # entry locked by another gateway
        self.idle_releases = 0
        self.idle_ns = self.sequence.max_sequence_idle_us * 1000
        # A STRING state or CORRID: written into the slot from each step's `serialized`, as BYTES inputs are.
        self.strings = any(s.datatype == "BYTES" for s in self.sequence.states) or any(
            c.datatype == "BYTES" for c in self.sequence.controls
        )
        self._retry_timer: asyncio.TimerHandle | None = None
        self._reaper: asyncio.TimerHandle | None = None

    @property
    def store(self) -> StateStore:
        if self._store is None:
            self._store = self.stores.open(self.config)
        return self._store

    def finish_step(self, request: InferRequest, error: GatewayError) -> None:
        self.stores.finish(request, error=error)

    @property
    def pump_soon(self) -> Callable[[], None]:
        return self.stores.pump_soon

    # -- accepting steps -----------------------------------------------------------------------
    def submit(self, request: InferRequest) -> None:
        step: Step = request.sequence
        sequence = self.sequences.get(step.key)
        if sequence is None:
            words = key_words(step.key)  # (hashed once per sequence at this gateway, not per step)
            found = self.store.find(words)
            if found is None and not step.start:
                raise unknown_sequence(self.config, step.key)
            sequence = Sequence(step.key, words)
            if found is not None:  # started here before, or at another gateway
                sequence.entry, sequence.owner = found
            self.sequences[step.key] = sequence
        if sequence.entry >= 0:
            self.store.touch(sequence.entry, time.monotonic_ns())
        step.release = self.step_done
        sequence.steps.append(request)
        self._promote(sequence)
        self._keep_reaping()

    def _promote(self, sequence: Sequence) -> None:
        """Put the sequence's head step into the lanes, when it holds a candidate slot and its lock."""
        while sequence.promoted is None and sequence.steps:
            head = sequence.steps[0]
            step: Step = head.sequence
            if not self._holds_entry(sequence, step):
                return
            if not sequence.locked:
                if not self.store.try_lock(sequence.entry):
                    self._wait_blocked(sequence)
                    return
                sequence.locked = True
                if self.store.owner(sequence.entry) != sequence.owner:  # released there meanwhile
                    self._unlock(sequence)
                    sequence.entry = -1
                    continue
            if self.store.torn(sequence.entry) and not step.start:
                self._refuse_head(sequence, StateLost(self.config.name, step.key))
                continue
            self._feed(sequence, head)
            head.shape_key = (*head.shape_key, *step.shapes)  # equal state shapes share a batch
            sequence.promoted = head
            super().submit(head)
            return

    def _holds_entry(self, sequence: Sequence, step: Step) -> bool:
        """Whether the sequence has a candidate slot (taking a free one for a START); else it waits or fails."""
        if sequence.entry >= 0:
            return True
        if not step.start:
            self._refuse_head(
                sequence,
                unknown_sequence(
                    self.config,
                    step.key,
                    "the sequence was released (idle past max_sequence_idle_microseconds, ended, or the server "
                    "restarted since it started)",
                ),
            )
            return bool(sequence.steps) and sequence.entry >= 0
        allocated = (
            self.store.allocate(sequence.words, time.monotonic_ns())
            if not self.backlog or self.backlog[0] is sequence
            else None
        )
        if allocated is None:
            if sequence not in self.backlog:
                self.backlog.append(sequence)
            self._retry_soon()
            return False
        if self.backlog and self.backlog[0] is sequence:
            self.backlog.popleft()
        sequence.entry, sequence.owner = allocated
        return True

    def _feed(self, sequence: Sequence, request: InferRequest) -> None:
        """What the step's state inputs are fed: the entry's state, or at START the initial state."""
        step: Step = request.sequence
        store, entry = self.store, sequence.entry
        step.entry, step.owner = entry, sequence.owner
        step.sources, step.shapes = [], []
        for index, state in enumerate(self.sequence.states):
            fixed = state.fixed_shape
            if fixed is not None and state.datatype != "BYTES":  # (the usual state: no shape to read)
                committed = not step.start and store.shape(entry, index) == fixed
                step.sources.append(store.fixed_view(entry, index, fixed, state.np_dtype) if committed else None)
                step.shapes.append(fixed if committed else state.start_shape())
                continue
            shape = None if step.start else store.shape(entry, index)  # (None: no commit yet, the start value)
            if shape is None:
                step.sources.append(None)
                step.shapes.append(state.start_shape())
            elif state.datatype == "BYTES":
                step.sources.append(store.bytes_view(entry, index, store.length(entry, index)))
                step.shapes.append(shape)
            else:
                step.sources.append(store.view(entry, index, shape, state.np_dtype))
                step.shapes.append(shape)
        if self.strings:
            self._feed_strings(request, step)

    def _feed_strings(self, request: InferRequest, step: Step) -> None:
        """A STRING state or CORRID goes into the slot as BYTES inputs do: in the step's `serialized`."""
        forms = dict(request.serialized or {})
        corrid = self.sequence.control("CORRID")
        if corrid is not None and corrid.datatype == "BYTES":
            forms[corrid.name] = serialize_bytes_tensor(np.array([step.key], dtype=object))
        for index, state in enumerate(self.sequence.states):
            if state.datatype == "BYTES":
                source = step.sources[index]
                forms[state.input_name] = (
                    serialize_bytes_tensor(state.start_value()) if source is None else source.tobytes()
                )
        request.serialized = forms

    def _refuse_head(self, sequence: Sequence, error: GatewayError) -> None:
        head = sequence.steps[0]
        head.sequence.release = None  # (answered here: nothing to release)
        sequence.steps.popleft()
        self.finish_step(head, error)

    # -- the scheduler's side ---------------------------------------------------------------------
    def step_done(self, request: InferRequest) -> None:
        """A step was answered (result or error, from a batch or from the queue): its sequence moves on."""
        step: Step = request.sequence
        step.release = None
        sequence = self.sequences.get(step.key)
        if sequence is None:
            return
        if sequence.promoted is request:
            sequence.promoted = None
        else:
            try:
                sequence.steps.remove(request)  # answered while it waited (expired, drained)
            except ValueError:
                pass
        if sequence.steps and sequence.steps[0] is request:
            sequence.steps.popleft()
        store = self.store
        if sequence.entry >= 0:
            store.touch(sequence.entry, time.monotonic_ns())
            if step.end and sequence.promoted is None:
                store.free(sequence.entry, sequence.owner)
                sequence.entry = -1
        if sequence.promoted is None:
            self._unlock(sequence)
        if not sequence.steps and sequence.promoted is None and sequence.entry < 0:
            self.sequences.pop(sequence.key, None)
            self.backlog_moves()
        else:
            self._promote(sequence)
        self.pump_soon()

    def collect_batch(self, prune: Callable[[InferRequest], bool] = lambda r: False) -> list[InferRequest]:
        taken = super().collect_batch(prune)
        for request in taken:
            sequence = self.sequences[request.sequence.key]
            sequence.steps.popleft()  # the head: promoted, now running (sequence.promoted stays it)
        return taken

    def discard(self, request: InferRequest) -> bool:
        if super().discard(request):
            return True
        sequence = self.sequences.get(request.sequence.key) if request.sequence is not None else None
        if sequence is not None and request in sequence.steps and sequence.promoted is not request:
            return True  # waiting behind its head: the caller answers it, and step_done takes it out
        return False

    def expiry_error(self, request: InferRequest) -> GatewayError | None:
        sequence = self.sequences.get(request.sequence.key)
        if sequence is not None and sequence in self.backlog:
            return Unavailable(say("sequence_backlog_timeout", "it waited in the backlog for a candidate slot"))
        return None

    def drain_all(self) -> list[InferRequest]:
        waiting = super().drain_all()
        for sequence in self.sequences.values():
            waiting += [r for r in sequence.steps if r is not sequence.promoted]
        return waiting

    # -- entries freed, locks taken elsewhere, idle sequences -------------------------------------
    def backlog_moves(self) -> None:
        """Sequences of the backlog take entries as they free, oldest first."""
        while self.backlog:
            sequence = self.backlog[0]
            if not sequence.steps:
                self.backlog.popleft()
                continue
            before = len(self.backlog)
            self._promote(sequence)
            if len(self.backlog) == before and self.backlog[0] is sequence:
                return  # still no free entry

    def _wait_blocked(self, sequence: Sequence) -> None:
        self.blocked.add(sequence)
        self._retry_soon()

    def _retry_soon(self) -> None:
        if self._retry_timer is None:
            self._retry_timer = asyncio.get_running_loop().call_later(BLOCKED_RETRY_S, self._retry)

    def _retry(self) -> None:
        self._retry_timer = None
        blocked, self.blocked = self.blocked, set()
        for sequence in blocked:
            self._promote(sequence)
        self.backlog_moves()
        if self.blocked or self.backlog:
            self._retry_soon()
        self.pump_soon()

    def _unlock(self, sequence: Sequence) -> None:
        if sequence.locked:
            sequence.locked = False
            if sequence.entry >= 0:
                self.store.unlock(sequence.entry)

    def _keep_reaping(self) -> None:
        """Wake at the earliest moment a sequence can pass its idle bound (Triton's reaper does the same),
        at most a second apart (another gateway's sequences touch the store too)."""
        if self._reaper is None:
            oldest = self.store.oldest_use_ns()
            due_s = 1.0 if oldest is None else (oldest + self.idle_ns - time.monotonic_ns()) / 1e9
            self._reaper = asyncio.get_running_loop().call_later(min(max(due_s, 0.0) + REAP_SLACK_S, 1.0), self._reap)

    def _reap(self) -> None:
        """Release sequences idle past max_sequence_idle_microseconds, without telling the model (Triton)."""
        self._reaper = None
        store = self.store
        now_ns = time.monotonic_ns()
        ours = {s.entry: s for s in self.sequences.values() if s.entry >= 0}
        for entry, owner in store.idle_entries(now_ns - self.idle_ns):
            sequence = ours.get(entry)
            if sequence is not None and (sequence.steps or sequence.promoted is not None):
                store.touch(entry, now_ns)  # a step waits: not idle (Triton: idle means nothing queued)
                continue
            held = sequence is not None and sequence.locked
            if not held and not store.try_lock(entry):
                continue  # a step of it runs at another gateway (ours too: it may have arrived there since)
            if store.free(entry, owner):
                self.idle_releases += 1
                log.info("model %s: released an idle sequence (entry %d)", self.config.key, entry)
            if sequence is not None:
                sequence.locked = True  # (the lock just taken, or the one it held: _unlock drops it)
                self._unlock(sequence)
                sequence.entry = -1
                self.sequences.pop(sequence.key, None)
            else:
                store.unlock(entry)
        self.backlog_moves()
        if self.sequences or store.in_use():
            self._keep_reaping()

    def status(self) -> dict[str, Any]:
        """/admin/status and /metrics: the sequences this gateway knows, and the store's."""
        store = self._store
        return {
            "active_sequences": store.in_use() if store is not None else 0,
            "backlog": len(self.backlog),
            "idle_releases": self.idle_releases,
            "state_bytes": store.entry_count * store.entry_bytes if store is not None else 0,
        }


def model_queue(config: ModelConfig, slot_capacity_bytes: int, stores: StateStores) -> ModelQueue:
    """A model's queue: a SequenceQueue for a sequence model (its states in `stores`), else the usual one."""
    if config.sequence_batching is None:
        return ModelQueue(config, slot_capacity_bytes)
    return SequenceQueue(config, slot_capacity_bytes, stores)


def commit_batch_states(
    segment: Segment, slot: int, requests: list[InferRequest], outputs: list[TensorRef], queue: SequenceQueue
) -> list[TensorRef]:
    """commit_states for a batch of `queue`'s steps (gateway/dispatch/replies.py, on the live worker's RESULT)."""
    return commit_states(segment, slot, requests, queue.config, outputs, queue.store, queue.finish_step)


def commit_answer_states(
    segment: Segment, slot: int, requests: list[InferRequest], answers: list[list[Any]], queue: SequenceQueue
) -> list[list[Any]]:
    """commit_states for a Python model's steps, which answer one by one (RESULT's `answers`): each step's
    state outputs from its own answer; the answers returned without them."""
    states = queue.sequence.state_outputs - queue.config.outputs_by_name.keys()  # (also an output: the client's)
    kept = []
    for request, (refs, error, *rest) in zip(requests, answers):  # (rest: the status, the response's parameters)
        if error is None:
            mine = [TensorRef.from_wire(ref) for ref in refs if ref[0] in queue.sequence.state_outputs]
            commit_states(segment, slot, [request], queue.config, mine, queue.store, queue.finish_step)
            refs = [ref for ref in refs if ref[0] not in states]
        kept.append([refs, error, *rest])
    return kept
