"""gateway/http/routes.py: the repository endpoints read their body as the infer path does."""
from __future__ import annotations

from starlette.requests import Request

from ringserve.gateway.http.routes import Endpoints


def endpoints(max_request_bytes: int = 1024, body_timeout_s: float = 0.1) -> Endpoints:
    return Endpoints(None, max_request_bytes, body_timeout_s=body_timeout_s)


def request(messages: list[dict], headers: list[tuple[bytes, bytes]] = ()) -> Request:
    async def receive() -> dict:
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/v2/repository/index", "headers": list(headers),
             "path_params": {}, "query_string": b""}
    return Request(scope, receive)


def test_a_client_that_hangs_up_mid_body_gets_499_not_a_traceback(loop):
    r = request([{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}])
    response = loop.run_until_complete(endpoints().repository_index(r))
    assert response.status_code == 499


def test_a_body_over_max_request_bytes_gets_413_before_it_is_read(loop):
    r = request([], headers=[(b"content-length", b"300000000")])
    response = loop.run_until_complete(endpoints().repository_index(r))
    assert response.status_code == 413 and b"--max-request-bytes" in response.body

    r = request([{"type": "http.request", "body": b" " * 800, "more_body": True},
                 {"type": "http.request", "body": b" " * 800, "more_body": True}])  # no Content-Length (chunked)
    response = loop.run_until_complete(endpoints().repository_index(r))
    assert response.status_code == 413


def test_a_body_in_pieces_is_read_whole(loop):
    r = request([{"type": "http.request", "body": b'{"ready"', "more_body": True},
                 {"type": "http.request", "body": b': true}', "more_body": False}])
    assert loop.run_until_complete(endpoints()._json_body(r)) == {"ready": True}


def test_a_ready_nested_250000_deep_reads_as_in_l0_http(loop):
    """qa/L0_http test_repository_index_deeply_nested_json: Triton parses the body, then finds 'ready' no boolean."""
    body = b'{"ready":' + b"[" * 250000 + b"true" + b"]" * 250000 + b"}"
    r = request([{"type": "http.request", "body": body, "more_body": False}])
    response = loop.run_until_complete(endpoints(max_request_bytes=1 << 20).repository_index(r))
    assert response.status_code == 400
    assert b"Invalid value for 'ready': expected a boolean" in response.body
    r = request([{"type": "http.request", "body": b'{"other":' + b"[" * 2000 + b"]" * 2000 + b"}", "more_body": False}])
    response = loop.run_until_complete(endpoints(max_request_bytes=1 << 20).repository_index(r))
    assert response.status_code == 400 and b"failed to parse the request JSON buffer" in response.body
