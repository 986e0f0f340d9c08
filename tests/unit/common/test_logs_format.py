"""common/logfmt.py and configure_logging: one JSON object a line with the process's role and the ids
a line is about; in text, the ids in brackets after the message."""
from __future__ import annotations

import fcntl
import io
import logging
import os
import re
import select
import sys
import threading
import time

import orjson
import pytest

from ringserve.common.logfmt import LINE_BYTES, JsonFormatter, LineHandler, TextFormatter, batch_fields, cut_to_fit
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
    hooks = sys.excepthook, threading.excepthook
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        sys.excepthook, threading.excepthook = hooks
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


CUT = re.compile(r" \[\.\.\.(\d+) bytes cut\.\.\.\] ")


def test_a_text_that_fits_is_kept_and_a_longer_one_loses_its_middle_between_characters():
    assert cut_to_fit("short", 5) == "short"
    text = "a" + "\u00e9" * 5000 + "z"  # 10002 bytes
    cut = cut_to_fit(text, 100)
    assert len(cut.encode()) <= 100 and cut.startswith("a\u00e9") and cut.endswith("\u00e9z")
    head, tail = CUT.split(cut)[0], CUT.split(cut)[2]
    assert len(head.encode()) + len(tail.encode()) + int(CUT.search(cut)[1]) == len(text.encode())
    assert cut_to_fit("x" * 50, 3).startswith(" [...")  # (a budget below the marker: the marker alone)


def test_a_long_json_line_stays_one_object_cut_in_its_longest_field_and_its_end_kept():
    message = "start " + "\x01" * 3000 + " end"  # each control character takes 6 bytes escaped
    try:
        raise ValueError("x" * 6000)
    except ValueError:
        line = record(message, (), exc_info=sys.exc_info(), **batch_fields(3, [f"id-{n:0>60}" for n in range(200)]))
    text = JsonFormatter("worker", 0).format(line)
    doc = orjson.loads(text)
    assert len(text.encode()) <= LINE_BYTES - 1
    assert CUT.search(doc["exception"]) and doc["exception"].endswith("x" * 100)
    assert doc["request_ids"][0] == "id-" + "0" * 60 and CUT.fullmatch(" " + doc["request_ids"][-1] + " ")
    assert doc["message"].startswith("start \x01") and doc["message"].endswith("\x01 end")
    assert (doc["role"], doc["batch_id"]) == ("worker", 3)


def test_a_long_text_line_keeps_its_head_and_the_end_of_its_traceback():
    try:
        raise ValueError("the reason")
    except ValueError:
        line = record("failed: %s", ("y" * 9000,), exc_info=sys.exc_info())
    text = TextFormatter().format(line)
    assert len(text.encode()) <= LINE_BYTES - 1 and CUT.search(text)
    assert " WARNING " in text.split("\n")[0] and text.endswith("ValueError: the reason")


def test_the_handler_writes_each_line_in_one_write_and_waits_out_a_full_non_blocking_pipe():
    """A pipe made non-blocking by another process of the tree refuses a write whole while full: the line
    waits, and comes whole once the reader drains it."""
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, fcntl.F_SETFL, fcntl.fcntl(write_fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    filler = b"f" * 65536
    while True:  # fill the pipe to its last byte
        try:
            os.write(write_fd, filler)
        except BlockingIOError:
            if len(filler) == 1:
                break
            filler = filler[: len(filler) // 2]
    handler = LineHandler(os.fdopen(write_fd, "w"))
    handler.setFormatter(JsonFormatter("gateway", 0))
    got = bytearray()
    writer = threading.Thread(target=handler.emit, args=(record("whole %s", ("\u00e9" * 1500,)),))
    try:
        writer.start()
        writer.join(0.2)
        assert writer.is_alive()  # waiting for room, not failing, not writing a part
        deadline = time.monotonic() + 10  # (a line that never comes fails the test, not hangs it)
        while not got.endswith(b"\n") and time.monotonic() < deadline:
            if select.select([read_fd], [], [], 0.1)[0]:
                got = (got + os.read(read_fd, 65536)).lstrip(b"f")
        writer.join(timeout=10)
    finally:
        handler.stream.close()
        os.close(read_fd)
    assert orjson.loads(got)["message"] == "whole " + "\u00e9" * 1500


def test_an_uncaught_exception_in_a_thread_is_one_text_record_with_its_traceback(restore_logging, monkeypatch):
    """Python's own hook writes the traceback line by line, between which other processes' lines can land."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    configure_logging("worker", "INFO", index=2)
    writes = []
    monkeypatch.setattr(stream, "write", writes.append)
    thread = threading.Thread(target=lambda: {}["missing"])
    thread.start()
    thread.join()
    (record,) = writes
    assert " CRITICAL worker-2[" in record.split("\n")[0] and record.split("\n")[1] == "Traceback (most recent call last):"
    assert record.endswith("KeyError: 'missing'\n")


def test_configure_logging_makes_stdout_line_buffered_so_a_models_print_leaves_line_by_line(
        restore_logging, monkeypatch):
    stdout = io.TextIOWrapper(io.BytesIO())
    monkeypatch.setattr(sys, "stdout", stdout)
    configure_logging("worker", "INFO", index=0)
    assert stdout.line_buffering
