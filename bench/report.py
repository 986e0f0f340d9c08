"""Summaries of repeated runs, the Markdown table, the machine description and the JSON file."""
from __future__ import annotations

import contextlib
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.load import median

# Keys of a run whose median across repeats is reported; errors are summed instead.
MEDIAN_KEYS = ("rps", "p50_ms", "p99_ms", "mean_ms", "mean_batch", "gen_cpu_pct")
TABLE_COLUMNS = ("case", "clients", "req/s", "p50 ms", "p99 ms", "errors", "mean batch", "gen CPU %")


def summarize(case: str, clients: int, runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median of each MEDIAN_KEYS value over `runs` (independently per key) and total errors."""
    summary: dict[str, Any] = {"case": case, "clients": clients, "repeats": len(runs)}
    for key in MEDIAN_KEYS:
        value = median([run.get(key) for run in runs])
        summary[key] = None if math.isnan(value) else value
    summary["errors"] = sum(int(run.get("errors") or 0) for run in runs)
    return summary


def _fmt(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def render_table(rows: Iterable[Mapping[str, Any]]) -> str:
    """Markdown table of summaries (one row each), columns as in TABLE_COLUMNS."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(TABLE_COLUMNS) - 1)) + "|"]
    for row in rows:
        cells = [str(row.get("label") or row["case"]), str(row["clients"]), _fmt(row.get("rps"), 0), _fmt(row.get("p50_ms"), 2),
                 _fmt(row.get("p99_ms"), 2), _fmt(row.get("errors"), 0), _fmt(row.get("mean_batch"), 1),
                 _fmt(row.get("gen_cpu_pct"), 0)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _version(*distributions: str) -> str | None:
    for name in distributions:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return f"{name} {importlib.metadata.version(name)}"
    return None


def _git_revision(cwd: Path) -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    return None


def machine_info() -> dict[str, Any]:
    with contextlib.suppress(OSError):
        load = os.getloadavg()
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "onnxruntime": _version("onnxruntime", "onnxruntime-gpu"),
        "aiohttp": _version("aiohttp"),
        "numpy": _version("numpy"),
        "loadavg_at_start": list(load) if "load" in locals() else None,
        "ringserve_git": _git_revision(Path(__file__).resolve().parent.parent),
    }


def write_json(path: Path, document: Mapping[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
    tmp.replace(path)
    return path
