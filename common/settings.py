"""Every server setting, with its one default: what `ringserve serve` was asked to do.

cli/ builds a `Settings` from its flags (argparse holds no defaults of its own), the
supervisor writes it to `<runtime_dir>/settings.json` (0600: it may hold the API key) and
starts each child with `--settings <that file>` plus only what differs per process
(worker index and generation, quarantined models, the inherited listen fd, the ring's name,
the parent's pid). The gateway and the workers build their own settings objects from it.

A setting that no flag sets (max_inflight_per_worker, retry_after_s, the poison quarantine)
still lives here, so that its value is written once.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

from .errors import SettingError
from .metrics_config import parse_metrics_config

SETTINGS_FILE = "settings.json"  # in the runtime dir

ArenaExtendStrategy = Literal["", "kNextPowerOfTwo", "kSameAsRequested"]  # "" = ORT's default
CudnnConvAlgoSearch = Literal["", "EXHAUSTIVE", "HEURISTIC", "DEFAULT"]  # "" = ORT's default
LogFormat = Literal["text", "json"]
LaneLayout = Literal["model", "shared"]
GrpcEngine = Literal["core", "aio"]  # gateway/grpc/listener.py
# Triton's model control (common/repository/control.py); "" = ringserve's own: every model at start, a load
# re-reads a served model's config, an unload stops serving it, SIGHUP reloads the repository.
ModelControlMode = Literal["", "none", "explicit", "poll"]
SERVED_REPOSITORY_DIR = "repository"  # explicit mode: the models loaded, in the runtime dir (control.py)
HttpEngine = Literal["fast", "uvicorn"]


@dataclass(frozen=True)
class Settings:
    """One server's settings; `ringserve serve --help` shows each flag with the default from here."""

    model_repository: str
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    # model: each model its own worker processes (lanes; supervision/lanes.py), --workers of them unless its
    # instance_group says; shared: --workers processes, each with every model (one batch at a time for all).
    # model by default: a one-model server is still one worker process (lane 0 serves it).
    lanes: LaneLayout = "model"
    # Model control as Triton's (--model-control-mode): explicit serves only what --load-model names and the
    # repository API loads; poll reloads as the repository changes, every repository_poll_s.
    model_control_mode: ModelControlMode = ""
    load_models: tuple[str, ...] = ()  # explicit mode: the models served from the start ("*": every one)
    repository_poll_s: float = 15.0  # Triton's --repository-poll-secs default
    # Gateway processes accepting on one listening socket; 0 = auto (Settings.gateway_count).
    gateways: int = 0
    # Each gateway binds its own SO_REUSEPORT socket, instead of all accepting on the one the
    # supervisor binds (or systemd passes: then this is ignored).
    reuse_port: bool = False
    standby_workers: int = 0  # hot spares: models loaded, no batches until a worker dies
    # A warm spare per worker device: a worker process started and set up but for its models, which
    # takes the place of a worker that dies (no interpreter start). ~90 MiB RSS each, no model memory.
    warm_spare: bool = True
    slot_count: int = 8
    slot_mb: int = 16
    hang_timeout_s: float = 5.0
    # Before its first heartbeat a worker is still starting its interpreter and importing
    # ONNX Runtime: seconds of CPU that an overloaded host can stretch past hang_timeout_s.
    # Judging that as a hang killed every new worker there, forever (a crash loop).
    worker_start_timeout_s: float = 60.0
    batch_timeout_s: float = 0.0  # 0 = no per-batch ceiling
    # Bounds on calls into a model's code, each a model parameter's default (common/repository/call_bounds.py):
    # a call past its bound has its worker killed (reason load_timeout, ...), judged from the heartbeat's
    # record of the running call (worker/progress.py). 0 = unbounded.
    load_timeout_s: float = 300.0  # a load: ONNX Runtime's session, a model.py's import and initialize
    warmup_timeout_s: float = 300.0  # a load's warm-up (model_warmup)
    execute_timeout_s: float = 300.0  # a batch of a Python model or an ensemble (ONNX: its parameter only)
    finalize_timeout_s: float = 30.0  # a Python model's finalize, at an unload (ttl_s, API, the stop)
    hold_when_unavailable_s: float = 0.0  # 0 = answer 503 at once while no worker is ready
    request_timeout_s: float = 30.0
    max_attempts: int = 2  # worker deaths a batch may cause before it is bisected
    drain_timeout_s: float = 30.0
    max_batches_per_worker: int = 0  # 0 = never recycle for the number of batches
    worker_memory_limit_bytes: int = 0  # 0 = no RSS ceiling
    intra_op_threads: int = 0  # 0: split the CPUs across the workers (Settings.worker_intra_op_threads)
    cpu_only: bool = False
    model_memory_budget_bytes: int = 0  # per worker; 0 = no budget
    gpus: tuple[int, ...] = ()  # CUDA devices, dealt to the workers round-robin; () = device 0
    cuda_arena_extend_strategy: ArenaExtendStrategy = ""
    cudnn_conv_algo_search: CudnnConvAlgoSearch = ""
    runtime_dir: str | None = None  # None: a temp dir of the supervisor's
    log_level: str = "INFO"
    log_format: LogFormat = "text"  # every process's log lines: text, or one JSON object a line
    access_log: bool = False  # one line per HTTP/gRPC request, in log_format
    # OpenTelemetry: the OTLP endpoint spans go to; None = OTEL_EXPORTER_OTLP_ENDPOINT, else tracing off.
    otel_endpoint: str | None = None
    # /metrics on a port of its own as well (Triton: 8002); 0 = only on the HTTP port.
    metrics_port: int = 0
    # Triton's --metrics-config `<setting>=<value>`s, as given (common/metrics_config.py reads them).
    metrics_config: tuple[str, ...] = ()
    # KServe v2 gRPC (GRPCInferenceService), beside HTTP in every gateway (Triton's 8001); 0 = off.
    grpc_port: int = 8001
    # Readiness and start-up checks (issue 15 item 10). Both off: a repository with one broken
    # model serves the others and reports ready, as ringserve always has (Triton's are both on).
    strict_readiness: bool = False  # /v2/health/ready only while every model in the repository serves
    exit_on_error: bool = False  # `serve` exits before serving when a model of the repository cannot serve
    # The gateway's HTTP side. fast: uvicorn's protocol with one write per response and the head's limits
    # (gateway/http/fast.py), where its uvicorn is one CI has run, else uvicorn's own; uvicorn: uvicorn's own.
    http_engine: HttpEngine = "fast"
    api_key: str | None = dataclasses.field(default=None, repr=False)  # None: no key needed
    api_key_everywhere: bool = False  # also on health, metrics and /openapi.json
    max_request_bytes: int = 256 * 1024 * 1024
    body_timeout_s: float = 30.0  # a request body that pauses this long gets 408
    # The gateway's connections (issue 15 item 4).
    # 64 KiB: above nginx's (32 KiB), Node's (16 KiB) and Apache's (8 KiB a line) defaults, so no client that
    # works elsewhere is refused here, and it bounds what one head costs to parse (60 MB took 6 s).
    max_header_bytes: int = 64 * 1024  # request line and headers; 431 past it
    # A head is one packet in practice; 10 s leaves slow links room and frees a dripping connection's
    # descriptor 6x sooner than nginx's 60 s.
    header_timeout_s: float = 10.0  # a request head still incomplete after this gets 408, and is closed
    # Well under the descriptors systemd/ringserve.service allows (65536) and what one event loop serves well.
    max_connections: int = 4096  # requests on connections past this many get 503
    # Triton's system shared-memory extension (Triton 26.09's flag and default: off). On, any client
    # may make the server open, read and write any segment the server's user can open.
    allow_client_shm: bool = False
    client_shm_key_prefixes: tuple[str, ...] = ()  # once on, the keys a client may register (): any
    # gRPC's connections, apart from HTTP's: HTTP/2 multiplexes a client's calls on one, so fewer are needed.
    # A connection past them is closed at accept (the client's call fails UNAVAILABLE, retryable).
    grpc_max_connections: int = 1024
    # Requests one ModelStreamInfer holds, read but not yet answered back; at the cap the gateway stops
    # reading that stream (HTTP/2 flow control then holds the client's writes), so a client that never
    # reads its answers holds this many requests' memory, not every request it can write.
    grpc_stream_max_in_flight: int = 128
    # What one gRPC connection may hold (gateway/grpc/connections.py): calls in flight (also HTTP/2's
    # SETTINGS_MAX_CONCURRENT_STREAMS, so a client queues past it) and their requests' bytes, past which a
    # call is RESOURCE_EXHAUSTED (a connection holding nothing always takes one request).
    grpc_max_calls_per_connection: int = 256
    grpc_max_connection_bytes: int = 256 * 1024 * 1024
    # gRPC's engine: core, the fast path on grpcio's core (falls back to aio, logging why, on a grpcio it
    # was not run on), or aio, grpcio's public grpc.aio.
    grpc_engine: GrpcEngine = "core"
    # The largest input tensor a request may carry, in bytes; 0 = only the slot bounds it (413).
    max_tensor_bytes: int = 0
    # The gateway's scheduling; no flag sets these.
    max_inflight_per_worker: int = 2  # pipelining: the next batch is in the slot while one computes
    retry_after_s: int = 1  # the Retry-After of a 503
    quarantine_poison_requests: int = 3  # this many requests isolated as poison...
    quarantine_window_s: float = 60.0  # ...within this window quarantine their model
    # Sequence models' state stores in /dev/shm are named from this (the supervisor sets it, with 64
    # random bits, and unlinks them all at its stop: shm/states.py). "" before the supervisor has.
    state_store_prefix: str = ""
    # Triton's response cache (--cache-config local,size=N; --response-cache-byte-size N): the bytes of
    # responses it holds, for the models whose config enables it; 0 = no cache (gateway/cache/).
    response_cache_bytes: int = 0
    # Its shared-memory store (shm/cache.py), made by the supervisor; "" before it has, or without a cache.
    response_cache_segment: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_type(f.name, f.type, getattr(self, f.name))
            if f.type == "float" and type(getattr(self, f.name)) is int:  # JSON and callers may write 30 for 30.0
                object.__setattr__(self, f.name, float(getattr(self, f.name)))
        for name in (
            "hang_timeout_s",
            "worker_start_timeout_s",
            "request_timeout_s",
            "body_timeout_s",
            "header_timeout_s",
        ):
            if getattr(self, name) <= 0:
                raise SettingError(name, f"must be > 0, got {getattr(self, name)}")
        for name in (
            "workers",
            "slot_count",
            "slot_mb",
            "max_attempts",
            "max_request_bytes",
            "max_inflight_per_worker",
            "quarantine_poison_requests",
            "max_header_bytes",
            "max_connections",
            "grpc_max_connections",
            "grpc_stream_max_in_flight",
            "grpc_max_calls_per_connection",
            "grpc_max_connection_bytes",
        ):
            if getattr(self, name) < 1:
                raise SettingError(name, f"must be >= 1, got {getattr(self, name)}")
        for name in (
            "gateways",
            "max_batches_per_worker",
            "worker_memory_limit_bytes",
            "drain_timeout_s",
            "batch_timeout_s",
            "load_timeout_s",
            "warmup_timeout_s",
            "execute_timeout_s",
            "finalize_timeout_s",
            "hold_when_unavailable_s",
            "standby_workers",
            "intra_op_threads",
            "model_memory_budget_bytes",
            "retry_after_s",
            "quarantine_window_s",
            "max_tensor_bytes",
            "response_cache_bytes",
        ):
            if getattr(self, name) < 0:
                raise SettingError(name, f"must be >= 0 (0 = off), got {getattr(self, name)}")
        for name in ("port", "grpc_port", "metrics_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise SettingError(name, f"must be a TCP port (0-65535), got {getattr(self, name)}")
        if self.reuse_port and self.port == 0:
            raise SettingError(
                "reuse_port", "needs a fixed port: with port 0 each gateway would listen on a port of its own"
            )
        if any(g < 0 for g in self.gpus):
            raise SettingError("gpus", f"must be CUDA device ids (>= 0), got {list(self.gpus)}")
        if not self.model_repository:
            raise SettingError("model_repository", "must name a directory")
        if self.api_key is not None and not self.api_key.strip():
            raise SettingError("api_key", "is empty; give a key, or none for no key")
        self._check_client_shm()
        self._check_model_control()
        parse_metrics_config(self.metrics_config)  # (SettingError naming the bad one)

    def _check_model_control(self) -> None:
        if self.load_models and self.model_control_mode != "explicit":
            raise SettingError(
                "load_models",
                "names the models to serve at the start in explicit mode: add --model-control-mode explicit",
            )
        if any(not name.strip() or "/" in name or name.strip() in (".", "..") for name in self.load_models):
            raise SettingError(
                "load_models", f"must be model names (directories of the repository), got {list(self.load_models)}"
            )
        if self.repository_poll_s <= 0:
            raise SettingError("repository_poll_s", f"must be > 0, got {self.repository_poll_s}")

    def _check_client_shm(self) -> None:
        if self.client_shm_key_prefixes and not self.allow_client_shm:
            raise SettingError(
                "client_shm_key_prefixes",
                "narrows client shared memory, which is off: add --allow-client-shm, or leave the prefixes out",
            )
        for prefix in self.client_shm_key_prefixes:
            bare = prefix[1:] if prefix.startswith("/") else prefix
            if not bare or "/" in bare or "\0" in bare:
                raise SettingError(
                    "client_shm_key_prefixes",
                    f"{prefix!r} is not the start of a shared-memory key: "
                    "give e.g. /myapp- (one name, a leading '/' allowed)",
                )

    # -- what children derive -------------------------------------------------------------
    def served_repository(self) -> str:
        """The directory every process scans for what it serves: in explicit mode the models loaded, one link
        (or override folder) each in the runtime dir (common/repository/control.py); else the repository."""
        if self.model_control_mode == "explicit" and self.runtime_dir:
            return str(Path(self.runtime_dir) / SERVED_REPOSITORY_DIR)
        return self.model_repository

    def active_workers(self) -> int:
        """Workers the gateway sends batches to: 0 = every ready one; with standbys, --workers of them."""
        return self.workers if self.standby_workers else 0

    def worker_device_id(self, index: int) -> int:
        """The CUDA device of worker `index`: --gpus dealt round-robin, else device 0."""
        return self.gpus[index % len(self.gpus)] if self.gpus else 0

    def spare_device(self, index: int) -> int:
        """The spare group of worker `index`: the CUDA device its runtime is set up for (0 with --cpu-only)."""
        return 0 if self.cpu_only else self.worker_device_id(index)

    def gateway_count(self) -> int:
        """Gateway processes: as given, or (0) one per 4 usable CPUs, 1 to 8 (1 on a 2-core machine,
        where a second gateway only competes with the worker for the same cores)."""
        if self.gateways:
            return self.gateways
        return max(1, min(8, _usable_cpus() // 4))

    def worker_intra_op_threads(self) -> int:
        """ORT intra-op threads per worker: as given, or (0) the usable CPUs less one for the gateway,
        split evenly across every worker process (standbys included), at least 1."""
        if self.intra_op_threads:
            return self.intra_op_threads
        return max(1, (_usable_cpus() - self.gateway_count()) // (self.workers + self.standby_workers))

    # -- the settings file ----------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}

    @classmethod
    def from_json(cls, doc: Any) -> Settings:
        if not isinstance(doc, dict):
            raise SettingError("settings", f"must be a JSON object, got {type(doc).__name__}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(doc) - set(known))
        if unknown:
            raise SettingError("settings", f"unknown: {', '.join(map(repr, unknown))}")
        if "model_repository" not in doc:
            raise SettingError("model_repository", "is missing")
        return cls(
            **{
                name: tuple(value) if known[name].type.startswith("tuple[") and isinstance(value, list) else value
                for name, value in doc.items()
            }
        )

    def write(self, path: Path | str) -> None:
        """Write the settings file, readable by this user only (it may hold the API key)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)  # an earlier run's file may have other bits
            json.dump(self.to_json(), f, indent=1)

    @classmethod
    def read(cls, path: Path | str) -> Settings:
        """The settings a child runs with. The file lies in the runtime dir, which it names too."""
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise SettingError("settings", f"cannot read the settings file {path}: {exc}") from None
        settings = cls.from_json(doc)
        if settings.runtime_dir is None:
            settings = dataclasses.replace(settings, runtime_dir=str(Path(path).resolve().parent))
        return settings


def _usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


_SCALARS = {"str": str, "int": int, "float": (int, float), "bool": bool}
_CHOICES = {
    "ArenaExtendStrategy": ArenaExtendStrategy,
    "CudnnConvAlgoSearch": CudnnConvAlgoSearch,
    "LogFormat": LogFormat,
    "LaneLayout": LaneLayout,
    "GrpcEngine": GrpcEngine,
    "ModelControlMode": ModelControlMode,
    "HttpEngine": HttpEngine,
}


def _check_type(name: str, annotation: str, value: Any) -> None:
    """Refuse a value of the wrong type (a hand-edited settings file, a caller's typo)."""
    if annotation in _CHOICES:
        choices = get_args(_CHOICES[annotation])
        if value not in choices:
            raise SettingError(name, f"must be one of {', '.join(map(repr, choices))}; got {value!r}")
        return
    if annotation in _SCALARS:  # bool is an int to Python, never to a setting
        ok = isinstance(value, _SCALARS[annotation]) and (annotation == "bool") == (type(value) is bool)
    elif annotation == "str | None":
        ok = value is None or isinstance(value, str)
    elif annotation == "tuple[int, ...]":
        ok = isinstance(value, tuple) and all(type(v) is int for v in value)
    elif annotation == "tuple[str, ...]":
        ok = isinstance(value, tuple) and all(type(v) is str for v in value)
    else:
        raise TypeError(f"Settings.{name}: no type check for {annotation}")
    if not ok:
        raise SettingError(name, f"must be {annotation}, got {type(value).__name__} {value!r}")
