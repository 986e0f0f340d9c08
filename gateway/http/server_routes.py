"""The whole server's numbers, whichever gateway is asked: /metrics, /admin/status, statistics.

The gateway a client reached answers its own share and asks every other one for theirs
(`?scope=gateway`, gateway/cluster/peers.py), then merges them (gateway/cluster/merge.py); with ?scope=gateway
it answers only its own. Statistics are Triton's document (HTTP's /stats and gRPC's
ModelStatistics both call statistics_doc).
"""

from __future__ import annotations

import dataclasses
import os

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from ringserve.gateway.batching.sequences import SequenceQueue
from ringserve.gateway.cluster.answers import peer_status
from ringserve.gateway.cluster.merge import gateway_scope, merge_metrics, merge_status, parse_metrics
from ringserve.gateway.cluster.peers import SCOPE_GATEWAY, PeerAnswer
from ringserve.gateway.cluster.triton_metrics import exposition
from ringserve.gateway.core.errors import GatewayError
from ringserve.gateway.dispatch.dispatcher import Dispatcher
from ringserve.gateway.http.responses import error_response, json_response, scope_of
from ringserve.gateway.kserve.dataplane import DataPlane
from ringserve.gateway.observe import latencies, model_metrics


class ServerEndpoints:
    """One gateway's side of the server-wide endpoints: its own numbers, and the peers' merged in."""

    def __init__(self, plane: DataPlane | None, dispatcher: Dispatcher | None = None) -> None:
        self.plane = plane  # None: only routes() is called
        self.dispatcher = dispatcher  # what /admin/status reports of the workers, queues and ring
        self.peers = None if plane is None else plane.peers  # the other gateways (None: this one is the server)
        self.gateway_index = 0 if self.peers is None else self.peers.index

    async def metrics_text(self, request: Request) -> Response:
        """The whole server's metrics (gateway/cluster/merge.py), or with ?scope=gateway this gateway's own share."""
        try:
            scope = scope_of(request, self.peers)
        except GatewayError as exc:
            return error_response(exc)
        if scope == SCOPE_GATEWAY:
            families = gateway_scope(self.plane.metrics.registry.collect())
        else:
            peers, gateways = [], {self.gateway_index: True}
            for answer in await self._ask_peers(request):
                gateways[answer.gateway_index] = False
                if answer.ok:
                    try:
                        peers.append(parse_metrics(answer.body.decode()))
                        gateways[answer.gateway_index] = True
                    except (ValueError, UnicodeDecodeError):
                        pass
            families = merge_metrics(self.plane.metrics.registry.collect(), peers, gateways)
            families = latencies.finish(families, self.plane.statistics.latency)  # the summaries' quantiles
        text = exposition(families)
        if scope != SCOPE_GATEWAY:  # the Python models' own families, the server's: once, by the answering gateway
            text += model_metrics.exposition(self.plane.dispatcher.runtime_dir, (f.name for f in families))
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    async def _ask_peers(self, request: Request) -> list[PeerAnswer]:
        """This request's path from every other gateway, for its own share; [] with one gateway."""
        if self.peers is None:
            return []
        return await self.peers.get(request.url.path + "?scope=" + SCOPE_GATEWAY)

    async def admin_status(self, request: Request) -> Response:
        d = self.dispatcher
        workers = [
            {
                "index": w.index,
                "pid": w.pid,
                "generation": w.generation,
                "state": w.state,
                "wedged": w.wedged,  # its heartbeats stopped: not counted ready (WorkerSilent)
                "restarts": w.restarts,
                "restarts_total": sum(w.restarts.values()),
                "last_exit": w.last_exit,
                "in_flight_batches": len(w.in_flight),
                "in_flight_requests": sum(len(b.requests) for b in w.in_flight.values()),
                "batches_done": w.batches_done,
                "busy_s": round(w.busy_s, 6),  # its executions' seconds (this gateway's; summed over all)
                "rss_bytes": w.rss_bytes,  # the supervisor's numbers, once a second
                "uss_bytes": w.uss_bytes,
                "role": "standby" if w.standby else "active",
                "models": w.models,
                "failed_models": w.failed_models,
            }
            for w in sorted(d.workers.values(), key=lambda w: w.index)
        ]
        models = {
            name: {
                "queue_depth": q.depth,
                "requeued_batches": len(q.requeued),
                "ready": bool(d.ready_workers(name))
                and name not in d.quarantined
                and name not in self.plane.repository.unloaded,
                "quarantined": d.quarantined.get(name),
                # the latest requests isolated as poison: request_id, reason, time (Unix s)
                "poison_requests": list(d.recovery.poison_requests.get(name, ())),
                "unloaded": self.plane.repository.unloaded.get(name),
                "version": q.config.version,
                "model_state": d.models.state_of(name)[0],
                "memory_bytes": d.models.memory_of(name),
                # a sequence model's live sequences, backlog, idle releases, state bytes (batching/sequences.py)
                "sequences": q.status() if isinstance(q, SequenceQueue) else None,
                # its lanes: the worker processes that hold it (supervision/lanes.py)
                "lanes": [
                    {"worker": w.index, "pid": w.pid, "state": w.state}
                    for w in sorted(d.workers.values(), key=lambda w: w.index)
                    if name in w.models and not w.standby
                ],
            }
            for name, q in d.queues.items()
        }
        gateways = [
            {
                "index": g.gateway_index,
                "pid": g.pid,
                "generation": g.generation,
                "restarts": g.restarts,
                "restarts_total": sum(g.restarts.values()),
                "last_exit": g.last_exit,
            }
            for g in d.gateways
        ]
        slots = {"total": d.ring.slot_count, "free": d.ring.free_count}
        this = {
            "index": self.gateway_index,
            "pid": os.getpid(),
            "draining": d.draining,
            "queue_depth": sum(m["queue_depth"] for m in models.values()),
            "requeued_batches": sum(m["requeued_batches"] for m in models.values()),
            "in_flight_batches": sum(w["in_flight_batches"] for w in workers),
            "in_flight_requests": sum(w["in_flight_requests"] for w in workers),
            "slots": dict(slots),
        }
        spares = [dataclasses.asdict(spare) for spare in d.spares]  # the supervisor's: one per worker device
        own = {
            "ready": self.plane.server_ready(),
            "draining": d.draining,
            "gateway": this,
            "gateways": gateways,
            "workers": workers,
            "spares": spares,
            "models": models,
            "reload": d.reload_status(),
            "slots": slots,
        }
        try:
            if scope_of(request, self.peers) == SCOPE_GATEWAY:
                return json_response(own)
        except GatewayError as exc:
            return error_response(exc)
        peers = {answer.gateway_index: peer_status(answer) for answer in await self._ask_peers(request)}
        count = 1 if self.peers is None else self.peers.count
        return json_response(merge_status(own, peers, count))
