"""common/logfmt.py and configure_logging: one JSON object a line with the process's role and the ids
a line is about; in text, the ids in brackets after the message."""
from __future__ import annotations

import io
import logging
import sys

import orjson
import pytest

from ringserve.common.logfmt import JsonFormatter, TextFormatter, batch_fields
from ringserve.common.process import configure_logging


def record(message: str = "batch %d failed", args: tuple = (7,), level: int = logging.WARNING, **extra
           ) -> logging.LogRecord:
    r = logging.LogRecord("ringserve.worker.loop", level, __file__, 1, message, args, None)
    r.__dict__.update(extra)
    r.created = 1796152151.0834
    return r


def test_a_json_line_has_time_level_role_index_and_the_message():
    doc = orjson.loads(JsonFormatter("worker", 2, 5).format(record()))
    assert doc == {"time": "2026-12-01T19:09:11.083Z", "level": "WARNING", "role": "worker", "index": 2,
                   "generation": 5, "pid": doc["pid"], "logger": "ringserve.worker.loop", "message": "batch 7 failed"}


def test_a_line_about_a_batch_carries_its_id_and_its_requests_ids():
    line = record(**batch_fields(7, ["a", "b"]))
    assert orjson.loads(JsonFormatter("worker", 0).format(line))["request_ids"] == ["a", "b"]
    assert orjson.loads(JsonFormatter("worker", 0).format(line))["batch_id"] == 7
    assert TextFormatter().format(line).endswith("batch 7 failed [batch_id=7 request_ids=a,b]")
    assert TextFormatter().format(record()).endswith("batch 7 failed")  # no ids: no brackets


def test_a_line_about_one_request_carries_its_id():
    line = record("expired", (), request_id="r-1")
    assert orjson.loads(JsonFormatter("gateway", 1).format(line))["request_id"] == "r-1"
    assert TextFormatter().format(line).endswith("expired [request_id=r-1]")


def test_the_traceback_stays_inside_the_json_object():
    try:
        raise ValueError("boom")
    except ValueError:
        line = record("failed", (), exc_info=sys.exc_info())
    text = JsonFormatter("supervisor").format(line)
    assert "\n" not in text and "ValueError: boom" in orjson.loads(text)["exception"]


def test_an_argument_json_cannot_encode_is_written_as_its_text():
    line = record("at %s", (object(),), request_id=object())
    assert orjson.loads(JsonFormatter("gateway", 0).format(line))["request_id"].startswith("<object object")


def test_the_access_fields_join_the_object_and_are_not_repeated_in_text():
    line = record("GET / 200", (), level=logging.INFO, access={"method": "GET", "status": 200, "request_id": "x"})
    doc = orjson.loads(JsonFormatter("gateway", 0).format(line))
    assert (doc["method"], doc["status"], doc["request_id"]) == ("GET", 200, "x")
    assert TextFormatter().format(line).endswith("GET / 200")


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    hooks = sys.excepthook
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        sys.excepthook = hooks
        logging.captureWarnings(False)


def test_configure_logging_json_formats_every_logger_uvicorns_too(restore_logging, monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    configure_logging("gateway", "INFO", "json", index=3, generation=1)
    logging.getLogger("uvicorn.error").warning("uvicorn says %s", "hi")
    logging.getLogger("ringserve.gateway.dispatch.recovery").info("requeued", extra=batch_fields(9, ["q"]))
    first, second = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    assert (first["role"], first["index"], first["logger"], first["message"]) == (
        "gateway", 3, "uvicorn.error", "uvicorn says hi")
    assert (second["batch_id"], second["request_ids"]) == (9, ["q"])


def test_configure_logging_text_keeps_the_classic_line(restore_logging, monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    configure_logging("worker", "INFO", index=1)
    logging.getLogger("ringserve.worker").info("hello")
    assert " INFO worker-1[" in stream.getvalue() and stream.getvalue().rstrip().endswith("ringserve.worker: hello")


def test_a_text_line_escapes_the_control_characters_a_client_put_in_its_message():
    """A path with %0a (uvicorn decodes it) forged a line of its own; %1b reached the terminal raw."""
    forged = record("POST %s 404", ("/v2/models/m\n2026-01-01 00:00:00,000 INFO forged\r\x1b[2J\x85\u2028/infer",))
    line = TextFormatter().format(forged)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\x85" not in line
    assert line.endswith("POST /v2/models/m\\n2026-01-01 00:00:00,000 INFO forged\\r\\x1b[2J\\x85\\u2028/infer 404")
    assert TextFormatter().format(record("caf\u00e9 \u00e0 l'\u00e9t\u00e9\tok", ())).endswith("café à l'été\\tok")


def test_a_text_traceback_keeps_its_lines_but_not_a_clients_escape_sequences():
    try:
        raise ValueError("model 'm\x1b[31m'")
    except ValueError:
        line = record("failed", (), exc_info=sys.exc_info())
    text = TextFormatter().format(line)
    assert "\x1b" not in text and "ValueError: model 'm\\x1b[31m'" in text
    assert text.count("\n") >= 3  # the traceback's own lines
