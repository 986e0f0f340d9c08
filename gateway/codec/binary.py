"""KServe v2 binary tensor extension: raw little-endian tensors after the JSON header.

    request body:   <JSON header: Inference-Header-Content-Length bytes><input 0 bytes><input 1 bytes>...
    response body:  <JSON header: Inference-Header-Content-Length bytes><output 0 bytes>...

Each binary tensor is named in the JSON with `parameters.binary_data_size`, in the order
the JSON lists them. Fixed-size types are their native little-endian bytes, row-major, no
padding (BOOL: one byte, 0 or 1). BYTES: per element a 4-byte little-endian length, then
the bytes. A header length of 0 is the raw form: the whole body is the single input.

Inputs become numpy views over the request body (no copy here); the batcher copies them
once, straight into the slot. BYTES inputs become object arrays of bytes, any bytes (images,
serialized protos: Triton's BYTES are not text), and the slot carries them in this same BYTES
form; only the worker's ONNX Runtime session needs text, and refuses there what is not UTF-8
(worker/slots.py). Also here: gzip/deflate request bodies and responses.
"""

from __future__ import annotations

import gzip
import math
import zlib
from collections.abc import Iterator

import numpy as np

from ringserve.common.repository.config import TensorConfig
from ringserve.common.wire import BytesCountError, BytesFormatError, deserialize_bytes_tensor
from ringserve.gateway.core.errors import BadRequest, RequestTooLarge, UnsupportedEncoding, echo
from ringserve.gateway.core.phrases import say

COMPRESS_MIN_BYTES = 1024  # smaller responses gain nothing from gzip and pay its CPU
GZIP_MAGIC = b"\x1f\x8b"
_COMPRESS_LEVEL = 1  # fast: the gateway's CPU is the server's bottleneck, not the wire


def little_endian(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype


# -- request side -----------------------------------------------------------------
def header_length_of(header_length_text: bytes | str) -> int:
    """The Inference-Header-Content-Length value, or BadRequest."""
    try:
        header_length = int(header_length_text)
    except ValueError:
        raise BadRequest(
            say(
                "header_length",
                f"Inference-Header-Content-Length must be a non-negative integer, "
                f"got {echo(_text(header_length_text))}",
                value=echo(_text(header_length_text), quoted=False),
            )
        ) from None
    if header_length < 0:
        raise BadRequest(
            say(
                "header_length",
                f"Inference-Header-Content-Length must be a non-negative integer, got {header_length}",
                value=header_length,
            )
        )
    return header_length


def split_body(
    body: bytes, header_length_text: bytes | str, model: str = ""
) -> tuple[bytes | memoryview, BinaryReader]:
    """(JSON header, reader over the binary part) from the Inference-Header-Content-Length value."""
    header_length = header_length_of(header_length_text)
    if header_length > len(body):
        raise BadRequest(
            say(
                "header_length_range",
                f"Inference-Header-Content-Length is {header_length} but the "
                f"body has only {len(body)} bytes; it must give the length of "
                "the JSON header that starts the body",
                size=len(body),
                value=header_length,
            )
        )
    view = memoryview(body)
    return view[:header_length], BinaryReader(view[header_length:], model)


class BinaryReader:
    """Hands out the binary part of a request body tensor by tensor, in order."""

    def __init__(self, data: memoryview, model: str = "") -> None:
        self.data = data
        self.offset = 0
        self.model = model  # named in the errors

    def take(self, name: str, nbytes: object) -> memoryview:
        if type(nbytes) is not int or nbytes < 0:
            raise BadRequest(
                say(
                    "json_field",
                    f"input {name!r}: parameters.binary_data_size must be a non-negative integer, got {echo(nbytes)}",
                    field="binary_data_size",
                )
            )
        end = self.offset + nbytes
        if end > len(self.data):
            raise BadRequest(
                say(
                    "binary_past_end",
                    f"input {name!r}: binary_data_size {nbytes} runs past the end of "
                    f"the body ({len(self.data) - self.offset} binary bytes are left "
                    "for it); the binary part holds the inputs' bytes in the order "
                    "the JSON lists them",
                    input=name,
                    size=nbytes,
                    model=self.model,
                )
            )
        chunk = self.data[self.offset : end]
        self.offset = end
        return chunk

    def finish(self) -> None:
        left = len(self.data) - self.offset
        if left:
            raise BadRequest(
                say(
                    "binary_left_over",
                    f"the body has {left} bytes after the last input's binary data; "
                    "the binary part must be exactly the sum of the inputs' "
                    "binary_data_size",
                    model=self.model,
                )
            )


def tensor_from_buffer(tensor: TensorConfig, shape: tuple[int, ...], buffer: memoryview, model: str = "") -> np.ndarray:
    """A view over `buffer` (no copy) for fixed-size types; an object array of bytes for BYTES."""
    if tensor.datatype == "BYTES":
        return bytes_input(tensor.name, buffer, shape, model)
    count = math.prod(shape)
    dtype = little_endian(tensor.np_dtype)
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise BadRequest(
            say(
                "input_byte_size",
                f"input {tensor.name!r}: binary_data_size is {len(buffer)} bytes "
                f"but shape {list(shape)} of {tensor.datatype} needs {count} x "
                f"{dtype.itemsize} = {expected} bytes",
                input=tensor.name,
                model=model,
                expected=expected,
                got=len(buffer),
            )
        )
    array = np.frombuffer(buffer, dtype=dtype).reshape(shape)
    if tensor.datatype == "BOOL" and count and np.frombuffer(buffer, dtype=np.uint8).max() > 1:
        raise BadRequest(f"input {tensor.name!r}: BOOL elements must be bytes 0 or 1")
    return array


def bytes_input(name: str, buffer: memoryview, shape: tuple[int, ...], model: str) -> np.ndarray:
    """A BYTES input from its binary data (the slot's form too): an object array of bytes, as sent."""
    try:
        return deserialize_bytes_tensor(buffer, shape)
    except BytesCountError as exc:  # Triton's words for it, by its count
        condition = "string_elements_over" if exc.found > exc.expected else "string_elements"
        detail = f"input {name!r}: {exc}; each element is a 4-byte little-endian length followed by that many bytes"
        raise BadRequest(
            say(condition, detail, expected=exc.expected, got=exc.found, input=name, model=model)
        ) from None
    except BytesFormatError as exc:
        raise BadRequest(
            f"input {name!r}: {exc}; each element is a 4-byte little-endian length followed by that many bytes"
        ) from None


def raw_input_shape(tensor: TensorConfig, batched: bool, body_bytes: int) -> tuple[int, ...]:
    """Shape of the single input of a raw request (header length 0), deduced from the body size.

    Triton's rule (core's infer_request.cc): the body is one request of the config dims, batch 1
    when the model batches, and at most one config dim may be variable; a BYTES input must be one
    element (dims [1]), the body its bytes. Beyond Triton, a batching model whose dims are all
    fixed takes a body of several whole rows (the batch dim is then the one variable).
    """
    dims = list(tensor.dims)
    variable = [i for i, d in enumerate(dims) if d == -1]
    if len(variable) > 1:
        raise BadRequest(
            say(
                "raw_input_variable",
                "a raw request (Inference-Header-Content-Length: 0) needs an input "
                f"with at most one variable dim; {tensor.name!r} has dims {dims}: "
                "send a JSON header with its shape",
                input=tensor.name,
            )
        )
    if tensor.datatype == "BYTES":
        if variable or math.prod(dims) != 1:
            raise BadRequest(
                say(
                    "raw_input_bytes",
                    f"input {tensor.name!r} is BYTES with dims {dims}: a raw "
                    "request's body is one element, for a model whose input has dims [1]; send a JSON "
                    "header with its shape",
                    input=tensor.name,
                )
            )
        return (1, *dims) if batched else tuple(dims)
    fixed = math.prod(d for d in dims if d != -1) * tensor.np_dtype.itemsize
    if variable:
        if not fixed or body_bytes % fixed:
            raise BadRequest(
                f"a raw request's body for {tensor.name!r} {tensor.datatype} {dims} must be a whole "
                f"number of {fixed}-byte steps of its variable dim; got {body_bytes} bytes"
            )
        dims[variable[0]] = body_bytes // fixed
        return (1, *dims) if batched else tuple(dims)
    if batched:
        if body_bytes == 0 or body_bytes % fixed:
            raise BadRequest(
                f"a raw request's body must be a whole number (>= 1) of {fixed}-byte rows of "
                f"{tensor.name!r} {tensor.datatype} {[-1, *dims]}; got {body_bytes} bytes"
            )
        return (body_bytes // fixed, *dims)
    if body_bytes != fixed:
        raise BadRequest(f"input {tensor.name!r} {dims} is {fixed} bytes; a raw request's body has {body_bytes}")
    return tuple(dims)


# -- content encodings ------------------------------------------------------------
INFLATE_CHUNK_BYTES = 1 << 20  # what one step of inflate() makes: about a millisecond of zlib


def inflate(body: bytes, encoding: str) -> Iterator[bytes]:
    """Undo a gzip/deflate Content-Encoding a chunk (at most INFLATE_CHUNK_BYTES) at a time.

    The caller stops at its own limit and may yield to the loop between chunks: a 248 KiB gzip body
    inflating to 250 MiB was inflated whole, in one call on the event loop, before any check.
    """
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        yield body
        return
    gzip_members = encoding in ("gzip", "x-gzip")
    if gzip_members:
        attempts = (16 + zlib.MAX_WBITS,)
    elif encoding == "deflate":
        # HTTP's "deflate" is the zlib format; some clients send bare deflate: accept both.
        attempts = (zlib.MAX_WBITS, -zlib.MAX_WBITS)
    else:
        raise UnsupportedEncoding(encoding)
    for wbits in attempts:  # (the first chunk tells the format)
        inflater = zlib.decompressobj(wbits)
        try:
            chunk = inflater.decompress(body, INFLATE_CHUNK_BYTES)
            break
        except zlib.error as exc:
            error = exc
    else:
        raise BadRequest(f"the body is not valid {encoding} data ({error})") from None
    while True:
        if chunk:
            yield chunk
        if inflater.eof:
            # gzip allows members one after another (RFC 1952, what `cat a.gz b.gz` makes): each is decoded.
            if not (gzip_members and inflater.unused_data[:2] == GZIP_MAGIC):
                break
            pending, inflater = inflater.unused_data, zlib.decompressobj(attempts[0])
        else:
            pending = inflater.unconsumed_tail
            if not pending and len(chunk) < INFLATE_CHUNK_BYTES:
                break  # the input is used up and nothing more came out: truncated
        try:
            chunk = inflater.decompress(pending, INFLATE_CHUNK_BYTES)
        except zlib.error as exc:
            raise BadRequest(f"the body is not valid {encoding} data ({exc})") from None
    if not inflater.eof:
        raise BadRequest(f"the {encoding} body is truncated: its compressed stream does not end")
    if inflater.unused_data:
        raise BadRequest(
            f"the {encoding} body has {len(inflater.unused_data)} bytes after its compressed stream; "
            "send the compressed stream alone"
        )


def decode_content(body: bytes, encoding: str, limit_bytes: int) -> bytes:
    """The whole decoded body at once, refusing anything that inflates past `limit_bytes`."""
    chunks, size = [], 0
    for chunk in inflate(body, encoding):
        size += len(chunk)
        if size > limit_bytes:
            raise RequestTooLarge(size, limit_bytes, what=f"the {encoding.strip().lower()}-decoded request body")
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def pick_encoding(accept_encoding: str) -> str | None:
    """gzip or deflate when the client's Accept-Encoding allows it (q > 0), else None."""
    allowed = {}
    for part in accept_encoding.lower().split(","):
        name, _, params = part.strip().partition(";")
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                q = 0.0
        allowed[name.strip()] = q
    for name in ("gzip", "deflate"):
        if allowed.get(name, 0.0) > 0:
            return name
    return None


def encode_content(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.compress(body, compresslevel=_COMPRESS_LEVEL, mtime=0)
    return zlib.compress(body, _COMPRESS_LEVEL)


def _text(value: bytes | str) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value
