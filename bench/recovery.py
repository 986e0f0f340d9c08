"""`python -m bench recovery`: how long a worker's death keeps the server from serving, with the warm
spare and without it (--warm-spare true / false), one server after the other in one run.

One worker, no standby. Measured from the signal, each --kills times idle and under --clients
closed-loop clients (bench/recovery_load.py):
  SIGKILL -> ready     until /admin/status shows a new worker pid ready and the server ready
  SIGSTOP -> replaced  the same for a stopped worker, which the supervisor kills at --hang-timeout-s
Signals are --kill-spacing-s apart counted from the previous recovery, longer than the supervisor's
stable period (10 s), so that each death is restarted at once rather than after a crash-loop
backoff; with the spare, each waits until the spare is primed (/admin/status `spares`).
Next to them, in the same run: a fresh interpreter's `import ringserve.worker.__main__`, what a
fresh worker pays before it can load a model, idle and under the same load.
The soak: --soak-clients clients for --soak-s, the worker SIGKILLed --kill-spacing-s after each
recovery: answers by status (the share of 503), lost (no answer) and wrong (a 200 whose numbers are
not ONNX Runtime's, computed here).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

import numpy as np

from bench.load import median, percentile
from bench.recovery_load import CheckedLoad
from bench.report import new_document, render_table
from bench.servers import Service, ringserve_service
from bench.suite import add_common_arguments, command_line, pick, resolve_common, running, workspace, write_outputs

log = logging.getLogger(__name__)

NAME = "recovery"
DEFAULTS = {"duration_s": 1.0, "warmup_s": 0.0, "repeats": 1, "kills": 6, "kill_spacing_s": 10.5, "soak_s": 240.0,
            "hang_timeout_s": 5.0, "imports": 5}
QUICK = {"kills": 1, "kill_spacing_s": 0.5, "soak_s": 3.0, "hang_timeout_s": 1.0, "imports": 1}
POLL_S = 0.002
IMPORT_WORKER = "import ringserve.worker.__main__"
BODIES = 16


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="SIGKILL / SIGSTOP the worker, idle and under load, with and without "
                                         "the warm spare; a soak with a death per recovery",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=None, help=f"signals of each kind per case (default {DEFAULTS['kills']})")
    p.add_argument("--kill-spacing-s", type=float, default=None,
                   help=f"recovered uptime before the next signal (default {DEFAULTS['kill_spacing_s']})")
    p.add_argument("--clients", type=int, default=16, help="closed-loop clients of the loaded cases")
    p.add_argument("--soak-s", type=float, default=None, help=f"soak length (default {DEFAULTS['soak_s']:g})")
    p.add_argument("--soak-clients", type=int, default=32)
    p.add_argument("--think-ms", type=float, default=10.0,
                   help="a client's mean pause between an answer and its next request, uniform in [0, 2x) "
                        "(tests/chaos' clients pause 10)")
    p.add_argument("--hang-timeout-s", type=float, default=None,
                   help=f"the servers' --hang-timeout-s (default {DEFAULTS['hang_timeout_s']:g})")
    p.add_argument("--imports", type=int, default=None, help="fresh-interpreter imports timed per load")
    p.add_argument("--model", choices=("mlp", "slow"), default="mlp",
                   help="mlp: the demo model (loads in ms); slow: 120 x 2048-wide MatMul, ~1.4 s to load")
    add_common_arguments(p, DEFAULTS, QUICK)
    p.set_defaults(func=main)
    return p


def _status(service: Service) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(service.url + "/admin/status", timeout=5) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def _ready_pid(status: dict[str, Any] | None) -> int | None:
    """The pid of worker 0 when it is ready and the server says so."""
    if not status or not status.get("ready") or not status["workers"]:
        return None
    worker = status["workers"][0]
    return worker["pid"] if worker["state"] == "ready" else None


def _wait(predicate, timeout_s: float) -> Any:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if value := predicate():
            return value
        time.sleep(POLL_S)
    return None


def _spare_primed(service: Service, worker_pid: int) -> bool:
    """A primed spare, other than the worker: the snapshot behind /admin/status is up to 1 s old, and may
    still show as the spare the process that has since taken over."""
    status = _status(service) or {}
    return any(s["state"] == "ready" and s["pid"] != worker_pid for s in status.get("spares", ()))


def one_death(service: Service, sig: signal.Signals, *, spare: bool, timeout_s: float) -> dict[str, Any]:
    """Signal worker 0 (once it is ready, and with `spare` once the spare is primed); time its replacement."""
    old_pid = _wait(lambda: _ready_pid(_status(service)), timeout_s)
    if old_pid is None:
        return {"failed": "no ready worker before the signal"}
    if spare and not _wait(lambda: _spare_primed(service, old_pid), timeout_s):
        return {"failed": "no primed spare before the signal"}
    t0 = time.perf_counter()
    os.kill(old_pid, sig)
    new_pid = _wait(lambda: (pid := _ready_pid(_status(service))) not in (None, old_pid) and pid, timeout_s)
    if new_pid is None:
        return {"failed": f"no new worker ready {timeout_s:g} s after {sig.name}"}
    return {"seconds": time.perf_counter() - t0, "old_pid": old_pid, "new_pid": new_pid}


def fresh_imports(count: int) -> list[float]:
    """Wall seconds of `python -P -c 'import ringserve.worker.__main__'`, each in a new interpreter."""
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-P", "-c", IMPORT_WORKER], check=True)
        times.append(time.perf_counter() - t0)
    return times


def _deaths(service: Service, *, spare: bool, load: str, kills: int, spacing_s: float, timeout_s: float,
            runs: list[dict[str, Any]]) -> None:
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        for i in range(kills):
            time.sleep(spacing_s)
            run = {"spare": spare, "load": load, "signal": sig.name, "i": i,
                   **one_death(service, sig, spare=spare, timeout_s=timeout_s)}
            log.info("%s", run)
            runs.append(run)


def soak(service: Service, load: CheckedLoad, *, spare: bool, soak_s: float, spacing_s: float,
         timeout_s: float) -> dict:
    """The load for `soak_s`, the worker SIGKILLed `spacing_s` after each recovery."""
    ready_s: list[float] = []
    with load:
        load.wait_for_answers(1)
        t_end = time.perf_counter() + soak_s
        while time.perf_counter() + spacing_s < t_end:
            time.sleep(spacing_s)
            run = one_death(service, signal.SIGKILL, spare=spare, timeout_s=timeout_s)
            if "failed" in run:
                break
            ready_s.append(run["seconds"])
        time.sleep(max(0.0, t_end - time.perf_counter()))
    return {"seconds": soak_s, "clients": load.clients, "kills": len(ready_s), "ready_s": ready_s,
            **load.tally.to_json()}


def measure(service: Service, *, spare: bool, args: argparse.Namespace, knobs: dict[str, Any],
            bodies: list[bytes], expected: list[np.ndarray], document: dict[str, Any]) -> None:
    timeout_s = max(60.0, knobs["hang_timeout_s"] * 4)
    url = service.infer_url
    _deaths(service, spare=spare, load="idle", kills=knobs["kills"], spacing_s=knobs["kill_spacing_s"],
            timeout_s=timeout_s, runs=document["runs"])
    think_s = args.think_ms / 1e3
    with CheckedLoad(url, bodies, expected, args.clients, timeout_s, think_s) as load:
        load.wait_for_answers(args.clients)
        if spare:  # once, under the same load as the deaths
            document["import_s"]["loaded"] = fresh_imports(knobs["imports"])
        _deaths(service, spare=spare, load=f"{args.clients} clients", kills=knobs["kills"],
                spacing_s=knobs["kill_spacing_s"], timeout_s=timeout_s, runs=document["runs"])
    document["loaded_answers"][str(spare)] = load.tally.to_json()
    document["soak"].append({"spare": spare, **soak(
        service, CheckedLoad(url, bodies, expected, args.soak_clients, timeout_s, think_s), spare=spare,
        soak_s=knobs["soak_s"], spacing_s=knobs["kill_spacing_s"], timeout_s=timeout_s)})
    status = _status(service) or {}
    document["restarts_by_reason"][str(spare)] = (status.get("workers") or [{}])[0].get("restarts")
    document["spares_at_end"][str(spare)] = status.get("spares")


def _model(tmp, name: str) -> tuple[Any, int]:
    from ringserve.common.repository.demo import MLP_IN, build_demo_models, build_slow_model

    if name == "slow":
        width = 2048
        build_slow_model(tmp / "repo" / "slow", width=width, layers=120)
        return tmp / "repo" / "slow" / "1" / "model.onnx", width
    build_demo_models(tmp / "repo")
    return tmp / "repo" / "mlp" / "1" / "model.onnx", MLP_IN


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    import onnxruntime as ort

    settings = resolve_common(args, DEFAULTS, QUICK)
    knobs = {k: pick(args, k, DEFAULTS, QUICK) for k in ("kills", "kill_spacing_s", "soak_s", "hang_timeout_s",
                                                         "imports")}
    document = new_document(NAME, "recovery from a worker's death, with and without the warm spare",
                            command_line(argv), {**settings.to_json(), **knobs, "clients": args.clients,
                                                 "soak_clients": args.soak_clients, "think_ms": args.think_ms,
                                                 "model": args.model})
    document.update(import_s={"idle": fresh_imports(knobs["imports"])}, loaded_answers={}, soak=[],
                    restarts_by_reason={}, spares_at_end={})
    with workspace(NAME) as tmp:
        model_path, width = _model(tmp, args.model)
        session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
        inputs = [np.random.default_rng(i).standard_normal((1, width)).astype(np.float32) for i in range(BODIES)]
        expected = [session.run(None, {"x": x})[0] for x in inputs]
        bodies = [json.dumps({"inputs": [{"name": "x", "shape": [1, width], "datatype": "FP32",
                                          "data": x.ravel().tolist()}]}).encode() for x in inputs]
        for spare in (True, False):
            service = ringserve_service(
                f"ringserve_spare_{'on' if spare else 'off'}", tmp / "repo", [args.model], log_dir=tmp / "logs",
                workers=1, intra_op_threads=settings.intra_op_threads,
                extra_args=["--warm-spare", str(spare).lower(), "--hang-timeout-s", str(knobs["hang_timeout_s"])],
                description=f"ringserve, {args.model}, --warm-spare {str(spare).lower()}")
            with running([service], settings, document):
                measure(service, spare=spare, args=args, knobs=knobs, bodies=bodies, expected=expected,
                        document=document)
    document["summary"] = summarize(document)
    write_outputs(document, settings, render_markdown(document))
    return document


def _stats(values: list[float]) -> dict[str, Any]:
    return {"median": median(values) if values else None, "p90": percentile(values, 90) if values else None,
            "min": min(values, default=None), "max": max(values, default=None), "n": len(values)}


def summarize(document: dict[str, Any]) -> dict[str, Any]:
    """Medians per (spare, load, signal) with the ratio to a fresh import, and the issue's three checks."""
    imports = {load: _stats(times)["median"] for load, times in document["import_s"].items()}
    rows = []
    keys = sorted({(r["spare"], r["load"], r["signal"]) for r in document["runs"]}, key=lambda k: (not k[0], k[1:]))
    for spare, load, sig in keys:
        runs = [r for r in document["runs"] if (r["spare"], r["load"], r["signal"]) == (spare, load, sig)]
        stats = _stats([r["seconds"] for r in runs if "seconds" in r])
        idle_import = imports.get("idle")
        rows.append({"spare": spare, "load": load, "signal": sig, **stats, "failed": sum("failed" in r for r in runs),
                     "vs_import": stats["median"] / idle_import if stats["median"] and idle_import else None})
    hang_s = document["settings"]["hang_timeout_s"]
    loaded = [r for r in rows if r["spare"] and r["load"] != "idle"]
    soak_on = next((s for s in document["soak"] if s["spare"]), {})
    checks = {
        "sigkill_loaded_vs_import_le_0.5": next((r["vs_import"] <= 0.5 for r in loaded if r["signal"] == "SIGKILL"
                                                 and r["vs_import"] is not None), None),
        "sigstop_loaded_within_hang_plus_1s": next((r["median"] <= hang_s + 1.0 for r in loaded
                                                    if r["signal"] == "SIGSTOP" and r["median"] is not None), None),
        "soak_503_le_15pct_none_lost_or_wrong": (soak_on.get("share_503") is not None and soak_on["share_503"] <= 0.15
                                                 and soak_on["lost"] == 0 and soak_on["wrong"] == 0) if soak_on
        else None}
    return {"rows": rows, "import_median_s": imports, "checks": checks,
            "runs_failed": sum("failed" in r for r in document["runs"])}


def render_markdown(document: dict[str, Any]) -> str:
    s, settings = document["summary"], document["settings"]
    rows = [{**r, "spare": "on" if r["spare"] else "off",
             **{k: None if r[k] is None else r[k] * 1e3 for k in ("median", "p90", "min", "max")}} for r in s["rows"]]
    soak_rows = [{"spare": "on" if x["spare"] else "off", "kills": x["kills"], "answers": x["answers"],
                  "share_503_pct": None if x["share_503"] is None else x["share_503"] * 100, "lost": x["lost"],
                  "wrong": x["wrong"], "ready_ms": median(x["ready_s"]) * 1e3 if x["ready_s"] else None}
                 for x in document["soak"]]
    imports = ", ".join(f"{load} {v * 1e3:.0f} ms" for load, v in s["import_median_s"].items() if v)
    return "\n\n".join([
        (f"One worker serving {settings['model']}, no standby, --hang-timeout-s {settings['hang_timeout_s']:g}; "
         f"signals {settings['kill_spacing_s']:g} s after the previous recovery. A fresh interpreter's "
         f"`{IMPORT_WORKER}` in this run (median): {imports}."),
        render_table(rows, [("spare", "spare", None), ("load", "load", None), ("signal", "signal", None),
                            ("median ms", "median", 1), ("p90 ms", "p90", 1), ("min ms", "min", 1),
                            ("max ms", "max", 1), ("n", "n", None), ("failed", "failed", None),
                            ("median / idle import", "vs_import", 2)]),
        (f"Soak: {settings['soak_clients']} clients for {settings['soak_s']:g} s, a SIGKILL "
         f"{settings['kill_spacing_s']:g} s after each recovery; each client sends its next request "
         f"0-{2 * settings['think_ms']:g} ms after an answer, a 503's too (no Retry-After wait). Requests already "
         f"queued when the worker dies wait for its replacement: the 503s are the requests that arrived "
         f"while no worker was ready."),
        render_table(soak_rows, [("spare", "spare", None), ("kills", "kills", None), ("answers", "answers", None),
                                 ("503 %", "share_503_pct", 1), ("lost", "lost", None), ("wrong", "wrong", None),
                                 ("ready ms (median)", "ready_ms", 1)]),
        f"Checks (issue's bar): {s['checks']}; restarts by reason: {document['restarts_by_reason']}."])
