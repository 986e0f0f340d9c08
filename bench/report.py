"""What a suite leaves behind: the JSON document, Markdown tables, PNG plots, the machine's description."""
from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import math
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

# (header, key, digits) of the standard run table; digits None = as is.
TABLE_COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("case", "label", None), ("clients", "clients", None), ("req/s", "rps", 0), ("p50 ms", "p50_ms", 2),
    ("p99 ms", "p99_ms", 2), ("errors", "errors", 0), ("mean batch", "mean_batch", 1),
    ("server CPU %", "server_cpu_pct", 0), ("CPU µs/req", "server_cpu_us_per_request", 0),
    ("RSS MiB", "rss_mib", 0), ("USS MiB", "uss_mib", 0), ("gen CPU %", "gen_cpu_pct", 0),
    ("foreign CPU %", "foreign_cpu_pct", 0))


def fmt(value: Any, digits: int | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if digits is None:
        return str(value)
    if isinstance(value, (int, float)):
        return f"{value:,.{digits}f}"
    return str(value)


def render_table(rows: Iterable[Mapping[str, Any]],
                 columns: Sequence[tuple[str, str, int | None]] = TABLE_COLUMNS) -> str:
    """Markdown table, one row per mapping; `columns` = (header, key, digits)."""
    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |",
             "|" + "|".join("---" if d is None else "---:" for _, _, d in columns) + "|"]
    for row in rows:
        cells = []
        for _, key, digits in columns:
            value = row.get(key)
            if key == "label" and value is None:
                value = row.get("case")
            cells.append(fmt(value, digits))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if not numerator or not denominator:
        return None
    return numerator / denominator


def ceiling_tables(ceiling: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The in-process timings, and served items/s against them (`rows`: summary rows with batches)."""
    fit = ceiling["fit"]
    timings = [{"batch": int(b), "us": v["s_per_batch"] * 1e6, **v} for b, v in ceiling["by_batch"].items()]
    return [(f"### In-process ceiling (ONNX Runtime alone, {ceiling['intra_op_threads']} thread, spinning off; "
             f"least-squares t(b) = {fit['fixed_s'] * 1e6:,.1f} µs + {fit['per_row_s'] * 1e6:,.2f} µs × b)"),
            render_table(timings, [("batch", "batch", None), ("µs/batch", "us", 1), ("items/s", "items_per_s", 0)]),
            "Efficiency = served items/s ÷ ONNX Runtime alone on the same batches (median over repeats):",
            render_table(rows, [("case", "label", None), ("clients", "clients", None), ("items/s", "rows_per_s", 0),
                                ("mean batch", "mean_batch", 1),
                                ("compute ms/batch (server)", "compute_ms_per_batch", 2),
                                ("ceiling items/s", "ceiling_items_per_s", 0), ("efficiency", "efficiency", 3)])]


# -- the machine ------------------------------------------------------------------------------
def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _cpu_flags() -> list[str]:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return sorted(f for f in flags if f in {"avx", "avx2", "avx512f", "fma", "avx512_vnni", "amx_tile"})
    return []


def _version(*distributions: str) -> str | None:
    for name in distributions:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return f"{name} {importlib.metadata.version(name)}"
    return None


def _git_revision(cwd: Path) -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10,
                              check=False)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=cwd, capture_output=True, text=True, timeout=10,
                               check=False)
        if head.returncode == 0:
            return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    return None


def _mem_total_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return None


def machine_info() -> dict[str, Any]:
    load = None
    with contextlib.suppress(OSError):
        load = list(os.getloadavg())
    wrk = shutil.which("wrk")
    wrk_version = None
    if wrk:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([wrk, "--version"], capture_output=True, text=True, timeout=5, check=False)
            wrk_version = " ".join((out.stdout or out.stderr).split()[:2])  # "wrk debian/4.1.0-3+b2"
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(), "cpu_flags": _cpu_flags(), "mem_total_gib": _mem_total_gib(),
        "kernel": platform.release(),
        "python": sys.version.split()[0], "python_implementation": platform.python_implementation(),
        # The GPU build first: on a machine with both, it is the one imported (bench/gpu_scaling.sh).
        "onnxruntime": _version("onnxruntime-gpu", "onnxruntime"), "aiohttp": _version("aiohttp"),
        "numpy": _version("numpy"), "uvicorn": _version("uvicorn"), "uvloop": _version("uvloop"),
        "httptools": _version("httptools"), "orjson": _version("orjson"), "starlette": _version("starlette"),
        "wrk": wrk_version, "loadavg_at_start": load,
        "ringserve_git": _git_revision(Path(__file__).resolve().parent.parent),
    }


def describe_machine(machine: Mapping[str, Any]) -> str:
    return (f"{machine.get('nproc')} CPUs ({machine.get('cpu_model')}; {', '.join(machine.get('cpu_flags') or [])}), "
            f"{machine.get('mem_total_gib')} GiB, Linux {machine.get('kernel')}, Python {machine.get('python')}, "
            f"{machine.get('onnxruntime')}, load generator: {machine.get('wrk') or 'aiohttp'}")


def new_document(suite: str, title: str, command: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    return {"suite": suite, "benchmark": title,
            "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": command, "argv": sys.argv, "settings": dict(settings), "machine": machine_info(),
            "summary_rule": "median over repeats of each column independently; errors summed over repeats; "
                            "memory = the largest RSS/PSS/USS of the whole process tree seen after any run",
            "services": {}, "runs": [], "summary": []}


def finish_document(document: dict[str, Any]) -> None:
    document["finished_at"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with contextlib.suppress(OSError):
        document["machine"]["loadavg_at_end"] = list(os.getloadavg())  # includes the bench's own load


def _clean(value: Any) -> Any:
    """NaN/inf become null: the JSON stays strict."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, document: Mapping[str, Any], *, clean: bool = False) -> Path:
    """Strict JSON (NaN refused unless clean=True turns it into null), written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(document) if clean else document, indent=2, allow_nan=False) + "\n")
    tmp.replace(path)
    return path


# -- plots ------------------------------------------------------------------------------------
def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_throughput(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path | None:
    """req/s (median) against clients, one line per case (closed-loop rows only)."""
    plt = _pyplot()
    closed = [r for r in rows if r.get("mode", "closed") == "closed" and r.get("rps")]
    if plt is None or not closed:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label in dict.fromkeys(r["label"] for r in closed):
        points = sorted((r["clients"], r["rps"]) for r in closed if r["label"] == label)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set_xscale("log", base=2)
    levels = sorted({r["clients"] for r in closed})
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrent clients (closed loop)")
    ax.set_ylabel("requests/s (median of repeats)")
    return _save(plt, fig, ax, path, title)


def _save(plt, fig, ax, path: Path, title: str, grid_which: str = "major") -> Path:
    """What every plot ends with: title, grid, legend, written as PNG, figure closed."""
    ax.set_title(title)
    ax.grid(True, alpha=0.3, which=grid_which)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_cdf(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path | None:
    """Latency CDF of each row (the median-throughput run's percentiles), log x."""
    plt = _pyplot()
    rows = [r for r in rows if r.get("cdf")]
    if plt is None or not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for row in rows:
        points = [(q, ms) for q, ms in row["cdf"] if ms and ms > 0]
        ax.plot([ms for _, ms in points], [q for q, _ in points], marker=".", label=row["label"])
    ax.set_xscale("log")
    ax.set_xlabel("latency ms (log)")
    ax.set_ylabel("percentile")
    return _save(plt, fig, ax, path, title, grid_which="both")


def plot_throughput_and_cdf(rows: Sequence[Mapping[str, Any]], plots_dir: Path, stem: str, label: str
                            ) -> list[str]:
    """The two plots every load suite draws: `<stem>-throughput.png` over all levels and
    `<stem>-latency-cdf.png` at the highest client count; the paths written."""
    top = max((r["clients"] for r in rows), default=None)
    paths = (plot_throughput(rows, plots_dir / f"{stem}-throughput.png", f"{label}: throughput vs concurrency"),
             plot_cdf([r for r in rows if r["clients"] == top], plots_dir / f"{stem}-latency-cdf.png",
                      f"{label}: latency CDF at {top} clients"))
    return [str(p) for p in paths if p]


def plot_series(series: Mapping[str, Sequence[tuple[float, float]]], path: Path, title: str, xlabel: str,
                ylabel: str) -> Path | None:
    """Simple lines, e.g. RSS over a soak."""
    plt = _pyplot()
    if plt is None or not any(series.values()):
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, points in series.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return _save(plt, fig, ax, path, title)
