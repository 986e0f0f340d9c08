"""`python -m bench openai`: OpenAI's routes (/v1) on the demo's text models, one server for the whole run.

Cases:
  stream      /v1/completions with stream: true on `echo`, which sends a token every --token-delay-ms (5) from
              its own thread: time to first token, and the gap between tokens over the model's own pace
              (what the transport adds per token), at 1 and 64 concurrent streams
  embed       /v1/embeddings, one text per request, 64 clients: `embed` (batched, max_batch_size 64) beside
              `embed_mbs1` (the same ensemble, max_batch_size 1), and the wordllama package's own encode in
              this process (the ceiling: one text per call, and 64 per call)

A benchmark, not a test: nothing here is asserted. Clients are httpx in this process, on the same machine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from bench.report import new_document, render_table
from bench.servers import ringserve_service
from bench.suite import add_common_arguments, command_line, pick, resolve_common, running, workspace, write_outputs

log = logging.getLogger(__name__)

NAME = "openai"
DEFAULTS = {"duration_s": 8.0, "warmup_s": 1.0, "repeats": 1, "concurrency": [1, 64]}
QUICK = {"duration_s": 3.0, "warmup_s": 0.5, "repeats": 1, "concurrency": [1, 16]}
TOKENS = 32
TEXTS = ["The quick brown fox jumps over the lazy dog.", "ringserve batches requests on the server",
         "A sentence of moderate length about embeddings and their uses in retrieval."]


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="OpenAI's routes: stream time to first token and per-token cost; embeddings",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=lambda t: [int(x) for x in t.split(",")], default=None,
                   help="concurrent streams (default 1,64)")
    p.add_argument("--token-delay-ms", type=float, default=5.0, help="echo's pace: a token every this many ms")
    add_common_arguments(p, DEFAULTS, QUICK)
    p.set_defaults(func=main)
    return p


def build_repository(repo: Path, token_delay_ms: float) -> None:
    from ringserve.common.repository.demo_text import build_echo_model, build_embed_models, wordllama_folder  # noqa: PLC0415

    build_echo_model(repo, token_delay_ms=token_delay_ms)
    build_embed_models(repo, wordllama_folder())
    config = json.loads((repo / "embed" / "config.json").read_text())
    (repo / "embed_mbs1" / "1").mkdir(parents=True)
    (repo / "embed_mbs1" / "config.json").write_text(json.dumps({**config, "name": "embed_mbs1", "max_batch_size": 1}))


def client_limits(clients: int) -> httpx.Limits:
    """A keep-alive connection per client, as wrk's: httpx keeps 20 by default, so past 20 clients a request could
    find no idle connection and open one of its own."""
    return httpx.Limits(max_connections=clients, max_keepalive_connections=clients)


async def one_stream(client: httpx.AsyncClient, sink: list[dict[str, float]]) -> None:
    body = {"model": "echo", "prompt": " ".join(f"w{k}" for k in range(TOKENS)), "max_tokens": TOKENS, "stream": True}
    sent = time.perf_counter()
    arrivals: list[float] = []
    async with client.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"text":""' not in line:
                arrivals.append(time.perf_counter())
    record_stream(sink, sent, arrivals)


def record_stream(sink: list[dict[str, float]], sent: float, arrivals: list[float]) -> None:
    """One stream's time to first token, mean gap between tokens and time from its send to its last token; a
    stream short of TOKENS is an error."""
    if len(arrivals) == TOKENS:
        sink.append({"ttft_s": arrivals[0] - sent, "gap_s": (arrivals[-1] - arrivals[0]) / (TOKENS - 1),
                     "stream_s": arrivals[-1] - sent})
    else:
        sink.append({"error": 1.0})


async def closed_loop(clients: int, one: Callable[[list[dict[str, float]]], Awaitable[None]], duration_s: float,
                      warmup_s: float, at_start: Callable[[], None] | None = None,
                      ) -> tuple[list[dict[str, float]], float]:
    """`clients` loops, each running `one(sink)` back to back: warm-up, then `duration_s` measured (`at_start()` is
    called as it starts); the measured streams' records and the measured window's length (to the last stream's
    end). A stream that raises is an error, not the run's end."""
    async def loop(until: float, sink: list[dict[str, float]]) -> None:
        while time.perf_counter() < until:
            try:
                await one(sink)
            except (httpx.HTTPError, OSError, RuntimeError) as exc:
                log.debug("stream failed: %r", exc)
                sink.append({"error": 1.0})
                await asyncio.sleep(0.01)  # a refused connection must not turn the client into a busy loop

    await asyncio.gather(*(loop(time.perf_counter() + warmup_s, []) for _ in range(clients)))
    results: list[dict[str, float]] = []
    if at_start is not None:
        at_start()
    started = time.perf_counter()
    await asyncio.gather(*(loop(started + duration_s, results) for _ in range(clients)))
    return results, time.perf_counter() - started


def stream_row(clients: int, results: list[dict[str, float]], elapsed: float) -> dict[str, Any]:
    done = [r for r in results if "error" not in r]
    ttft = sorted(r["ttft_s"] for r in done)
    gaps = sorted(r["gap_s"] for r in done)
    return {"clients": clients, "streams": len(done), "errors": len(results) - len(done),
            "tokens_per_s": round(len(done) * TOKENS / elapsed, 1),
            "ttft_p50_ms": _ms(_pct(ttft, 50)), "ttft_p99_ms": _ms(_pct(ttft, 99)),
            "gap_p50_ms": _ms(_pct(gaps, 50)), "gap_p99_ms": _ms(_pct(gaps, 99)),
            "per_token_p50_ms": _ms(_pct(sorted(r["stream_s"] / TOKENS for r in done), 50))}


async def streams(url: str, clients: int, duration_s: float, warmup_s: float) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=client_limits(clients)) as client:
        results, elapsed = await closed_loop(clients, lambda sink: one_stream(client, sink), duration_s, warmup_s)
    return stream_row(clients, results, elapsed)


async def embeddings(url: str, model: str, clients: int, duration_s: float, warmup_s: float) -> dict[str, Any]:
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=client_limits(clients)) as client:
        async def loop(until: float, sink: list, k: int) -> None:
            while time.perf_counter() < until:
                t = time.perf_counter()
                r = await client.post("/v1/embeddings", json={"model": model, "input": TEXTS[k % len(TEXTS)]})
                if r.status_code == 200:
                    sink.append(time.perf_counter() - t)

        await asyncio.gather(*(loop(time.perf_counter() + warmup_s, [], k) for k in range(clients)))
        started = time.perf_counter()
        await asyncio.gather(*(loop(started + duration_s, latencies, k) for k in range(clients)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {"case": model, "clients": clients, "rps": round(len(latencies) / elapsed, 1),
            "p50_ms": _ms(_pct(latencies, 50)), "p99_ms": _ms(_pct(latencies, 99))}


def in_process(duration_s: float, batch: int) -> dict[str, Any]:
    from wordllama import WordLlama  # noqa: PLC0415 - the text extra

    from ringserve.common.repository.demo_text import wordllama_folder  # noqa: PLC0415

    model = WordLlama.load(cache_dir=wordllama_folder(), disable_download=True)
    texts = [TEXTS[k % len(TEXTS)] for k in range(batch)]
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < duration_s:
        model.embed(texts, norm=True)
        done += batch
    rate = done / (time.perf_counter() - started)
    return {"case": f"in-process, {batch} per call", "clients": 1, "rps": round(rate, 1)}


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # (a line per request otherwise)
    settings = resolve_common(args, DEFAULTS, QUICK)
    concurrency = pick(args, "concurrency", DEFAULTS, QUICK)
    document = new_document(NAME, "OpenAI's routes: streams and embeddings", command_line(argv),
                            {**settings.to_json(), "concurrency": concurrency, "token_delay_ms": args.token_delay_ms})
    with workspace(NAME) as tmp:
        repo = tmp / "models"
        build_repository(repo, args.token_delay_ms)
        # A decoupled stream holds its batch's slot to its end: 64 streams at once need 64 slots (small ones).
        service = ringserve_service("ringserve", repo, ["echo", "embed", "embed_mbs1"], log_dir=tmp / "logs",
                                    workers=settings.workers, description="ringserve serving echo and embed",
                                    extra_args=["--slot-count", str(max(concurrency) + 8), "--slot-mb", "1"])
        with running([service], settings, document):
            url = f"http://127.0.0.1:{service.port}"
            document["streams"] = [asyncio.run(streams(url, n, settings.duration_s, settings.warmup_s))
                                   for n in concurrency]
            clients = max(concurrency)
            document["embeddings"] = [asyncio.run(embeddings(url, m, clients, settings.duration_s, settings.warmup_s))
                                      for m in ("embed", "embed_mbs1")]
    document["embeddings"] += [in_process(settings.duration_s, 1), in_process(settings.duration_s, 64)]
    for row in document["streams"]:
        row["added_per_token_ms"] = round(row["gap_p50_ms"] - args.token_delay_ms, 2)
    write_outputs(document, settings, render_markdown(document))
    return document


def render_markdown(document: dict[str, Any]) -> str:
    delay = document["settings"]["token_delay_ms"]
    stream_columns = [("streams at once", "clients", 0), ("tokens/s (all)", "tokens_per_s", 0),
                      ("TTFT p50 ms", "ttft_p50_ms", 1), ("TTFT p99 ms", "ttft_p99_ms", 1),
                      ("gap p50 ms", "gap_p50_ms", 2), ("gap p99 ms", "gap_p99_ms", 2),
                      (f"added per token ms (p50 - {delay:g})", "added_per_token_ms", 2)]
    embed_columns = [("case", "case", None), ("clients", "clients", 0), ("texts/s", "rps", 0),
                     ("p50 ms", "p50_ms", 1), ("p99 ms", "p99_ms", 1)]
    return "\n\n".join([
        f"### OpenAI stream on echo ({TOKENS} tokens, one every {delay:g} ms)",
        render_table(document["streams"], stream_columns),
        "### /v1/embeddings (one text per request) beside the package in-process",
        render_table(document["embeddings"], embed_columns)])


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)



