"""`ringserve status`: a running server's /admin/status as tables (workers, spares, gateways, models,
sequences), or as JSON."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any

from ringserve.common.exits import EXIT_FAILURE, EXIT_OK


def show_status(args: argparse.Namespace) -> int:
    try:
        with urllib.request.urlopen(args.url.rstrip("/") + "/admin/status", timeout=5) as response:
            status = json.load(response)
    except (urllib.error.URLError, OSError) as exc:
        print(f"cannot reach {args.url}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    if args.json:
        print(json.dumps(status, indent=2))
        return EXIT_OK
    print(
        f"ready: {status['ready']}   draining: {status['draining']}   "
        f"slots free: {status['slots']['free']}/{status['slots']['total']}"
    )
    print(
        f"{'worker':>6} {'pid':>8} {'gen':>4} {'state':<9} {'restarts':>8} {'busy s':>8} {'RSS/USS MiB':>13}"
        "  by reason / last exit  (lane: models)"
    )
    for w in status["workers"]:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(w["restarts"].items())) or "-"
        last = w["last_exit"]["reason"] if w["last_exit"] else "-"
        models = ", ".join(sorted(w.get("models") or ())) or "-"
        memory = f"{w.get('rss_bytes', 0) / 2**20:.0f}/{w.get('uss_bytes', 0) / 2**20:.0f}"
        print(
            f"{w['index']:>6} {w['pid'] or '-':>8} {w['generation']:>4} {w['state']:<9} "
            f"{w['restarts_total']:>8} {w.get('busy_s', 0.0):>8.2f} {memory:>13}  {reasons} / {last}  ({models})"
        )
    _print_spares(status)
    _print_gateways(status)
    print(f"{'model':<16} {'ready':<6} {'state':<11} {'memory MiB':>10} {'queued':>6} {'requeued':>8}")
    for name, m in sorted(status["models"].items()):
        memory = f"{m.get('memory_bytes', 0) / 2**20:.1f}"
        print(
            f"{name:<16} {str(m['ready']):<6} {m.get('model_state', '-'):<11} {memory:>10} {m['queue_depth']:>6} "
            f"{m['requeued_batches']:>8}"
        )
    _print_sequences(status)
    return EXIT_OK


def _print_sequences(status: dict[str, Any]) -> None:
    """One line per sequence model: its live sequences, backlog, idle releases and state memory."""
    models = {name: m["sequences"] for name, m in status["models"].items() if m.get("sequences")}
    if not models:
        return
    print(f"{'sequence model':<16} {'active':>6} {'backlog':>7} {'idle released':>13} {'state MiB':>9}")
    for name, s in sorted(models.items()):
        print(
            f"{name:<16} {s['active_sequences']:>6} {s['backlog']:>7} {s['idle_releases']:>13} "
            f"{s['state_bytes'] / 2**20:>9.1f}"
        )


def _print_spares(status: dict[str, Any]) -> None:
    """One line per worker device's warm spare: its process (none while it restarts), memory, takeovers
    and its own deaths (no worker restarts)."""
    spares = status.get("spares") or []
    if not spares:
        return
    print(f"{'spare':>6} {'pid':>8} {'state':<9} {'RSS MiB':>8} {'takeovers':>9}  deaths by reason")
    for s in spares:
        deaths = ", ".join(f"{k}={v}" for k, v in sorted(s["deaths"].items())) or "-"
        print(
            f"{'dev ' + str(s['device']):>6} {s['pid'] or '-':>8} {s['state']:<9} {s['rss_bytes'] / 2**20:>8.1f} "
            f"{s['takeovers']:>9}  {deaths}"
        )


def _print_gateways(status: dict[str, Any]) -> None:
    """One line per gateway: the supervisor's numbers (generation, restarts) and the gateway's own
    (state, queued and in-flight requests), or why it did not answer the one that answered."""
    gateways = status.get("gateways") or []
    if not gateways:
        return
    if "answered_by" in status:
        print(
            f"answered by gateway {status['answered_by']}; "
            f"gateways up: {status.get('gateways_up', '-')}/{len(gateways)}"
        )
    print(
        f"{'gateway':>7} {'pid':>8} {'gen':>4} {'state':<11} {'queued':>6} {'in-flight':>9} {'restarts':>8}  "
        f"by reason / last exit"
    )
    for g in gateways:
        restarts = g.get("restarts") or {}
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(restarts.items())) or "-"
        last = g["last_exit"]["reason"] if g.get("last_exit") else "-"
        dash = lambda value: "-" if value is None else value  # noqa: E731 - a one-line formatter beside the row it formats
        line = (
            f"{g['index']:>7} {dash(g.get('pid')):>8} {dash(g.get('generation')):>4} {g.get('state', '-'):<11} "
            f"{dash(g.get('queue_depth')):>6} {dash(g.get('in_flight_requests')):>9} "
            f"{g.get('restarts_total', sum(restarts.values())):>8}  {reasons} / {last}"
        )
        print(line + (f"  ({g['error']})" if g.get("error") else ""))
