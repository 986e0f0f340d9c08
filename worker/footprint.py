"""How much memory a loaded model takes: measured around its load, never guessed.

CPU sessions: the process's resident set before and after the load (psutil). glibc keeps
freed heap pages, so a load after an unload would reuse them and look free; `trim()`
hands free pages back to the kernel after every unload and before every measurement.
That works for glibc's main heap only: each thread's own heap (arena) keeps pages that
trimming does not return, and a load measured 0 bytes after such reuse (tried). So the
worker runs with one heap (`one_heap()`, M_ARENA_MAX=1, first thing at start); its threads
(batch loop, loader, heartbeat, ORT's pools) allocate little outside ORT's own arenas.

CUDA sessions: the device memory this process holds on its device, from NVML
(libnvidia-ml.so.1, loaded with ctypes when present), before and after the load; the
host-side part is measured as for CPU and the two are added. Without NVML the CUDA
footprint is the host part only, and the worker logs that once. Not exercised by the
test suite (its machines have no GPU).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Iterable

import psutil

log = logging.getLogger(__name__)

_NVML_SUCCESS = 0
_NVML_ERROR_INSUFFICIENT_SIZE = 7


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


_LIBC = _libc()
_M_ARENA_MAX = -8  # mallopt parameter (malloc.h)


def one_heap() -> None:
    """Every thread allocates from glibc's main heap, so `trim()` can return what an unload frees.
    Call before starting threads."""
    if _LIBC is not None and hasattr(_LIBC, "mallopt"):
        _LIBC.mallopt(_M_ARENA_MAX, 1)


def trim() -> None:
    """Give free heap pages back to the kernel (glibc malloc_trim), so RSS tells the truth."""
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


class _ProcessInfo(ctypes.Structure):
    # nvmlProcessInfo_t (v2/v3 layout): pid, usedGpuMemory, gpuInstanceId, computeInstanceId.
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class NvmlDeviceMemory:
    """Device memory held by this process on one GPU, through NVML; unusable -> `available` False."""

    def __init__(self, device_id: int) -> None:
        self.available = False
        try:
            self._nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if self._nvml.nvmlInit_v2() != _NVML_SUCCESS:
                return
            self._handle = ctypes.c_void_p()
            if self._nvml.nvmlDeviceGetHandleByIndex_v2(device_id, ctypes.byref(self._handle)) != _NVML_SUCCESS:
                return
            self._query = self._nvml.nvmlDeviceGetComputeRunningProcesses_v3
        except (OSError, AttributeError):
            return
        self.available = True

    def used_bytes(self) -> int:
        count = ctypes.c_uint(0)
        status = self._query(self._handle, ctypes.byref(count), None)
        if status not in (_NVML_SUCCESS, _NVML_ERROR_INSUFFICIENT_SIZE):
            return 0
        infos = (_ProcessInfo * max(count.value + 4, 1))()  # room for processes that start meanwhile
        count = ctypes.c_uint(len(infos))
        if self._query(self._handle, ctypes.byref(count), infos) != _NVML_SUCCESS:
            return 0
        pid = os.getpid()
        return sum(info.usedGpuMemory for info in infos[: count.value] if info.pid == pid)


class MemoryMeter:
    """The memory a worker's models use: host RSS, plus this process's memory on its CUDA devices."""

    def __init__(self, cuda_device_ids: Iterable[int] = ()) -> None:
        self._process = psutil.Process()
        self._devices = [NvmlDeviceMemory(d) for d in cuda_device_ids]
        if not all(d.available for d in self._devices):
            log.warning("NVML is not usable here: model footprints on CUDA count host memory only")
            self._devices = []

    def sample(self) -> int:
        """Bytes in use now; call `trim()` first for a number that excludes freed heap."""
        return self._process.memory_info().rss + sum(d.used_bytes() for d in self._devices)
