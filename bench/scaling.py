"""`python -m bench scaling`: one server with G gateway processes, G side by side.

Cases (every server up for the whole invocation, runs interleaved as in every suite):
  g{G}_{provider}_json     ringserve --gateways G, `mlp` (max_batch_size 64), one JSON row per request
  g{G}_{provider}_binary   the same server, the same row as binary tensors (KServe binary extension)
  g{G}rp_{provider}_json   --gateways G --reuse-port (each gateway binds its own SO_REUSEPORT socket)
                           against g{G}_{provider}_json (the supervisor's one shared socket), at
                           G = --reuse-port-at; left out, with the reason, while `serve` has no such flag
  baseline_{provider}_json with --baseline REV: ringserve at REV with its own defaults
  triton_json, triton_binary  with --peers triton: Triton Inference Server (PyTriton's bundled
                           tritonserver: C++ HTTP front end, dynamic batcher, Python backend running
                           the same ONNX model through ONNX Runtime)

--gateways is a list (1,2 here; 1,2,4,8 on a 16-core machine), --providers cpu[,cuda]: cpu runs the
worker with --cpu-only; cuda lets it take the CUDA provider, and the provider each worker really
chose is read from /admin/status (a cuda server whose worker fell back to the CPU is left out, with
the reason). One worker with --intra-op-threads 1 (the common flags) in every case.

Each run reports, besides req/s and latency, the CPU µs per request of each process role (all
gateway processes summed, and each gateway on its own), the mean executed batch, and per gateway
its requests: from each gateway's own /metrics (`/metrics?scope=gateway` on its Unix socket,
<runtime dir>/gateway-<k>.http) when the server has that socket, else estimated from each gateway
process's share of the gateways' CPU (the JSON says which, per run). Then: req/s of each G against
G = 1, the listening modes side by side (balance = busiest gateway's share x G; 1.00 is perfect),
and a projection to --cores CPUs from the CPU per request measured at G = 1 (see render_projection).
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import logging
import math
import os
import socket
import subprocess
import threading
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from bench.load import Payload, ServerCounters, make_binary_infer_body, make_infer_body, median
from bench.models import build_case_repositories
from bench.peers import PEERS, PeerUnavailable, cleanup_peer_temp, install, peer_service
from bench.report import new_document, plot_throughput_and_cdf, ratio, render_table
from bench.runner import Case, run_matrix, summarize_all
from bench.servers import Service, checkout_command, ringserve_command, ringserve_service, role_of
from bench.mlp import baseline_checkout, start_peers_tolerantly
from bench.suite import (
    add_common_arguments,
    command_line,
    levels,
    pick,
    resolve_common,
    running,
    workspace,
    write_outputs,
)

log = logging.getLogger(__name__)

NAME = "scaling"
MODEL = "mlp"
CUDA = "CUDAExecutionProvider"
PROVIDERS = ("cpu", "cuda")
PAYLOADS = ("json", "binary")
DEFAULTS = {"duration_s": 8.0, "warmup_s": 2.0, "repeats": 3, "concurrency": [1, 16, 64]}
QUICK = {"duration_s": 1.0, "warmup_s": 0.0, "repeats": 1, "concurrency": [1, 4]}
PAYLOAD_LABEL = {"json": "JSON", "binary": "binary"}


def names(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"{flag}: expected a comma-separated subset of {','.join(allowed)}, "
                                         f"got {text!r}")
    return list(dict.fromkeys(values))


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="several gateways: G = 1 vs 2 (.. 8), JSON and binary, CPU by role, "
                                         "SO_REUSEPORT vs one shared socket, Triton",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gateways", type=levels, default=[1, 2],
                   help="comma-separated gateway counts, one server each (default 1,2; a 16-core machine: 1,2,4,8)")
    p.add_argument("--providers", type=lambda t: names(t, PROVIDERS, "--providers"), default=["cpu"],
                   help="cpu (the worker runs --cpu-only) and/or cuda (default cpu)")
    p.add_argument("--payloads", type=lambda t: names(t, PAYLOADS, "--payloads"), default=list(PAYLOADS),
                   help="json and/or binary (default both)")
    p.add_argument("--concurrency", type=levels, default=None,
                   help=f"comma-separated client counts (default {','.join(map(str, DEFAULTS['concurrency']))})")
    p.add_argument("--reuse-port-at", type=int, default=2, metavar="G",
                   help="also serve G gateways with --reuse-port, JSON, beside the shared socket (default 2; 0 = no)")
    p.add_argument("--peers", default="", help="peers to measure beside ringserve: triton")
    p.add_argument("--baseline", default=None, metavar="REV",
                   help="also serve ringserve at this git revision (its own defaults), JSON, per provider")
    p.add_argument("--wrk-threads", type=int, default=1,
                   help="wrk -t (default 1: at most one core; a 16-core machine with 8 gateways needs ~4)")
    p.add_argument("--cores", type=int, default=16, help="the projection's machine: this many CPUs (default 16)")
    add_common_arguments(p, DEFAULTS, QUICK)
    p.set_defaults(func=main)
    return p


# -- the server's flags -------------------------------------------------------------------------
def serve_help(source: Path | None = None) -> str:
    """`ringserve serve --help` of this checkout (or of `source`): which flags the server has."""
    program, env = (checkout_command(source) if source else (ringserve_command(), None))
    try:
        done = subprocess.run([*program, "serve", "--help"], capture_output=True, text=True, timeout=60,
                              env=None if env is None else {**os.environ, **env}, cwd=source, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(serve --help failed: {exc})"
    return done.stdout + done.stderr


# -- per gateway: its own counters over its Unix socket, its process, its CPU -----------------------
class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.unix_path)
        except BaseException:
            sock.close()  # a socket file nobody listens on (the gateway is gone): refused
            raise
        self.sock = sock


def unix_get(path: str, target: str, timeout_s: float = 5.0) -> tuple[int, str]:
    connection = _UnixHTTPConnection(path, timeout_s)
    try:
        connection.request("GET", target)
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


def _arg(cmdline: list[str], flag: str) -> str | None:
    for i, arg in enumerate(cmdline):
        if arg == flag and i + 1 < len(cmdline):
            return cmdline[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def gateway_processes(service: Service) -> dict[int, dict[str, Any]]:
    """{pid: {"index": k, "runtime_dir": dir}} of the service's gateway processes, from their command
    lines (`--index k`, absent in a server older than several gateways = 0; `--settings <runtime
    dir>/settings.json`)."""
    found = {}
    for process in service.processes():
        with contextlib.suppress(psutil.Error):
            if role_of(process) != "gateway":
                continue
            cmdline = process.cmdline()
            index = _arg(cmdline, "--index")
            settings = _arg(cmdline, "--settings")
            found[process.pid] = {"index": int(index) if index and index.isdigit() else 0,
                                  "runtime_dir": os.path.dirname(settings) if settings else None}
    return found


class GatewayCounters:
    """Window extra: each gateway's requests in the window, and each gateway process's CPU.

    Requests per gateway come from its gateway-scope /metrics over its Unix socket when every gateway
    answers there; otherwise from each gateway's share of the gateways' CPU (requests cost about the
    same CPU whichever gateway takes them, so the CPU share estimates the request share)."""

    def __init__(self, service: Service, model: str) -> None:
        self.service, self.model = service, model
        self.gateways: dict[int, dict[str, Any]] = {}
        self.before: dict[int, ServerCounters | None] = {}
        self.after: dict[int, ServerCounters | None] = {}
        self.errors: list[str] = []

    def _scrape(self) -> dict[int, ServerCounters | None]:
        out = {}
        for pid, info in self.gateways.items():
            out[pid] = None
            if not info["runtime_dir"]:
                continue
            path = os.path.join(info["runtime_dir"], f"gateway-{info['index']}.http")
            if not os.path.exists(path):
                continue
            try:
                status, text = unix_get(path, "/metrics?scope=gateway")
            except OSError as exc:
                self.errors.append(f"gateway {info['index']}: {exc!r}")
                continue
            if status == 200:
                out[pid] = ServerCounters.from_text(text, self.model)
            else:
                self.errors.append(f"gateway {info['index']}: /metrics?scope=gateway answered {status}")
        return out

    def start(self) -> None:
        self.gateways = gateway_processes(self.service)
        self.errors = []
        self.before = self._scrape()

    def end(self) -> None:
        self.after = self._scrape()

    def result(self, load, window) -> dict[str, Any]:
        rows = []
        for pid, info in sorted(self.gateways.items(), key=lambda kv: kv[1]["index"]):
            role, c1 = window.cpu1.get(pid, ("gone", 0.0))
            c0 = window.cpu0.get(pid, (role, 0.0))[1]
            rows.append({"index": info["index"], "pid": pid, "cpu_s": max(0.0, c1 - c0)})
        scraped = rows and all(self.before.get(r["pid"]) and self.after.get(r["pid"]) for r in rows)
        if scraped:
            for row in rows:
                b, a = self.before[row["pid"]], self.after[row["pid"]]
                row["requests"] = sum(a.requests_by_code.values()) - sum(b.requests_by_code.values())
                row["batches"] = a.batches - b.batches
                row["batch_rows"] = a.batch_rows - b.batch_rows
            source = "gateway-scope /metrics over each gateway's Unix socket"
        else:
            total_cpu = sum(r["cpu_s"] for r in rows)
            for row in rows:
                row["requests"] = load.requests * row["cpu_s"] / total_cpu if total_cpu > 0 else None
            source = "each gateway process's share of the gateways' CPU (no gateway Unix socket answered)"
        counted = sum(r["requests"] or 0 for r in rows)
        for row in rows:
            row["share"] = row["requests"] / counted if counted and row["requests"] is not None else None
            row["cpu_us_per_request"] = row["cpu_s"] / row["requests"] * 1e6 if row["requests"] else None
            row["cpu_s"] = round(row["cpu_s"], 4)
        shares = [r["share"] for r in rows if r["share"] is not None]
        out: dict[str, Any] = {
            "gateways": rows, "gateway_count": len(rows), "gateway_requests_source": source,
            # 1.00 = every gateway took 1/G of the requests; 2.00 at G = 2 = one gateway took them all.
            "gateway_balance": max(shares) * len(rows) if shares and len(rows) > 1 else None,
            "gateway_errors": self.errors[:5]}
        if scraped:
            batches = sum(r["batches"] for r in rows)
            out["mean_batch_gateways"] = sum(r["batch_rows"] for r in rows) / batches if batches else None
        return out


class TritonBatches:
    """Window extra for the Triton peer: its executed batches from its own Prometheus metrics
    (nv_inference_request_success / nv_inference_exec_count of the model = mean batch)."""

    def __init__(self, metrics_url: str, model: str = MODEL) -> None:
        self.url, self.model = metrics_url, model
        self.before: tuple[float, float] | None = None
        self.after: tuple[float, float] | None = None

    def _scrape(self) -> tuple[float, float] | None:
        from bench.load import metric_sum, parse_prometheus  # noqa: PLC0415

        try:
            with urllib.request.urlopen(self.url, timeout=5) as response:
                samples = parse_prometheus(response.read().decode())
        except OSError:
            return None
        return (metric_sum(samples, "nv_inference_request_success", model=self.model),
                metric_sum(samples, "nv_inference_exec_count", model=self.model))

    def start(self) -> None:
        self.before = self._scrape()

    def end(self) -> None:
        self.after = self._scrape()

    def result(self, load, window) -> dict[str, Any]:
        if not self.before or not self.after or self.after[1] <= self.before[1]:
            return {}
        requests, executions = self.after[0] - self.before[0], self.after[1] - self.before[1]
        return {"mean_batch": requests / executions, "batches": executions, "batch_rows": requests}


class NvmlSampler:
    """Window extra (cuda cases, when nvidia-ml-py imports): GPU utilisation and memory during the window."""

    def __init__(self, device: int = 0, period_s: float = 0.1) -> None:
        import pynvml  # noqa: PLC0415 - optional

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        self.period_s = period_s
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self.stop.wait(self.period_s):
            with contextlib.suppress(Exception):
                util = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
                memory = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
                self.samples.append((float(util.gpu), memory.used / 2**20))

    def start(self) -> None:
        self.samples = []
        self.stop.clear()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def end(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(2)

    def result(self, load, window) -> dict[str, Any]:
        if not self.samples:
            return {"gpu_util_pct": None, "gpu_mem_used_mib": None}
        util = [s[0] for s in self.samples]
        return {"gpu_util_pct": sum(util) / len(util), "gpu_util_pct_max": max(util),
                "gpu_mem_used_mib": max(s[1] for s in self.samples), "gpu_samples": len(self.samples)}


def nvml_snapshot(worker_pids: list[int]) -> dict[str, Any]:
    """The device, its memory and which processes hold memory on it (device placement), via NVML."""
    try:
        import pynvml  # noqa: PLC0415 - optional
    except ImportError:
        return {"available": False, "why": "nvidia-ml-py (pynvml) is not importable"}
    try:
        pynvml.nvmlInit()
        out: dict[str, Any] = {"available": True, "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
                               "devices": []}
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            processes = []
            with contextlib.suppress(pynvml.NVMLError):
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    processes.append({"pid": p.pid, "used_mib": (p.usedGpuMemory or 0) / 2**20,
                                      "ringserve_worker": p.pid in worker_pids})
            out["devices"].append({"index": i, "name": _text(pynvml.nvmlDeviceGetName(handle)),
                                   "memory_total_mib": memory.total / 2**20, "memory_used_mib": memory.used / 2**20,
                                   "processes": processes})
        return out
    except Exception as exc:  # noqa: BLE001 - NVML is a report, never a failure of the bench
        return {"available": False, "why": repr(exc)}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def chosen_providers(service: Service) -> dict[str, Any]:
    """What each worker of a ringserve service chose, from /admin/status: {model key: provider}, pids."""
    try:
        import json  # noqa: PLC0415

        with urllib.request.urlopen(service.url + "/admin/status", timeout=10) as response:
            status = json.loads(response.read())
    except (OSError, ValueError) as exc:
        return {"error": repr(exc)}
    return {"workers": [{"index": w.get("index"), "pid": w.get("pid"), "models": w.get("models")}
                        for w in status.get("workers", [])],
            "gateways": [{"index": g.get("index"), "pid": g.get("pid")} for g in status.get("gateways", [])]}


def uses_cuda(providers: dict[str, Any]) -> bool:
    workers = providers.get("workers") or []
    return bool(workers) and all(CUDA in (w.get("models") or {}).values() for w in workers)


# -- building the cases -----------------------------------------------------------------------------
def label(g: int | str, provider: str, payload: str, reuse_port: bool = False) -> str:
    mode = ", SO_REUSEPORT" if reuse_port else ""
    return f"ringserve G={g}{mode}, {provider.upper()}, {PAYLOAD_LABEL[payload]}"


def build_cases(args, settings, tmp: Path, document: dict[str, Any], baseline: Path | None
                ) -> tuple[list[Case], dict[str, str]]:
    repos = build_case_repositories(tmp, MODEL)
    logs = tmp / "logs"
    body = make_infer_body()
    binary, headers = make_binary_infer_body()
    payloads = {"json": Payload.single(body, description=f"KServe v2 JSON, one row of 512 FP32 values, "
                                                         f"{len(body)} bytes"),
                "binary": Payload(bodies=(binary,), headers=(headers,), content_type="application/octet-stream",
                                  description=f"binary tensor extension, {len(binary)} bytes")}
    help_text = serve_help()
    has_gateways, has_reuse_port = "--gateways" in help_text, "--reuse-port" in help_text
    document["server_flags"] = {"--gateways": has_gateways, "--reuse-port": has_reuse_port}
    cases: list[Case] = []
    labels: dict[str, str] = {}

    def ringserve(name: str, provider: str, extra: list[str], source: Path | None = None) -> Service:
        service = ringserve_service(name, repos["batched"], [MODEL], log_dir=logs, workers=settings.workers,
                                    intra_op_threads=settings.intra_op_threads, extra_args=extra,
                                    description=name, source=source, cpu_only=provider == "cpu")
        document["services"][name] = {"provider_requested": provider}
        return service

    def add(name: str, text: str, service: Service, payload: str, extras: tuple = ()) -> None:
        labels[name] = text
        cases.append(Case(name, text, service, payloads[payload], MODEL,
                          extras=(GatewayCounters(service, MODEL), *extras)))

    skipped = document.setdefault("skipped", {})
    if not has_gateways:
        skipped["gateways"] = "`ringserve serve` has no --gateways here: every case runs the server's one gateway"
    for provider in args.providers:
        for g in args.gateways:
            service = ringserve(f"g{g}_{provider}", provider, ["--gateways", str(g)] if has_gateways else [])
            for payload in args.payloads:
                add(f"g{g}_{provider}_{payload}", label(g, provider, payload), service, payload)
        rp = args.reuse_port_at
        if rp:
            if not has_reuse_port:
                skipped[f"g{rp}rp_{provider}_json"] = (
                    f"g{rp}rp_{provider}_json: skipped, `ringserve serve` has no --reuse-port yet; "
                    "only the shared socket is measured")
            else:
                if rp not in args.gateways:
                    log.warning("--reuse-port-at %d: G=%d is not in --gateways, so the shared socket's case is "
                                "missing beside it", rp, rp)
                service = ringserve(f"g{rp}rp_{provider}", provider, ["--gateways", str(rp), "--reuse-port"])
                add(f"g{rp}rp_{provider}_json", label(rp, provider, "json", reuse_port=True), service, "json")
        if baseline is not None:
            service = ringserve(f"baseline_{provider}", provider, [], source=baseline)
            add(f"baseline_{provider}_json", f"ringserve at {args.baseline}, {provider.upper()}, JSON", service,
                "json")
    for peer_name in [p.strip() for p in args.peers.split(",") if p.strip()]:
        if peer_name not in PEERS:
            raise SystemExit(f"--peers: unknown peer {peer_name!r}; choose from {', '.join(PEERS)}")
        peer = PEERS[peer_name]
        try:
            install(peer)
        except PeerUnavailable as exc:
            log.warning("%s", exc)
            skipped[peer_name] = str(exc)
            continue
        workdir = tmp / "peers" / peer_name
        workdir.mkdir(parents=True, exist_ok=True)
        service = peer_service(peer, repos["batched"] / MODEL / "1" / "model.onnx", workdir=workdir, log_dir=logs,
                               body=body)
        document["services"][peer_name] = {"kind": "peer", "description": service.description}
        for payload in args.payloads if peer_name == "triton" else ["json"]:
            name = f"{peer_name}_{payload}"
            labels[name] = f"{peer.label}, {PAYLOAD_LABEL[payload]}"
            extras = ()
            if peer_name == "triton":  # triton_app.py MODEL HTTP_PORT GRPC_PORT METRICS_PORT ...
                extras = (TritonBatches(f"http://127.0.0.1:{service.args[5]}/metrics"),)
            cases.append(Case(name, labels[name], service, payloads[payload], extras=extras))
    return cases, labels


# -- main -----------------------------------------------------------------------------------------
def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    settings = resolve_common(args, DEFAULTS, QUICK)
    concurrency = pick(args, "concurrency", DEFAULTS, QUICK)
    document = new_document(NAME, "several gateways: G side by side, CPU by process role, listening modes",
                            command_line(argv), {**settings.to_json(), "concurrency": concurrency,
                                                 "gateways": args.gateways, "providers": args.providers,
                                                 "payloads": args.payloads, "reuse_port_at": args.reuse_port_at,
                                                 "peers": args.peers, "baseline": args.baseline,
                                                 "wrk_threads": args.wrk_threads, "cores": args.cores})
    document["onnxruntime_imported"] = imported_onnxruntime()
    interrupted: BaseException | None = None
    with workspace(NAME) as tmp, baseline_checkout(args.baseline, tmp, document) as baseline:
        all_cases, labels = build_cases(args, settings, tmp, document, baseline)
        try:
            # One start per peer service (triton serves two cases); a peer that fails is left out with the reason.
            started = {id(c.service): c for c in all_cases if c.service.kind == "peer"}
            ok = {id(c.service) for c in start_peers_tolerantly(list(started.values()), settings, document)}
            cases = [c for c in all_cases if c.service.kind != "peer" or id(c.service) in ok]
            services = list({id(c.service): c.service for c in cases if c.service.kind != "peer"}.values())
            with running(services, settings, document):
                cases = check_providers(cases, services, document)
                try:
                    run_matrix(cases, concurrency, repeats=settings.repeats, duration_s=settings.duration_s,
                               warmup_s=settings.warmup_s, generator=settings.generator,
                               request_timeout_s=settings.request_timeout_s, quiet=settings.quiet,
                               wrk_threads=args.wrk_threads, sink=document["runs"])
                except (SystemExit, KeyboardInterrupt) as exc:  # a timeout's SIGTERM: keep what was measured
                    interrupted = exc
                    document["interrupted"] = (f"stopped ({type(exc).__name__} {getattr(exc, 'code', '')}) after "
                                               f"{len(document['runs'])} runs; the tables hold those only")
                    log.warning("%s", document["interrupted"])
                if "cuda" in args.providers:
                    workers = [w["pid"] for s in document["providers"].values() for w in s.get("workers", [])]
                    document["nvml_after"] = nvml_snapshot(workers)
        finally:
            for case in all_cases:
                if case.service.kind == "peer" and not case.service.stop_report:
                    report = case.service.stop()
                    if report:
                        document["services"].setdefault(case.service.name, {})["stop"] = report
                    cleanup_peer_temp(case.service)
    kept = {c.name: labels[c.name] for c in cases}
    document["summary"] = summarize_all(document["runs"], kept)
    add_role_medians(document["summary"], document["runs"])
    document["ratios"] = gateway_ratios(document["summary"])
    document["listening"] = listening_rows(document["summary"], args.reuse_port_at)
    document["projection"] = projection(document["summary"], args.gateways, args.cores)
    write_outputs(document, settings, render_markdown(document, settings))
    if interrupted is not None:
        raise interrupted
    return document


def imported_onnxruntime() -> dict[str, Any]:
    """The onnxruntime that `import` finds (bench/gpu_scaling.sh puts a carried onnxruntime-gpu ahead of the
    image's own build, whose distribution metadata the machine description would otherwise report)."""
    try:
        import onnxruntime as ort  # noqa: PLC0415
    except ImportError as exc:
        return {"error": repr(exc)}
    return {"version": ort.__version__, "file": ort.__file__, "providers": ort.get_available_providers()}


def check_providers(cases: list[Case], services: list[Service], document: dict[str, Any]) -> list[Case]:
    """Record the provider each ringserve worker chose; leave out cuda servers that run on the CPU."""
    document["providers"] = {}
    dropped = set()
    for service in services:
        if service.kind != "ringserve":
            continue
        requested = document["services"].get(service.name, {}).get("provider_requested", "cpu")
        chosen = chosen_providers(service)
        document["providers"][service.name] = {"requested": requested, **chosen}
        if requested == "cuda" and not uses_cuda(chosen):
            said = "; ".join(line.split("execution provider", 1)[-1].strip(": ")
                             for line in service.log_lines("execution provider")[:1])
            reason = (f"{service.name}: skipped, the CUDA provider was asked for but the worker chose "
                      f"{[w.get('models') for w in chosen.get('workers', [])] or chosen.get('error')}"
                      f"{f' (its log: {said})' if said else ''}")
            log.warning("%s", reason)
            document.setdefault("skipped", {})[service.name] = reason
            document["providers"][service.name]["worker_said"] = said
            dropped.add(service.name)
            service.stop()  # not measured: its idle processes should not share the machine with the runs
            document["services"][service.name]["stop"] = service.stop_report
    if any(p.get("requested") == "cuda" for p in document["providers"].values()):
        workers = [w["pid"] for p in document["providers"].values() for w in p.get("workers", []) if w.get("pid")]
        document["nvml_before"] = nvml_snapshot(workers)
    kept = []
    for case in cases:
        if case.service.name in dropped:
            continue
        if case.service.kind == "ringserve" and document["providers"].get(case.service.name, {}).get("requested") \
                == "cuda" and "nvml_before" in document and document["nvml_before"].get("available"):
            with contextlib.suppress(Exception):
                case.extras = (*case.extras, NvmlSampler())
        kept.append(case)
    return kept


# -- summaries --------------------------------------------------------------------------------------
def _used_runs(runs: list[dict[str, Any]], case: str, level: float) -> list[dict[str, Any]]:
    """The runs summarize() took its medians from: kept, not failed, quiet ones when there are any."""
    measured = [r for r in runs if r["case"] == case and r["level"] == level and not r.get("discarded")
                and "failed" not in r]
    return [r for r in measured if not r.get("noisy")] or measured


def add_role_medians(summary: list[dict[str, Any]], runs: list[dict[str, Any]]) -> None:
    """Per summary row: median CPU µs per request of each role, of each gateway, the gateway balance."""
    for row in summary:
        used = _used_runs(runs, row["case"], row["level"])
        roles = sorted({k for r in used for k in r.get("server_cpu_us_per_request_by_role", {})})
        row["cpu_us_by_role"] = {role: _m([r.get("server_cpu_us_per_request_by_role", {}).get(role) for r in used])
                                 for role in roles}
        count = max((r.get("gateway_count") or 0 for r in used), default=0)
        row["gateway_count"] = count or None
        per = []
        for k in range(count):
            entries = [next((g for g in r.get("gateways", []) if g["index"] == k), None) for r in used]
            per.append({"index": k, "cpu_us_per_request_of_all": _m([g["cpu_s"] / r["requests"] * 1e6
                                                                     if g and r.get("requests") else None
                                                                     for g, r in zip(entries, used, strict=True)]),
                        "share": _m([g and g.get("share") for g in entries])})
        row["gateways"] = per
        row["gateway_balance"] = _m([r.get("gateway_balance") for r in used])
        row["gateway_requests_source"] = next((r.get("gateway_requests_source") for r in used), None)
        row["mean_batch_gateways"] = _m([r.get("mean_batch_gateways") for r in used])
        if row.get("mean_batch") is None:
            row["mean_batch"] = row["mean_batch_gateways"]


def _m(values) -> float | None:
    value = median([v for v in values if v is not None])
    return None if math.isnan(value) else value


def _parse_case(case: str) -> tuple[str, str, str] | None:
    """'g2_cpu_json' -> ('2', 'cpu', 'json'); 'g2rp_cpu_json' -> ('2rp', ...); others None."""
    parts = case.split("_")
    if len(parts) == 3 and parts[0].startswith("g"):
        return parts[0][1:], parts[1], parts[2]
    return None


def gateway_ratios(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each G's req/s against G = 1 (same provider, payload, clients): the ratio, and ideal G."""
    closed = [r for r in summary if r["mode"] == "closed"]
    index = {(_parse_case(r["case"]), r["clients"]): r for r in closed if _parse_case(r["case"])}
    rows = []
    for (parsed, clients), row in index.items():
        g, provider, payload = parsed
        if not g.isdigit() or g == "1":
            continue
        one = index.get((("1", provider, payload), clients))
        if one is None:
            continue
        rows.append({"provider": provider, "payload": payload, "clients": clients, "gateways": int(g),
                     "g1_rps": one["rps"], "g_rps": row["rps"], "rps_ratio": ratio(row["rps"], one["rps"]),
                     "scaling_efficiency": (ratio(row["rps"], one["rps"]) or 0) / int(g) or None,
                     "g1_p99_ms": one["p99_ms"], "g_p99_ms": row["p99_ms"]})
    rows.sort(key=lambda r: (r["provider"], r["payload"], r["clients"], r["gateways"]))
    top = max((r["clients"] for r in rows), default=None)
    small = (os.cpu_count() or 1) <= 4
    for row in rows:  # the goals for several gateways, at the highest client count
        if row["clients"] != top or row["rps_ratio"] is None:
            continue
        # 2 vCPUs: G = 2 must not lose more than 5 %; more cores: req/s grows >= 0.8 x G (until the worker
        # or the GPU saturates, which the projection and the worker's CPU tell).
        want = 0.95 if small else 0.8 * row["gateways"]
        row["goal"] = f"≥ {want:.2f}: {'met' if row['rps_ratio'] >= want else 'missed'}"
    return rows


def listening_rows(summary: list[dict[str, Any]], g: int) -> list[dict[str, Any]]:
    """The shared socket and SO_REUSEPORT at G = g, side by side per provider and clients."""
    rows = []
    for row in summary:
        parsed = _parse_case(row["case"])
        if row["mode"] != "closed" or not parsed or parsed[0] not in (str(g), f"{g}rp") or parsed[2] != "json":
            continue
        shares = [p["share"] for p in row.get("gateways", [])]
        rows.append({"provider": parsed[1], "clients": row["clients"],
                     "mode": "SO_REUSEPORT, a socket per gateway" if parsed[0].endswith("rp") else "one shared socket",
                     "rps": row["rps"], "p50_ms": row["p50_ms"], "p99_ms": row["p99_ms"], "errors": row["errors"],
                     "shares": " / ".join("-" if s is None else f"{s * 100:.0f}%" for s in shares) or "-",
                     "balance": row.get("gateway_balance"), "source": row.get("gateway_requests_source")})
    rows.sort(key=lambda r: (r["provider"], r["clients"], r["mode"]))
    return rows


def projection(summary: list[dict[str, Any]], gateways: list[int], cores: int) -> list[dict[str, Any]]:
    """req/s a `cores`-CPU machine would serve with G gateways, from the CPU per request at G = 1.

    At the highest client count, per provider and payload, the G = 1 run gives the CPU µs per request of
    the gateway (g), the worker (w), the rest of the server (s: supervisor, resource tracker) and the
    load generator (l). With G gateways each on a core of its own, the gateways serve G x 1e6/g req/s,
    the one worker (one intra-op thread) 1e6/w, and the machine (cores) x 1e6/(g + w + s + l): the
    projection is the least of the three, and says which one binds. It assumes per-request costs stay
    as measured (no lock or cache contention between gateways, the same batches), so it is an upper
    bound that the measured G rows check where the machine has the cores.
    """
    closed = [r for r in summary if r["mode"] == "closed" and r.get("rps")]
    rows = []
    for row in closed:
        parsed = _parse_case(row["case"])
        if not parsed or parsed[0] != "1":
            continue
        top = max(r["clients"] for r in closed if r["case"] == row["case"])
        if row["clients"] != top:
            continue
        roles = row.get("cpu_us_by_role") or {}
        g, w = roles.get("gateway"), roles.get("worker")
        s = sum(v for k, v in roles.items() if k not in ("gateway", "worker") and v)
        gen = (row.get("gen_cpu_pct") or 0) / 100 * 1e6 / row["rps"] if row.get("rps") else 0.0
        if not g or not w:
            continue
        for n in sorted(set(gateways) | {1, 2, 4, 8}):
            bounds = {"gateways": n * 1e6 / g, "worker": 1e6 / w, "cores": cores * 1e6 / (g + w + s + gen)}
            binding = min(bounds, key=bounds.get)
            rows.append({"provider": parsed[1], "payload": parsed[2], "clients": top, "gateways": n,
                         "gateway_us": g, "worker_us": w, "other_us": s, "generator_us": gen,
                         "projected_rps": bounds[binding], "bound_by": binding,
                         "vs_g1": None})
    for row in rows:
        one = next(r for r in rows if (r["provider"], r["payload"], r["gateways"]) ==
                   (row["provider"], row["payload"], 1))
        row["vs_g1"] = ratio(row["projected_rps"], one["projected_rps"])
    return rows


# -- Markdown -------------------------------------------------------------------------------------
def _roles_text(row: dict[str, Any]) -> str:
    roles = row.get("cpu_us_by_role") or {}
    order = sorted(roles, key=lambda k: (k not in ("gateway", "worker"), k))  # gateway, worker, then the rest
    return ", ".join(f"{k} {roles[k]:,.0f}" for k in order if roles[k] is not None and roles[k] >= 0.5) or "-"


def _gateways_text(row: dict[str, Any]) -> str:
    per = [g.get("cpu_us_per_request_of_all") for g in row.get("gateways", [])]
    if len(per) < 2:
        return "-"
    return " / ".join("-" if v is None else f"{v:,.0f}" for v in per)


def render_markdown(document: dict[str, Any], settings) -> str:
    summary = document["summary"]
    closed = [r for r in summary if r["mode"] == "closed"]
    for row in closed:
        row["roles_text"] = _roles_text(row)
        row["gateways_text"] = _gateways_text(row)
    parts = [f"**Interrupted:** {document['interrupted']}"] if document.get("interrupted") else []
    parts += ["### Closed loop (CPU µs per request: each role's processes summed; per gateway: each gateway's "
             "CPU over all the requests)",
             render_table(closed, [("case", "label", None), ("clients", "clients", None), ("req/s", "rps", 0),
                                   ("p50 ms", "p50_ms", 2), ("p99 ms", "p99_ms", 2), ("errors", "errors", 0),
                                   ("mean batch", "mean_batch", 1), ("CPU µs/req", "server_cpu_us_per_request", 0),
                                   ("CPU µs/req by role", "roles_text", None),
                                   ("per gateway µs/req", "gateways_text", None),
                                   ("gen CPU %", "gen_cpu_pct", 0), ("foreign CPU %", "foreign_cpu_pct", 0)])]
    if document["ratios"]:
        parts += ["### G gateways against G = 1 (req/s ratio; ideal = G)",
                  render_table(document["ratios"], [("provider", "provider", None), ("payload", "payload", None),
                                                    ("clients", "clients", None), ("G", "gateways", None),
                                                    ("G=1 req/s", "g1_rps", 0), ("G req/s", "g_rps", 0),
                                                    ("G ÷ G=1", "rps_ratio", 2),
                                                    ("÷ G (efficiency)", "scaling_efficiency", 2),
                                                    ("G=1 p99 ms", "g1_p99_ms", 1), ("G p99 ms", "g_p99_ms", 1),
                                                    ("goal", "goal", None)])]
    if document["listening"]:
        parts += [f"### Listening: one shared socket vs SO_REUSEPORT at G = {document['settings']['reuse_port_at']} "
                  "(balance = busiest gateway's share × G; 1.00 = even)",
                  render_table(document["listening"], [("provider", "provider", None), ("clients", "clients", None),
                                                        ("mode", "mode", None), ("req/s", "rps", 0),
                                                        ("p99 ms", "p99_ms", 2), ("errors", "errors", 0),
                                                        ("requests per gateway", "shares", None),
                                                        ("balance", "balance", 2), ("counted from", "source", None)])]
    if document["projection"]:
        parts += [f"### Projection to {document['settings']['cores']} CPUs from the CPU per request at G = 1 "
                  "(least of: G × 1e6/gateway µs, 1e6/worker µs, cores × 1e6/all µs)",
                  render_table(document["projection"], [("provider", "provider", None), ("payload", "payload", None),
                                                         ("clients", "clients", None), ("G", "gateways", None),
                                                         ("gateway µs", "gateway_us", 0), ("worker µs", "worker_us", 0),
                                                         ("other µs", "other_us", 0), ("wrk µs", "generator_us", 0),
                                                         ("projected req/s", "projected_rps", 0),
                                                         ("bound by", "bound_by", None), ("÷ G=1", "vs_g1", 2)])]
    for row in closed:  # a server older than several gateways runs one, whatever --gateways says
        parsed = _parse_case(row["case"])
        if parsed and parsed[0].rstrip("rp").isdigit() and row.get("gateway_count") \
                and row["gateway_count"] != int(parsed[0].rstrip("rp")):
            note = (f"{row['case']}: asked for {parsed[0].rstrip('rp')} gateways, {row['gateway_count']} gateway "
                    f"process(es) ran")
            document.setdefault("gateway_mismatch", [])
            if note not in document["gateway_mismatch"]:
                document["gateway_mismatch"].append(note)
    if document.get("gateway_mismatch"):
        parts.append("**Gateway processes that ran differ from --gateways:**\n\n" +
                     "\n".join(f"- {n}" for n in document["gateway_mismatch"]))
    providers = document.get("providers") or {}
    if providers:
        ort_info = document.get("onnxruntime_imported") or {}
        lines = [f"- onnxruntime imported: {ort_info.get('version')} ({ort_info.get('file')}), available providers "
                 f"{ort_info.get('providers')}"] + [f"- {name}: asked {p.get('requested')}, worker(s) chose "
                 f"{', '.join(str(w.get('models')) for w in p.get('workers', [])) or p.get('error')}"
                 for name, p in providers.items()]
        parts.append("### Execution providers (from /admin/status)\n\n" + "\n".join(lines))
    for key in ("nvml_before", "nvml_after"):
        nvml = document.get(key)
        if key == "nvml_after" and nvml and not nvml.get("available"):
            continue  # said once, before
        if nvml and nvml.get("available"):
            devices = "; ".join(f"GPU {d['index']} {d['name']}: {d['memory_used_mib']:,.0f} of "
                                f"{d['memory_total_mib']:,.0f} MiB used, processes "
                                f"{[(p['pid'], round(p['used_mib']), p['ringserve_worker']) for p in d['processes']]}"
                                for d in nvml["devices"])
            parts.append(f"- NVML {key.split('_')[1]} the runs (driver {nvml['driver']}): {devices}")
        elif nvml:
            parts.append(f"- NVML: {nvml.get('why')}")
    for reason in document.get("skipped", {}).values():
        parts.append(f"- skipped: {reason}")
    document["plots"] = plot_throughput_and_cdf(closed, settings.plots_dir, "scaling", "scaling (mlp)")
    return "\n\n".join(parts)
