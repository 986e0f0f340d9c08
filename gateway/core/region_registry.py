"""The regions one gateway holds (RegionRegistry): register, unregister, status, under
--allow-client-shm and its key prefixes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ringserve.gateway.core.errors import PayloadTooLarge, echo
from ringserve.gateway.core.phrases import say
from ringserve.gateway.core.region_errors import (
    CLIENT_SHM_DISABLED,
    MAX_REGIONS,
    ClientShmDisabled,
    RegionError,
    RegionNotFound,
    TooManyRegions,
)
from ringserve.gateway.core.regions import (
    PARAM_REGION,
    OutputRegion,
    Region,
    RegionInput,
    check_key,
    check_name,
    open_region,
)


class RegionRegistry:
    """The regions registered with this gateway, by name (each gateway of a server holds the same).

    `allowed`: --allow-client-shm (off: register and unregister answer ClientShmDisabled, status
    lists nothing). `key_prefixes`: --client-shm-key-prefix, the keys a client may name (empty: any).
    `max_read_bytes`: the most a tensor read at parse may take (a BYTES input: a slot's capacity).
    `max_regions`: MAX_REGIONS, or fewer where the open-files limit is lower.
    """

    def __init__(
        self,
        allowed: bool = False,
        key_prefixes: tuple[str, ...] = (),
        max_read_bytes: int | None = None,
        max_regions: int = MAX_REGIONS,
    ) -> None:
        self.regions: dict[str, Region] = {}
        self.allowed = allowed
        self.key_prefixes = tuple(_with_slash(p) for p in key_prefixes)
        self.max_read_bytes = max_read_bytes
        self.max_regions = max_regions

    def register(self, name: Any, doc: Any, *, idempotent: bool = False) -> Region:
        """Register `name` from a register request body ({key, offset, byte_size}).

        `idempotent`: the same name with the same key, offset and size already registered is not an
        error (another gateway forwarding a register, or a restarted one catching up).
        """
        if not self.allowed:
            raise ClientShmDisabled()
        name = check_name(name)
        if not isinstance(doc, dict):
            raise RegionError("the register request body must be a JSON object with key, offset and byte_size")
        if "key" not in doc:
            raise RegionError(
                "Shared memory register request has no 'key' field; give key (the segment's "
                "shared-memory key), offset (default 0) and byte_size"
            )
        if "byte_size" not in doc:
            raise RegionError(
                "Shared memory register request has no 'byte_size' field; give key, offset (default 0) and byte_size"
            )
        key = self._check_prefix(check_key(doc["key"], name))
        offset, byte_size = doc.get("offset", 0), doc["byte_size"]
        for field, value in (("offset", offset), ("byte_size", byte_size)):
            if type(value) is not int or value < 0:
                raise RegionError(f"'{field}' must be a non-negative integer, got {value!r}")
        if byte_size == 0:  # (Triton's words for a region out of its segment: its QA registers 0 bytes past the end)
            raise RegionError(say("shm_register_bounds", "'byte_size' must be at least 1", name=name))
        existing = self.regions.get(name)
        if existing is not None:
            if idempotent and (existing.key, existing.offset, existing.byte_size) == (key, offset, byte_size):
                return existing
            raise RegionError(
                say(
                    "shm_registered",
                    f"it is registered with key {existing.key!r}; unregister it first or use another name",
                    name=name,
                )
            )
        if len(self.regions) >= self.max_regions:
            raise TooManyRegions(name, self.max_regions)
        region = open_region(name, key, offset, byte_size)
        self.regions[name] = region
        return region

    def _check_prefix(self, key: str) -> str:
        if self.key_prefixes and not _with_slash(key).startswith(self.key_prefixes):
            raise RegionError(
                f"'key' {key!r} is not one this server accepts: its keys must start with "
                f"{' or '.join(map(repr, self.key_prefixes))} (--client-shm-key-prefix)"
            )
        return key

    def unregister(self, name: str | None) -> list[str]:
        """Drop one region (None: all); an unknown name is not an error (Triton's rule). Requests that
        hold a dropped region keep its descriptor until they are answered."""
        if not self.allowed:
            raise ClientShmDisabled()
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
    def input_tensor(
        self,
        what: str,
        params: dict,
        datatype: str,
        dtype: np.dtype,
        shape: tuple[int, ...],
        *,
        input_name: str = "",
        model: str = "",
    ) -> tuple[RegionInput, Region]:
        """Where an input that names a region lies (nothing is read yet), and the region to hold."""
        region = self.get_for(what, params[PARAM_REGION])
        offset, byte_size = region.span(what, params)
        if datatype != "BYTES":
            needed = math.prod(shape) * dtype.itemsize
            if byte_size != needed:
                raise RegionError(
                    say(
                        "input_byte_size",
                        f"{what}: shared_memory_byte_size is {byte_size} bytes but "
                        f"shape {list(shape)} of {datatype} needs {math.prod(shape)} x "
                        f"{dtype.itemsize} = {needed} bytes",
                        input=input_name,
                        model=model,
                        expected=needed,
                        got=byte_size,
                    )
                )
            return RegionInput(what, region, region.offset + offset, shape, dtype, datatype == "BOOL"), region
        if self.max_read_bytes is not None and byte_size > self.max_read_bytes:
            raise PayloadTooLarge(byte_size, self.max_read_bytes)
        return RegionInput(what, region, region.offset + offset, (byte_size,), np.dtype(np.uint8)), region

    def output_region(self, what: str, params: dict) -> OutputRegion:
        region = self.get_for(what, params[PARAM_REGION])
        offset, byte_size = region.span(what, params)
        return OutputRegion(region, offset, byte_size)

    def get_for(self, what: str, name: Any) -> Region:
        if not isinstance(name, str):
            raise RegionError(f"{what}: parameters.{PARAM_REGION} must be a region name (string), got {echo(name)}")
        if not self.allowed:
            raise RegionError(f"{what}: shared memory region {echo(name)}: {CLIENT_SHM_DISABLED}")
        try:
            return self.get(name)
        except RegionNotFound as exc:
            raise RegionError(
                say(
                    "shm_unknown_region",
                    f"{what}: registered: {', '.join(exc.registered) or 'none'} "
                    "(POST /v2/systemsharedmemory/region/<name>/register first)",
                    name=name,
                )
            ) from None


def _with_slash(key: str) -> str:
    """A key or key prefix as shm_open names it, with its one leading '/'."""
    return key if key.startswith("/") else "/" + key
