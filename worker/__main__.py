"""`python -m worker`: one inference worker process, spawned by the supervisor."""
from __future__ import annotations

import argparse
import functools
import logging
import signal
import sys
from pathlib import Path

import zmq

from ringserve.common import wire
from ringserve.common.config import ModelConfig, scan_repository
from ringserve.common.process import configure_logging, die_with_parent
from ringserve.shm.segment import Segment

from . import faults
from .footprint import MemoryMeter, one_heap
from .loop import EventOutbox, Heartbeat, ModelLoader, WorkerLoop
from .models import ModelRegistry
from .session import CUDA, ModelSession, SessionSettings, choose_providers, prime_runtime

log = logging.getLogger("ringserve.worker")

EXIT_OK = 0
EXIT_BOOT_ERROR = 3  # could not attach the ring or read the repository: restarting won't help
LOADER_STOP_S = 2.0  # how long a stop waits for a model load in progress
LOADER_CONNECT_S = 10.0  # how long READY waits for the loader's socket to be routable


def loading_marker(runtime_dir: str, index: int, generation: int) -> Path:
    """File that holds the name of the model this worker is loading (read by the supervisor).

    Per generation: during a zero-downtime replacement two generations of one index live.
    """
    return Path(runtime_dir) / f"loading-w{index}.g{generation}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m worker")
    p.add_argument("--runtime-dir", required=True)
    p.add_argument("--segment", required=True)
    p.add_argument("--model-repository", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--generation", type=int, required=True)
    p.add_argument("--parent-pid", type=int, default=0)
    p.add_argument("--intra-op-threads", type=int, default=1)
    p.add_argument("--allow-spinning", action="store_true")
    p.add_argument("--cpu-only", action="store_true")
    p.add_argument("--skip-model", action="append", default=[],
                   help="quarantined: do not serve this model key ('m': its default version, 'm/2': version 2)")
    p.add_argument("--model-memory-budget", type=int, default=0,
                   help="bytes the loaded models of this worker may take (0 = no budget)")
    p.add_argument("--device-id", type=int, default=0, help="the CUDA device of this worker")
    p.add_argument("--cuda-arena-extend-strategy", default="", choices=["", "kNextPowerOfTwo", "kSameAsRequested"])
    p.add_argument("--cudnn-conv-algo-search", default="", choices=["", "EXHAUSTIVE", "HEURISTIC", "DEFAULT"])
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def prime(settings: SessionSettings, providers: list) -> None:
    """Run the runtime's one-time setup in this thread, so no model's footprint includes it."""
    try:
        prime_runtime(settings, providers)
    except Exception as exc:  # the models' own loads will say what is wrong
        log.warning("could not prime the runtime (the first model's footprint includes its setup): %s", exc)


def build_registry(configs: list[ModelConfig], settings: SessionSettings, providers: list, budget_bytes: int,
                   worker_index: int, marker: Path, outbox: EventOutbox) -> ModelRegistry:
    """Every served version, none loaded yet; sessions use the chosen providers, each on its device."""
    on_cuda = isinstance(providers[0], tuple) and providers[0][0] == CUDA
    devices = {c.lifecycle.device_for(worker_index, settings.cuda_device_id) for c in configs}

    def open_session(config: ModelConfig) -> ModelSession:
        faults.trigger_on_load(config)
        return ModelSession(config, settings, providers,
                            device_id=config.lifecycle.device_for(worker_index, settings.cuda_device_id))

    return ModelRegistry(configs, open_session=open_session, budget_bytes=budget_bytes,
                         meter=MemoryMeter(sorted(devices) if on_cuda else ()), marker=marker, notify=outbox.put)


def main(argv: list[str] | None = None) -> int:
    one_heap()  # before any thread: model footprints are measured as RSS deltas (worker/footprint.py)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(f"worker-{args.index}", args.log_level)
    die_with_parent(args.parent_pid, signal.SIGKILL)
    loop: WorkerLoop | None = None

    def handle_term(signum: int, frame: object) -> None:
        # Only flag it: the loop finishes the batch it is running, then exits.
        if loop is not None:
            loop.stopping = True
        else:
            raise SystemExit(EXIT_OK)

    signal.signal(signal.SIGTERM, handle_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the supervisor; it decides
    try:
        segment = Segment.attach(args.segment)
        configs = [c for c in scan_repository(Path(args.model_repository)).all_versions()
                   if c.key not in args.skip_model]
    except Exception as exc:
        log.critical("worker cannot boot: %s", exc)
        return EXIT_BOOT_ERROR
    settings = SessionSettings(intra_op_threads=args.intra_op_threads, allow_spinning=args.allow_spinning,
                               use_cuda=not args.cpu_only, cuda_device_id=args.device_id,
                               cuda_arena_extend_strategy=args.cuda_arena_extend_strategy,
                               cudnn_conv_algo_search=args.cudnn_conv_algo_search)
    context = zmq.Context(io_threads=1)
    # Heartbeats start before loading: a slow load is alive, a wedged one is not.
    heartbeat = Heartbeat(context, wire.endpoint(args.runtime_dir, "heartbeat"), args.index, args.generation)
    heartbeat.start()
    outbox = EventOutbox()
    providers = choose_providers(settings)
    prime(settings, providers)
    registry = build_registry(configs, settings, providers, args.model_memory_budget, args.index,
                              loading_marker(args.runtime_dir, args.index, args.generation), outbox)
    dispatch_endpoint = wire.endpoint(args.runtime_dir, "dispatch")
    # Connected before the eager loads, so the gateway knows its identity by READY. It primes too:
    # a thread's first allocations (its malloc arena) are not a model's footprint.
    loader = ModelLoader(registry, outbox, context=context, endpoint=dispatch_endpoint, index=args.index,
                         generation=args.generation, prime=functools.partial(prime, settings, providers))
    registry.load_eager(args.index)
    if not loader.wait_connected(LOADER_CONNECT_S):
        log.warning("worker %d: the model loader's socket is not connected yet; lazy loads may wait", args.index)
    loader.start()
    loop = WorkerLoop(context=context, dispatch_endpoint=dispatch_endpoint, index=args.index,
                      generation=args.generation, segment=segment, registry=registry, outbox=outbox)
    heartbeat.loop = loop
    try:
        loop.run()
    finally:
        loader.stop()
        heartbeat.stop()
        heartbeat.join(timeout=1)
        loader.join(timeout=LOADER_STOP_S)
        segment.close()
        if loader.is_alive():  # in the middle of a long load: its socket stays open, the exit closes it
            log.warning("worker %d: a model load was still running at exit", args.index)
        else:
            context.term()
    log.info("worker %d generation %d stopped", args.index, args.generation)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
