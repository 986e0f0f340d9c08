"""Triton's system shared-memory extension: regions a client registers, tensors read from and written into them.

A client creates a POSIX shared-memory segment (`tritonclient.utils.shared_memory`), registers a
region of it by name (`POST /v2/systemsharedmemory/region/<name>/register` with `key`, `offset`,
`byte_size`), then names the region in an input's or a requested output's parameters
(`shared_memory_region`, `shared_memory_offset`, `shared_memory_byte_size`) instead of sending the data.

Copies. An input in a region is a numpy view over the gateway's mapping of it (no copy at parse);
the batcher copies it once, straight into the batch's ring slot (gateway/slots.py write_batch), as it
does a binary input's view over the request body. An output in a region is copied once, from the
worker's output area in the slot straight into the client's segment (`write_outputs`, `os.pwritev`
on the segment's descriptor), before the slot is freed: no per-request array, no serialization.

Safety, and why each rule:
- The gateway opens a key with plain `shm_open(O_RDWR)` (glibc adds O_NOFOLLOW) under the server's
  own user: a client can name only what that user may open. Keys with a '/' past the leading one,
  '.'/'..', NUL, and the server's own ring segments (`ringserve-*`: their names are listed in
  /dev/shm) are refused; only regular files are mapped.
- Nothing here touches `multiprocessing`'s resource tracker (Python 3.11's SharedMemory registers
  what it attaches and unlinks it at exit): the segment is the client's, never ours to unlink.
- offset + byte_size is checked against the segment's real size (fstat) at register, and each
  tensor's offset + size against the registered region at parse.
- A request holds its Region (fd and mapping): an unregister while it waits drops the name only, the
  mapping lives until the request is answered (Triton defers the unmap the same way), so it is served.
  A client that unlinks its segment changes nothing either (the mapping keeps the memory). A client
  that *truncates* it would turn the next read of the mapping into SIGBUS, which kills the gateway:
  so the segment's size is checked again (`check_intact`, fstat) in the loop step that copies the
  inputs into the slot, and such a request gets 400 instead. Outputs are written with pwritev, which
  cannot fault: a truncated output segment is refused the same way.
"""
from __future__ import annotations

import mmap
import os
import stat
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from ringserve.common.model_config import ModelConfig
from ringserve.common.wire import serialize_bytes_tensor
from ringserve.shm.segment import SEGMENT_PREFIX

from .errors import BadRequest, echo

try:  # CPython's own binding of shm_open(3), used by multiprocessing.shared_memory (Linux, macOS)
    from _posixshmem import shm_open as _shm_open
except ImportError:  # pragma: no cover - not a POSIX build
    _shm_open = None

MAX_REGIONS = 512  # each holds a descriptor and a mapping; a client registering in a loop must not exhaust fds
MAX_NAME_CHARS = 255
PARAM_REGION = "shared_memory_region"
PARAM_OFFSET = "shared_memory_offset"
PARAM_BYTE_SIZE = "shared_memory_byte_size"


class RegionError(BadRequest):
    """A register, a tensor's region parameters or a region's segment that cannot be used (400)."""


class RegionNotFound(RegionError):
    """A region name that is not registered (status of one region answers 404, as Triton's does)."""

    def __init__(self, name: str, registered: list[str]) -> None:
        super().__init__(f"Unable to find system shared memory region: {echo(name)}; registered: "
                         f"{', '.join(registered) or 'none'} (POST /v2/systemsharedmemory/region/<name>/register first)")


NO_CUDA_SHM = ("ringserve does not support CUDA shared memory (its gateway copies tensors through host "
               "shared memory to the workers); use system shared memory, /v2/systemsharedmemory")


class CudaSharedMemoryUnsupported(RegionError):
    """A CUDA shared-memory register: refused as Triton built without GPUs refuses it (400)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"failed to register CUDA shared memory region: {echo(name)}, GPUs not supported: {NO_CUDA_SHM}")


@dataclass(eq=False)
class Region:
    """One registered region: `byte_size` bytes at `offset` in the segment `key`, mapped read-write."""

    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    view: memoryview  # the region's bytes in the gateway's mapping

    def status(self) -> dict[str, Any]:
        """Triton's status entry."""
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def check_intact(self) -> None:
        """400 when the client has truncated its segment under the region (reading it would be SIGBUS)."""
        size = os.fstat(self.fd).st_size
        if size < self.offset + self.byte_size:
            raise RegionError(f"shared memory region {self.name!r}: its segment {self.key!r} was truncated to "
                              f"{size} bytes while a request used it; the region needs offset {self.offset} + "
                              f"byte_size {self.byte_size} = {self.offset + self.byte_size} bytes")

    def span(self, what: str, params: dict) -> tuple[int, int]:
        """(offset, byte_size) of a tensor's parameters, checked against this region."""
        offset = params.get(PARAM_OFFSET, 0)
        byte_size = params.get(PARAM_BYTE_SIZE)
        if byte_size is None:
            raise RegionError(f"{what}: parameters.{PARAM_REGION} needs parameters.{PARAM_BYTE_SIZE} (the tensor's "
                              f"size in bytes; {PARAM_OFFSET} is optional, 0 by default)")
        for field, value in ((PARAM_OFFSET, offset), (PARAM_BYTE_SIZE, byte_size)):
            if type(value) is not int or value < 0:
                raise RegionError(f"{what}: parameters.{field} must be a non-negative integer, got {echo(value)}")
        if offset + byte_size > self.byte_size:
            raise RegionError(f"{what}: {PARAM_OFFSET} {offset} + {PARAM_BYTE_SIZE} {byte_size} = "
                              f"{offset + byte_size} runs past region {self.name!r} (byte_size {self.byte_size}); "
                              f"offset + byte_size must be <= {self.byte_size}")
        return offset, byte_size


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


def check_key(key: Any) -> str:
    """A key shm_open may be given: one name in /dev/shm, optionally with its leading '/'."""
    if not isinstance(key, str):
        raise RegionError(f"'key' must be a string (the shared-memory key, e.g. '/my_region'), got {echo(key)}")
    bare = key[1:] if key.startswith("/") else key
    if not bare or "/" in bare or "\0" in bare or bare in (".", "..") or len(bare) > MAX_NAME_CHARS:
        raise RegionError(f"'key' {echo(key)} is not a shared-memory key: give one name of at most {MAX_NAME_CHARS} "
                          "characters without '/' (a leading '/' is allowed), as shm_open takes it")
    if bare.startswith(SEGMENT_PREFIX):
        raise RegionError(f"'key' {key!r}: segments named {SEGMENT_PREFIX}* are the server's own rings and cannot "
                          "be registered")
    return key


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS or "/" in name:
        raise RegionError(f"region name {echo(name)} must be 1 to {MAX_NAME_CHARS} characters without '/'")
    return name


def open_region(name: str, key: str, offset: int, byte_size: int) -> Region:
    """shm_open(key) with the server's permissions, check the segment's size, map the region read-write."""
    if _shm_open is None:  # pragma: no cover
        raise RegionError("system shared memory is not supported on this platform")
    path_key = key if key.startswith("/") else "/" + key
    try:
        fd = _shm_open(path_key, os.O_RDWR, mode=0o600)  # no O_CREAT: only an existing segment
    except FileNotFoundError:
        raise RegionError(f"failed to register shared memory region {name!r}: no shared-memory segment {key!r} "
                          f"(/dev/shm{path_key}); create it first (e.g. tritonclient.utils.shared_memory."
                          "create_shared_memory_region) on this host") from None
    except PermissionError:
        raise RegionError(f"failed to register shared memory region {name!r}: the server's user may not open "
                          f"{key!r} read-write; create the segment as that user or give it read-write access") from None
    except OSError as exc:
        raise RegionError(f"failed to register shared memory region {name!r}: cannot open {key!r}: "
                          f"{exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RegionError(f"failed to register shared memory region {name!r}: {key!r} is not a shared-memory "
                              "segment")
        if offset + byte_size > info.st_size:
            raise RegionError(f"failed to register shared memory region {name!r}: offset {offset} + byte_size "
                              f"{byte_size} = {offset + byte_size} runs past the end of segment {key!r}, which has "
                              f"{info.st_size} bytes")
        start = offset - offset % mmap.ALLOCATIONGRANULARITY  # mmap's offset must be page-aligned
        mapping = mmap.mmap(fd, offset + byte_size - start, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                            offset=start)
    except BaseException:
        os.close(fd)
        raise
    region = Region(name, key, offset, byte_size, fd, memoryview(mapping)[offset - start:])
    # The descriptor lives as long as the Region: requests still holding it after an unregister
    # check the segment's size through it. The mapping goes with the last view of it.
    weakref.finalize(region, os.close, fd)
    return region


class RegionRegistry:
    """The regions registered with this gateway, by name (each gateway of a server holds the same)."""

    def __init__(self) -> None:
        self.regions: dict[str, Region] = {}

    def register(self, name: Any, doc: Any, *, idempotent: bool = False) -> Region:
        """Register `name` from a register request body ({key, offset, byte_size}).

        `idempotent`: the same name with the same key, offset and size already registered is not an
        error (another gateway forwarding a register, or a restarted one catching up).
        """
        name = check_name(name)
        if not isinstance(doc, dict):
            raise RegionError("the register request body must be a JSON object with key, offset and byte_size")
        if "key" not in doc:
            raise RegionError("Shared memory register request has no 'key' field; give key (the segment's "
                              "shared-memory key), offset (default 0) and byte_size")
        if "byte_size" not in doc:
            raise RegionError("Shared memory register request has no 'byte_size' field; give key, offset "
                              "(default 0) and byte_size")
        key = check_key(doc["key"])
        offset, byte_size = doc.get("offset", 0), doc["byte_size"]
        for field, value in (("offset", offset), ("byte_size", byte_size)):
            if type(value) is not int or value < 0:
                raise RegionError(f"'{field}' must be a non-negative integer, got {value!r}")
        if byte_size == 0:
            raise RegionError("'byte_size' must be at least 1")
        existing = self.regions.get(name)
        if existing is not None:
            if idempotent and (existing.key, existing.offset, existing.byte_size) == (key, offset, byte_size):
                return existing
            raise RegionError(f"shared memory region {name!r} already in manager (key {existing.key!r}); "
                              "unregister it first or use another name")
        if len(self.regions) >= MAX_REGIONS:
            raise RegionError(f"{MAX_REGIONS} regions are registered, the most this server holds; unregister some")
        region = open_region(name, key, offset, byte_size)
        self.regions[name] = region
        return region

    def unregister(self, name: str | None) -> list[str]:
        """Drop one region (None: all); an unknown name is not an error (Triton's rule). Requests that
        hold a dropped region keep its mapping until they are answered."""
        if name is None:
            names = list(self.regions)
            self.regions.clear()
            return names
        return [name] if self.regions.pop(name, None) is not None else []

    def status(self, name: str | None) -> list[dict[str, Any]]:
        if name is None:
            return [r.status() for r in self.regions.values()]
        return [self.get(name).status()]

    def get(self, name: Any) -> Region:
        region = self.regions.get(name) if isinstance(name, str) else None
        if region is None:
            raise RegionNotFound(str(name), sorted(self.regions))
        return region

    # -- tensors -------------------------------------------------------------------
    def input_buffer(self, what: str, params: dict) -> tuple[memoryview, Region]:
        """The bytes of an input that names a region (a view, no copy) and the region to hold."""
        region = self.get_for(what, params[PARAM_REGION])
        offset, byte_size = region.span(what, params)
        region.check_intact()
        return region.view[offset:offset + byte_size], region

    def output_region(self, what: str, params: dict) -> OutputRegion:
        region = self.get_for(what, params[PARAM_REGION])
        offset, byte_size = region.span(what, params)
        return OutputRegion(region, offset, byte_size)

    def get_for(self, what: str, name: Any) -> Region:
        if not isinstance(name, str):
            raise RegionError(f"{what}: parameters.{PARAM_REGION} must be a region name (string), got {echo(name)}")
        try:
            return self.get(name)
        except RegionNotFound as exc:
            raise RegionError(f"{what}: {exc}") from None


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
            raise RegionError(f"{what} is {data.nbytes} bytes (shape {list(array.shape)} {datatype}); "
                              f"{PARAM_BYTE_SIZE} gives it {target.byte_size} bytes in region "
                              f"{target.region.name!r}: give at least {data.nbytes}")
        region = target.region
        region.check_intact()
        # pwritev, not a store through the mapping: a write cannot fault if the segment shrinks.
        written = os.pwritev(region.fd, [data], region.offset + target.offset)
        if written != data.nbytes:  # pragma: no cover - tmpfs writes whole buffers or raises
            raise RegionError(f"{what}: only {written} of {data.nbytes} bytes reached region {region.name!r}")
        outputs[name] = WrittenOutput(tuple(array.shape), target.parameters(data.nbytes))


def regions_intact(regions: list[Region]) -> None:
    for region in regions:
        region.check_intact()
