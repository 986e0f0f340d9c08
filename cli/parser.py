"""The `ringserve` command's parser: its subcommands and every serve flag, each one a Settings field whose
type and default come from the field; and what each subcommand runs."""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, get_args

from ringserve.cli.flags import ENV_API_KEY, parse_bool, parse_bytes, parse_gpus, settings_from_args
from ringserve.cli.status import show_status
from ringserve.common import runtime_settings
from ringserve.common.cache_config import parse_cache_config
from ringserve.common.errors import SettingError
from ringserve.common.exits import EXIT_OK, EXIT_USAGE
from ringserve.common.process import configure_logging
from ringserve.common.settings import (
    ArenaExtendStrategy,
    CudnnConvAlgoSearch,
    HttpEngine,
    LaneLayout,
    LogFormat,
    ModelControlMode,
    Settings,
)
from ringserve.common.version import VERSION

_FIELD_TYPES = {f.name: {"int": int, "float": float}[f.type] for f in fields(Settings) if f.type in ("int", "float")}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DESCRIPTION = (  # (the text of the command's docstring before it became a package)
    "`ringserve`: serve, serve with tritonserver's flags (tritonserver.py), build demo models, show a running\n"
    "server's status."
)


def _serve(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except SettingError as exc:
        print(f"ringserve serve: {args.flags.get(exc.field, exc.field)}: {exc.problem}", file=sys.stderr)
        return EXIT_USAGE
    return serve_settings(settings, "ringserve serve", "--model-repository")


def serve_settings(settings: Settings, prog: str, repository_flag: str) -> int:
    """Run the supervisor with `settings` (`ringserve serve`'s, or tritonserver's command line's)."""
    from ringserve.supervisor import Supervisor  # noqa: PLC0415 - the supervisor (and everything it imports) only for `serve`

    # Checked here, before any process starts: a worker would only find it missing and be restarted.
    if not Path(settings.model_repository).is_dir():
        print(f"{prog}: {repository_flag}: {settings.model_repository} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    configure_logging("supervisor", settings.log_level, settings.log_format)
    runtime_settings.begin(settings, role="supervisor", runtime_dir="")  # (its own: nothing saved yet)
    return Supervisor(settings).run()


def _with_default(help: str, field: str) -> str:  # noqa: A002 - argparse's own keyword
    """The help text with the default read from Settings (none for flags whose help says it)."""
    default = getattr(Settings.__dataclass_fields__.get(field), "default", MISSING)
    if default is MISSING or default in (None, "", ()) or "default:" in help.lower():
        return help
    if default is False:
        default = "off"
    if field.endswith("_bytes") and default >= 2**20 and default % 2**20 == 0:
        default = f"{default >> 20}MiB"
    elif field.endswith("_bytes") and default >= 2**10 and default % 2**10 == 0:
        default = f"{default >> 10}KiB"
    return f"{help} (default: {default})" if help else f"default: {default}"


def _demo_models(args: argparse.Namespace) -> int:
    from ringserve.common.repository.demo import build_demo_models, build_demo_python_model  # noqa: PLC0415 - onnx is imported only for `demo-models`
    from ringserve.common.repository.demo_text import build_demo_text_models  # noqa: PLC0415 - likewise

    names = [*build_demo_models(Path(args.directory)), build_demo_python_model(Path(args.directory))]
    if args.text:  # (OpenAI's routes: echo, and embed where wordllama is installed)
        names += build_demo_text_models(Path(args.directory))
    print(f"wrote {', '.join(names)} to {args.directory}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringserve", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)
    # No defaults here: a flag not given is absent from the namespace and keeps Settings' default.
    serve = sub.add_parser(
        "serve", help="serve a model repository over KServe v2 HTTP", argument_default=argparse.SUPPRESS
    )
    flags: dict[str, str] = {}  # Settings field -> its flag, for error messages

    def setting(flag: str, field: str | None = None, help: str = "", **options: Any) -> None:  # noqa: A002 - argparse's own keyword
        """A flag that sets a Settings field: its type (int, float) and default come from the field."""
        field = field or flag[2:].replace("-", "_")
        flags[field] = flag
        if "type" not in options and "action" not in options and field in _FIELD_TYPES:
            options["type"] = _FIELD_TYPES[field]
        serve.add_argument(flag, dest=field, help=_with_default(help, field), **options)

    setting(
        "--model-repository",
        required=True,
        metavar="DIR",
        help="the model repository: one folder per model, with config.json (or Triton's config.pbtxt) "
        "and version folders (required, no default)",
    )
    setting(
        "--model-control-mode",
        choices=[c for c in get_args(ModelControlMode) if c],
        help="Triton's model control: none (the models of the start; loads and unloads refused), explicit "
        "(only --load-model's at the start, then the repository API loads and unloads, with config overrides "
        "and files), poll (reload as the repository changes). Default: ringserve's own: every model at the "
        "start, a load re-reads a served model's config, an unload stops serving it, SIGHUP reloads",
    )
    setting(
        "--load-model",
        "load_models",
        action="append",
        metavar="NAME",
        help="explicit mode: serve this model from the start; repeat for several, '*' for every one (default: none)",
    )
    setting(
        "--repository-poll-secs",
        "repository_poll_s",
        type=float,
        metavar="SECONDS",
        help="poll mode: look for changes in the repository this often",
    )
    setting("--host", help="address to listen on")
    setting("--port", help="TCP port to listen on (checked free before any model loads)")
    setting(
        "--workers",
        help="worker processes: with --lanes model, each model's (unless its instance_group says); "
        "with --lanes shared, in all",
    )
    setting(
        "--lanes",
        choices=list(get_args(LaneLayout)),
        help="model: each model runs in worker processes of its own, so no model's batch waits for another "
        "model's; shared: every worker holds every model",
    )
    setting(
        "--gateways",
        help="gateway processes accepting HTTP on the one port, each with its own ring "
        "(0 = one per 4 CPUs, 1 to 8: 1 on a machine of fewer than 8 CPUs)",
    )
    setting(
        "--reuse-port",
        action="store_true",
        help="each gateway listens on its own SO_REUSEPORT socket and the kernel deals connections among "
        "them (default: all accept on one socket the supervisor binds; ignored under socket activation)",
    )
    setting("--standby-workers", help="hot spares with models loaded: one takes over at once when a worker dies")
    setting(
        "--warm-spare",
        nargs="?",
        const=True,
        type=parse_bool,
        metavar="BOOL",
        help="keep a warm spare per worker device: a worker process started and set up but for its models, "
        "which takes the place of a worker that dies or is replaced, so that no interpreter start is "
        "waited for (~90 MiB RSS, no model memory; default: true; --warm-spare=false: off)",
    )
    setting("--slot-count", help="batch slots in each gateway's shared-memory ring")
    setting("--slot-mb", help="bytes per slot (inputs + outputs of one batch)")
    setting("--hang-timeout-s", help="a worker silent this long (no heartbeat) is killed and restarted")
    setting(
        "--worker-start-timeout-s",
        help="a new worker's first heartbeat may take this long (interpreter start and imports on a loaded "
        "host); then --hang-timeout-s applies",
    )
    setting("--batch-timeout-s", help="kill a worker whose batch runs longer than this (0 = off)")
    setting(
        "--load-timeout-s",
        help="kill a worker whose model load (initialize, ONNX Runtime's session) runs longer (0 = off; "
        "a model's parameters.load_timeout_s overrides it)",
    )
    setting("--warmup-timeout-s", help="the same for a load's warm-up (model_warmup; parameters.warmup_timeout_s)")
    setting(
        "--execute-timeout-s",
        help="the same for a batch of a Python model or an ensemble (parameters.execute_timeout_s; "
        "an ONNX model's own parameter only)",
    )
    setting("--finalize-timeout-s", help="the same for a Python model's finalize (parameters.finalize_timeout_s)")
    setting(
        "--hold-when-unavailable-s",
        help="while no worker is ready, hold new requests up to this long instead of 503 (0 = 503)",
    )
    setting("--request-timeout-s", help="a request still waiting for a worker after this gets 504")
    setting("--max-attempts", help="worker deaths a batch may cause before it is bisected")
    setting("--drain-timeout-s", help="on SIGTERM, how long accepted requests may take to finish")
    setting("--max-batches-per-worker", help="replace a worker (without downtime) after this many batches (0 = never)")
    setting(
        "--worker-memory-limit",
        "worker_memory_limit_bytes",
        type=parse_bytes,
        metavar="SIZE",
        help="replace a worker (without downtime) whose RSS passes this, e.g. 2GiB (0 = no limit)",
    )
    setting(
        "--runtime-dir", help="dir for the ZeroMQ sockets (0700); systemd: ${RUNTIME_DIRECTORY}. Default: a temp dir"
    )
    setting(
        "--intra-op-threads",
        help="ORT threads per worker (0 = the CPUs less one per gateway, split across the workers, at least 1)",
    )
    setting("--cpu-only", action="store_true", help="never try the CUDA provider")
    setting(
        "--model-memory-budget",
        "model_memory_budget_bytes",
        type=parse_bytes,
        metavar="SIZE",
        help="memory each worker's loaded models may take, e.g. 2GiB; loads evict idle models to fit, "
        "highest eviction_priority first, then least recently used (0 = no budget)",
    )
    setting(
        "--gpus",
        type=parse_gpus,
        metavar="IDS",
        help="CUDA devices for the workers, e.g. 0,1: worker i gets device ids[i %% len(ids)] (default: 0)",
    )
    setting(
        "--cuda-arena-extend-strategy",
        choices=[c for c in get_args(ArenaExtendStrategy) if c],
        help="ORT CUDA provider option (default: ORT's, kNextPowerOfTwo)",
    )
    setting(
        "--cudnn-conv-algo-search",
        choices=[c for c in get_args(CudnnConvAlgoSearch) if c],
        help="ORT CUDA provider option (default: ORT's, EXHAUSTIVE)",
    )
    setting(
        "--api-key-file",
        metavar="PATH",
        help=f"require 'Authorization: Bearer <key>' on inference, model, repository and admin routes "
        f"(the key: this file's content; or set {ENV_API_KEY}; default: no key)",
    )
    setting(
        "--api-key-everywhere",
        action="store_true",
        help="with an API key, also require it on health, metrics and /openapi.json",
    )
    setting(
        "--max-request-bytes",
        type=parse_bytes,
        metavar="SIZE",
        help="413 for larger request bodies, refused before reading them",
    )
    setting("--body-timeout-s", help="408 when a request body stops arriving for this long")
    setting(
        "--max-header-bytes",
        type=parse_bytes,
        metavar="SIZE",
        help="431 for a request line and headers larger than this",
    )
    setting("--header-timeout-s", help="408 and close when a request's headers have not all arrived after this long")
    setting("--max-connections", help="requests on connections opened past this many get 503")
    # Triton's name and default (26.09): a client that may register a key makes the server read and
    # write any segment its user can open.
    setting(
        "--allow-client-shm",
        nargs="?",
        const=True,
        type=parse_bool,
        metavar="BOOL",
        help="let clients register system shared-memory regions and name them in requests (Triton's "
        "extension): they may then make the server open, read and write any shared-memory segment "
        "its user can open (default: false: register and unregister answer 501)",
    )
    setting(
        "--client-shm-key-prefix",
        "client_shm_key_prefixes",
        action="append",
        metavar="PREFIX",
        help="with --allow-client-shm, only keys that start with PREFIX may be registered, e.g. /myapp-; "
        "repeat for several (default: any key)",
    )
    setting(
        "--grpc-max-connections",
        help="gRPC connections each gateway holds open; one past them is closed at accept (the client's "
        "call fails UNAVAILABLE)",
    )
    setting(
        "--grpc-stream-max-in-flight",
        help="requests one ModelStreamInfer stream may have read and not yet answered; at this many the "
        "gateway stops reading the stream until an answer goes out",
    )
    setting(
        "--grpc-max-calls-per-connection",
        help="gRPC calls one connection may have in flight (HTTP/2's max concurrent streams: a client queues "
        "past it; the server refuses streams past it, a rapid-reset flood's too)",
    )
    setting(
        "--grpc-max-connection-bytes",
        type=parse_bytes,
        metavar="SIZE",
        help="request bytes one gRPC connection's calls may hold; a call past them is RESOURCE_EXHAUSTED "
        "(a connection holding nothing always takes one request)",
    )
    setting(
        "--grpc-engine",
        choices=["core", "aio"],
        help="gRPC's engine: core (the fast path on grpcio's core; grpc.aio serves instead, logging why, on a "
        "grpcio it was not run on) or aio (grpcio's public grpc.aio, slower)",
    )
    setting(
        "--max-tensor-bytes",
        type=parse_bytes,
        metavar="SIZE",
        help="400 for an input tensor larger than this, e.g. 4MiB, refused before its data is read "
        "(0 = only the slot bounds it: 413)",
    )
    setting(
        "--cache-config",
        "response_cache_bytes",
        type=lambda text: parse_cache_config(text, parse_bytes),
        metavar="local,size=SIZE",
        help="Triton's response cache, shared by every gateway: responses of the models whose config has "
        "response_cache { enable: true } are answered from it, least recently used out first past SIZE",
    )
    setting(
        "--response-cache-byte-size",
        "response_cache_bytes",
        type=parse_bytes,
        metavar="SIZE",
        help="Triton's older spelling of --cache-config local,size=SIZE",
    )
    setting("--log-level", type=str.upper, choices=LOG_LEVELS, help="log level of every process")
    setting(
        "--log-format",
        choices=list(get_args(LogFormat)),
        help="every process's log lines: text, or json (one object a line)",
    )
    setting(
        "--access-log",
        nargs="?",
        const=True,
        type=parse_bool,
        metavar="BOOL",
        help="log one line per HTTP and gRPC request, in --log-format (default: false)",
    )
    setting(
        "--otel-endpoint",
        metavar="URL",
        help="send OpenTelemetry spans to this OTLP/HTTP base URL, e.g. http://127.0.0.1:4318 (needs the "
        "otel extra; default: $OTEL_EXPORTER_OTLP_ENDPOINT; neither: tracing off; '' : off)",
    )
    setting("--metrics-port", help="serve /metrics on this port as well (Triton: 8002; 0 = only on --port)")
    setting(
        "--metrics-config",
        "metrics_config",
        action="append",
        metavar="SETTING=VALUE",
        help="Triton's metrics settings: summary_latencies=true, summary_quantiles=0.5:0.05,0.9:0.01,..., "
        "histogram_latencies=true, counter_latencies=false, summary_max_age=S, summary_age_buckets=N; "
        "repeat for several (default: none)",
    )
    setting("--grpc-port", help="KServe v2 gRPC port (Triton's 8001); 0 = no gRPC")
    setting(
        "--http-engine",
        choices=list(get_args(HttpEngine)),
        help="fast: uvicorn's protocol with one write per response and the request head's limits, where the "
        "installed uvicorn is one CI has run (else uvicorn's own, with a warning); uvicorn: uvicorn's own protocol",
    )
    # Triton's names, and its way of writing them: --strict-readiness or --strict-readiness=false.
    setting(
        "--strict-readiness",
        nargs="?",
        const=True,
        type=parse_bool,
        metavar="BOOL",
        help="/v2/health/ready answers 200 only while every model of the repository can be served: none "
        "failed its config or its load (default: false: ready while a worker serves at least one model; "
        "Triton's: true)",
    )
    setting(
        "--exit-on-error",
        nargs="?",
        const=True,
        type=parse_bool,
        metavar="BOOL",
        help="exit before serving when any model of the repository cannot be served, naming each and why "
        "(default: false, the others serve; Triton's: true)",
    )
    serve.set_defaults(func=_serve, flags=flags)
    demo = sub.add_parser(
        "demo-models", help="write the demo models (mlp, encoder; normalize, a Python model) into DIR"
    )
    demo.add_argument("directory")
    demo.add_argument(
        "--text",
        action="store_true",
        help="also the text models of OpenAI's /v1 routes: echo, and embed (the text extra; default: off)",
    )
    demo.set_defaults(func=_demo_models)
    # Parsed by tritonserver.py (main hands it everything after the word): tritonserver's own flags.
    sub.add_parser(
        "tritonserver",
        help="serve with tritonserver's command line (as the ringserve-tritonserver command; see its --help)",
        add_help=False,
    )
    status = sub.add_parser("status", help="show workers, restarts and queues of a running server")
    status.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL (default: %(default)s)")
    status.add_argument("--json", action="store_true", help="print /admin/status as JSON (default: a table)")
    status.set_defaults(func=show_status)
    return parser
