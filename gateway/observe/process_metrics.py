"""Metrics about the server's processes and machine rather than its traffic: what an operator's
standard dashboards look for (gateway process; read at scrape time).

- `ringserve_build_info{version,onnxruntime,python}` 1: read from the installed packages' metadata
  once (the gateway never imports onnxruntime: the workers do, from the same environment).
- prometheus_client's `process_*` families (ProcessCollector: CPU seconds, resident and virtual
  memory, open and max fds, start time) for every process of the server, labelled
  `role` (supervisor, gateway, worker) and `index`. The gateway reads /proc/<pid> of its parent
  (the supervisor) and of the workers it knows, as well as its own: same user, same host, so
  /proc answers, and nothing has to be added to the supervisor's or the workers' messages. Each
  gateway writes its own process only into its `?scope=gateway` share (gateway/cluster/merge.py), so with
  several gateways every process is counted once.
- GPU utilisation, power and memory per device, through NVML (the `nvidia-ml-py` package, module
  `pynvml`), when a GPU and its driver are there; without them, no GPU family and no error.
  Named and labelled exactly as Triton names them (`nv_gpu_utilization`, `nv_gpu_power_usage` in
  watts, `nv_gpu_memory_used_bytes`, `nv_gpu_memory_total_bytes`; `gpu_uuid` their one label): a
  Triton dashboard's GPU panels work unchanged, and perf_analyzer's `--collect-metrics` finds them
  (it matches `name{gpu_uuid="..."} value` and nothing with another label).
"""

from __future__ import annotations

import importlib.metadata
import logging
import platform
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector

from ringserve.common.version import VERSION
from ringserve.common.vocabulary import ProcessRole

log = logging.getLogger(__name__)

BUILD_INFO = "ringserve_build_info"
# ProcessCollector's families (the names its collect() yields; counters without `_total`).
PROCESS_FAMILIES = frozenset(
    {
        "process_virtual_memory_bytes",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "process_cpu_seconds",
        "process_open_fds",
        "process_max_fds",
    }
)
GPU_FAMILIES = frozenset(
    {"nv_gpu_utilization", "nv_gpu_power_usage", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"}
)
ROLE_GATEWAY: ProcessRole = "gateway"
UNKNOWN_VERSION = "unknown"


@dataclass(frozen=True)
class ProcessId:
    role: ProcessRole
    index: int
    pid: int


def distribution_version(*names: str) -> str:
    """The installed version of the first distribution of `names` that is installed."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return UNKNOWN_VERSION


def onnxruntime_version() -> str:
    """The version of the distribution that provides the `onnxruntime` module (onnxruntime-gpu here,
    onnxruntime or a vendor build elsewhere), without importing it."""
    providers = importlib.metadata.packages_distributions().get("onnxruntime", [])
    return distribution_version(*providers, "onnxruntime-gpu", "onnxruntime")


class BuildInfoCollector:
    def __init__(self) -> None:
        self.labels = [VERSION, onnxruntime_version(), platform.python_version()]

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            BUILD_INFO,
            "ringserve's build: its version, ONNX Runtime's and Python's (always 1)",
            labels=["version", "onnxruntime", "python"],
        )
        family.add_metric(self.labels, 1.0)
        yield family


class ProcessesCollector:
    """ProcessCollector's families for each of `processes()`, one series per process (role, index)."""

    def __init__(self, processes: Callable[[], list[ProcessId]], proc: str = "/proc") -> None:
        self.processes = processes
        self.proc = proc
        self._collectors: dict[int, ProcessCollector] = {}  # pid -> its collector (made once: it reads /proc/stat)

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        processes = self.processes()
        for process in processes:
            collector = self._collectors.get(process.pid)
            if collector is None:
                collector = self._collectors[process.pid] = ProcessCollector(
                    pid=lambda pid=process.pid: pid, proc=self.proc, registry=None
                )
            labels = {"role": process.role, "index": str(process.index)}
            for family in collector.collect():  # what /proc/<pid> gave (nothing once it has exited)
                mine = families.get(family.name)
                if mine is None:
                    mine = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                for sample in family.samples:
                    mine.add_sample(sample.name, {**sample.labels, **labels}, sample.value)
        live = {p.pid for p in processes}
        for pid in [pid for pid in self._collectors if pid not in live]:
            del self._collectors[pid]
        return families.values()


class GpuCollector:
    """Per GPU: utilisation (0..1 of the last sample period) and memory used and total, from NVML.

    NVML is initialised at the first scrape; where it cannot be (no `pynvml`, no driver, no GPU),
    the collector says so once in the debug log and yields nothing from then on. NVML reads the driver's
    counters: it makes no CUDA context in the gateway.
    """

    def __init__(self, load_nvml: Callable[[], ModuleType] | None = None) -> None:
        self.load_nvml = load_nvml or _import_pynvml
        self.nvml: ModuleType | None = None
        self.devices: list[tuple[str, str, object]] = []  # (index, uuid, handle)
        self._tried = False

    def _start(self) -> None:
        self._tried = True
        try:
            nvml = self.load_nvml()
            nvml.nvmlInit()
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                self.devices.append((str(index), _text(nvml.nvmlDeviceGetUUID(handle)), handle))
        except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            # Debug, not info: a CPU-only server is the usual case, and each gateway would say it.
            log.debug("no GPU metrics: NVML is not available (%s: %s)", type(exc).__name__, exc)
            self.devices = []
            return
        self.nvml = nvml
        if not self.devices:
            log.debug("no GPU metrics: NVML sees no GPU")

    def collect(self) -> Iterable[Metric]:
        if not self._tried:
            self._start()
        if not self.devices:
            return []
        nvml = self.nvml
        labels = ["gpu_uuid"]
        utilization = GaugeMetricFamily(
            "nv_gpu_utilization",
            "Fraction of the last sample period in which a kernel ran on the GPU (NVML)",
            labels=labels,
        )
        power = GaugeMetricFamily("nv_gpu_power_usage", "GPU power usage in watts (NVML)", labels=labels)
        used = GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU memory in use, all processes (NVML)", labels=labels)
        total = GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU memory installed (NVML)", labels=labels)
        for index, uuid, handle in self.devices:
            try:
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:  # noqa: BLE001 - a GPU fallen off the bus must not fail the scrape
                log.warning("GPU %s: NVML read failed: %s", index, exc)
                continue
            utilization.add_metric([uuid], rates.gpu / 100.0)
            used.add_metric([uuid], float(memory.used))
            total.add_metric([uuid], float(memory.total))
            try:
                power.add_metric([uuid], nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)  # (NVML: milliwatts)
            except Exception:  # noqa: BLE001 - NVML_ERROR_NOT_SUPPORTED on some boards: the rest still counts
                pass
        return [utilization, power, used, total]


def _import_pynvml() -> ModuleType:
    import pynvml  # noqa: PLC0415 - only when GPU metrics are read: nvidia-ml-py's ctypes over libnvidia-ml.so

    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
