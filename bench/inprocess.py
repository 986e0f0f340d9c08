"""The in-process ceiling: ONNX Runtime alone, in this process, at the batch sizes the server formed.

No HTTP, no JSON, no queue, no copy: one InferenceSession, set up as ringserve's worker sets
up its own (CPU, `intra_op_threads` threads, spinning off), runs pre-built inputs back to back.
For each batch size, the fastest of `blocks` timing blocks (the median is recorded too).

The ceiling for a run is rows / sum over its batches of t(b): what ONNX Runtime alone needs for
exactly the batches the server ran. The exact sizes come from the statistics extension
(`/v2/models/m/stats` batch_stats) when the server reports them; otherwise from /metrics, whose
histogram gives only bucket counts but the exact number of batches and rows, so the mean batch.
t(b) between measured sizes is interpolated linearly; the sizes measured are the powers of two
up to max_batch_size plus every mean batch seen, rounded. A least-squares line
t(b) = fixed + per_row * b over all sizes is reported too.
"""
from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from bench.load import median

InputFactory = Callable[[int], dict[str, np.ndarray]]


def make_session(model_path: Path, intra_op_threads: int = 1):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as worker/session.py
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


def float_rows(input_name: str, width: int, seed: int = 1) -> InputFactory:
    rng = np.random.default_rng(seed)

    def make(batch: int) -> dict[str, np.ndarray]:
        return {input_name: rng.standard_normal((batch, width), dtype=np.float32)}
    return make


def time_batches(model_path: Path, make_input: InputFactory, batch_sizes: Iterable[int], *,
                 intra_op_threads: int = 1, seconds_per_size: float = 1.0,
                 blocks: int = 5) -> dict[int, dict[str, Any]]:
    """{batch: {"s_per_batch", "items_per_s", "runs"}} (median of `blocks` blocks per size)."""
    session = make_session(model_path, intra_op_threads)
    results: dict[int, dict[str, Any]] = {}
    for batch in sorted({int(b) for b in batch_sizes if b >= 1}):
        feed = make_input(batch)
        session.run(None, feed)  # first run allocates
        t = time.perf_counter()
        session.run(None, feed)
        estimate = max(time.perf_counter() - t, 1e-6)
        runs_per_block = max(1, int(seconds_per_size / blocks / estimate))
        per_run = []
        for _ in range(blocks):
            t = time.perf_counter()
            for _ in range(runs_per_block):
                session.run(None, feed)
            per_run.append((time.perf_counter() - t) / runs_per_block)
        # The fastest block: noise (another process, a page fault) only ever adds time, and this is
        # a ceiling. The median is kept too.
        s = min(per_run)
        results[batch] = {"s_per_batch": s, "items_per_s": batch / s, "s_per_batch_median": median(per_run),
                          "runs": runs_per_block * blocks,
                          "block_spread_pct": (max(per_run) - min(per_run)) / s * 100.0}
    return results


def fit_linear(timings: dict[int, dict[str, Any]]) -> dict[str, float]:
    """Least-squares t(b) = fixed_s + per_row_s * b over the measured sizes."""
    xs = [float(b) for b in timings]
    ys = [timings[b]["s_per_batch"] for b in timings]
    if len(xs) == 1:
        return {"fixed_s": 0.0, "per_row_s": ys[0] / xs[0]}
    x_mean, y_mean = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - x_mean) ** 2 for x in xs)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    fixed = y_mean - slope * x_mean
    return {"fixed_s": fixed, "per_row_s": slope}


def ceiling_items_per_s(fit: dict[str, float], mean_batch: float) -> float:
    """Items/s ONNX Runtime alone reaches when batches average `mean_batch` rows."""
    t = fit["fixed_s"] + fit["per_row_s"] * mean_batch
    return mean_batch / t if t > 0 else math.nan


def batch_sizes_for(mean_batches: Iterable[float | None], max_batch: int) -> list[int]:
    """Powers of two up to max_batch, plus every observed mean batch rounded."""
    sizes = {1}
    b = 1
    while b < max_batch:
        b *= 2
        sizes.add(min(b, max_batch))
    sizes |= {max(1, round(m)) for m in mean_batches if m}
    return sorted(sizes)


def measure_ceiling(model_path: Path, make_input: InputFactory, mean_batches: Iterable[float | None], *,
                    max_batch: int = 64, intra_op_threads: int = 1, seconds_per_size: float = 1.0,
                    blocks: int = 5) -> dict[str, Any]:
    means = list(mean_batches)
    timings = time_batches(model_path, make_input, batch_sizes_for(means, max_batch),
                           intra_op_threads=intra_op_threads, seconds_per_size=seconds_per_size, blocks=blocks)
    fit = fit_linear(timings)
    return {"model_path": str(model_path), "intra_op_threads": intra_op_threads, "blocks": blocks,
            "seconds_per_size": seconds_per_size,
            "by_batch": {str(b): v for b, v in timings.items()}, "fit": fit}


def interpolate_s(timings: dict[str, dict[str, Any]], batch: float) -> float:
    """Seconds per batch of `batch` rows, piecewise linear between the measured sizes."""
    points = sorted((int(b), v["s_per_batch"]) for b, v in timings.items())
    if batch <= points[0][0] or len(points) == 1:
        return points[0][1] * batch / points[0][0]
    for (b0, t0), (b1, t1) in itertools.pairwise(points):
        if batch <= b1:
            return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
    (b0, t0), (b1, t1) = points[-2], points[-1]  # beyond the largest: extend the last segment
    return t1 + (t1 - t0) * (batch - b1) / (b1 - b0)


def efficiency(ceiling: dict[str, Any], mean_batch: float | None, served_items_per_s: float | None,
               batch_sizes: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Served items/s ÷ what ONNX Runtime alone does on the same batches.

    With the exact batch sizes (the statistics extension): rows / sum(batches_b * t(b)). Without
    them: mean / t(mean) from the mean batch, t piecewise linear between the measured sizes
    (exact when the batches were all about the same size, as at saturation).
    """
    if not mean_batch or not served_items_per_s:
        return {"ceiling_items_per_s": None, "efficiency": None, "ceiling_method": None}
    by_batch = ceiling["by_batch"]
    if batch_sizes:
        rows = sum(int(b) * v["batches"] for b, v in batch_sizes.items())
        seconds = sum(v["batches"] * interpolate_s(by_batch, int(b)) for b, v in batch_sizes.items())
        fitted, method = rows / seconds, "exact batch sizes (statistics extension)"
    else:
        fitted, method = mean_batch / interpolate_s(by_batch, mean_batch), "mean batch (interpolated)"
    return {"ceiling_items_per_s": fitted, "ceiling_method": method,
            "ceiling_items_per_s_linear_fit": ceiling_items_per_s(ceiling["fit"], mean_batch),
            "efficiency": served_items_per_s / fitted if fitted else None}


def attach_efficiency(runs: list[dict[str, Any]], ceiling: dict[str, Any]) -> None:
    """Add the ceiling and the efficiency to each run that reports batches (ringserve's)."""
    for run in runs:
        if "failed" not in run and run.get("mean_batch"):
            run.update(efficiency(ceiling, run.get("mean_batch"), run.get("rows_per_s"), run.get("batch_sizes")))
