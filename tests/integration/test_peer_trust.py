"""The gateways' own Unix sockets are where peer calls come in, and the only place: on the real stack
(`--gateways 2`, an API key), `?scope=gateway` from TCP is refused, the peer sockets need no key, and
no gateway ever sends the key to a peer socket (one a local user slipped into the runtime dir gets none).
"""
from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import httpx
import pytest

from tests.support.stack import poll_for
from .test_gateways import GATEWAYS, gateway_client, runtime_dir, start  # noqa: F401 (a fixture)
from .test_systemd import stop_and_check

pytestmark = pytest.mark.integration

KEY = "k3y-of-the-peer-tests"


class FakePeer:
    """A listener in gateway 1's place (as a user who could swap the runtime dir would put it): it
    answers 200 with an empty body and keeps every request head it was sent."""

    def __init__(self, path: str) -> None:
        os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.heads: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn:
                head = b""
                while b"\r\n\r\n" not in head and (chunk := conn.recv(65536)):
                    head += chunk
                self.heads.append(head.split(b"\r\n\r\n")[0])
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


def test_peer_calls_come_only_on_the_peer_sockets_which_need_and_get_no_api_key(demo_repo: Path, runtime_dir: str,
                                                                                 tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    stack = start(demo_repo, runtime_dir, "--api-key-file", str(key_file), "--allow-client-shm")
    auth = {"authorization": f"Bearer {KEY}"}
    fake = None
    try:
        with httpx.Client(base_url=stack.url, headers=auth, timeout=60) as tcp:
            # From outside, ?scope=gateway is refused (400 naming it), whatever the route; the server's scope works.
            for method, url in (("GET", "/metrics"), ("GET", "/admin/status"), ("GET", "/v2/models/stats"),
                                ("GET", "/v2/systemsharedmemory/status"),
                                ("POST", "/v2/systemsharedmemory/region/r/register"),
                                ("POST", "/v2/systemsharedmemory/region/r/unregister")):
                body = {"key": "/rs-test-shmx-none", "byte_size": 8} if url.endswith("/register") else None
                refused = tcp.request(method, url, params={"scope": "gateway"}, json=body)
                assert refused.status_code == 400, (url, refused.text)
                assert refused.json()["error"].startswith("scope=gateway is only for this server's gateways"), url
            assert tcp.get("/admin/status", params={"scope": "server"}).status_code == 200
            assert tcp.get("/v2/systemsharedmemory/status").json() == []
            assert httpx.get(stack.url + "/admin/status").status_code == 401  # (TCP still needs the key)
        # On a gateway's own socket: its own share, and no key needed (its 0700 dir is the trust).
        for k in range(GATEWAYS):
            with gateway_client(runtime_dir, k) as own:
                assert own.get("/admin/status", params={"scope": "gateway"}).json()["gateway"]["index"] == k
                assert own.get("/v2/models/mlp").status_code == 200

        # Gateway 1's socket swapped for a listener of someone else's: the scrapes that gateway 0
        # answers ask it for gateway 1's share, and must not hand it the key.
        fake = FakePeer(f"{runtime_dir}/gateway-1.http")

        def scraped_through_the_fake() -> bool:
            with httpx.Client(base_url=stack.url, headers=auth, timeout=60) as tcp:  # (a new connection each)
                assert tcp.get("/metrics").status_code == 200
            return bool(fake.heads)
        poll_for(scraped_through_the_fake, 60, 0.05, what="a scrape answered by gateway 0")
        for head in fake.heads:
            assert head.startswith(b"GET /metrics?scope=gateway HTTP/1.1\r\n"), head
            assert b"authorization" not in head.lower() and KEY.encode() not in head, head
    finally:
        if fake is not None:
            fake.close()
        stop_and_check(stack)
