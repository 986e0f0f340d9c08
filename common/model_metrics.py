"""Python models' custom metrics (pb_utils.MetricFamily): the file a worker publishes them in.

    worker (worker/pb_metrics.py)                       gateway (gateway/observe/model_metrics.py)
    a Metric changes -> after the call into model code   /metrics (the whole server's answer) reads every
    that changed it: write <runtime dir>/model-metrics-  live worker's file and writes the families beside
    w<index>.g<generation>.json (whole, then renamed)    the server's own, as Triton writes them

A file is the worker's whole registry, written after each call into model code that changed it (and once
a second for changes from a model's own threads), before the batch's RESULT leaves: a client that has
its answer and then scrapes /metrics sees what the batch counted. A file whose worker is gone (its pid
no longer runs: a crash) is skipped by the readers and removed by the next worker of its index.

    {"pid": 123, "families": [{"name": "requests_total", "description": "...", "kind": "counter",
      "series": [{"labels": {"model": "m"}, "value": 3.0, "updated": 1765000000.0}]},
     {"name": "latency", "kind": "histogram", ...
      "series": [{"labels": {}, "buckets": [0.1, 1.0], "counts": [2, 1, 0], "sum": 0.7, "count": 3, ...}]}]}

`counts` has one entry per bucket and one for +Inf, each its own (not cumulative); `updated` is the
time.time() of the series' last change (a gauge set in two workers: the later wins).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

FILE_PREFIX = "model-metrics-w"
_FILE = re.compile(rf"{FILE_PREFIX}(\d+)\.g(\d+)\.json")


def path_of(runtime_dir: str, index: int, generation: int) -> Path:
    return Path(runtime_dir) / f"{FILE_PREFIX}{index}.g{generation}.json"


def write(path: Path, snapshot: dict[str, Any]) -> None:
    """The whole snapshot, atomically: a reader sees the previous file or this one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps(snapshot, separators=(",", ":")))
    os.replace(temporary, path)


def _alive(pid: Any) -> bool:
    if type(pid) is not int or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_live(runtime_dir: str) -> list[tuple[int, dict[str, Any]]]:
    """(worker index, snapshot) of every file whose worker still runs, by index and generation."""
    found = []
    try:
        names = os.listdir(runtime_dir)
    except OSError:
        return []
    for name in names:
        match = _FILE.fullmatch(name)
        if match is None:
            continue
        try:
            snapshot = json.loads((Path(runtime_dir) / name).read_text())
        except (OSError, ValueError):
            continue  # (removed meanwhile, or not ours)
        if isinstance(snapshot, dict) and _alive(snapshot.get("pid")):
            found.append(((int(match[1]), int(match[2])), snapshot))
    return [(key[0], snapshot) for key, snapshot in sorted(found, key=lambda item: item[0])]


def remove_dead(runtime_dir: str, index: int) -> None:
    """The files of worker `index`'s earlier generations whose process is gone (a crash leaves its file)."""
    try:
        names = os.listdir(runtime_dir)
    except OSError:
        return
    for name in names:
        match = _FILE.fullmatch(name)
        if match is None or int(match[1]) != index:
            continue
        path = Path(runtime_dir) / name
        try:
            pid = json.loads(path.read_text()).get("pid")
        except (OSError, ValueError, AttributeError):
            pid = None
        if not _alive(pid):
            path.unlink(missing_ok=True)
