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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import orjson

# Record attributes (set with `extra=`) that a line carries when present.
CONTEXT_FIELDS = ("request_id", "batch_id", "request_ids")
ACCESS_FIELD = "access"  # the access log's fields, a dict: in the JSON object, not repeated in text
TEXT_FORMAT = "%(asctime)s %(levelname)s %(processName)s[%(process)d] %(name)s: %(message)s"
# C0 and C1 controls, DEL, and the Unicode line and paragraph separators: each as its Python escape.
_CONTROL = [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]
_ESCAPES = {code: chr(code).encode("unicode_escape").decode("ascii") for code in _CONTROL}
_TRACEBACK_ESCAPES = {code: escape for code, escape in _ESCAPES.items() if code != ord("\n")}  # (its lines stay lines)


def escape_controls(text: str) -> str:
    """`text` with every control character written as its escape (a newline as `\n`); as it was when it has none."""
    return text if text.isprintable() else text.translate(_ESCAPES)


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

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - before the traceback, which format() appends
        record.message = escape_controls(record.message)
        line = super().formatMessage(record)
        context = _context(record)
        if not context:
            return line
        ids = " ".join(f"{key}={','.join(value) if isinstance(value, list) else value}" for key, value in context)
        return f"{line} [{ids}]"

    def formatException(self, exc_info) -> str:  # noqa: N802 - logging.Formatter's method name
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
        # default=str: an argument orjson cannot encode (a Path, an exception) is written as its str
        return orjson.dumps(doc, default=str).decode()
