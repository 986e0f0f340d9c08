"""The messages between processes: their base class and wire format, and the worker <-> gateway kinds.

Every message kind is a frozen dataclass deriving from `Message`; the supervisor's kinds (to and
from it) are in common/supervisor_messages.py, the runtime settings' in common/runtime_settings.py.
Each message is three ZeroMQ frames: [protocol version, kind, orjson body], and `Message.encode` /
`decode` below are the only code that builds or reads them. Tensors never travel here:
BATCH and RESULT carry only where the tensors lie in the shared-memory slot (TensorRef's
wire form, a list, see common/wire.py).

    worker  -> gateway     Ready, Result, Error, ModelState,  (DEALER -> ROUTER dispatch-<k>.sock,
                           StreamResponse, Executed             one per gateway k)
    gateway -> worker      Attach, Batch, Load, Unload,        (ROUTER -> DEALER)
                           Cancel                               (to the worker's courier thread:
                                                                 worker/python/decoupled.py)
    worker  -> gateway     Call, CallCancel + a body frame     (a worker's call DEALER -> ROUTER
    gateway -> worker      CallReply + its body frame            dispatch-<k>.sock: worker/calls.py)
    worker  -> supervisor  Heartbeat                           (PUSH -> PULL heartbeat.sock)
    spare   -> supervisor  SpareHeartbeat                      (PUSH -> PULL heartbeat.sock)
    supervisor -> spare    TakeOver                            (one line on the spare's stdin:
                                                                 Message.encode_line / decode_line)
    supervisor -> gateway  WorkerStarted, WorkerExited,
                           ModelQuarantined, ModelUnquarantined,
                           Snapshot, Reload                    (PUSH -> PULL events-<k>.sock)
    gateway -> supervisor  KillWorker, WorkerRetired,
                           QuarantineModel, Unquarantine,
                           ReloadWorkers, RepositoryChanged    (PUSH -> PULL control.sock;
                                                                 RepositoryChanged goes on to the
                                                                 other gateways' events-<k>.sock)

A zero-downtime replacement: WorkerStarted carries `replaces` (the generation the new
process takes over from); the gateway switches dispatch on the new one's Ready and, once
the old one holds no batch, answers WorkerRetired so the supervisor stops it.

Model lifecycle (worker/models.py, gateway/dispatch/model_states.py): Ready lists every (model, version)
the worker may serve with its state (`model_states`); each later change comes as a
ModelState from the thread that made it. The gateway sends Load and Unload to the worker's
loader thread, a second DEALER (`wire.control_identity`). `seq` counts the changes of one
version in one worker: a report older than one already seen is ignored, as the two sockets
do not keep order between them. An Error may carry `kind` (ErrorKind) when the batch never ran.

orjson writes the dataclasses natively (no asdict copy on the hot path); `decode` builds
the class of the kind (BY_KIND, which each subclass joins as it is defined) from the body, so a
missing or unknown field is a WireError here, not a KeyError deep in a handler. The classes have
no __slots__: orjson writes a dataclass from its __dict__ about three times faster (a Batch: 0.25
instead of 0.7 µs), and `decode` fills that __dict__ at once (see _builder).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Self

import orjson

from ringserve.common.vocabulary import ChangeCause, ErrorKind, LoadCause, LoadPolicy, ModelVersionState

PROTOCOL_VERSION = b"rs1"


class WireError(ValueError):
    """A message that does not follow this protocol version."""


class Message:
    """What every message kind derives from: its KIND (the second frame), and how it is written and built.

    A subclass joins BY_KIND as it is defined; a KIND taken twice is a TypeError at import.
    """

    KIND: ClassVar[str]
    _KIND_FRAME: ClassVar[bytes]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("KIND")
        if not isinstance(kind, str):
            raise TypeError(f"message class {cls.__name__} has no KIND of its own")
        frame = kind.encode()
        if frame in BY_KIND:
            raise TypeError(f"KIND {kind!r} of {cls.__name__} is {BY_KIND[frame].__name__}'s already")
        cls._KIND_FRAME = frame
        BY_KIND[frame] = cls

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        """The message of a decoded body; a kind with nested records overrides it to build them."""
        return cls(**body)

    def encode(self) -> list[bytes]:
        return [PROTOCOL_VERSION, self._KIND_FRAME, orjson.dumps(self)]

    def encode_line(self) -> bytes:
        """This message as one line, for a pipe (which has no frames): the three frames joined by spaces.
        The version and the kind hold no space, and orjson writes no raw newline (it escapes them)."""
        return b" ".join(self.encode()) + b"\n"


BY_KIND: dict[bytes, type[Message]] = {}  # filled by Message.__init_subclass__


@dataclass(frozen=True)
class ModelStateReport:
    """One model version in one worker (Ready's `model_states`, and the body of ModelState)."""

    model: str
    version: int
    key: str  # the gateway's queue key: 'm' for the default version, 'm/2' for version 2
    state: ModelVersionState
    reason: str = ""
    memory_bytes: int = 0
    load_s: float = 0.0
    seq: int = 0
    policy: LoadPolicy = "eager"
    provider: str | None = None
    peak_refs: int = 0  # the most batches that held this version at once in this worker


@dataclass(frozen=True)
class CompletedConfig:
    """A model version's config as a worker completed it (Ready's `configs`): a Python model's
    model.py may complete its own (auto_complete_config), and only workers import model.py."""

    key: str  # 'm' for the default version, 'm/2'
    version: int
    model_path: str
    config: dict[str, Any]  # Triton's JSON (ModelConfig.to_json), what /v2/models/{m}/config shows


# -- worker -> gateway ----------------------------------------------------------------------
@dataclass(frozen=True)
class Ready(Message):
    KIND: ClassVar[str] = "READY"
    worker_index: int
    generation: int
    pid: int
    models: dict[str, str | None]  # model key -> execution provider (None until loaded)
    failed_models: dict[str, str] = field(default_factory=dict)  # model key -> why
    model_states: tuple[ModelStateReport, ...] | None = None  # None: a worker without lifecycle reports
    memory_budget_bytes: int = 0
    configs: tuple[CompletedConfig, ...] = ()  # the Python models' configs, as this worker completed them

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Ready:
        states = body.get("model_states")
        if states is not None:
            body = {**body, "model_states": tuple(ModelStateReport(**s) for s in states)}
        if "configs" in body:
            body = {**body, "configs": tuple(CompletedConfig(**c) for c in body["configs"])}
        return cls(**body)


@dataclass(frozen=True)
class Result(Message):
    KIND: ClassVar[str] = "RESULT"
    batch_id: int
    attempt: int
    outputs: list[list[Any]]  # TensorRef wire forms, in the slot's output area
    compute_s: float = 0.0  # of the whole execution (a fused one's included)
    # Worker-side fusion (worker/fusion.py): batches of one model from several gateways run as one
    # execution. `fused` is how many batches it held (1: this batch alone). The execution is reported
    # once, by the Result of its first batch: `execution_rows` is its row count there, 0 elsewhere.
    fused: int = 1
    execution_rows: int = 0
    # A Python model's or an ensemble's answer per request, in row order (None: the model's batch
    # outputs above, split by rows at the gateway): [outputs (TensorRef wire forms), error, status],
    # error None when the request succeeded, else its message and the HTTP status it is answered with;
    # a fourth item when the response set parameters (InferenceResponse(parameters=...)): name -> bool,
    # int, float or str.
    answers: list[list[Any]] | None = None


@dataclass(frozen=True)
class StreamResponse(Message):
    """One response of a decoupled model's request, sent as the model sends it (worker/python/decoupled.py).

    Its outputs lie in the slot's output area, after the responses sent before it; the gateway copies
    them out at once. `final`: the model said TRITONSERVER_RESPONSE_COMPLETE_FINAL for the request.
    The batch's Result comes after every request's final one, and frees the slot.
    """

    KIND: ClassVar[str] = "STREAM_RESPONSE"
    batch_id: int
    attempt: int
    request_index: int  # the request's position in the batch
    outputs: list[list[Any]]  # TensorRef wire forms ([] for a final flag alone, or an error)
    error: str | None = None
    status: int = 0  # the HTTP status of `error`
    final: bool = False
    parameters: dict[str, Any] | None = None  # the response's parameters (InferenceResponse(parameters=...))


@dataclass(frozen=True)
class Executed(Message):
    """A decoupled batch's execute returned (the batch loop's answer to it, in place of RESULT): its
    streams go on from the model's threads, and the worker takes other batches meanwhile. The
    batch's responses and its RESULT come from the worker's courier (worker/python/decoupled.py)."""

    KIND: ClassVar[str] = "EXECUTED"
    batch_id: int
    attempt: int
    compute_s: float = 0.0  # execute's own time


@dataclass(frozen=True)
class Error(Message):
    KIND: ClassVar[str] = "ERROR"
    batch_id: int
    attempt: int
    error: str
    kind: ErrorKind | None = None  # set when the batch never ran


@dataclass(frozen=True)
class ModelState(Message):
    """A model version changed state in a worker (worker/models.py's registry)."""

    KIND: ClassVar[str] = "MODEL_STATE"
    report: ModelStateReport
    cause: ChangeCause = ""
    loaded: bool = False  # this change finished a load (counted, with its load_s)
    budget_bytes: int = 0
    used_bytes: int = 0

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ModelState:
        return cls(report=ModelStateReport(**body["report"]), **{k: v for k, v in body.items() if k != "report"})


# -- gateway -> worker ----------------------------------------------------------------------
@dataclass(frozen=True)
class Attach(Message):
    """The gateway's first answer to a worker's Ready: the ring its batches lie in.

    Each gateway process owns one ring; a restarted gateway has a new one (stale writes of a
    batch its predecessor sent land in the old segment, never in a new batch's slot).
    """

    KIND: ClassVar[str] = "ATTACH"
    gateway_index: int
    segment: str


@dataclass(frozen=True)
class RequestInfo:
    """One request of a Python model's (or an ensemble's) batch: its rows in the slot's tensors, and
    what pb_utils.InferenceRequest tells of it."""

    rows: int
    id: str | None = None  # the request body's `id` (request_id())
    parameters: dict[str, Any] | None = None  # the request's parameters (parameters())
    outputs: list[str] | None = None  # requested output names; None: every output
    shapes: dict[str, list[int]] | None = None  # ragged inputs: this request's own shape of each
    # A sequence model's step: its sequence id (correlation_id()) and START/END (flags(): Triton's bits)
    correlation_id: int | str = 0
    flags: int = 0


@dataclass(frozen=True)
class Batch(Message):
    KIND: ClassVar[str] = "BATCH"
    batch_id: int
    model: str
    version: int
    attempt: int
    slot_index: int
    generation: int  # the slot's generation: a stale batch is refused
    inputs: list[list[Any]]  # TensorRef wire forms
    output_offset: int
    faults: list[str] | None = None  # fault injection (tests only, worker/faults.py)
    request_ids: list[str] | None = None  # the requests' ids (X-Request-ID), in row order, for the worker's logs
    trace: str | None = None  # W3C traceparent of the batch's span (None: tracing off)
    # Python models and ensembles: what each request is, in row order (None for ONNX models)
    requests: tuple[RequestInfo, ...] | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Batch:
        parts = body.get("requests")
        if parts is None and body.keys() == _BATCH_FIELDS:  # an ONNX model's: __init__ skipped (see _builder)
            message = object.__new__(cls)
            message.__dict__.update(body)
            return message
        if parts is not None:
            body = {**body, "requests": tuple(RequestInfo(**p) for p in parts)}
        return cls(**body)


@dataclass(frozen=True)
class Load(Message):
    KIND: ClassVar[str] = "LOAD"
    model: str
    version: int
    cause: LoadCause = "lazy"


@dataclass(frozen=True)
class Unload(Message):
    KIND: ClassVar[str] = "UNLOAD"
    model: str
    version: int


@dataclass(frozen=True)
class Cancel(Message):
    """Requests of a Python model's batch are cancelled (their client went away, or a stream's deadline
    passed): their `is_cancelled()` turns true, and a decoupled stream's responses to them stop (the
    slot is freed once every request of the batch is final or cancelled). To the worker's courier."""

    KIND: ClassVar[str] = "CANCEL"
    batch_id: int
    attempt: int
    request_indexes: list[int]  # positions in the batch


# -- a worker's request to a model it does not hold (BLS, ensemble steps: worker/calls.py) -------
# All carry a fourth frame: a KServe v2 body in the binary tensor extension (JSON header of
# `header_length` bytes, then the tensors), the same bytes an HTTP client would send or get (CallCancel's
# is empty). A `stream` call (exec(decoupled=True) to a decoupled model) is answered by one CallReply per
# response the model sends, as it sends it; the one with `final` ends it (gateway/calls/stream.py).
@dataclass(frozen=True)
class Call(Message):
    KIND: ClassVar[str] = "CALL"
    call_id: int  # the worker's, echoed in CallReply
    model: str
    version: int  # -1: the model's default version
    header_length: int
    stream: bool = False  # a decoupled model's responses as they come (a model that is not: its one answer)


@dataclass(frozen=True)
class CallReply(Message):
    KIND: ClassVar[str] = "CALL_REPLY"
    call_id: int
    status: int  # the HTTP status the request was answered with
    error: str = ""  # its error when status is not 200 (the body frame is then empty)
    header_length: int = 0  # 0 with status 200: a response without outputs (a stream's final flag alone)
    final: bool = True  # a stream's last (every reply to a call that is not a stream is)


@dataclass(frozen=True)
class CallCancel(Message):
    """The caller cancelled its stream call (ResponseIterator.cancel()): the target's request is cancelled
    as a client's is, and the stream ends with a 499 reply."""

    KIND: ClassVar[str] = "CALL_CANCEL"
    call_id: int


_BATCH_FIELDS = frozenset(f.name for f in fields(Batch))


def _builder(cls: type[Message]) -> Callable[[dict[str, Any]], Message]:
    """How `decode` makes a `cls` from its body.

    A flat message whose body holds exactly its fields (as `encode` writes them) gets them in
    its __dict__ at once, skipping the frozen __init__ that sets each one through
    object.__setattr__ (a Batch: 0.15 instead of 1.2 µs; BATCH and RESULT go once per batch).
    Any other body goes through __init__, which fills defaults or raises the TypeError naming
    a missing or unknown field.
    """
    if cls.from_body.__func__ is not Message.from_body.__func__ or hasattr(cls, "__post_init__"):  # type: ignore[attr-defined]
        return cls.from_body  # nested, or checks its fields
    names = frozenset(f.name for f in fields(cls))  # type: ignore[arg-type]
    new = object.__new__

    def build(body: dict[str, Any]) -> Message:
        if body.keys() == names:
            message = new(cls)
            message.__dict__.update(body)
            return message
        return cls(**body)

    return build


# Built on a kind's first decode: a class is a dataclass only once its decorator has run, after
# __init_subclass__.
_DECODERS: dict[bytes, tuple[type[Message], Callable[[dict[str, Any]], Message]]] = {}


def _decoder(kind: bytes) -> tuple[type[Message], Callable[[dict[str, Any]], Message]]:
    try:
        return _DECODERS[kind]
    except KeyError:
        pass
    try:
        cls = BY_KIND[kind]
    except KeyError:
        raise WireError(f"unknown message kind {kind!r}") from None
    decoder = _DECODERS[kind] = (cls, _builder(cls))
    return decoder


def decode(frames: list[Any]) -> Message:
    """The message the frames hold; WireError for anything this protocol version does not say."""
    if len(frames) != 3:
        raise WireError(f"expected 3 frames, got {len(frames)}")
    version, kind, body = frames
    if bytes(version) != PROTOCOL_VERSION:
        raise WireError(f"protocol version {bytes(version)!r}, this side speaks {PROTOCOL_VERSION!r}")
    cls, build = _decoder(bytes(kind))
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"{cls.KIND} body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise WireError(f"{cls.KIND} body must be an object, got {type(doc).__name__}")
    try:
        return build(doc)
    except (TypeError, KeyError) as exc:  # a missing or unknown field
        raise WireError(
            f"{cls.KIND} body does not match its fields ({', '.join(f.name for f in fields(cls))}): {exc}"  # type: ignore[arg-type]
        ) from None


def decode_line(line: bytes) -> Message:
    """The message of one `Message.encode_line` line; WireError for anything else."""
    return decode(line.rstrip(b"\n").split(b" ", 2))
