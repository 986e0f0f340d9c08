"""gateway/observe/access.py: which X-Request-ID is kept, what replaces the others, and where the id goes
(error bodies, the BATCH's request_ids, a poison request's record, the access line's batch size)."""
from __future__ import annotations

import logging

import orjson
import pytest

from ringserve.common.supervisor_messages import QuarantineModel
from ringserve.gateway.observe.access import (MAX_REQUEST_ID_CHARS, AccessLog, header_request_id, new_request_id,
                                      request_id_of)
from ringserve.gateway.core.errors import error_body

from .test_dispatch import WIDE, Harness, rows
from tests.support.gateway_fakes import dispatch_settings


@pytest.mark.parametrize("value", [b"abc-123", b"3f2a8c9e-1b2d-4c5e-8f90-123456789abc", b"01HZX3J6Q8Y2T5R7W9K0M4N6P8",
                                   b"1-5759e988-bd862e3fe1be46a994272793", b"dGVzdA==/+_.:@",
                                   b"a" * MAX_REQUEST_ID_CHARS])
def test_a_client_id_of_safe_characters_within_the_bound_is_kept(value):
    assert request_id_of(value) == value.decode()


@pytest.mark.parametrize("value", [b"", b"a" * (MAX_REQUEST_ID_CHARS + 1), b"has space", b'quo"te', b"new\nline",
                                   b"tab\there", b"semi;colon", b"<script>", "caf\u00e9".encode(), b"\x00"])
def test_any_other_id_is_replaced_by_a_made_one_not_refused(value):
    replaced = request_id_of(value)
    assert replaced != value.decode("latin-1") and _made(replaced)


def test_grpc_metadata_gives_str_and_is_judged_the_same():
    assert request_id_of("from-grpc.1") == "from-grpc.1"
    assert _made(request_id_of("caf\u00e9")) and _made(request_id_of("has space")) and _made(request_id_of(None))


def test_made_ids_are_unique_and_share_the_process_prefix():
    ids = [new_request_id() for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(_made(i) for i in ids)
    assert len({i.rsplit("-", 1)[0] for i in ids}) == 1


def test_the_header_is_found_among_the_raw_headers():
    assert header_request_id([(b"host", b"x"), (b"x-request-id", b"mine")]) == "mine"
    assert _made(header_request_id([(b"host", b"x")]))


def test_error_bodies_carry_the_request_id_when_there_is_one():
    assert orjson.loads(error_body("bad", "id-1")) == {"error": "bad", "request_id": "id-1"}
    assert orjson.loads(error_body("bad")) == {"error": "bad"}


def test_the_access_line_has_its_fields_and_shows_under_log_level_warning(caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger(), "level", logging.WARNING)  # --log-level WARNING
    logging.getLogger("ringserve.access").setLevel(logging.NOTSET)
    access = AccessLog()
    access.write("POST", "/v2/models/m/infer", 200, 123, 0, "id-9", "m", 8)
    (record,) = [r for r in caplog.records if r.name == "ringserve.access"]
    assert record.levelno == logging.INFO and "POST /v2/models/m/infer 200 123B" in record.getMessage()
    assert {k: v for k, v in record.access.items() if k != "latency_ms"} == {
        "method": "POST", "path": "/v2/models/m/infer", "status": 200, "bytes": 123, "model": "m", "batch_size": 8,
        "request_id": "id-9"}


def test_a_batch_carries_its_requests_ids_in_row_order_and_each_request_learns_its_batch_size(segment, loop):
    h = Harness(segment, loop, dispatch_settings())
    h.ready(0, 1)
    first, second = h.request(rows(2, 0.0), WIDE), h.request(rows(3, 100.0), WIDE)
    first.request_id, second.request_id = "id-a", "id-b"
    for request in (first, second):
        h.dispatcher.submit(request)
    h.settle()
    (sent,) = h.sent
    assert sent.batch.request_ids == ["id-a", "id-b"]
    h.answer(sent)
    assert (first.batch_size, second.batch_size) == (5, 5)


def test_a_poison_request_is_recorded_and_told_with_its_id(segment, loop):
    h = Harness(segment, loop, dispatch_settings(max_inflight_per_worker=1))
    poison = h.request(rows(1, 0.0), WIDE)
    poison.request_id = "the-poison"
    h.isolate_as_poison(poison)
    assert poison.future.done()
    told = [m for m in h.port.supervisor if isinstance(m, QuarantineModel)]
    assert told == [QuarantineModel("wide", "SIGSEGV", poison_request=True, request_id="the-poison")]
    (record,) = h.dispatcher.recovery.poison_requests["wide"]
    assert (record["request_id"], record["reason"]) == ("the-poison", "SIGSEGV")


def _made(request_id: str) -> bool:
    """An id the gateway made: 12 hex digits of this process's prefix, '-', a counter."""
    prefix, _, counter = request_id.partition("-")
    return len(prefix) == 12 and all(c in "0123456789abcdef" for c in prefix) and counter.isdigit()
