"""The benchmark harness (bench/): its pieces without a server, and one quick real run.

Structure and sanity only: nothing here asserts how fast anything is.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from bench.__main__ import QUICK, build_parser, resolve
from bench.load import (
    ServerCounters,
    counters_delta,
    make_infer_body,
    median,
    parse_prometheus,
    percentile,
    run_load_async,
)
from bench.report import TABLE_COLUMNS, machine_info, render_table, summarize, write_json
from bench.servers import build_case_repositories, rewrite_config_unbatched, unbatched_config
from common.config import load_model, load_repository

REPO_ROOT = Path(__file__).resolve().parents[2]


# -- statistics -------------------------------------------------------------------------------
def test_percentile_interpolates_between_ranks():
    values = [float(v) for v in range(1, 11)]  # 1..10
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 10.0
    assert percentile(values, 50) == pytest.approx(5.5)
    assert percentile(values, 99) == pytest.approx(9.91)  # rank 0.99 * 9 = 8.91 -> 9 + 0.91
    assert percentile(values, 25) == pytest.approx(3.25)


def test_percentile_ignores_input_order_and_handles_tiny_inputs():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_percentile_matches_numpy_default():
    rng = random.Random(7)
    values = [rng.expovariate(1.0) for _ in range(1001)]
    for q in (1, 50, 90, 99, 99.9):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_median_skips_missing_values():
    assert median([3.0, None, 1.0, float("nan"), 2.0]) == 2.0
    assert median([4.0, 1.0]) == 2.5
    assert math.isnan(median([None]))


def test_summarize_takes_medians_and_sums_errors():
    runs = [{"rps": 100.0, "p50_ms": 1.0, "p99_ms": 9.0, "mean_ms": 2.0, "mean_batch": 1.0, "gen_cpu_pct": 30.0,
             "errors": 0},
            {"rps": 300.0, "p50_ms": 3.0, "p99_ms": 5.0, "mean_ms": 4.0, "mean_batch": None, "gen_cpu_pct": 10.0,
             "errors": 2},
            {"rps": 200.0, "p50_ms": 2.0, "p99_ms": 7.0, "mean_ms": 3.0, "mean_batch": 3.0, "gen_cpu_pct": 20.0,
             "errors": 1}]
    s = summarize("batched", 16, runs)
    assert (s["case"], s["clients"], s["repeats"]) == ("batched", 16, 3)
    assert (s["rps"], s["p50_ms"], s["p99_ms"], s["gen_cpu_pct"]) == (200.0, 2.0, 7.0, 20.0)
    assert s["mean_batch"] == 2.0  # the missing one is skipped
    assert s["errors"] == 3


# -- table and JSON ---------------------------------------------------------------------------
def test_render_table_is_markdown_with_one_row_per_summary():
    rows = [{"case": "batched", "label": "batching (mbs 64)", "clients": 64, "rps": 12345.678, "p50_ms": 4.5,
             "p99_ms": 12.345, "errors": 0, "mean_batch": 17.25, "gen_cpu_pct": 88.4},
            {"case": "unbatched", "clients": 1, "rps": None, "p50_ms": float("nan"), "p99_ms": None,
             "errors": 3, "mean_batch": None, "gen_cpu_pct": None}]
    lines = render_table(rows).splitlines()
    assert len(lines) == 4
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == list(TABLE_COLUMNS)
    assert set(lines[1].replace("|", "").replace("-", "").replace(":", "")) == set()
    first = [c.strip() for c in lines[2].strip("|").split("|")]
    assert first == ["batching (mbs 64)", "64", "12,346", "4.50", "12.35", "0", "17.2", "88"]
    second = [c.strip() for c in lines[3].strip("|").split("|")]
    assert second == ["unbatched", "1", "-", "-", "-", "3", "-", "-"]


def test_write_json_creates_directories_and_rejects_nan(tmp_path):
    path = write_json(tmp_path / "a" / "b" / "r.json", {"x": 1})
    assert json.loads(path.read_text()) == {"x": 1}
    with pytest.raises(ValueError):
        write_json(tmp_path / "nan.json", {"x": float("nan")})


def test_machine_info_names_the_machine():
    info = machine_info()
    assert info["nproc"] == os.cpu_count()
    assert info["python"] == sys.version.split()[0]
    assert "onnxruntime" in (info["onnxruntime"] or "")
    json.dumps(info, allow_nan=False)


# -- command line ---------------------------------------------------------------------------
def test_quick_mode_and_explicit_flags():
    quick = resolve(build_parser().parse_args(["--quick"]))
    assert quick["concurrency"] == [1, 4]
    assert (quick["duration_s"], quick["warmup_s"], quick["repeats"]) == (QUICK["duration_s"], QUICK["warmup_s"], 1)
    full = resolve(build_parser().parse_args([]))
    assert (full["concurrency"], full["duration_s"], full["warmup_s"], full["repeats"]) == ([1, 16, 64], 10.0, 2.0, 3)
    mixed = resolve(build_parser().parse_args(["--quick", "--concurrency", "2,8", "--repeats", "2"]))
    assert (mixed["concurrency"], mixed["repeats"], mixed["duration_s"]) == ([2, 8], 2, 1.0)
    assert full["cases"] == ["batched", "unbatched"]


def test_bad_concurrency_is_refused():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--concurrency", "1,zero"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--concurrency", "0"])


# -- model repositories -----------------------------------------------------------------------
def test_unbatched_config_sets_max_batch_size_1_and_drops_dynamic_batching():
    original = {"name": "mlp", "max_batch_size": 64, "input": [{"name": "x", "dims": [512]}],
                "dynamic_batching": {"max_queue_delay_microseconds": 0}}
    doc = unbatched_config(original)
    assert doc["max_batch_size"] == 1
    assert "dynamic_batching" not in doc
    assert doc["input"] == original["input"]
    assert original["max_batch_size"] == 64 and "dynamic_batching" in original  # a copy, not an edit


def test_rewrite_config_unbatched_is_loadable(tmp_path, demo_repo):
    import shutil

    shutil.copytree(demo_repo / "mlp", tmp_path / "mlp")
    rewrite_config_unbatched(tmp_path / "mlp")
    config = load_model(tmp_path, "mlp")
    assert config.max_batch_size == 1
    assert config.dynamic_batching is None
    assert [t.name for t in config.inputs] == ["x"]


def test_case_repositories_hold_only_mlp(tmp_path):
    repos = build_case_repositories(tmp_path)
    assert set(repos) == {"batched", "unbatched"}
    batched, unbatched = load_repository(repos["batched"]), load_repository(repos["unbatched"])
    assert list(batched) == ["mlp"] and list(unbatched) == ["mlp"]
    assert batched["mlp"].max_batch_size == 64 and batched["mlp"].dynamic_batching is not None
    assert unbatched["mlp"].max_batch_size == 1 and unbatched["mlp"].dynamic_batching is None


# -- request body and /metrics ------------------------------------------------------------------
def test_infer_body_is_fixed_and_well_formed():
    body = make_infer_body()
    assert body == make_infer_body()
    doc = json.loads(body)
    (tensor,) = doc["inputs"]
    assert (tensor["name"], tensor["shape"], tensor["datatype"]) == ("x", [1, 512], "FP32")
    assert len(tensor["data"]) == 512 and len(set(tensor["data"])) > 500


SCRAPE = """# HELP ringserve_batch_size Rows per batch sent to a worker
# TYPE ringserve_batch_size histogram
ringserve_batch_size_bucket{le="1.0",model="mlp"} 3.0
ringserve_batch_size_count{model="mlp"} 10.0
ringserve_batch_size_sum{model="mlp"} 40.0
ringserve_batch_size_count{model="encoder"} 99.0
ringserve_batch_size_sum{model="encoder"} 999.0
ringserve_requests_total{code="200",model="mlp"} 40.0
ringserve_requests_total{model="mlp",code="503"} 2.0
ringserve_worker_up{worker="0"} 1.0
"""


def test_parse_prometheus_reads_labels_in_any_order():
    samples = parse_prometheus(SCRAPE)
    assert samples[("ringserve_batch_size_sum", frozenset({("model", "mlp")}))] == 40.0
    assert samples[("ringserve_requests_total", frozenset({("model", "mlp"), ("code", "503")}))] == 2.0
    counters = ServerCounters.from_text(SCRAPE, "mlp")
    assert (counters.batches, counters.batch_rows) == (10.0, 40.0)
    assert counters.requests_by_code == {"200": 40.0, "503": 2.0}


def test_counters_delta_gives_mean_batch_of_the_window():
    before = ServerCounters.from_text(SCRAPE, "mlp")
    after = ServerCounters(batch_rows=40.0 + 96.0, batches=10.0 + 6.0,
                           requests_by_code={"200": 40.0 + 96.0, "503": 2.0})
    delta = counters_delta(before, after)
    assert (delta["batches"], delta["batch_rows"], delta["mean_batch"]) == (6.0, 96.0, 16.0)
    assert delta["server_requests_by_code"] == {"200": 96.0}
    assert counters_delta(before, before)["mean_batch"] is None
    assert counters_delta(None, after)["mean_batch"] is None


# -- the load generator against a stand-in server ---------------------------------------------
def test_load_generator_measures_and_counts_errors():
    """A tiny aiohttp server: every 5th request is a 503. The generator must count them."""
    seen = {"infer": 0, "peers": set()}

    async def infer(request: web.Request) -> web.Response:
        await request.read()
        seen["infer"] += 1
        seen["peers"].add(request.transport.get_extra_info("peername"))
        if seen["infer"] % 5 == 0:
            return web.json_response({"error": "busy"}, status=503)
        return web.json_response({"outputs": [{"name": "y", "shape": [1, 10], "data": [0.0] * 10}]})

    rows = {"n": 0}

    async def metrics(request: web.Request) -> web.Response:
        rows["n"] += 8
        return web.Response(text=f'ringserve_batch_size_count{{model="mlp"}} {rows["n"] // 8}\n'
                                 f'ringserve_batch_size_sum{{model="mlp"}} {rows["n"]}\n')

    async def scenario():
        app = web.Application()
        app.router.add_post("/v2/models/mlp/infer", infer)
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            return await run_load_async(f"http://127.0.0.1:{port}", "mlp", make_infer_body(), concurrency=3,
                                        duration_s=0.5, warmup_s=0.1)
        finally:
            await runner.cleanup()

    result = asyncio.run(scenario())
    assert result.clients == 3
    assert result.requests > 0 and result.rps > 0
    assert result.errors > 0 and set(result.errors_by_kind) == {"http_503"}
    assert result.errors_in_window <= result.errors
    total = result.requests + result.warmup_requests + result.tail_requests + result.errors
    assert total == seen["infer"]  # every answer is accounted for
    assert len(seen["peers"]) == 3  # one keep-alive connection per client
    assert 0 < result.p50_ms <= result.p99_ms <= result.max_ms
    assert result.mean_batch == 8.0 and result.batches == 1.0
    assert result.gen_cpu_s >= 0 and result.window_s > 0
    json.dumps(result.to_json(), allow_nan=False)


# -- one real run ---------------------------------------------------------------------------
@pytest.mark.integration
def test_quick_bench_runs_both_cases_at_both_levels(tmp_path):
    out = tmp_path / "r.json"
    process = subprocess.Popen([sys.executable, "-m", "bench", "--quick", "--out", str(out)], cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=180)
    finally:
        if process.poll() is None:  # SIGTERM first: the bench then stops its servers
            process.send_signal(signal.SIGTERM)
            try:
                process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
    assert process.returncode == 0, output
    doc = json.loads(out.read_text())
    assert "| case | clients | req/s |" in output
    assert doc["settings"]["quick"] is True
    assert doc["machine"]["nproc"] == os.cpu_count()
    assert "--quick" in doc["command"]
    summary = {(row["case"], row["clients"]): row for row in doc["summary"]}
    assert set(summary) == {(case, clients) for case in ("batched", "unbatched") for clients in (1, 4)}
    for key, row in summary.items():
        assert row["rps"] > 0, key
        assert row["errors"] == 0, key
        assert row["p50_ms"] > 0 and row["p99_ms"] >= row["p50_ms"], key
    assert len(doc["runs"]) == 4
    for run in doc["runs"]:
        assert run["errors"] == 0 and run["requests"] > 0, run
        assert run["batches"] and run["batches"] > 0, run
    assert all(r["mean_batch"] == 1.0 for r in doc["runs"] if r["case"] == "unbatched")
    for case in ("batched", "unbatched"):
        stop = doc["cases"][case]["stop"]
        assert stop["returncode"] == 0 and not stop["forced"], stop
        assert not stop["killed_children"] and not stop["removed_leftovers"], stop
