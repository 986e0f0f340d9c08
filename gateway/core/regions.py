"""Triton's system shared-memory extension: regions a client registers, tensors read from and written into them.

A client creates a POSIX shared-memory segment (`tritonclient.utils.shared_memory`), registers a
region of it by name (`POST /v2/systemsharedmemory/region/<name>/register` with `key`, `offset`,
`byte_size`), then names the region in an input's or a requested output's parameters
(`shared_memory_region`, `shared_memory_offset`, `shared_memory_byte_size`) instead of sending the data.

Off unless the server is started with `--allow-client-shm` (Triton 26.09's flag and default): a
client that may register a key makes the server open, read and write any segment its user can
open. Then `--client-shm-key-prefix` (repeatable) narrows the keys a client may name.

Copies. An input in a region is a `RegionInput` at parse: where it lies, no bytes yet. The batcher
reads it once with `os.preadv` on the segment's descriptor, straight into its place in the batch's
ring slot (gateway/batching/slots.py write_batch). An output in a region is written once from the worker's
output area in the slot into the segment (`write_outputs`, `os.pwritev`) before the slot is freed.

Safety, and why each rule:
- No mapping of a client's segment, ever: the client owns its size. A read through a mapping of a
  segment the client truncates is SIGBUS, which kills the gateway (a check of the size before the
  read only narrows the race: a client truncating and restoring in a loop won it within seconds).
  preadv past the end returns fewer bytes, and pwritev cannot fault: a short read is that
  request's 400 (`RegionReadFailed`), and the batch is written again without it.
- The gateway opens a key with plain `shm_open(O_RDWR)` (glibc adds O_NOFOLLOW) under the server's
  own user: a client can name only what that user may open. Keys with a '/' past the leading one,
  '.'/'..', NUL, and the server's own ring segments (`ringserve-*`: their names are listed in
  /dev/shm) are refused; only regular files are opened.
- Nothing here touches `multiprocessing`'s resource tracker (Python 3.11's SharedMemory registers
  what it attaches and unlinks it at exit): the segment is the client's, never ours to unlink.
- offset + byte_size is checked against the segment's real size (fstat) at register, and each
  tensor's offset + size against the registered region at parse.
- A request holds its Region (the descriptor): an unregister while it waits drops the name only, the
  descriptor lives until the request is answered (Triton defers the unmap the same way), so it is
  served. A client that unlinks its segment changes nothing either (the descriptor keeps the memory).
"""

from __future__ import annotations

import math
import os
import stat
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from ringserve.common.repository.config import ModelConfig
from ringserve.common.wire import serialize_bytes_tensor
from ringserve.gateway.core.errors import echo
from ringserve.gateway.core.phrases import say
from ringserve.gateway.core.region_errors import MAX_NAME_CHARS, RegionError
from ringserve.shm.segment import SEGMENT_PREFIX

try:  # CPython's own binding of shm_open(3), used by multiprocessing.shared_memory (Linux, macOS)
    from _posixshmem import shm_open as _shm_open
except ImportError:  # pragma: no cover - not a POSIX build
    _shm_open = None

PARAM_REGION = "shared_memory_region"
PARAM_OFFSET = "shared_memory_offset"
PARAM_BYTE_SIZE = "shared_memory_byte_size"
SIZE_MAX = 2**64 - 1  # Triton's size_t: an offset + byte_size past it is its "Integer overflow" refusal


class RegionReadFailed(RegionError):
    """An input's bytes that could not be read from its region (the client truncated the segment): 400
    for that request alone; `source` tells the batcher which request it was."""

    def __init__(self, source: RegionInput, message: str) -> None:
        super().__init__(message)
        self.source = source


@dataclass(eq=False)
class Region:
    """One registered region: `byte_size` bytes at `offset` in the segment `key`, open read-write
    (read with preadv and written with pwritev: never mapped)."""

    name: str
    key: str
    offset: int
    byte_size: int
    fd: int

    def status(self) -> dict[str, Any]:
        """Triton's status entry."""
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def check_intact(self) -> None:
        """400 when the client has truncated its segment under the region (an output would not fit)."""
        size = os.fstat(self.fd).st_size
        if size < self.offset + self.byte_size:
            raise RegionError(
                f"shared memory region {self.name!r}: its segment {self.key!r} was truncated to "
                f"{size} bytes while a request used it; the region needs offset {self.offset} + "
                f"byte_size {self.byte_size} = {self.offset + self.byte_size} bytes"
            )

    def span(self, what: str, params: dict) -> tuple[int, int]:
        """(offset, byte_size) of a tensor's parameters, checked against this region."""
        offset = params.get(PARAM_OFFSET, 0)
        byte_size = params.get(PARAM_BYTE_SIZE)
        if byte_size is None:
            raise RegionError(
                f"{what}: parameters.{PARAM_REGION} needs parameters.{PARAM_BYTE_SIZE} (the tensor's "
                f"size in bytes; {PARAM_OFFSET} is optional, 0 by default)"
            )
        for field, value in ((PARAM_OFFSET, offset), (PARAM_BYTE_SIZE, byte_size)):
            if type(value) is not int or value < 0:
                raise RegionError(f"{what}: parameters.{field} must be a non-negative integer, got {echo(value)}")
        if offset < self.byte_size and offset + byte_size > SIZE_MAX:  # (Triton's size_t overflow check)
            raise RegionError(
                say(
                    "shm_overflow",
                    f"{what}: {PARAM_BYTE_SIZE} {byte_size} runs past region {self.name!r} ({self.byte_size} bytes)",
                    byte_size=byte_size,
                    offset=offset,
                    max=SIZE_MAX,
                    name=self.name,
                )
            )
        if offset >= self.byte_size or offset + byte_size > self.byte_size:
            # Triton's order: an offset at or past the end, the sum past SIZE_MAX (above), a tensor past the end.
            raise RegionError(
                say(
                    "shm_offset" if offset >= self.byte_size else "shm_offset_size",
                    f"{what}: {PARAM_OFFSET} {offset} + {PARAM_BYTE_SIZE} {byte_size} = "
                    f"{offset + byte_size} runs past region {self.name!r} (byte_size {self.byte_size}); "
                    f"offset must be < {self.byte_size} and offset + byte_size <= {self.byte_size}",
                    name=self.name,
                )
            )
        return offset, byte_size


@dataclass(frozen=True, slots=True, eq=False)
class RegionInput:
    """An input that lies in a region: what parse, the lanes and the batcher need of an array (shape,
    dtype, sizes), and `read_into` its place in a slot. It holds no bytes: a client's segment is read
    only by preadv, once, in the loop step that writes the batch."""

    what: str  # "input 'x'", for messages
    region: Region
    position: int  # in the segment: the region's offset + the tensor's shared_memory_offset
    shape: tuple[int, ...]
    dtype: np.dtype
    check_bool: bool = False  # BOOL: every byte must be 0 or 1 (binary tensors' rule)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def read_into(self, dst: np.ndarray) -> None:
        """preadv the tensor into `dst` (its place in a slot); RegionReadFailed when fewer bytes come."""
        buffer = dst if dst.flags.c_contiguous else np.empty(self.shape, self.dtype)  # (a padded batch's rows)
        raw = buffer.reshape(-1).view(np.uint8)
        try:
            got = os.preadv(self.region.fd, [raw], self.position)
        except OSError as exc:
            raise RegionReadFailed(
                self, f"{self.what}: reading shared memory region {self.region.name!r} failed: {exc.strerror}"
            ) from None
        if got != self.nbytes:
            raise RegionReadFailed(self, self._short_read(got))
        if self.check_bool and self.nbytes and raw.max() > 1:
            raise RegionReadFailed(
                self, f"{self.what}: BOOL elements must be bytes 0 or 1 (shared memory region {self.region.name!r})"
            )
        if buffer is not dst:
            dst[...] = buffer

    def read(self) -> np.ndarray:
        """The tensor as a private array (for values the gateway itself needs: BYTES, a batching key)."""
        array = np.empty(self.shape, self.dtype)
        self.read_into(array)
        return array

    def _short_read(self, got: int) -> str:
        region = self.region
        try:
            size = f"{os.fstat(region.fd).st_size} bytes"
        except OSError:  # pragma: no cover - the descriptor is ours until the Region goes
            size = "an unknown size"
        return (
            f"{self.what}: shared memory region {region.name!r} (key {region.key!r}): only {got} of "
            f"{self.nbytes} bytes could be read at offset {self.position} (region offset {region.offset} + "
            f"{PARAM_OFFSET} {self.position - region.offset}); the segment now has {size}: it was truncated "
            "while the request waited. Keep the segment at least offset + byte_size bytes until the answer"
        )


@dataclass(frozen=True, slots=True)
class OutputRegion:
    """A requested output to be written into a region: where, and how much room there is."""

    region: Region
    offset: int
    byte_size: int

    def parameters(self, written_bytes: int) -> dict[str, Any]:
        """The response entry's parameters (it carries no data)."""
        params = {PARAM_REGION: self.region.name, PARAM_BYTE_SIZE: written_bytes}
        if self.offset:
            params[PARAM_OFFSET] = self.offset
        return params


@dataclass(frozen=True, slots=True)
class WrittenOutput:
    """An output the scheduler wrote into its region: what the response says of it in place of data."""

    shape: tuple[int, ...]
    parameters: dict[str, Any]


def check_key(key: Any, name: str = "") -> str:
    """A key shm_open may be given: one name in /dev/shm, optionally with its leading '/'."""
    if not isinstance(key, str):
        raise RegionError(
            say(
                "shm_key",
                f"'key' must be a string (the shared-memory key, e.g. '/my_region'), got {echo(key)}",
                name=echo(name, quoted=False),
                key=echo(key, quoted=False),
            )
        )
    bare = key[1:] if key.startswith("/") else key
    if not bare or "/" in bare or "\0" in bare or bare in (".", "..") or len(bare) > MAX_NAME_CHARS:
        raise RegionError(
            say(
                "shm_key",
                f"'key' {echo(key)} is not a shared-memory key: give one name of at most "
                f"{MAX_NAME_CHARS} characters without '/' (a leading '/' is allowed), as "
                "shm_open takes it",
                name=echo(name, quoted=False),
                key=echo(key, quoted=False),
            )
        )
    if bare.startswith(SEGMENT_PREFIX):
        raise RegionError(
            f"'key' {key!r}: segments named {SEGMENT_PREFIX}* are the server's own rings and cannot be registered"
        )
    return key


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS or "/" in name:
        raise RegionError(f"region name {echo(name)} must be 1 to {MAX_NAME_CHARS} characters without '/'")
    return name


def open_region(name: str, key: str, offset: int, byte_size: int) -> Region:
    """shm_open(key) with the server's permissions and check the segment's size (no mapping: see above)."""
    if _shm_open is None:  # pragma: no cover
        raise RegionError("system shared memory is not supported on this platform")
    path_key = key if key.startswith("/") else "/" + key
    try:
        fd = _shm_open(path_key, os.O_RDWR, mode=0o600)  # no O_CREAT: only an existing segment
    except FileNotFoundError:
        raise RegionError(
            say(
                "shm_open",
                f"failed to register shared memory region {name!r}: no shared-memory "
                f"segment {key!r} (/dev/shm{path_key}); create it first (e.g. "
                "tritonclient.utils.shared_memory.create_shared_memory_region) on this "
                "host",
                key=key,
            )
        ) from None
    except PermissionError:
        raise RegionError(
            say(
                "shm_open",
                f"failed to register shared memory region {name!r}: the server's user "
                f"may not open {key!r} read-write; create the segment as that user or give "
                "it read-write access",
                key=key,
            )
        ) from None
    except OSError as exc:
        raise RegionError(
            say(
                "shm_open",
                f"failed to register shared memory region {name!r}: cannot open {key!r}: {exc.strerror}",
                key=key,
            )
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RegionError(say("shm_register", f"{key!r} is not a shared-memory segment", name=name))
        if offset + byte_size > info.st_size:
            raise RegionError(
                say(
                    "shm_register_bounds",
                    f"offset {offset} + byte_size {byte_size} = "
                    f"{offset + byte_size} runs past the end of segment {key!r}, "
                    f"which has {info.st_size} bytes",
                    name=name,
                )
            )
    except BaseException:
        os.close(fd)
        raise
    region = Region(name, key, offset, byte_size, fd)
    # The descriptor lives as long as the Region: requests still holding it after an unregister
    # read their inputs and write their outputs through it.
    weakref.finalize(region, os.close, fd)
    return region


def write_outputs(outputs: dict[str, Any], targets: dict[str, OutputRegion], config: ModelConfig) -> None:
    """Copy each output named in `targets` into its region, and put a WrittenOutput in its place.

    Called by the scheduler while `outputs` still views the batch's slot (one copy: slot → segment).
    HTTP and gRPC responses then say of such an output only its shape and `WrittenOutput.parameters`.
    RegionError (400) when an output does not fit the room the request gave it, or the segment was
    truncated; nothing is half-reported then (the request fails as a whole).
    """
    for name, target in targets.items():
        array = outputs[name]
        what = f"output {name!r}"
        datatype = config.outputs_by_name[name].datatype
        if datatype == "BYTES":
            data = memoryview(serialize_bytes_tensor(array))
        else:
            data = memoryview(np.ascontiguousarray(array)).cast("B")  # (a row range of the slot: no copy)
        if data.nbytes > target.byte_size:
            raise RegionError(
                say(
                    "shm_output_size",
                    f"{what} is {data.nbytes} bytes (shape {list(array.shape)} "
                    f"{datatype}); {PARAM_BYTE_SIZE} gives it {target.byte_size} "
                    f"bytes in region {target.region.name!r}: give at least "
                    f"{data.nbytes}",
                    output=name,
                    given=target.byte_size,
                    needed=data.nbytes,
                )
            )
        region = target.region
        region.check_intact()
        try:  # pwritev, never a store through a mapping: a write cannot fault if the segment shrinks
            written = os.pwritev(region.fd, [data], region.offset + target.offset)
        except OSError as exc:
            raise RegionError(
                f"{what}: writing into shared memory region {region.name!r} failed: {exc.strerror}"
            ) from None
        if written != data.nbytes:  # pragma: no cover - tmpfs writes whole buffers or raises
            raise RegionError(f"{what}: only {written} of {data.nbytes} bytes reached region {region.name!r}")
        outputs[name] = WrittenOutput(tuple(array.shape), target.parameters(data.nbytes))
