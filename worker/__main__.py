"""`python -m worker`: one inference worker process, spawned by the supervisor (or a warm spare,
`--spare-device`, that becomes one when the supervisor hands it a dead worker's place: worker/spare.py)."""

from __future__ import annotations

import argparse
import functools
import logging
import signal
import sys
from pathlib import Path

import zmq

from ringserve.common import runtime_settings, tracing, wire
from ringserve.common.errors import ConfigError
from ringserve.common.exits import EXIT_BOOT_ERROR, EXIT_OK
from ringserve.common.process import configure_logging, die_with_parent
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.scan import scan_repository
from ringserve.common.settings import Settings

from . import faults, spare
from .bls import Runtime
from .calls import GatewayCalls
from .ensemble import EnsembleSession
from .errors import StopRequested
from .footprint import MemoryMeter, one_heap
from .loop import WorkerLoop
from .models import ModelRegistry
from .onnx_model import OnnxModel
from .progress import CALLS
from .python import pb_metrics, pb_utils
from .python.decoupled import Courier
from .python.python_model import PythonModel, completer
from .runner import Runner
from .session import CUDA, SessionSettings, choose_providers, prime_runtime
from .threads import EventOutbox, HeartbeatThread, ModelLoader

log = logging.getLogger("ringserve.worker")

LOADER_STOP_S = 2.0  # how long a stop waits for a model load in progress
FIRST_GENERATION = 1  # the supervisor counts each index's generations from 1 (supervision/workers.py: Workers.spawn)


def loading_marker(runtime_dir: str, index: int, generation: int) -> Path:
    """File that holds the name of the model this worker is loading (read by the supervisor).

    Per generation: during a zero-downtime replacement two generations of one index live.
    """
    return Path(runtime_dir) / f"loading-w{index}.g{generation}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The settings file, and what differs per worker process (see supervision/workers.py: Workers.spawn)."""
    p = argparse.ArgumentParser(prog="python -m ringserve.worker")
    p.add_argument("--settings", required=True, help="the settings file the supervisor wrote")
    # Each gateway names its own ring (Attach) once the worker has said Ready to it. Accepted and
    # ignored, so that a supervisor that still passes it starts this worker.
    p.add_argument("--segment", default=None, help=argparse.SUPPRESS)
    p.add_argument("--index", type=int)
    p.add_argument("--generation", type=int)
    p.add_argument("--parent-pid", type=int, default=0)
    p.add_argument(
        "--skip-model",
        action="append",
        default=[],
        help="quarantined: do not serve this model key ('m': its default version, 'm/2': version 2)",
    )
    # Its lane (supervision/lanes.py): only these models (or every model but the excluded ones).
    p.add_argument("--lane-model", action="append", default=[], help="serve this model (its lane's)")
    p.add_argument("--lane-exclude", action="append", default=[], help="serve every model but these")
    p.add_argument("--lane-rank", type=int, default=0, help="which of its model's lanes this is")
    p.add_argument(
        "--spare-device",
        type=int,
        default=None,
        help="a warm spare for this device's workers: index and generation come on stdin (TakeOver)",
    )
    args = p.parse_args(argv)
    if args.spare_device is None and (args.index is None or args.generation is None):
        p.error("--index and --generation are required (or --spare-device)")
    return args


def in_lane(args: argparse.Namespace, model: str) -> bool:
    """Whether this worker's lane serves `model` (supervision/lanes.py: Lane.serves)."""
    return model in args.lane_model if args.lane_model else model not in args.lane_exclude


def other_lanes(configs: list[ModelConfig], args: argparse.Namespace) -> dict[tuple[str, int], ModelConfig]:
    """The configs of the models this worker's lane does not hold, by (name, version); -1: the default."""
    found: dict[tuple[str, int], ModelConfig] = {}
    for config in configs:
        if not in_lane(args, config.name):
            found[config.name, config.version] = config
            if config.key == config.name:
                found[config.name, -1] = config
    return found


def prime(settings: SessionSettings, providers: list) -> None:
    """Run the runtime's one-time setup in this thread, so no model's footprint includes it."""
    try:
        prime_runtime(settings, providers)
    except Exception as exc:  # noqa: BLE001 - the models' own loads will say what is wrong
        log.warning("could not prime the runtime (the first model's footprint includes its setup): %s", exc)


def build_registry(
    configs: list[ModelConfig],
    settings: SessionSettings,
    providers: list,
    budget_bytes: int,
    worker_index: int,
    marker: Path,
    outbox: EventOutbox,
    calls: GatewayCalls | None = None,
    elsewhere: dict[tuple[str, int], ModelConfig] | None = None,
) -> ModelRegistry:
    """Every served version, none loaded yet; sessions use the chosen providers, each on its device."""
    on_cuda = isinstance(providers[0], tuple) and providers[0][0] == CUDA
    devices = {c.lifecycle.device_for(worker_index, settings.cuda_device_id) for c in configs}

    def open_session(config: ModelConfig) -> Runner:
        faults.trigger_on_load(config)
        device_id = config.lifecycle.device_for(worker_index, settings.cuda_device_id)
        if config.kind == "python":
            return PythonModel(config, device_id)
        if config.kind == "ensemble":
            return EnsembleSession(config, runtime)
        return OnnxModel(config, settings, providers, device_id=device_id)

    registry = ModelRegistry(
        configs,
        open_session=open_session,
        budget_bytes=budget_bytes,
        meter=MemoryMeter(sorted(devices) if on_cuda else ()),
        marker=marker,
        notify=outbox.put,
    )
    # BLS requests and ensemble steps run the registry's models, and other lanes' through `calls` (worker/bls.py)
    runtime = Runtime(registry, calls, elsewhere)
    pb_utils.set_runtime(runtime)
    return registry


def main(argv: list[str] | None = None) -> int:
    one_heap()  # before any thread: model footprints are measured as RSS deltas (worker/footprint.py)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    die_with_parent(args.parent_pid, signal.SIGKILL)
    try:
        server = Settings.read(args.settings)
    except ConfigError as exc:
        configure_logging("worker", index=args.index, generation=args.generation)
        log.critical("worker cannot boot: %s", exc)
        return EXIT_BOOT_ERROR
    if args.spare_device is not None:
        order = spare.wait_for_takeover(server, args.spare_device, SessionSettings.from_settings)
        if order is None:
            return EXIT_OK
        args.index, args.generation, args.skip_model = order.worker_index, order.generation, order.skip_models
        args.lane_model, args.lane_exclude, args.lane_rank = order.lane_models, order.lane_excludes, order.lane_rank
    configure_logging("worker", server.log_level, server.log_format, index=args.index, generation=args.generation)
    CALLS.configure(server)  # the bounds on calls into model code (worker/progress.py)
    tracing.setup(server.otel_endpoint, "worker", args.index, args.generation)
    runtime_settings.begin(server, role="worker", index=args.index, generation=args.generation)
    loop: WorkerLoop | None = None

    def handle_term(signum: int, frame: object) -> None:
        # Only flag it: the loop finishes the batch it is running, then exits.
        if loop is not None:
            loop.stopping = True
        else:  # scanning or loading: a model's code may be running, and must not take this for its own exit
            raise StopRequested(EXIT_OK)

    signal.signal(signal.SIGTERM, handle_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the supervisor; it decides
    runtime_dir = server.runtime_dir
    # The scan runs Python models' auto_complete_config (worker/python/python_model.py), under the loading
    # marker, and before the first heartbeat, under --worker-start-timeout-s: a big ONNX graph's parse
    # holds the GIL for seconds (a config file is at most 1 MiB: common/repository/pbtxt.py's read_config_text).
    marker = loading_marker(runtime_dir, args.index, args.generation)
    try:
        mine = functools.partial(in_lane, args) if server.lanes == "model" else None  # (not other lanes' imports)
        scan = scan_repository(Path(server.served_repository()), complete=completer(marker, set(args.skip_model), mine))
        configs = [c for c in scan.all_versions() if c.key not in args.skip_model and in_lane(args, c.name)]
    except Exception as exc:  # noqa: BLE001 - whatever stops the boot is logged; the exit code tells the supervisor
        log.critical("worker cannot boot: %s", exc)
        return EXIT_BOOT_ERROR
    pb_metrics.registry.publish_to(runtime_dir, args.index, args.generation)  # Python models' custom metrics
    settings = SessionSettings.from_settings(server, args.index)
    context = zmq.Context(io_threads=1)
    # Heartbeats start before loading: a slow load is alive, a wedged one is not.
    heartbeat = HeartbeatThread(context, wire.endpoint(runtime_dir, "heartbeat"), args.index, args.generation)
    heartbeat.start()
    outbox = EventOutbox()
    # Said once per server start: by worker 0's first generation (the supervisor starts it, and
    # every other worker and restart would only repeat the same machine-wide reason).
    providers = choose_providers(settings, announce=args.index == 0 and args.generation == FIRST_GENERATION)
    prime(settings, providers)
    dispatch_endpoints = [wire.gateway_endpoint(runtime_dir, "dispatch", k) for k in range(server.gateway_count())]
    calls, elsewhere = None, None
    if server.lanes == "model":  # the models of other lanes, asked through the gateways (worker/calls.py)
        calls = GatewayCalls(context, dispatch_endpoints, args.index, args.generation, server.request_timeout_s)
        elsewhere = other_lanes(scan.all_versions(), args)
    registry = build_registry(
        configs, settings, providers, server.model_memory_budget_bytes, args.index, marker, outbox, calls, elsewhere
    )
    # Connected before the eager loads, so each gateway knows its identity by READY. It primes too:
    # a thread's first allocations (its malloc arena) are not a model's footprint.
    loader = ModelLoader(
        registry,
        outbox,
        context=context,
        endpoints=dispatch_endpoints,
        index=args.index,
        generation=args.generation,
        prime=functools.partial(prime, settings, providers),
    )
    # Decoupled streams' responses out and CANCEL in, while the batch loop runs model code.
    courier = Courier(context, dispatch_endpoints, args.index, args.generation)
    registry.load_eager(args.lane_rank if args.lane_model else args.index)  # (a lane's own models: its rank)
    loader.start()
    courier.start()
    loop = WorkerLoop(
        context=context,
        dispatch_endpoints=dispatch_endpoints,
        index=args.index,
        generation=args.generation,
        registry=registry,
        outbox=outbox,
        loader_monitors=[c.monitor for c in loader.connections],
        courier=courier,
        config_failures={
            key: why
            for key, why in scan.failed.items()
            if key not in args.skip_model and in_lane(args, key.split("/")[0])
        },
    )
    heartbeat.loop = loop
    try:
        loop.run()
        registry.close_all()  # Python models' finalize(), as at an unload
    finally:
        loader.stop()
        courier.stop()
        heartbeat.stop()
        heartbeat.join(timeout=1)
        courier.join(timeout=1)
        loader.join(timeout=LOADER_STOP_S)
        loader.close_monitors()
        if calls is not None:
            calls.close()
        if loader.is_alive():  # in the middle of a long load: its socket stays open, the exit closes it
            log.warning("worker %d: a model load was still running at exit", args.index)
        else:
            context.term()
        tracing.shutdown()  # the last batches' spans
        pb_metrics.registry.unpublish()
    log.info("worker %d generation %d stopped", args.index, args.generation)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
