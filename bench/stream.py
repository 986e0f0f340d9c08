"""`python -m bench stream`: the three stream transports side by side, and embeddings batched vs not.

One ringserve (HTTP and --grpc-port) serves the demo's text models for the whole invocation
(common/repository/demo_text.py): `echo`, a decoupled Python model that sends its prompt back a word per
response, one every --token-delay-ms (5) from its own thread, and `embed` (WordLlama: tokenizer in Python,
encoder in ONNX Runtime, an ensemble) beside `embed_mbs1`, the same ensemble with max_batch_size 1.

Streams (TOKENS words each; in each repeat every transport at every level, the transports' order rotating):
  generate_stream  POST /v2/models/echo/generate_stream (Triton's generate extension), `data:` events, httpx
  openai           POST /v1/completions with "stream": true (OpenAI's server-sent events), httpx
  grpc             ModelStreamInfer with triton_enable_empty_final_response (as tritonclient.grpc's
                   stream_infer sends it), one call per stream, grpc.aio, a channel per client
  Each stream gives its time to first token (from the request's send) and its mean gap between tokens; a
  run's p50/p99 are over its streams, and the table holds each run's value's median over --repeats.
  "added per token" = the gap's p50 less the model's nominal pace (the issue's bar: at most 1 ms);
  time.sleep's own overshoot (measured here, in-process, as "sleep pace") is part of it.
Embeddings (POST /v1/embeddings, one text per request, --embed-clients clients):
  embed, embed_mbs1, and the wordllama package's own encode loop in this process (the ceiling: one text
  per call, and 64 texts per call).

A benchmark, not a test: nothing here is asserted. The clients run in this process on the same machine as
the server: on a small machine they compete with it for CPU (their CPU share is in each row).
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import statistics
import struct
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import httpx

from bench.openai_routes import (
    TOKENS,
    build_repository,
    client_limits,
    closed_loop,
    embeddings,
    in_process,
    one_stream,
    record_stream,
    stream_row,
)
from bench.report import new_document, render_table
from bench.servers import free_port, ringserve_service
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

NAME = "stream"
DEFAULTS = {"duration_s": 5.0, "warmup_s": 1.0, "repeats": 3, "concurrency": [1, 64], "embed_clients": 64}
QUICK = {"duration_s": 1.0, "warmup_s": 0.3, "repeats": 1, "concurrency": [1, 4], "embed_clients": 4}
TRANSPORTS = ("generate_stream", "openai", "grpc")
STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
BAR_MS = 1.0  # the bar: a transport adds at most this much per token
MEDIAN_KEYS = ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "gap_p50_ms", "gap_p99_ms", "per_token_p50_ms",
               "server_cpu_us_per_token", "gateway_cpu_us_per_token", "client_cpu_pct", "load1")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="generate_stream vs OpenAI stream vs gRPC stream; embeddings batched vs not",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=levels, default=None, help="concurrent streams (default 1,64)")
    p.add_argument("--embed-clients", type=int, default=None, help="clients for /v1/embeddings (default 64)")
    p.add_argument("--token-delay-ms", type=float, default=5.0, help="echo's pace: a token every this many ms")
    add_common_arguments(p, DEFAULTS, QUICK)
    p.set_defaults(func=main)
    return p


def prompt() -> str:
    return " ".join(f"w{k}" for k in range(TOKENS))


async def generate_stream_one(client: httpx.AsyncClient, sink: list[dict[str, float]]) -> None:
    body = {"text_input": prompt(), "max_tokens": TOKENS, "stream": True}
    sent = time.perf_counter()
    arrivals: list[float] = []
    async with client.stream("POST", "/v2/models/echo/generate_stream", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"text_output"' in line:
                arrivals.append(time.perf_counter())
    record_stream(sink, sent, arrivals)


def grpc_stream_request() -> bytes:
    """echo's request as tritonclient.grpc's stream_infer(enable_empty_final_response=True) sends it: raw contents."""
    from tritonclient.grpc import service_pb2 as pb  # noqa: PLC0415 - the client extra

    request = pb.ModelInferRequest(model_name="echo", id="bench")
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    text = prompt().encode()
    for name, datatype, raw in (("text_input", "BYTES", struct.pack("<I", len(text)) + text),
                                ("max_tokens", "INT32", struct.pack("<i", TOKENS)), ("stream", "BOOL", b"\x01")):
        request.inputs.add(name=name, datatype=datatype, shape=[1])
        request.raw_input_contents.append(raw)
    return request.SerializeToString()


async def grpc_one(call_factory: Callable[[], Any], body: bytes, sink: list[dict[str, float]]) -> None:
    """One ModelStreamInfer call carrying one request: a token per response with outputs, until the final flag."""
    import grpc  # noqa: PLC0415

    sent = time.perf_counter()
    arrivals: list[float] = []
    call = call_factory()
    try:
        await call.write(body)
        async for response in call:
            if response.error_message:
                log.warning("grpc stream: %s", response.error_message)
                break
            if response.infer_response.outputs:
                arrivals.append(time.perf_counter())
            if response.infer_response.parameters["triton_final_response"].bool_param:
                break
        await call.done_writing()
    except grpc.RpcError as exc:
        log.warning("grpc stream failed after %d tokens, %.1f s: %s %s", len(arrivals), time.perf_counter() - sent,
                    exc.code(), exc.details())
        arrivals = []
    finally:
        call.cancel()
    record_stream(sink, sent, arrivals)


async def grpc_streams(target: str, clients: int, duration_s: float, warmup_s: float,
                       at_start: Callable[[], None] | None = None) -> dict[str, Any]:
    import grpc  # noqa: PLC0415
    from tritonclient.grpc import service_pb2 as pb  # noqa: PLC0415

    body = grpc_stream_request()
    channels = [grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(clients)]
    try:
        await asyncio.gather(*(c.channel_ready() for c in channels))
        # Each stream takes the next channel in turn: with `clients` loops, about one stream per channel at a time.
        calls = itertools.cycle([c.stream_stream(STREAM_METHOD, request_serializer=None,
                                                 response_deserializer=pb.ModelStreamInferResponse.FromString)
                                 for c in channels])

        async def one(sink: list[dict[str, float]]) -> None:
            await grpc_one(next(calls), body, sink)

        results, elapsed = await closed_loop(clients, one, duration_s, warmup_s, at_start)
    finally:
        await asyncio.gather(*(c.close() for c in channels))
    return stream_row(clients, results, elapsed)


async def http_streams(url: str, transport: str, clients: int, duration_s: float, warmup_s: float,
                       at_start: Callable[[], None] | None = None) -> dict[str, Any]:
    one_http = generate_stream_one if transport == "generate_stream" else one_stream
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=client_limits(clients)) as client:
        results, elapsed = await closed_loop(clients, lambda sink: one_http(client, sink), duration_s, warmup_s,
                                             at_start)
    return stream_row(clients, results, elapsed)


def measured(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`run()`'s row with this process's CPU share (the clients') and the machine's 1-minute load average."""
    cpu, wall = time.process_time(), time.perf_counter()
    row = run()
    row["client_cpu_pct"] = round(100 * (time.process_time() - cpu) / (time.perf_counter() - wall), 1)
    row["load1"] = round(os.getloadavg()[0], 2)
    return row


def cpu_per_token(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                  tokens: int) -> dict[str, float | None]:
    """The server's CPU µs per token over the measured window: all its processes, and its gateway's."""
    by_role: dict[str, float] = {}
    for pid, (role, seconds) in after.items():
        by_role[role] = by_role.get(role, 0.0) + seconds - before.get(pid, (role, 0.0))[1]
    if not tokens:
        return {"server_cpu_us_per_token": None, "gateway_cpu_us_per_token": None}
    return {"server_cpu_us_per_token": round(sum(by_role.values()) * 1e6 / tokens, 1),
            "gateway_cpu_us_per_token": round(by_role.get("gateway", 0.0) * 1e6 / tokens, 1)}


def statistics_of(url: str, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) of `model` by Triton's statistics extension: their ratio is the mean batch."""
    with urllib.request.urlopen(f"{url}/v2/models/{model}/stats", timeout=10) as response:
        stats = json.loads(response.read())["model_stats"]
    return sum(int(s["inference_count"]) for s in stats), sum(int(s["execution_count"]) for s in stats)


def sleep_pace_ms(delay_ms: float, samples: int = 200) -> float:
    """The mean of time.sleep(delay) here, now: the pace echo's thread can keep at best."""
    started = time.perf_counter()
    for _ in range(samples):
        time.sleep(delay_ms / 1000)
    return round((time.perf_counter() - started) * 1000 / samples, 3)


def medians(runs: list[dict[str, Any]], keys: tuple[str, ...], group: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per `group` value: each of `keys` as the median over the runs (repeats), errors summed."""
    grouped: dict[tuple, list[dict[str, Any]]] = {}
    for run in runs:
        grouped.setdefault(tuple(run[k] for k in group), []).append(run)
    rows = []
    for key, members in grouped.items():
        row: dict[str, Any] = dict(zip(group, key, strict=True))
        for name in keys:
            values = [m[name] for m in members if m.get(name) is not None]
            row[name] = round(statistics.median(values), 3) if values else None
        row["errors"] = sum(m.get("errors", 0) for m in members)
        row["repeats"] = len(members)
        rows.append(row)
    return rows


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # (a line per request otherwise)
    settings = resolve_common(args, DEFAULTS, QUICK)
    concurrency = pick(args, "concurrency", DEFAULTS, QUICK)
    embed_clients = pick(args, "embed_clients", DEFAULTS, QUICK)
    delay = args.token_delay_ms
    document = new_document(NAME, "Streams over generate_stream, OpenAI and gRPC; embeddings batched vs not",
                            command_line(argv), {**settings.to_json(), "concurrency": concurrency,
                                                 "embed_clients": embed_clients, "token_delay_ms": delay})
    stream_runs: list[dict[str, Any]] = document.setdefault("stream_runs", [])
    embed_runs: list[dict[str, Any]] = document.setdefault("embed_runs", [])
    with workspace(NAME) as tmp:
        repo = tmp / "models"
        build_repository(repo, delay)
        grpc_port = free_port()
        # A decoupled stream holds its batch's slot to its end: N streams at once need N slots (small ones).
        service = ringserve_service("ringserve", repo, ["echo", "embed", "embed_mbs1"], log_dir=tmp / "logs",
                                    workers=settings.workers, grpc_port=grpc_port,
                                    description="ringserve serving echo and embed, HTTP and gRPC",
                                    extra_args=["--slot-count", str(max(concurrency) + 8), "--slot-mb", "1"])
        with running([service], settings, document):
            url, target = f"http://127.0.0.1:{service.port}", f"127.0.0.1:{grpc_port}"
            for repeat in range(settings.repeats):
                order = TRANSPORTS[repeat % 3:] + TRANSPORTS[:repeat % 3]
                for clients in concurrency:
                    for transport in order:
                        before: dict[int, tuple[str, float]] = {}

                        def run(transport: str = transport, clients: int = clients,
                                before: dict[int, tuple[str, float]] = before) -> dict[str, Any]:
                            def at_start() -> None:
                                before.update(service.cpu_seconds())
                            if transport == "grpc":
                                return asyncio.run(grpc_streams(target, clients, settings.duration_s,
                                                                settings.warmup_s, at_start))
                            return asyncio.run(http_streams(url, transport, clients, settings.duration_s,
                                                            settings.warmup_s, at_start))
                        row = {"transport": transport, "repeat": repeat, **measured(run)}
                        row.update(cpu_per_token(before, service.cpu_seconds(), row["streams"] * TOKENS))
                        log.info("%s", row)
                        stream_runs.append(row)
                for model in ("embed", "embed_mbs1"):
                    counts = statistics_of(url, model)
                    row = measured(lambda model=model: asyncio.run(
                        embeddings(url, model, embed_clients, settings.duration_s, settings.warmup_s)))
                    inferences, executions = (b - a for a, b in zip(counts, statistics_of(url, model), strict=True))
                    row["mean_batch"] = round(inferences / executions, 2) if executions else None
                    embed_runs.append({"repeat": repeat, **row})
    for repeat in range(settings.repeats):
        for batch in (1, 64):
            row = measured(lambda batch=batch: in_process(settings.duration_s, batch))
            embed_runs.append({"repeat": repeat, **row})
    document["sleep_pace_ms"] = sleep_pace_ms(delay)
    document["streams"] = medians(stream_runs, MEDIAN_KEYS, ("transport", "clients"))
    for row in document["streams"]:
        gap, whole = row["gap_p50_ms"], row["per_token_p50_ms"]
        row["added_per_token_ms"] = None if gap is None else round(gap - delay, 3)
        row["added_whole_stream_ms"] = None if whole is None else round(whole - delay, 3)
        row["stream_tokens_per_s"] = None if not whole else round(1000 / whole, 1)
        row["within_bar"] = None if whole is None else ("yes" if max(whole, gap) - delay <= BAR_MS else "no")
    document["embeddings"] = medians(embed_runs, ("rps", "p50_ms", "p99_ms", "mean_batch", "client_cpu_pct", "load1"),
                                     ("case", "clients"))
    write_outputs(document, settings, render_markdown(document))
    return document


def render_markdown(document: dict[str, Any]) -> str:
    delay = document["settings"]["token_delay_ms"]
    stream_columns = [("transport", "transport", None), ("streams at once", "clients", 0),
                      ("tokens/s (all)", "tokens_per_s", 0), ("tokens/s per stream", "stream_tokens_per_s", 0),
                      ("TTFT p50 ms", "ttft_p50_ms", 1), ("TTFT p99 ms", "ttft_p99_ms", 1),
                      ("gap p50 ms", "gap_p50_ms", 2), ("gap p99 ms", "gap_p99_ms", 2),
                      (f"added/token, between tokens (gap p50 - {delay:g})", "added_per_token_ms", 2),
                      (f"added/token, whole stream (p50 - {delay:g})", "added_whole_stream_ms", 2),
                      (f"<= {BAR_MS:g} ms", "within_bar", None), ("errors", "errors", 0),
                      ("server CPU µs/token", "server_cpu_us_per_token", 0),
                      ("gateway CPU µs/token", "gateway_cpu_us_per_token", 0),
                      ("client CPU %", "client_cpu_pct", 0), ("load avg", "load1", 2)]
    embed_columns = [("case", "case", None), ("clients", "clients", 0), ("texts/s", "rps", 0),
                     ("p50 ms", "p50_ms", 1), ("p99 ms", "p99_ms", 1), ("mean batch", "mean_batch", 1),
                     ("client CPU %", "client_cpu_pct", 0), ("load avg", "load1", 2)]
    return "\n\n".join([
        f"### Streams on echo ({TOKENS} tokens, one every {delay:g} ms), medians over repeats",
        render_table(document["streams"], stream_columns),
        f"\"between tokens\": the gap from a stream's first token to its last, per token; \"whole stream\": from the "
        f"request's send to its last token, over {TOKENS} tokens (queueing before the first token included); the "
        f"bar is met when both are within {BAR_MS:g} ms. time.sleep({delay:g} ms) in this process took "
        f"{document['sleep_pace_ms']:g} ms on average: the model's best pace, its overshoot counted as added.",
        "### /v1/embeddings (one text per request) beside the package in-process, medians over repeats",
        render_table(document["embeddings"], embed_columns)])
