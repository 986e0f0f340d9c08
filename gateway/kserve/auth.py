"""The server's API key (--api-key): what HTTP's Authorization header and gRPC's `authorization`
metadata are checked against. Which paths and RPCs need it is each front end's (--api-key-everywhere:
health and metrics too)."""

from __future__ import annotations

import hmac

from ringserve.gateway.core.errors import Unauthorized


class ApiKey:
    """The server's API key, checked against a request's `Authorization: Bearer <key>` header."""

    def __init__(self, key: str) -> None:
        self._key = key.strip().encode()

    def refusal(self, headers: list[tuple[bytes, bytes]]) -> Unauthorized | None:
        for name, value in headers:
            if name == b"authorization":
                scheme, _, credentials = value.strip().partition(b" ")
                # The scheme is case-insensitive (RFC 7235). Constant time: how much of a guess matched
                # must not show in the timing.
                if scheme.lower() == b"bearer" and hmac.compare_digest(credentials.lstrip(), self._key):
                    return None
                return Unauthorized("the API key in the Authorization header is wrong")
        return Unauthorized("this endpoint needs the server's API key")
