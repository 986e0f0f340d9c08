"""Read a server-sent-events answer over a raw socket, noting when each event arrived (no client library buffers
it): what `curl -N` shows, with times."""
from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable
from typing import Any

EVENT = re.compile(rb"data: (.*?)\n\n", re.S)


def post_events(port: int, path: str, body: dict, timeout_s: float = 60,
                seen: Callable[[Any], None] | None = None) -> tuple[int, dict[str, str], list[tuple[float, Any]]]:
    """POST `body` to `path`; (status, headers, [(monotonic arrival time, event JSON)]) once the answer ends
    (a plain JSON answer: its document as the one event, at its arrival). `seen` is called with each event as
    it arrives."""
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    events: list[tuple[float, Any]] = []
    buffer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(head + payload)
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buffer += chunk
            now = time.monotonic()
            for match in list(EVENT.finditer(buffer))[len(events):]:
                events.append((now, json.loads(match.group(1))))
                if seen is not None:
                    seen(events[-1][1])
    header_block, _, rest = buffer.partition(b"\r\n\r\n")
    lines = header_block.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("content-type") == "application/json":
        events = [(time.monotonic(), json.loads(rest))]
    return status, headers, events
