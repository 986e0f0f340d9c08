"""Why a client shared-memory region is refused: each error in Triton's words, with what is accepted."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ringserve.gateway.core.errors import BadRequest, Unsupported, echo
from ringserve.gateway.core.phrases import say

if TYPE_CHECKING:  # (regions.py imports these errors)
    pass

MAX_REGIONS = 512  # each holds a descriptor; a client registering in a loop must not exhaust fds


MAX_NAME_CHARS = 255


class RegionError(BadRequest):
    """A register, a tensor's region parameters or a region's segment that cannot be used (400)."""


# Triton's words (its server's common.h), over HTTP 501 and gRPC UNIMPLEMENTED as Triton answers them.
CLIENT_SHM_DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."


class ClientShmDisabled(Unsupported):
    """A register or unregister while --allow-client-shm is off (501, Triton's UNSUPPORTED)."""

    def __init__(self) -> None:
        super().__init__(CLIENT_SHM_DISABLED)


class RegionNotFound(RegionError):
    """A region name that is not registered (status of one region answers 404, as Triton's does)."""

    def __init__(self, name: str, registered: list[str]) -> None:
        super().__init__(
            say(
                "shm_unknown_status",
                f"registered: {', '.join(registered) or 'none'} (POST "
                "/v2/systemsharedmemory/region/<name>/register first)",
                name=echo(name, quoted=False),
            )
        )
        self.name, self.registered = name, registered


class TooManyRegions(RegionError):
    """A register past the regions this gateway holds: each holds open files, which HTTP and gRPC
    connections need too (gateway/descriptors.py)."""

    def __init__(self, name: str, limit: int) -> None:
        super().__init__(
            say(
                "shm_register",
                f"{limit} regions are registered, the most this server holds (each "
                f"keeps a file open, within the open-files limit it shares with its "
                f"connections); unregister regions you no longer use",
                name=echo(name, quoted=False),
            )
        )


NO_CUDA_SHM = (
    "ringserve does not support CUDA shared memory (its gateway copies tensors through host "
    "shared memory to the workers); use system shared memory, /v2/systemsharedmemory"
)


class CudaSharedMemoryUnsupported(RegionError):
    """A CUDA shared-memory register: refused as Triton built without GPUs refuses it (400)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"failed to register CUDA shared memory region: {echo(name)}, GPUs not supported: {NO_CUDA_SHM}"
        )
