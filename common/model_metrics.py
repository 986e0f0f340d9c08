"""Python models' custom metrics (pb_utils.MetricFamily): the file a worker publishes them in.

    worker (worker/python/pb_metrics.py)                gateway (gateway/observe/model_metrics.py)
    a Metric changes -> after the call into model code   /metrics (the whole server's answer) reads every
    that changed it: rewrite <runtime dir>/model-        live worker's file and writes the families beside
    metrics-w<index>.g<generation>.json (Publisher)      the server's own, as Triton writes them

    file: [u64 sequence][u64 payload length][payload: JSON, below]

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
import struct
from pathlib import Path
from typing import Any

FILE_PREFIX = "model-metrics-w"
_FILE = re.compile(rf"{FILE_PREFIX}(\d+)\.g(\d+)\.json")
_HEADER = struct.Struct("<QQ")  # sequence number (odd while a write is under way), payload length
READ_TRIES = 5


def path_of(runtime_dir: str, index: int, generation: int) -> Path:
    return Path(runtime_dir) / f"{FILE_PREFIX}{index}.g{generation}.json"


class Publisher:
    """The worker's side: one file, rewritten in place (never truncated or renamed).

    A sequence number before the payload says when it is whole, as a seqlock does: odd while a write is
    under way, and a reader that sees it odd or changed across its read tries again. Written with
    pwrite into the page cache (~3 µs here): a new file and a rename per write cost 0.7-6 ms on ext4,
    which flushes a replaced file's blocks at the rename (auto_da_alloc), once per batch."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._sequence = 0

    def write(self, snapshot: dict[str, Any]) -> None:
        payload = json.dumps(snapshot, separators=(",", ":")).encode()
        self._sequence += 1
        os.pwrite(self._fd, _HEADER.pack(self._sequence, 0), 0)
        os.pwrite(self._fd, payload, _HEADER.size)
        self._sequence += 1
        os.pwrite(self._fd, _HEADER.pack(self._sequence, len(payload)), 0)

    def close(self) -> None:
        os.close(self._fd)
        self.path.unlink(missing_ok=True)


def read(path: Path) -> dict[str, Any] | None:
    """A file's snapshot as last written whole; None when there is none (yet, or any more)."""
    try:
        with path.open("rb") as f:
            for _ in range(READ_TRIES):
                data = f.read()
                if len(data) < _HEADER.size:
                    return None
                sequence, length = _HEADER.unpack_from(data)
                f.seek(0)
                if sequence % 2 == 0 and _HEADER.unpack(f.read(_HEADER.size))[0] == sequence:
                    snapshot = json.loads(data[_HEADER.size : _HEADER.size + length])
                    return snapshot if isinstance(snapshot, dict) else None
                f.seek(0)
    except (OSError, ValueError):
        return None
    return None  # (rewritten during every try: this scrape goes without it)


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


def _files(runtime_dir: str) -> list[tuple[int, int, Path]]:
    try:
        names = os.listdir(runtime_dir)
    except OSError:
        return []
    found = [(m, name) for name in names if (m := _FILE.fullmatch(name)) is not None]
    return sorted((int(m[1]), int(m[2]), Path(runtime_dir) / name) for m, name in found)


def read_live(runtime_dir: str) -> list[tuple[int, dict[str, Any]]]:
    """(worker index, snapshot) of every file whose worker still runs, by index and generation."""
    found = []
    for index, _, path in _files(runtime_dir):
        snapshot = read(path)
        if snapshot is not None and _alive(snapshot.get("pid")):
            found.append((index, snapshot))
    return found


def remove_dead(runtime_dir: str, index: int) -> None:
    """The files of worker `index`'s earlier generations whose process is gone (a crash leaves its file)."""
    for file_index, _, path in _files(runtime_dir):
        if file_index == index:
            snapshot = read(path)
            if snapshot is None or not _alive(snapshot.get("pid")):
                path.unlink(missing_ok=True)
