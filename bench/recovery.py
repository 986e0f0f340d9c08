"""`python -m bench recovery`: SIGKILL the worker while it runs a batch, again and again.

For each kill: --requests concurrent requests go to a model slow enough that the batch is surely in
flight (--model busy, the default: no weights, ~100 ms for a batch of 4 here, loads in ~50 ms; or
--model slow: 120 x 2048-wide MatMul+Tanh sharing one weight, whose ONNX Runtime session takes
~1.4 s to create, to show what a model's load adds), /admin/status is polled until every request
reached the gateway (queued, on the worker or answered) and a batch is in flight, then, after
--kill-after-ms, the worker gets SIGKILL. Measured from the kill:
  ready_s     until /admin/status shows a worker with a new pid in state "ready" (the supervisor
              reaped, restarted, the new worker loaded its model and said READY)
  answered_s  until the last of the in-flight requests got its answer (requeued, re-run)
and every answer's status (all must be 200). Kills are --kill-spacing-s apart counted from the
previous restart, longer than the supervisor's stable period (10 s), so each is restarted at once
rather than after a crash-loop backoff. Median and p90 over --kills.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import signal
import time
import urllib.error
import urllib.request
from typing import Any

from bench.load import ServerCounters, median, percentile
from bench.models import build_busy_model
from bench.report import new_document, render_table
from bench.servers import Service, ringserve_service
from bench.suite import (
    add_common_arguments,
    command_line,
    pick,
    resolve_common,
    running,
    workspace,
    write_outputs,
)

log = logging.getLogger(__name__)

NAME = "recovery"
SLOW_WIDTH, SLOW_LAYERS = 2048, 120
BUSY_WIDTH, BUSY_ROUNDS, QUICK_BUSY_ROUNDS = 512, 6, 2
DEFAULTS = {"duration_s": 1.0, "warmup_s": 0.0, "repeats": 1, "kills": 12, "kill_spacing_s": 10.5,
            "kill_after_ms": 20.0}
QUICK = {"kills": 2, "kill_spacing_s": 0.5, "kill_after_ms": 0.0}
POLL_S = 0.002


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="SIGKILL the worker N times: time to ready, time to answer in-flight",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=None, help=f"SIGKILLs (default {DEFAULTS['kills']})")
    p.add_argument("--kill-spacing-s", type=float, default=None,
                   help=f"worker uptime before the next kill (default {DEFAULTS['kill_spacing_s']})")
    p.add_argument("--requests", type=int, default=4, help="concurrent requests in flight at each kill")
    p.add_argument("--model", choices=("busy", "slow"), default="busy",
                   help="busy: slow to run, instant to load (default); slow: also slow to load")
    p.add_argument("--kill-after-ms", type=float, default=None, help="wait after the batch is in flight (default 20)")
    add_common_arguments(p, DEFAULTS, QUICK)
    p.set_defaults(func=main)
    return p


def _get_json(url: str, timeout_s: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


def _post(url: str, body: bytes, timeout_s: float) -> tuple[int, float]:
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError:
        status = -1
    return status, time.perf_counter()


def _worker(service: Service) -> dict[str, Any] | None:
    try:
        workers = _get_json(service.url + "/admin/status")["workers"]
    except (OSError, ValueError, KeyError):
        return None
    return workers[0] if workers else None


def _restarts(service: Service) -> float:
    return ServerCounters.from_text(service.get_text("/metrics"), "").restarts  # every worker, every model


def _session_ms(path) -> float:
    """How long ONNX Runtime takes to create this model's session here (what a restart adds)."""
    from bench.inprocess import make_session

    t = time.perf_counter()
    make_session(path)
    return round((time.perf_counter() - t) * 1e3, 1)


def _in_flight(service: Service) -> tuple[int, int]:
    """(batches on a worker, requests the gateway holds: on a worker or queued)."""
    status = _get_json(service.url + "/admin/status")
    batches = sum(w["in_flight_batches"] for w in status["workers"])
    held = sum(w["in_flight_requests"] for w in status["workers"]) + \
        sum(m["queue_depth"] for m in status["models"].values())
    return batches, held


def one_kill(service: Service, body: bytes, *, requests: int, kill_after_s: float, timeout_s: float,
             pool: concurrent.futures.ThreadPoolExecutor, attempts: int = 10) -> dict[str, Any]:
    """Send, wait until every request reached the gateway and a batch is on the worker, SIGKILL, time
    the recovery. A batch that finished before the kill (the machine is shared; timing is not
    guaranteed) is retried, up to `attempts`.

    Every request must be in the gateway before the kill: one still on its way (a loaded machine
    can take that long to parse it) arrives while no worker is ready and gets the designed
    503 + Retry-After, which is not what this measures (what happens to requests in flight)."""
    for attempt in range(attempts):
        worker = _worker(service)
        if worker is None or worker["state"] != "ready":
            return {"failed": f"no ready worker before the kill: {worker}"}
        old_pid = worker["pid"]
        futures = [pool.submit(_post, service.infer_url, body, timeout_s) for _ in range(requests)]
        while not all(f.done() for f in futures):
            answered = sum(f.done() for f in futures)  # before the poll: an answered one is no longer held
            batches, held = _in_flight(service)
            if batches >= 1 and answered + held >= requests:
                break
            time.sleep(POLL_S)
        time.sleep(kill_after_s)
        in_flight, _ = _in_flight(service)
        if in_flight < 1 or all(f.done() for f in futures):
            concurrent.futures.wait(futures)
            continue  # too late: the batch is done
        t_kill = time.perf_counter()
        os.kill(old_pid, signal.SIGKILL)
        return {"attempt": attempt, **_recovery(service, old_pid, t_kill, futures, timeout_s),
                "in_flight_batches_at_kill": in_flight}
    return {"failed": f"the batch finished before the kill in {attempts} attempts"}


def _recovery(service: Service, old_pid: int, t_kill: float, futures: list, timeout_s: float) -> dict[str, Any]:
    saw_not_ready = False
    ready_s = worker = None
    while time.perf_counter() < t_kill + timeout_s:
        worker = _worker(service)
        if worker is not None and worker["pid"] != old_pid and worker["state"] == "ready":
            ready_s = time.perf_counter() - t_kill
            break
        saw_not_ready = True
        time.sleep(POLL_S)
    answers = [f.result() for f in futures]
    statuses: dict[str, int] = {}
    for code, _ in answers:
        statuses[str(code)] = statuses.get(str(code), 0) + 1
    return {"old_pid": old_pid, "new_pid": (worker or {}).get("pid"), "ready_s": ready_s,
            "answered_s": max(t for _, t in answers) - t_kill, "statuses": statuses,
            "saw_not_ready": saw_not_ready}


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    from ringserve.common.demo_models import build_slow_model

    settings = resolve_common(args, DEFAULTS, QUICK)
    kills = pick(args, "kills", DEFAULTS, QUICK)
    spacing_s = pick(args, "kill_spacing_s", DEFAULTS, QUICK)
    kill_after_ms = pick(args, "kill_after_ms", DEFAULTS, QUICK)
    model = args.model
    document = new_document(NAME, "recovery after SIGKILL of the worker with a batch in flight", command_line(argv),
                            {**settings.to_json(), "kills": kills, "kill_spacing_s": spacing_s,
                             "requests": args.requests, "kill_after_ms": kill_after_ms, "model": {"name": model}})
    with workspace(NAME) as tmp:
        if model == "slow":
            width = SLOW_WIDTH
            build_slow_model(tmp / "repo" / model, width=width, layers=SLOW_LAYERS)
            document["settings"]["model"].update(width=width, layers=SLOW_LAYERS)
            description = f"{model}: {SLOW_LAYERS} x MatMul {width}x{width} (one shared weight) + Tanh"
        else:
            width, rounds = BUSY_WIDTH, QUICK_BUSY_ROUNDS if args.quick else BUSY_ROUNDS
            build_busy_model(tmp / "repo", model, width=width, rounds=rounds)
            document["settings"]["model"].update(width=width, rounds=rounds)
            description = f"{model}: {rounds} rounds of tanh(A @ A) on a {width}x{width} matrix per row, no weights"
        document["model_load_ms"] = _session_ms(tmp / "repo" / model / "1" / "model.onnx")
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, width], "datatype": "FP32",
                                       "data": [0.5] * width}]}).encode()
        service = ringserve_service("ringserve", tmp / "repo", [model], log_dir=tmp / "logs", workers=settings.workers,
                                    intra_op_threads=settings.intra_op_threads, description=description)
        with running([service], settings, document), \
                concurrent.futures.ThreadPoolExecutor(max_workers=args.requests) as pool:
            _post(service.infer_url, body, settings.request_timeout_s)  # warm
            restarts0 = _restarts(service)
            t_up = time.monotonic()
            for i in range(kills):
                time.sleep(max(0.0, spacing_s - (time.monotonic() - t_up)))
                run = {"kill": i, **one_kill(service, body, requests=args.requests,
                                             kill_after_s=kill_after_ms / 1e3,
                                             timeout_s=settings.request_timeout_s, pool=pool)}
                t_up = time.monotonic()
                document["runs"].append(run)
                log.info("kill %d/%d: %s", i + 1, kills, {k: v for k, v in run.items() if k != "kill"})
                if "failed" in run:
                    break
            document["restarts_counted"] = _restarts(service) - restarts0
            status = _get_json(service.url + "/admin/status")
            document["restarts_by_reason"] = status["workers"][0]["restarts"] if status["workers"] else {}
    document["summary"] = summarize(document["runs"])
    document["summary"]["restarts_counted"] = document["restarts_counted"]
    write_outputs(document, settings, render_markdown(document))
    return document


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "failed" not in r]
    out: dict[str, Any] = {"kills": len(runs), "failed": len(runs) - len(ok)}
    for key in ("ready_s", "answered_s"):
        values = [r[key] for r in ok if r.get(key) is not None]
        out[key] = {"median": median(values) if values else None, "p90": percentile(values, 90) if values else None,
                    "min": min(values, default=None), "max": max(values, default=None), "n": len(values)}
    statuses: dict[str, int] = {}
    for r in ok:
        for code, n in r["statuses"].items():
            statuses[code] = statuses.get(code, 0) + n
    out["statuses"] = statuses
    out["all_answered_200"] = bool(ok) and set(statuses) == {"200"}
    return out


def render_markdown(document: dict[str, Any]) -> str:
    s = document["summary"]
    rows = [{"what": "SIGKILL → ready again (new worker READY)", **s["ready_s"]},
            {"what": "SIGKILL → in-flight requests answered", **s["answered_s"]}]
    for row in rows:
        for key in ("median", "p90", "min", "max"):
            row[key] = None if row[key] is None else row[key] * 1e3
    return "\n\n".join([
        (f"{s['kills']} SIGKILLs of the only worker, each with {document['settings']['requests']} requests in flight "
         f"on {document['services']['ringserve']['description']} (ONNX Runtime creates its session in "
         f"{document.get('model_load_ms')} ms here), kills {document['settings']['kill_spacing_s']:g} s apart."),
        render_table(rows, [("measured from the SIGKILL", "what", None), ("median ms", "median", 1),
                            ("p90 ms", "p90", 1), ("min ms", "min", 1), ("max ms", "max", 1), ("kills", "n", None)]),
        (f"Answers: {s['statuses']} (all 200: {s['all_answered_200']}); restarts counted by the server: "
         f"{document.get('restarts_counted')}, by reason {document.get('restarts_by_reason')}; failed kills: "
         f"{s['failed']}.")])
