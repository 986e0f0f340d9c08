"""The raw-request index beside Triton's key: an HTTP infer request's bytes -> the answer's bytes.

A hit on Triton's key (entries.py) still pays the HTTP front end's work: the JSON parsed and checked into
arrays, the inputs hashed, the outputs encoded to JSON again. On the bench's mlp row (9 KB of JSON) that was
149 µs of the gateway's CPU per hit against 56 µs for a raw-ASGI app that only parses the body. So HTTP's
infer route (gateway/http/routes.py) first hashes what it read, unparsed:

    the path (model and version as named), the version it resolved to, Inference-Header-Content-Length,
    Accept-Encoding, and the body's bytes        -> SHA-256, first 16 bytes (a key apart from Triton's BLAKE2b)

and looks that up in the same store (shm/cache.py, kind USED_RAW: same budget, same LRU, not counted in
Triton's entries, insertions or evictions). A hit is the exact answer once sent for those bytes (its headers
but X-Request-ID, and its body), written back at once and counted as Triton's cache hit. A miss goes the
whole way, where Triton's key may still hit (the same tensors in other JSON, or the same bytes seen once
before); when Triton's key hits and the answer is 200, it is stored under the raw key too. Only then: a
request's first sight stores its response under Triton's key alone, so a request never sent twice costs a
raw lookup (the hash and a locked probe, ~15 µs) but no second entry in the budget nor a second insertion
(~8 µs, ~18 with an eviction). On a 16 KiB store cycling 256 rows (bench mlp's ringserve_cache_miss, 16
clients), storing at first sight made a miss 40 µs dearer than before the index (267 against 227 µs of
server CPU); storing at second sight, 22 (237 against 215). A hit: 45 µs, beside 46 for the send-once ceiling.

Where the answer depends on more than those bytes, the index is not used (`bypasses`):
    - a Content-Encoding on the request (the body is decoded first; rare, and not worth a second key)
    - "shared_memory_region" anywhere in the body: inputs read from, or outputs written to, a client's
      region, whose contents the bytes do not hold (a binary part that happens to hold the word bypasses too)
    - an active trace (the span wants the parse, queue and compute steps)
    - a model whose config does not enable response_cache; and nothing is stored under a raw key for a
      request whose whole way used no Triton key (outputs into a region), nor for an answer other than 200
The API key is checked before the infer route runs (gateway/http/app.py), so a cached body never answers
an unauthenticated request. The answer's "id" comes from the body's "id" (in the key); X-Request-ID is the
request's own, added at each answer. Headers the route does not read (Content-Type, tracing headers while no
trace is active) do not change the answer.
"""

from __future__ import annotations

import hashlib
import struct

KEY_BYTES = 16
SHM_MARK = b"shared_memory_region"
_LENGTH = struct.Struct("<I")
Headers = list[tuple[bytes, bytes]]


def bypasses(body: bytes, content_encoding: bytes | None, span: object) -> bool:
    """Whether this request's answer may depend on more than its raw bytes (see the module's list)."""
    return content_encoding is not None or span is not None or SHM_MARK in body


def raw_key(path: str, version: int, header_length: bytes | None, accept_encoding: bytes | None, body: bytes) -> bytes:
    """The 16-byte raw key of an HTTP infer request."""
    digest = hashlib.sha256(
        b"ringserve-raw-1\0%s\0%d\0%s\0%s\0"
        % (
            path.encode(),
            version,
            b"-" if header_length is None else header_length,
            b"-" if accept_encoding is None else accept_encoding,
        )
    )
    digest.update(body)
    return digest.digest()[:KEY_BYTES]


def encode_answer(headers: Headers, payload: bytes) -> bytes:
    """An answer's headers ("name: value" lines) and body as one stored value."""
    head = b"\r\n".join(name + b": " + value for name, value in headers)
    return b"".join((_LENGTH.pack(len(head)), head, payload))


def decode_answer(value: bytes) -> tuple[Headers, bytes]:
    (head_bytes,) = _LENGTH.unpack_from(value, 0)
    at = _LENGTH.size + head_bytes
    headers = []
    for line in value[_LENGTH.size : at].split(b"\r\n"):
        name, _, header_value = line.partition(b": ")
        headers.append((name, header_value))
    return headers, value[at:]
