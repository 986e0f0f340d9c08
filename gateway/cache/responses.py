"""The response cache on a request's way: a hit answered before the batcher, a miss's answer stored.

The data plane (gateway/kserve/dataplane.py) calls two methods, and nothing else of the cache is on the
request path:

    lookup      in DataPlane._submit, once the request is parsed: for a model whose config enables the
                cache, its key (gateway/cache/entries.py) is looked up in the store every gateway shares
                (shm/cache.py). A hit answers the request's future there: no queue, no slot, no worker.
                A miss's response is stored when its future gets it, before the front end writes the answer
                (a done-callback added here, ahead of the front end's own), as Triton stores it before the
                response is sent: a client that sends the same request again once it has the answer finds
                it, through whichever gateway.
    finished    in DataPlane.finish, once the answer is on its way: Triton's statistics count the hit or
                the miss.

Never looked up nor stored: models whose config does not enable it (Triton's default), decoupled and
sequence models (their configs are refused: common/repository/response_cache.py), and requests whose
outputs go into client shared-memory regions (a hit would have to write them there; they pass through).
A stored response may lack an output a request asks for (a Python model answers the outputs asked for):
then that request is a miss, and its answer replaces the entry.

Statistics as Triton's core counts them (src/infer_stats.cc: UpdateSuccessCacheHit, UpdateSuccessCacheMiss):
a hit is a success (its time from arrival to answer), with no queue time and no compute, plus a cache_hit
of the lookup's time; the statistics' compute counts are then successes less hits (observe/stats.py). A miss
that succeeded adds a cache_miss of the lookup's and the insertion's time (both inside its success's time,
as Triton's request duration includes them).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from ringserve.common.repository import response_cache
from ringserve.common.repository.config import ModelConfig
from ringserve.gateway.cache.entries import decode_outputs, encode_outputs, request_key
from ringserve.gateway.cache.raw import Headers, bypasses, decode_answer, encode_answer, raw_key
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.observe.stats import Statistics
from ringserve.shm.cache import USED_RAW, CacheStore

log = logging.getLogger(__name__)


class CacheCall:
    """One cached model's request on its way: its key, the lookup's time, and whether it hit."""

    __slots__ = ("key", "lookup_ns", "hit", "insertion_ns")

    def __init__(self, key: bytes, lookup_ns: int, hit: bool) -> None:
        self.key, self.lookup_ns, self.hit = key, lookup_ns, hit
        self.insertion_ns = 0


class RawCall:
    """An HTTP request looked up by its raw bytes (raw.py): its key and, on a hit, the stored answer."""

    __slots__ = ("key", "lookup_ns", "headers", "payload")

    def __init__(self, key: bytes, lookup_ns: int, headers: Headers | None = None, payload: bytes | None = None):
        self.key, self.lookup_ns, self.headers, self.payload = key, lookup_ns, headers, payload


class ResponseCache:
    """One gateway's side of the server's response cache."""

    def __init__(self, store: CacheStore, statistics: Statistics) -> None:
        self.store = store
        self.statistics = statistics
        # By id(config), with the config itself: a reload makes new configs, and a freed one's id may be reused.
        self._enabled: dict[int, tuple[ModelConfig, bool]] = {}

    def enabled(self, config: ModelConfig) -> bool:
        """Does this model version use the cache? (its config's response_cache.enable, read once)"""
        known = self._enabled.get(id(config))
        if known is None or known[0] is not config:
            known = self._enabled[id(config)] = (config, response_cache.enabled(config.extra))
        return known[1]

    def lookup(self, request: InferRequest) -> CacheCall | None:
        """The request's CacheCall, with its future answered when the cache holds its response; None when
        the cache is not for it."""
        if not self.enabled(request.model) or request.output_regions is not None:
            return None
        started = time.perf_counter_ns()
        key = request_key(request)
        value = self.store.get(key)
        outputs = None if value is None else decode_outputs(value)
        if outputs is not None and not all(name in outputs for name in _asked(request)):
            outputs = None
        call = CacheCall(key, time.perf_counter_ns() - started, outputs is not None)
        if outputs is not None:
            request.done = True
            request.outcome = (outputs, None)
            request.future.set_result(outputs)
        else:
            request.future.add_done_callback(functools.partial(self._store, call))
        return call

    def raw_lookup(
        self,
        config: ModelConfig,
        path: str,
        body: bytes,
        headers: tuple[bytes | None, bytes | None, bytes | None],
        span: object,
    ) -> RawCall | None:
        """HTTP's infer request looked up by its raw bytes (raw.py); `headers`: its Inference-Header-Content-Length,
        Accept-Encoding and Content-Encoding. None: the raw index is not for it."""
        header_length, accept_encoding, content_encoding = headers
        if not self.enabled(config) or bypasses(body, content_encoding, span):
            return None
        started = time.perf_counter_ns()
        key = raw_key(path, config.version, header_length, accept_encoding, body)
        value = self.store.get(key, count_miss=False)  # (a miss is counted by Triton's key, looked up next)
        if value is None:
            return RawCall(key, time.perf_counter_ns() - started)
        answer_headers, payload = decode_answer(value)
        return RawCall(key, time.perf_counter_ns() - started, answer_headers, payload)

    def raw_hit(self, raw: RawCall) -> CacheCall:
        """What the call's finish counts for a raw hit: Triton's cache hit."""
        return CacheCall(raw.key, raw.lookup_ns, True)

    def raw_store(self, raw: RawCall, call: CacheCall | None, headers: Headers, payload: bytes) -> None:
        """A raw miss answered 200: its answer stored under the raw key when Triton's key hit (`call`): the
        second time a request is seen, not the first (raw.py: a one-off request never takes a raw entry). The
        raw lookup's time joins the call's lookup time."""
        if call is None:
            return
        call.lookup_ns += raw.lookup_ns
        if not call.hit:
            return
        self.store.put(raw.key, encode_answer(headers, payload), USED_RAW)

    def _store(self, call: CacheCall, future: asyncio.Future) -> None:
        """A miss's outcome, stored when it is a response (the future's done-callback)."""
        if future.cancelled() or future.exception() is not None:
            return
        started = time.perf_counter_ns()
        result = future.result()
        value = encode_outputs(result) if isinstance(result, dict) else None
        if value is not None and not self.store.put(call.key, value):
            log.debug(
                "Failed to insert key into the response cache: a response of %d bytes, more than it holds", len(value)
            )
        call.insertion_ns += time.perf_counter_ns() - started

    def finished(self, call: CacheCall, config: ModelConfig | None, arrived_ns: int, status: int) -> None:
        """A cached model's request answered with `status`: its hit or miss counted (Triton's statistics)."""
        if status != 200 or config is None:
            return  # (Triton counts neither a failed hit nor a failed miss)
        stats = self.statistics.of(config.name, config.version)
        if call.hit:
            stats.success_count += 1
            stats.success_ns += time.perf_counter_ns() - arrived_ns
            stats.cache_hit_count += 1
            stats.cache_hit_ns += call.lookup_ns
            return
        stats.cache_miss_count += 1
        stats.cache_miss_ns += call.lookup_ns + call.insertion_ns

    def close(self) -> None:
        self.store.close()


def _asked(request: InferRequest) -> list[str]:
    return request.requested_outputs or [t.name for t in request.model.outputs]
