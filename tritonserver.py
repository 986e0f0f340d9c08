"""`ringserve-tritonserver` (also `ringserve tritonserver ...`): tritonserver's command line, served by ringserve.

Tools that start Triton themselves (KServe's Triton runtime: `tritonserver --model-store=/mnt/models
--grpc-port=9000 --http-port=8080 --allow-grpc=true --allow-http=true`; Model Analyzer's local mode;
ModelMesh's Triton container) start ringserve with the same words. Each flag maps to a ringserve setting
(FLAG_SETTINGS, the README's table); defaults are tritonserver's, not `ringserve serve`'s: every address
(pods are probed on their IP), HTTP 8000, gRPC 8001, metrics on 8002, --strict-readiness and
--exit-on-error on, model control mode none. A tritonserver flag ringserve does not serve is refused by
name (UNSERVED), never taken in silence: a server that ignored --grpc-use-ssl would serve in the clear.
Booleans are written as tritonserver takes them: `--allow-grpc=true`, `--allow-grpc true`, `--allow-grpc`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ringserve.common.cache_config import parse_cache_config
from ringserve.common.errors import SettingError
from ringserve.common.exits import EXIT_USAGE
from ringserve.common.settings import Settings

PROG = "ringserve-tritonserver"

# tritonserver flag -> the ringserve setting it sets (the README's table says the same).
FLAG_SETTINGS = {
    "--model-repository": "model_repository (one repository; --model-store is its other name)",
    "--http-port": "port",
    "--http-address": "host (gRPC and metrics listen there too; default 0.0.0.0)",
    "--grpc-port": "grpc_port",
    "--grpc-address": "host: must equal --http-address",
    "--metrics-port": "metrics_port",
    "--metrics-address": "host: must equal --http-address",
    "--allow-http": "true only: ringserve always serves HTTP",
    "--allow-grpc": "false: grpc_port 0",
    "--allow-metrics": "false: metrics_port 0 (/metrics stays on the HTTP port)",
    "--allow-gpu-metrics": "accepted: nv_gpu_* are served wherever NVML finds a GPU",
    "--allow-cpu-metrics": "accepted: nv_cpu_* are served always",
    "--metrics-interval-ms": "accepted: metrics are read at scrape time (Model Analyzer's local mode sets it)",
    "--metrics-config": "metrics_config (Triton's <setting>=<value>s, repeatable)",
    "--model-control-mode": "model_control_mode",
    "--load-model": "load_models",
    "--repository-poll-secs": "repository_poll_s",
    "--strict-model-config": "false only: ringserve completes configs from the model",
    "--strict-readiness": "strict_readiness",
    "--exit-on-error": "exit_on_error",
    "--exit-timeout-secs": "drain_timeout_s",
    "--log-verbose": "log_level DEBUG when > 0",
    "--log-info": "false: log_level WARNING",
    "--log-warning": "false: log_level ERROR",
    "--log-error": "false: log_level CRITICAL",
    "--log-format": "default and ISO8601: ringserve's text lines",
    "--cache-config": "response_cache_bytes: local,size=N only (common/cache_config.py)",
    "--response-cache-byte-size": "response_cache_bytes (Triton's older spelling of local,size=N)",
}

# tritonserver's flags that ringserve does not serve, and why (or what to use instead).
UNSERVED = {
    "--id": "the server id: ringserve names itself in the server metadata",
    "--backend-directory": "ringserve runs ONNX and Python models itself",
    "--backend-config": "ringserve runs ONNX and Python models itself; see `ringserve serve --help`",
    "--repoagent-directory": "no repository agents",
    "--disable-auto-complete-config": "ringserve always completes configs from the model",
    "--model-config-name": "config.pbtxt or config.json only",
    "--model-namespacing": "one repository",
    "--model-load-thread-count": "each worker loads its models in turn",
    "--model-load-retry-count": "a failed load is retried by the next load request",
    "--model-load-gpu-limit": "use --model-memory-budget of `ringserve serve`",
    "--cache-directory": "the local cache only: --cache-config local,size=N",
    "--pinned-memory-pool-byte-size": "tensors travel in shared memory",
    "--cuda-memory-pool-byte-size": "ONNX Runtime's CUDA arena (`ringserve serve --cuda-arena-extend-strategy`)",
    "--cuda-virtual-address-size": "ONNX Runtime's CUDA arena",
    "--min-supported-compute-capability": "ONNX Runtime decides",
    "--rate-limit": "batches are admitted per lane",
    "--rate-limit-resource": "batches are admitted per lane",
    "--host-policy": "no host policies",
    "--buffer-manager-thread-count": "no buffer manager",
    "--http-thread-count": "one event loop per gateway (`ringserve serve --gateways`)",
    "--http-header-forward-pattern": "headers are not forwarded to models",
    "--http-restricted-api": "use an API key (`ringserve serve --api-key-file`)",
    "--grpc-restricted-api": "use an API key (`ringserve serve --api-key-file`)",
    "--grpc-header-forward-pattern": "headers are not forwarded to models",
    "--grpc-use-ssl": "no TLS: terminate it in front (deploy/)",
    "--grpc-use-ssl-mutual": "no TLS: terminate it in front (deploy/)",
    "--grpc-server-cert": "no TLS: terminate it in front (deploy/)",
    "--grpc-server-key": "no TLS: terminate it in front (deploy/)",
    "--grpc-root-cert": "no TLS: terminate it in front (deploy/)",
    "--grpc-infer-allocation-pool-size": "no allocation pool",
    "--grpc-max-response-pool-size": "no response pool",
    "--grpc-infer-response-compression-level": "answers are not compressed",
    "--grpc-keepalive-time": "grpcio's defaults",
    "--grpc-keepalive-timeout": "grpcio's defaults",
    "--grpc-keepalive-permit-without-calls": "grpcio's defaults",
    "--grpc-http2-max-pings-without-data": "grpcio's defaults",
    "--grpc-http2-min-recv-ping-interval-without-data": "grpcio's defaults",
    "--grpc-http2-max-ping-strikes": "grpcio's defaults",
    "--grpc-max-connection-age": "grpcio's defaults",
    "--grpc-max-connection-age-grace": "grpcio's defaults",
    "--trace-config": "use --otel-endpoint of `ringserve serve`",
    "--trace-file": "use --otel-endpoint of `ringserve serve`",
    "--trace-level": "use --otel-endpoint of `ringserve serve`",
    "--trace-rate": "use --otel-endpoint of `ringserve serve`",
    "--trace-count": "use --otel-endpoint of `ringserve serve`",
    "--trace-log-frequency": "use --otel-endpoint of `ringserve serve`",
    "--log-file": "logs go to stderr (journald under systemd)",
    "--allow-sagemaker": "no SageMaker front end",
    "--sagemaker-port": "no SageMaker front end",
    "--sagemaker-safe-port-range": "no SageMaker front end",
    "--allow-vertex-ai": "no Vertex AI front end",
    "--vertex-ai-port": "no Vertex AI front end",
    "--vertex-ai-default-model": "no Vertex AI front end",
}

# What tritonserver does when a flag is left out (where it differs from `ringserve serve`).
TRITON_DEFAULTS: dict[str, Any] = {
    "host": "0.0.0.0",
    "port": 8000,
    "grpc_port": 8001,
    "metrics_port": 8002,
    "strict_readiness": True,
    "exit_on_error": True,
    "model_control_mode": "none",
}


def parse_bool(text: str) -> bool:
    from ringserve.cli.flags import parse_bool as cli_parse_bool  # noqa: PLC0415 - one spelling of a boolean

    return cli_parse_bool(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Serve a Triton model repository with ringserve, started with tritonserver's flags.",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )

    def boolean(flag: str, help: str) -> None:  # noqa: A002 - argparse's own keyword
        parser.add_argument(flag, nargs="?", const=True, type=parse_bool, metavar="BOOL", help=help)

    parser.add_argument(
        "--model-repository",
        "--model-store",
        dest="model_repositories",
        action="append",
        metavar="DIR",
        help="the model repository (required; one)",
    )
    parser.add_argument("--http-port", type=int, help="HTTP port (default 8000)")
    parser.add_argument("--http-address", help="address HTTP, gRPC and metrics listen on (default 0.0.0.0)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (default 8001)")
    parser.add_argument("--grpc-address", help="must equal --http-address")
    parser.add_argument("--metrics-port", type=int, help="a port of its own for /metrics (default 8002)")
    parser.add_argument("--metrics-address", help="must equal --http-address")
    boolean("--allow-http", "true only: ringserve always serves HTTP")
    boolean("--allow-grpc", "serve gRPC (default true)")
    boolean("--allow-metrics", "serve /metrics on --metrics-port (default true)")
    boolean("--allow-gpu-metrics", "accepted: GPU metrics are served where a GPU is found")
    boolean("--allow-cpu-metrics", "accepted: CPU metrics are served always")
    parser.add_argument("--metrics-interval-ms", type=int, metavar="MS", help="accepted: read at scrape time")
    parser.add_argument(
        "--metrics-config",
        dest="metrics_config",
        action="append",
        metavar="SETTING=VALUE",
        help="summary_latencies=true, summary_quantiles=Q:E,..., histogram_latencies=true, counter_latencies=false",
    )
    parser.add_argument("--model-control-mode", choices=["none", "poll", "explicit"], help="default none")
    parser.add_argument("--load-model", dest="load_models", action="append", metavar="NAME", help="explicit mode")
    parser.add_argument("--repository-poll-secs", type=float, metavar="SECONDS", help="poll mode (default 15)")
    boolean("--strict-model-config", "false only: configs are completed from the model")
    boolean("--strict-readiness", "ready only while every model serves (default true)")
    boolean("--exit-on-error", "exit when a model cannot be served at the start (default true)")
    parser.add_argument("--exit-timeout-secs", type=float, metavar="SECONDS", help="drain time on SIGTERM (30)")
    parser.add_argument("--log-verbose", type=int, metavar="LEVEL", help="> 0: debug logs")
    boolean("--log-info", "false: warnings and errors only")
    boolean("--log-warning", "false: errors only")
    boolean("--log-error", "false: critical only")
    parser.add_argument("--log-format", choices=["default", "ISO8601"], help="ringserve's text lines either way")
    parser.add_argument("--cache-config", type=parse_cache_config, metavar="local,size=N", help="the response cache")
    parser.add_argument("--response-cache-byte-size", type=int, metavar="N", help="the same, as Triton once wrote it")
    return parser


def unserved_flags(argv: list[str]) -> list[str]:
    """The tritonserver flags in `argv` that ringserve does not serve."""
    return [flag for token in argv if (flag := token.split("=", 1)[0]) in UNSERVED]


def settings_from_triton_args(args: argparse.Namespace) -> Settings:
    """ringserve's settings for tritonserver's flags (SettingError naming the flag when one cannot be served)."""
    given = vars(args)
    repositories = given.get("model_repositories") or []
    if len(repositories) != 1:
        raise SettingError(
            "--model-repository",
            "give exactly one (ringserve serves one repository)" if repositories else "is required",
        )
    host = given.get("http_address", TRITON_DEFAULTS["host"])
    for flag in ("grpc_address", "metrics_address"):
        if given.get(flag, host) != host:
            raise SettingError(f"--{flag.replace('_', '-')}", f"must equal --http-address ({host}): one address")
    if given.get("allow_http", True) is False:
        raise SettingError("--allow-http", "ringserve always serves HTTP (its health checks and metrics need it)")
    if "cache_config" in given and "response_cache_byte_size" in given:  # (Triton's words)
        raise SettingError(
            "--cache-config",
            "Incompatible flags --response-cache-byte-size and --cache-config both provided. Please provide one "
            "or the other.",
        )
    if given.get("strict_model_config", False) is True:
        raise SettingError("--strict-model-config", "true is not served: ringserve completes configs from the model")
    values: dict[str, Any] = dict(TRITON_DEFAULTS)
    values.update(
        model_repository=str(Path(repositories[0]).resolve()),
        host=host,
        port=given.get("http_port", TRITON_DEFAULTS["port"]),
        grpc_port=given.get("grpc_port", TRITON_DEFAULTS["grpc_port"]) if given.get("allow_grpc", True) else 0,
        metrics_port=given.get("metrics_port", TRITON_DEFAULTS["metrics_port"])
        if given.get("allow_metrics", True)
        else 0,
        log_level=_log_level(given),
    )
    for flag, field in (
        ("model_control_mode", "model_control_mode"),
        ("repository_poll_secs", "repository_poll_s"),
        ("strict_readiness", "strict_readiness"),
        ("exit_on_error", "exit_on_error"),
        ("exit_timeout_secs", "drain_timeout_s"),
        ("cache_config", "response_cache_bytes"),
        ("response_cache_byte_size", "response_cache_bytes"),
    ):
        if flag in given:
            values[field] = given[flag]
    if "load_models" in given:
        values["load_models"] = tuple(given["load_models"])
    if "metrics_config" in given:
        values["metrics_config"] = tuple(given["metrics_config"])
    return Settings(**values)


def _log_level(given: dict[str, Any]) -> str:
    if given.get("log_verbose", 0) > 0:
        return "DEBUG"
    for flag, level in (("log_error", "CRITICAL"), ("log_warning", "ERROR"), ("log_info", "WARNING")):
        if given.get(flag, True) is False:
            return level
    return "INFO"


# A Settings field -> the tritonserver flag that sets it, for the refusals of Settings' own checks.
_FIELD_FLAGS = {
    "port": "--http-port",
    "grpc_port": "--grpc-port",
    "metrics_port": "--metrics-port",
    "host": "--http-address",
    "model_control_mode": "--model-control-mode",
    "load_models": "--load-model",
    "repository_poll_s": "--repository-poll-secs",
    "drain_timeout_s": "--exit-timeout-secs",
    "metrics_config": "--metrics-config",
    "response_cache_bytes": "--cache-config",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if unserved := unserved_flags(argv):
        for flag in unserved:
            print(f"{PROG}: {flag} is tritonserver's and not served by ringserve: {UNSERVED[flag]}", file=sys.stderr)
        return EXIT_USAGE
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from_triton_args(args)
    except SettingError as exc:
        print(f"{PROG}: {_FIELD_FLAGS.get(exc.field, exc.field)}: {exc.problem}", file=sys.stderr)
        return EXIT_USAGE
    from ringserve.cli.parser import serve_settings  # noqa: PLC0415 - the supervisor is imported only to serve

    return serve_settings(settings, PROG, "--model-repository")


if __name__ == "__main__":
    sys.exit(main())
