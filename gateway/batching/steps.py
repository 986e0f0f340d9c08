"""A sequence model's step: what a request says of its sequence, and the tensors it adds to a batch.

gateway/codec/parse.py reads each request's sequence_id, sequence_start and sequence_end (`read_step`,
in Triton's words); gateway/batching/sequences.py queues the steps; gateway/batching/slots.py writes the
control and state inputs of a batch of steps into its slot (`sequence_plan`, the one copy of a state
from its store into the slot); on the live worker's RESULT gateway/dispatch/replies.py commits each
step's output state from the slot into the store (`commit_states`, the one copy back) before it answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.datatypes import numpy_dtype
from ringserve.common.repository.sequences import MAX_STRING_ID_CHARS
from ringserve.common.wire import BytesTensorRef, TensorRef, deserialize_bytes_tensor, serialize_bytes_tensor
from ringserve.gateway.core.errors import BadRequest, GatewayError, Unsupported, echo
from ringserve.gateway.core.phrases import say
from ringserve.gateway.core.request import InferRequest
from ringserve.shm.segment import Segment
from ringserve.shm.states import StateStore


class StateLost(GatewayError):
    """A gateway died while it committed this sequence's state: the state cannot be trusted (500)."""

    def __init__(self, model: str, key: int | str) -> None:
        super().__init__(
            f"model {model!r}: the state of sequence {echo(key)} was lost (a gateway stopped while it was being "
            "written); start the sequence again with sequence_start"
        )


class StateOutgrew(BadRequest):
    """A step's output state does not fit the state's declared dims or its window (parameters.max_shapes)."""

    def __init__(self, model: str, state: str, shape: tuple[int, ...], window: tuple[int, ...]) -> None:
        super().__init__(
            f"model {model!r}: this step's output state {state!r} has shape {list(shape)}, past the state's bound "
            f"{list(window)} (its dims, with -1 bounded by parameters.max_shapes); the sequence keeps its state "
            "from before this step"
        )


@dataclass(eq=False, slots=True)
class Step:
    """A request's place in its sequence (InferRequest.sequence)."""

    key: int | str  # the client's sequence_id
    start: bool
    end: bool
    # Set when the step is promoted into the lanes: its entry, and per state what it is fed
    # (a view of the entry, or None for the start value) and that state's shape.
    entry: int = -1
    owner: int = 0
    sources: list[np.ndarray | None] = field(default_factory=list)
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    release: Callable[[InferRequest], None] | None = None  # the queue's, once it holds the step

    @property
    def flags(self) -> int:
        """Triton's request flags: 1 SEQUENCE_START, 2 SEQUENCE_END (a Python model's request.flags())."""
        return int(self.start) | int(self.end) << 1


def read_step(config: ModelConfig, params: dict, rows: int) -> Step:
    """The request's sequence_id, sequence_start and sequence_end, checked as Triton checks them."""
    if rows > 1 and config.max_batch_size > 0:
        raise BadRequest(say("sequence_batch_size", model=config.name))
    key = params.get("sequence_id", 0)
    if type(key) is str:
        if len(key) > MAX_STRING_ID_CHARS:
            raise Unsupported(say("sequence_id_length", f"this one has {len(key)}"))
    elif type(key) is not int or not 0 <= key < 1 << 64:
        raise BadRequest(
            say(
                "json_field",
                f"sequence_id must be an unsigned 64-bit integer or a string, got {echo(key)}",
                field="sequence_id",
            )
        )
    if key == 0 or key == "":
        raise BadRequest(say("sequence_no_id", model=config.name))
    flags = []
    for name in ("sequence_start", "sequence_end"):
        value = params.get(name, False)
        if type(value) is not bool:
            raise BadRequest(say("json_field", f"{name} must be true or false, got {echo(value)}", field=name))
        flags.append(value)
    corrid = config.sequences.control("CORRID")
    if corrid is not None and (corrid.datatype == "BYTES") != (type(key) is str):  # Triton's infer_request.cc
        sent = "BYTES" if type(key) is str else "UINT64"
        fields = {"control": corrid.name, "got": sent, "model": config.name, "expected": corrid.datatype}
        raise BadRequest(say("sequence_id_type", **fields))
    return Step(key, flags[0], flags[1])


def unknown_sequence(config: ModelConfig, key: int | str, detail: str = "") -> BadRequest:
    return BadRequest(say("sequence_no_start", detail, key=key, model=config.name))


def sequence_plan(requests: list[InferRequest], config: ModelConfig) -> list[tuple]:
    """(name, datatype, dtype, shape, fill) of the control and state inputs of a batch of steps, as
    gateway/batching/slots.py plans every tensor it writes into a slot."""
    sequence = config.sequences
    batched = config.max_batch_size > 0
    rows = len(requests)
    plan: list[tuple] = []
    for control in sequence.controls:
        shape = (rows, 1) if batched else (1,)
        if control.datatype == "BYTES":  # a string CORRID: in the steps' `serialized` (SequenceQueue._feed)
            plan.append((control.name, "BYTES", np.dtype(object), shape, None))
            continue
        dtype = numpy_dtype(control.datatype)
        if control.kind == "CORRID":
            values = np.array([r.sequence.key for r in requests], dtype=np.uint64).astype(dtype)
        else:
            values = np.array([control.value(_flag(control.kind, r.sequence)) for r in requests]).astype(dtype)
        plan.append((control.name, control.datatype, dtype, shape, _copy(values.reshape(shape))))
    for index, state in enumerate(sequence.states):
        one = requests[0].sequence.shapes[index]
        shape = (rows, *one) if batched else one
        if state.datatype == "BYTES":  # in the steps' `serialized`, as the store keeps it (SequenceQueue._feed)
            plan.append((state.input_name, "BYTES", np.dtype(object), shape, None))
            continue
        sources = [r.sequence.sources[index] for r in requests]
        starts = [state.start_value() if source is None else source for source in sources]
        plan.append((state.input_name, state.datatype, state.np_dtype, shape, _stack(starts, batched)))
    return plan


def _copy(values: np.ndarray) -> Callable[[np.ndarray], None]:
    def fill(dst: np.ndarray) -> None:
        dst[...] = values

    return fill


def _stack(rows: list[np.ndarray], batched: bool) -> Callable[[np.ndarray], None]:
    """Each step's state into its row of the batch's state input: the one copy from the store to the slot."""

    def fill(dst: np.ndarray) -> None:
        if not batched:
            dst[...] = rows[0]
            return
        for row, value in enumerate(rows):
            dst[row] = value

    return fill


def _flag(kind: str, step: Step) -> bool:
    return step.start if kind == "START" else step.end if kind == "END" else True  # READY: a real request


def commit_states(
    segment: Segment,
    slot: int,
    requests: list[InferRequest],
    config: ModelConfig,
    outputs: list[TensorRef],
    store: StateStore,
    refuse: Callable[[InferRequest, GatewayError], None],
) -> list[TensorRef]:
    """Each step's output state, from slot `slot` into its sequence's entry; the other outputs returned.

    Runs on the live worker's RESULT, before the steps are answered. A step whose output state
    outgrew its bound is refused (400) and leaves its entry as it was.
    """
    sequence = config.sequences
    by_name = {ref.name: ref for ref in outputs}
    # (a state output the config also lists as an output goes to the client too: Triton's test_request_output)
    rest = [ref for ref in outputs if ref.name not in sequence.state_outputs or ref.name in config.outputs_by_name]
    batched = config.max_batch_size > 0
    views = []
    for state in sequence.states:
        ref = by_name[state.output_name]
        if isinstance(ref, BytesTensorRef):  # a STRING state: its elements, each row serialized again below
            views.append(
                deserialize_bytes_tensor(segment.tensor(slot, ref.offset, np.dtype(np.uint8), (ref.nbytes,)), ref.shape)
            )
        else:
            views.append(segment.tensor(slot, ref.offset, state.np_dtype, ref.shape))
    for row, request in enumerate(requests):
        if request.done:
            continue
        step: Step = request.sequence
        rows = [view[row] if batched else view for view in views]
        # A STRING state's elements in KServe's BYTES form, made once: measured here, written below.
        forms = [
            np.frombuffer(serialize_bytes_tensor(data), np.uint8) if state.datatype == "BYTES" else None
            for state, data in zip(sequence.states, rows)
        ]
        refused = next(
            (
                (state, tuple(data.shape))
                for state, data, form in zip(sequence.states, rows, forms)
                if data.ndim != len(state.window)
                or any(d > w for d, w in zip(data.shape, state.window))
                or (form is not None and form.nbytes > state.max_bytes)
            ),
            None,
        )
        if refused is not None:
            state, shape = refused
            refuse(request, StateOutgrew(config.name, state.output_name, shape, state.window))
            continue
        store.begin_commit(step.entry)
        for state_index, (state, data, form) in enumerate(zip(sequence.states, rows, forms)):
            fixed = state.fixed_shape == data.shape  # (the usual state: its shape is written once, at START)
            if step.start or not fixed:
                store.set_shape(step.entry, state_index, tuple(data.shape))
            if form is not None:
                store.set_length(step.entry, state_index, form.nbytes)
                np.copyto(store.bytes_view(step.entry, state_index, form.nbytes), form)
            elif fixed:
                np.copyto(store.fixed_view(step.entry, state_index, data.shape, data.dtype), data)
            else:
                np.copyto(store.view(step.entry, state_index, tuple(data.shape), data.dtype), data)
        store.end_commit(step.entry)
    return rest
