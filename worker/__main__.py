"""`python -m worker`: one inference worker process, spawned by the supervisor."""
from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

import zmq

from common import wire
from common.config import ModelConfig, load_repository
from common.process import configure_logging, die_with_parent
from shm.segment import Segment

from . import faults
from .loop import Heartbeat, WorkerLoop
from .session import ModelSession, SessionSettings, choose_providers

log = logging.getLogger("worker")

EXIT_OK = 0
EXIT_BOOT_ERROR = 3  # could not attach the ring or read the repository: restarting won't help


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
    p.add_argument("--skip-model", action="append", default=[], help="quarantined: do not load")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def load_models(configs: dict[str, ModelConfig], settings: SessionSettings, marker: Path
                ) -> tuple[dict[str, ModelSession], dict[str, str]]:
    """Load every model; one that fails is reported, not fatal to the others.

    `marker` names the model being loaded while it loads, so that if a native crash
    kills us mid-load, the supervisor knows which model did it.
    """
    providers = choose_providers(settings)
    sessions: dict[str, ModelSession] = {}
    failed: dict[str, str] = {}
    for name, config in configs.items():
        marker.write_text(name)
        try:
            faults.trigger_on_load(config)
            sessions[name] = ModelSession(config, settings, providers)
        except Exception as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"
            log.error("model %s failed to load: %s", name, failed[name])
        else:
            log.info("loaded model %s version %d on %s", name, config.version, sessions[name].provider)
    marker.unlink(missing_ok=True)
    return sessions, failed


def main(argv: list[str] | None = None) -> int:
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
        configs = load_repository(Path(args.model_repository))
        for name in args.skip_model:
            configs.pop(name, None)
    except Exception as exc:
        log.critical("worker cannot boot: %s", exc)
        return EXIT_BOOT_ERROR
    settings = SessionSettings(intra_op_threads=args.intra_op_threads,
                               allow_spinning=args.allow_spinning, use_cuda=not args.cpu_only)
    context = zmq.Context(io_threads=1)
    # Heartbeats start before loading: a slow load is alive, a wedged one is not.
    heartbeat = Heartbeat(context, wire.endpoint(args.runtime_dir, "heartbeat"), args.index, args.generation)
    heartbeat.start()
    sessions, failed = load_models(configs, settings, loading_marker(args.runtime_dir, args.index, args.generation))
    loop = WorkerLoop(context=context, dispatch_endpoint=wire.endpoint(args.runtime_dir, "dispatch"),
                      index=args.index, generation=args.generation, segment=segment,
                      sessions=sessions, failed_models=failed)
    heartbeat.loop = loop
    try:
        loop.run()
    finally:
        heartbeat.stop()
        heartbeat.join(timeout=1)
        sessions.clear()
        segment.close()
        context.term()
    log.info("worker %d generation %d stopped", args.index, args.generation)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
