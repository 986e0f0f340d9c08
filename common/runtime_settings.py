"""Settings a client changes while the server runs (Triton's logging and trace extensions), in every process.

    gateway k  --ChangeRuntimeSettings-->  supervisor         (control.sock)
    supervisor --RuntimeSettings-->        every gateway      (events-<k>.sock), and <runtime>/runtime-settings.json
    gateway k  --RuntimeSettings-->        each worker's loader thread (dispatch-<k>.sock), and on each READY

The supervisor holds the one truth: it merges each change into its state, counts a revision, applies it to
its own logging, writes the whole state to the runtime dir (a process started later, a worker replaced
after a crash or a new gateway, reads it at start: `begin`) and sends it to every gateway, which applies
it and passes it to the workers it knows (a worker hears it from each gateway; a revision it already has is
skipped). A process's state is module state here, as logging's own is: one per process.

Log settings are Triton's names: log_info, log_warning, log_error switch those levels' lines (CRITICAL
lines always leave: a process about to stop says why), log_verbose_level >= 1 lets DEBUG lines out
(Python has one verbose level), log_format is "default" (ringserve's text line), "ISO8601" (the same with
an ISO 8601 UTC time) or "json" (--log-format json). log_file is "" (stderr): see `LogSettings`.

Trace settings map Triton's onto the OpenTelemetry tracing of common/tracing.py: trace_level OFF or
TIMESTAMPS (a request's spans carry times, never tensors), trace_rate (one request traced in N) and
trace_count (traces left, -1 unlimited), globally and per model (a model's own setting, else the global
one). The gateway that receives a request decides (tracing.start_request); the batch and the worker's
execute span follow that request's span, so a worker needs nothing more. Each gateway counts its own
requests for the rate and the count (see docs/manual.md "Runtime log and trace settings").
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

import orjson

from ringserve.common.logfmt import JsonFormatter, TextFormatter
from ringserve.common.messages import Message
from ringserve.common.settings import Settings

log = logging.getLogger(__name__)

SAVED_FILE = "runtime-settings.json"  # in the runtime dir, written by the supervisor
LOG_FORMATS = ("default", "ISO8601", "json")
TRACE_LEVELS = ("OFF", "TIMESTAMPS")
TRACE_SETTINGS = ("trace_level", "trace_rate", "trace_count", "log_frequency")
TRACE_MODE = "opentelemetry"
ACCESS_LOGGER = "ringserve.access"  # gateway/observe/access.py's


@dataclass(frozen=True)
class LogSettings:
    """Triton's log settings. log_file is always "": every process writes to the one stderr the supervisor,
    gateways and workers share (a pipe under Docker or journald), whole lines in one write each; a file
    per process, or a file all of them write, would lose that (Triton, one process, can)."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    @classmethod
    def from_flags(cls, level: str, log_format: str) -> LogSettings:
        """What --log-level and --log-format mean in Triton's terms."""
        rank = logging.getLevelName(level.upper())
        rank = rank if isinstance(rank, int) else logging.INFO
        return cls(
            log_info=rank <= logging.INFO,
            log_warning=rank <= logging.WARNING,
            log_error=rank <= logging.ERROR,
            log_verbose_level=1 if rank <= logging.DEBUG else 0,
            log_format="json" if log_format == "json" else "default",
        )

    def lowest_level(self) -> int:
        """The root logger's level: the lowest one whose lines may leave (callers below it pay nothing)."""
        if self.log_verbose_level > 0:
            return logging.DEBUG
        for on, level in ((self.log_info, logging.INFO), (self.log_warning, logging.WARNING)):
            if on:
                return level
        return logging.ERROR if self.log_error else logging.CRITICAL

    def lets_out(self, level: int) -> bool:
        if level >= logging.CRITICAL:
            return True
        if level >= logging.ERROR:
            return self.log_error
        if level >= logging.WARNING:
            return self.log_warning
        if level >= logging.INFO:
            return self.log_info
        return self.log_verbose_level > 0


@dataclass(frozen=True)
class TraceSettings:
    """Triton's trace settings, as OpenTelemetry serves them (see the module doc)."""

    trace_level: tuple[str, ...] = ("TIMESTAMPS",)  # (what a process with tracing on does until told otherwise)
    trace_rate: int = 1
    trace_count: int = -1
    log_frequency: int = 0  # (Triton's trace files only: refused over the API, kept at 0)

    @classmethod
    def from_flags(cls, otel_endpoint: str | None) -> TraceSettings:
        """With an OTLP endpoint every request is traced (the SDK's sampler may still drop it); else none."""
        return cls(trace_level=("TIMESTAMPS",) if otel_endpoint else ("OFF",))

    def traced(self) -> bool:
        return self.trace_level != ("OFF",) and self.trace_rate > 0 and self.trace_count != 0


@dataclass(frozen=True)
class State:
    """Everything a change can set, as one value: revision 0 is what the flags say (every process computes it)."""

    revision: int = 0
    log: LogSettings = LogSettings()
    trace: TraceSettings = TraceSettings()
    model_traces: dict[str, dict[str, Any]] = field(default_factory=dict)  # a model's own settings only

    def trace_of(self, model: str | None) -> TraceSettings:
        own = self.model_traces.get(model or "")
        return self.trace if not own else replace(self.trace, **_trace_values(own))

    def merged(self, change: ChangeRuntimeSettings) -> State:
        """This state with `change` made (checked by the gateway that took it), one revision on."""
        log_settings = replace(self.log, **change.log) if change.log else self.log
        trace, models = self.trace, dict(self.model_traces)
        if change.model:
            own = {**models.get(change.model, {}), **change.trace}
            own = {key: value for key, value in own.items() if value is not None}  # null: the global one again
            if own:
                models[change.model] = own
            else:
                models.pop(change.model, None)
        elif change.trace:  # (null: back to the flags' value)
            values = {k: getattr(initial.trace, k) if v is None else v for k, v in change.trace.items()}
            trace = replace(trace, **_trace_values(values))
        return State(self.revision + 1, log_settings, trace, models)

    def message(self, token: str = "") -> RuntimeSettings:
        return RuntimeSettings(
            revision=self.revision,
            log=asdict(self.log),
            trace={**asdict(self.trace), "trace_level": list(self.trace.trace_level)},  # (as JSON gives it back)
            model_traces=self.model_traces,
            token=token,
        )

    @classmethod
    def of(cls, message: RuntimeSettings) -> State:
        return cls(
            message.revision,
            LogSettings(**message.log),
            TraceSettings(**_trace_values(message.trace)),
            {model: dict(own) for model, own in message.model_traces.items()},
        )


def _trace_values(values: dict[str, Any]) -> dict[str, Any]:
    return {key: tuple(value) if key == "trace_level" else value for key, value in values.items()}


# -- the messages ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChangeRuntimeSettings(Message):
    """gateway -> supervisor: a client's change, checked. `trace` values of None clear a model's own setting."""

    KIND: ClassVar[str] = "CHANGE_RUNTIME_SETTINGS"
    token: str  # the gateway's, so that it knows the RuntimeSettings that answers it
    gateway_index: int
    log: dict[str, Any] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)
    model: str = ""  # "": the global trace settings


@dataclass(frozen=True)
class RuntimeSettings(Message):
    """supervisor -> every gateway, gateway -> each worker: the whole state after a change (`token`: its)."""

    KIND: ClassVar[str] = "RUNTIME_SETTINGS"
    revision: int
    log: dict[str, Any]
    trace: dict[str, Any]
    model_traces: dict[str, dict[str, Any]] = field(default_factory=dict)
    token: str = ""


# -- this process ------------------------------------------------------------------------------------
current = State()
initial = State()  # what the flags say (the settings a null brings back)
_identity: tuple[str, int | None, int | None] = ("supervisor", None, None)


class LevelSwitch(logging.Filter):
    """On the root handler: lets a line out by Triton's switches (log_info off, log_error on is allowed). The
    access log was asked for by a flag of its own (--access-log, at INFO whatever the level): it stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        return current.log.lets_out(record.levelno) or record.name == ACCESS_LOGGER


class Iso8601Formatter(TextFormatter):
    """ringserve's text line with Triton's ISO8601 time: 2026-12-07T08:01:02Z."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))


def begin(
    settings: Settings,
    *,
    role: str,
    index: int | None = None,
    generation: int | None = None,
    runtime_dir: str | None = None,
) -> State:
    """At a process's start, after configure_logging: the flags' settings, then what a client changed since
    the server started (the supervisor's file in `runtime_dir`, by default the settings'), so that a process
    started later (a worker replaced after a crash, a restarted gateway) logs and traces as the others do."""
    global _identity, initial
    _identity = (role, index, generation)
    flags = State(0, LogSettings.from_flags(settings.log_level, settings.log_format))
    flags = replace(flags, trace=TraceSettings.from_flags(settings.otel_endpoint))
    initial = flags
    where = settings.runtime_dir if runtime_dir is None else runtime_dir
    saved = read_saved(where) if where else None
    adopt((saved if saved is not None and saved.revision > 0 else flags).message(), force=True)
    return current


def adopt(message: RuntimeSettings, *, force: bool = False) -> bool:
    """Apply `message` in this process unless it is older than what it has (True: applied)."""
    global current
    if message.revision <= current.revision and not force:
        return False
    before, current = current, State.of(message)
    _apply_log(current.log, before.log if not force else None)
    if force or (before.trace, before.model_traces) != (current.trace, current.model_traces):
        sampler.reset()  # (a trace_count set counts down anew)
    if message.revision and (force or before.log != current.log):
        # (at DEBUG once DEBUG lines are on: a line each process writes at the new level, where the change began)
        level = logging.DEBUG if current.log.log_verbose_level else logging.INFO
        log.log(level, "log settings now %s (revision %d)", _changed(current.log, before.log), message.revision)
    return True


def _changed(now: LogSettings, before: LogSettings) -> str:
    changed = {k: v for k, v in asdict(now).items() if getattr(before, k) != v}
    return ", ".join(f"{k}={v}" for k, v in changed.items()) or "unchanged"


def _apply_log(settings: LogSettings, before: LogSettings | None) -> None:
    root = logging.getLogger()
    root.setLevel(settings.lowest_level())
    for handler in root.handlers:
        if not any(isinstance(f, LevelSwitch) for f in handler.filters):
            handler.addFilter(LevelSwitch())
        if before is None or before.log_format != settings.log_format:
            handler.setFormatter(_formatter(settings.log_format))


def _formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter(*_identity)
    return Iso8601Formatter() if log_format == "ISO8601" else TextFormatter()


def read_saved(runtime_dir: str) -> State | None:
    try:
        with open(os.path.join(runtime_dir, SAVED_FILE), "rb") as saved:
            return State.of(RuntimeSettings(**orjson.loads(saved.read())))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        log.warning("cannot read %s: %s; keeping the flags' settings", SAVED_FILE, exc)
        return None


def save(runtime_dir: str, state: State) -> None:
    """Written whole (a temporary file renamed over it): a process starting meanwhile reads the old or the new."""
    path = os.path.join(runtime_dir, SAVED_FILE)
    temporary = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(orjson.dumps(state.message()))
    os.replace(temporary, path)


class TraceSampler:
    """Which requests a gateway traces: each model with its own settings counts its requests apart, the
    others share the global count (as Triton's trace manager does). Reset by every change of the settings.
    On the infer path of a traced server: the settings of each count are worked out once, at their first use."""

    def __init__(self) -> None:
        self.rules: dict[str, tuple[bool, int]] = {}  # count key -> (traced at all, rate)
        self.seen: dict[str, int] = {}
        self.left: dict[str, int] = {}

    def reset(self) -> None:
        self.rules.clear()
        self.seen.clear()
        self.left.clear()

    def admit(self, model: str) -> bool:
        key = model if model in current.model_traces else ""
        rule = self.rules.get(key)
        if rule is None:
            settings = current.trace_of(key)
            rule = self.rules[key] = (settings.traced(), settings.trace_rate)
            self.left[key] = settings.trace_count
        traced, rate = rule
        if not traced:
            return False
        if rate != 1:
            seen = self.seen[key] = self.seen.get(key, 0) + 1
            if seen % rate:
                return False
        left = self.left[key]
        if left == 0:
            return False
        if left > 0:
            self.left[key] = left - 1
        return True

    def count_left(self, model: str | None) -> int:
        key = model if model and model in current.model_traces else ""
        return self.left.get(key, current.trace_of(key).trace_count)


sampler = TraceSampler()
