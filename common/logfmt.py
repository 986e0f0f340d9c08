"""The log lines of every ringserve process: text, or one JSON object a line (--log-format).

Every process (supervisor, gateway k, worker k) sets its root logger up with one of these
formatters (common/process.py: configure_logging), so uvicorn's and ONNX Runtime's Python
loggers come out in the same form. A JSON line holds:

    time      UTC, ISO 8601 with milliseconds: "2026-12-01T19:01:37.123Z"
    level     INFO, WARNING, ...
    role      supervisor | gateway | worker
    index     the gateway's or the worker's index (null for the supervisor)
    generation  its incarnation (null for the supervisor)
    pid, logger, message
    request_id          a line about one request (X-Request-ID, or the id the gateway made)
    batch_id, request_ids   a line about a batch: its id and its requests' ids, in row order
    exception           the traceback, when there is one
    access fields       the access log's line (gateway/observe/access.py): method, path, status, ...

A line about a request or a batch says so with `extra=`: `log.warning("...", extra=batch_fields(...))`.
In text those ids follow the message in brackets, so the same call serves both formats.

A text line's message has its control characters escaped (`\n`, `\x1b`, ...), as JSON escapes them:
what a client sends (a path with %0a, a gRPC model name with a newline) reaches log lines, and could
otherwise forge lines or send escape sequences to a terminal that shows the log.

Whole lines: the supervisor, the gateways, the workers and the spare share one stdout/stderr (a pipe
under Docker, journald or a test), and a line that leaves a process in more than one write() can be
torn by another process's line. So each line (its traceback included) leaves in one os.write() of at
most LINE_BYTES (PIPE_BUF: the kernel never splits or interleaves such a write to a pipe), by
`LineHandler`. A longer line keeps its head and its tail and loses its middle, where CUT_MARKER says
how many bytes went (in JSON, inside each field longer than its share of the line, so the line stays
one valid object).
"""

from __future__ import annotations

import io
import logging
import os
import select
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from logging import _SysExcInfoType

import orjson

# Record attributes (set with `extra=`) that a line carries when present.
CONTEXT_FIELDS = ("request_id", "batch_id", "request_ids")
ACCESS_FIELD = "access"  # the access log's fields, a dict: in the JSON object, not repeated in text
LINE_BYTES = 4096  # PIPE_BUF on Linux: the most one write() to a pipe takes whole, never interleaved
CUT_MARKER = " [...{} bytes cut...] "  # in place of the middle of a line that would not fit
TEXT_FORMAT = "%(asctime)s %(levelname)s %(processName)s[%(process)d] %(name)s: %(message)s"
# C0 and C1 controls, DEL, and the Unicode line and paragraph separators: each as its Python escape.
_CONTROL = [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]
_ESCAPES = {code: chr(code).encode("unicode_escape").decode("ascii") for code in _CONTROL}
_TRACEBACK_ESCAPES = {code: escape for code, escape in _ESCAPES.items() if code != ord("\n")}  # (its lines stay lines)


def escape_controls(text: str) -> str:
    """`text` with every control character written as its escape (a newline as `\n`); as it was when it has none."""
    return text if text.isprintable() else text.translate(_ESCAPES)


def cut_to_fit(text: str, max_bytes: int) -> str:
    """`text` when its UTF-8 fits in `max_bytes`; else its head and its tail, between them CUT_MARKER
    with the count of bytes cut (cuts fall between characters)."""
    if len(text) * 6 <= max_bytes:  # (a character takes at most 6 bytes: a lone surrogate's \udcxx) most lines
        return text
    data = text.encode("utf-8", "backslashreplace")  # (as sys.stderr writes a lone surrogate)
    if len(data) <= max_bytes:
        return text
    keep = max(max_bytes - len(CUT_MARKER.format(len(data))), 0)
    head = data[: keep - keep // 2].decode("utf-8", "ignore")  # "ignore": the character the cut split
    tail = data[len(data) - keep // 2 :].decode("utf-8", "ignore") if keep // 2 else ""
    return head + CUT_MARKER.format(len(data) - len(head.encode()) - len(tail.encode())) + tail


def batch_fields(batch_id: int, request_ids: Sequence[str] | None) -> dict[str, Any]:
    """`extra=` of a line about a batch."""
    return {"batch_id": batch_id, "request_ids": list(request_ids or ())}


def request_fields(request_id: str | None) -> dict[str, Any]:
    """`extra=` of a line about one request."""
    return {"request_id": request_id}


def _context(record: logging.LogRecord) -> list[tuple[str, Any]]:
    found = record.__dict__
    return [(key, found[key]) for key in CONTEXT_FIELDS if found.get(key) is not None]


class TextFormatter(logging.Formatter):
    """The classic line, then the ids it is about: `... batch 7 failed: ... [batch_id=7 request_ids=a,b]`."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return cut_to_fit(super().format(record), LINE_BYTES - 1)  # (the handler adds the newline)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - before the traceback, which format() appends
        record.message = escape_controls(record.message)
        line = super().formatMessage(record)
        context = _context(record)
        if not context:
            return line
        ids = " ".join(f"{key}={','.join(value) if isinstance(value, list) else value}" for key, value in context)
        return f"{line} [{ids}]"

    def formatException(self, exc_info: _SysExcInfoType) -> str:  # noqa: N802 - logging.Formatter's method name
        text = super().formatException(exc_info)
        return text if text.isprintable() else text.translate(_TRACEBACK_ESCAPES)


class JsonFormatter(logging.Formatter):
    """One JSON object a line, with the process's role and index (see the module doc)."""

    def __init__(self, role: str, index: int | None = None, generation: int | None = None) -> None:
        super().__init__()
        self.role, self.index, self.generation = role, index, generation

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
            + f".{int((record.created - seconds) * 1000):03d}Z",
            "level": record.levelname,
            "role": self.role,
            "index": self.index,
            "generation": self.generation,
            "pid": record.process,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _context(record):
            doc[key] = value
        access = record.__dict__.get(ACCESS_FIELD)
        if access:
            doc.update(access)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return _fit_json(doc).decode()


def _fit_json(doc: dict[str, Any]) -> bytes:
    """`doc` encoded in at most LINE_BYTES - 1 bytes. While longer, the fields share the room left by the
    line's punctuation evenly, what a short field leaves going to the others (water-filling), and a field
    over its share loses its middle: a string to CUT_MARKER, a list its last items to one CUT_MARKER item."""
    line = _dumps(doc)
    for _ in range(4):  # (once is the rule; escapes can leave a cut field a little over its share)
        if len(line) <= LINE_BYTES - 1:
            return line
        sizes = {key: len(_dumps(value)) for key, value in doc.items()}
        room = LINE_BYTES - 1 - (len(line) - sum(sizes.values()))
        for count, key in enumerate(sorted(sizes, key=sizes.__getitem__)):
            share = room // (len(sizes) - count)
            if sizes[key] > share:
                doc[key] = _cut_value(doc[key], share)
            room -= min(sizes[key], share)
        line = _dumps(doc)
    if len(line) <= LINE_BYTES - 1:
        return line
    head = ("time", "level", "role", "index", "generation", "pid", "logger")
    return _dumps({key: doc.get(key) for key in head} | {"message": CUT_MARKER.format(len(line)).strip()})


def _dumps(value: Any) -> bytes:
    # default=str: an argument orjson cannot encode (a Path, an exception) is written as its str
    return orjson.dumps(value, default=str)


def _cut_value(value: Any, max_bytes: int) -> Any:
    """`value` (a list, or any other as its text) in about `max_bytes` bytes of JSON."""
    if isinstance(value, list):
        kept, size = [], len(CUT_MARKER) + 24
        for item in value:
            size += len(_dumps(item)) + 1
            if size > max_bytes:
                break
            kept.append(item)
        return [*kept, CUT_MARKER.format(len(_dumps(value[len(kept) :]))).strip()]
    text = value if isinstance(value, str) else _dumps(value).decode()
    raw_bytes, json_bytes = len(text.encode("utf-8", "backslashreplace")), len(_dumps(text))
    return cut_to_fit(text, max(raw_bytes * max_bytes // json_bytes, 0))  # (escapes: JSON is longer than UTF-8)


class LineHandler(logging.StreamHandler):
    """Writes each line whole: one os.write() of the encoded line and its newline (see the module doc).

    logging.StreamHandler hands the line to a TextIOWrapper, whose buffer writes a line longer than
    itself in pieces, and a piece of a line longer than PIPE_BUF can land between two of another
    process's. A stream without a file descriptor (a test's StringIO) gets a write() of the line.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        try:
            self.fd: int | None = stream.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):
            self.fd = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = cut_to_fit(self.format(record), LINE_BYTES - 1) + self.terminator  # (a formatter of ours fits)
            if self.fd is None:
                self.stream.write(line)
                self.flush()
            else:
                write_whole(self.fd, line.encode("utf-8", "backslashreplace"))
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - logging's rule: a line that cannot be written never raises
            self.handleError(record)


def write_whole(fd: int, data: bytes) -> None:
    """os.write(fd, data), waiting while a non-blocking pipe is full (a write of at most PIPE_BUF bytes then
    fails whole), and writing the rest where a file or terminal took only part."""
    while data:
        try:
            data = data[os.write(fd, data) :]
        except BlockingIOError:  # another process of the tree may have made the shared pipe non-blocking
            writable = select.poll()
            writable.register(fd, select.POLLOUT)
            writable.poll(1000)
