"""The benchmark harness (bench/): its pieces without a server, and every suite once in --quick mode.

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

from bench.__main__ import DEFAULT_SUITE, build_parser
from bench.encoder import length_mix
from bench.inprocess import efficiency, fit_linear, interpolate_s, time_batches
from bench.load import (
    CDF_PERCENTILES,
    Payload,
    ServerCounters,
    batch_histogram,
    cdf_points,
    counters_delta,
    make_infer_body,
    median,
    parse_prometheus,
    percentile,
    run_load_async,
    run_open_loop_async,
)
from bench.models import (
    build_case_repositories,
    case_repository,
    mlp_large_model,
    rewrite_config_unbatched,
    unbatched_config,
    with_latency_target,
    without_buckets,
)
from bench.perf_analyzer import parse_report
from bench.profile import categorize, parse_collapsed, top_functions
from bench.recovery import summarize as summarize_recovery
from bench.report import TABLE_COLUMNS, machine_info, render_table, write_json
from bench.runner import summarize
from bench.soak import judge, slope_per_min
from bench.suite import resolve_common
from bench.wrk import parse_output, result_from_wrk, run_wrk, write_script, wrk_path
from ringserve.common.repository.scan import load_model, scan_repository

REPO_ROOT = Path(__file__).resolve().parents[2]


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


# -- statistics -------------------------------------------------------------------------------
def test_percentile_interpolates_between_ranks():
    values = [float(v) for v in range(1, 11)]  # 1..10
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 10.0
    assert percentile(values, 50) == pytest.approx(5.5)
    assert percentile(values, 99) == pytest.approx(9.91)  # rank 0.99 * 9 = 8.91 -> 9 + 0.91
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_percentile_matches_numpy_default():
    rng = random.Random(7)
    values = [rng.expovariate(1.0) for _ in range(1001)]
    for q in (1, 50, 90, 99, 99.9):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_median_skips_missing_values_and_cdf_has_every_point():
    assert median([3.0, None, 1.0, float("nan"), 2.0]) == 2.0
    assert math.isnan(median([None]))
    points = cdf_points([float(v) for v in range(100)])
    assert [q for q, _ in points] == list(CDF_PERCENTILES)
    assert [ms for _, ms in points] == sorted(ms for _, ms in points)
    assert cdf_points([]) == []


def test_summarize_takes_medians_sums_errors_and_keeps_the_median_runs_cdf():
    runs = [{"rps": 100.0, "p50_ms": 1.0, "p99_ms": 9.0, "mean_batch": 1.0, "errors": 0, "cdf": [[50, 1.0]],
             "memory": {"rss_mib": 10.0, "uss_mib": 5.0}},
            {"rps": 300.0, "p50_ms": 3.0, "p99_ms": 5.0, "mean_batch": None, "errors": 2, "cdf": [[50, 3.0]],
             "memory": {"rss_mib": 12.0, "uss_mib": 6.0}},
            {"rps": 200.0, "p50_ms": 2.0, "p99_ms": 7.0, "mean_batch": 3.0, "errors": 1, "cdf": [[50, 2.0]]},
            {"failed": "server exited"}]
    s = summarize("ringserve", 16, runs)
    assert (s["case"], s["clients"], s["repeats"], s["failed_runs"]) == ("ringserve", 16, 4, 1)
    assert (s["rps"], s["p50_ms"], s["p99_ms"], s["mean_batch"]) == (200.0, 2.0, 7.0, 2.0)
    assert s["errors"] == 3
    assert s["cdf"] == [[50, 2.0]]  # from the run with the median req/s
    assert (s["rss_mib"], s["uss_mib"]) == (12.0, 6.0)  # the largest seen


def test_summarize_prefers_quiet_repeats_and_skips_discarded_ones():
    runs = [{"rps": 100.0, "errors": 1, "noisy": True},
            {"rps": 900.0, "errors": 0, "discarded": "foreign CPU 120% > 50%"},
            {"rps": 300.0, "errors": 0}, {"rps": 500.0, "errors": 0}]
    s = summarize("ringserve", 64, runs)
    assert s["rps"] == 400.0  # the two quiet repeats
    assert (s["repeats"], s["used_runs"], s["discarded_runs"], s["errors"]) == (3, 2, 1, 1)
    assert summarize("ringserve", 64, runs[:1])["rps"] == 100.0  # only noisy ones: they are all there is


# -- table and JSON ---------------------------------------------------------------------------
def test_render_table_is_markdown_with_one_row_per_summary():
    rows = [{"case": "ringserve", "label": "ringserve (batching)", "clients": 64, "rps": 12345.678, "p50_ms": 4.5,
             "p99_ms": 12.345, "errors": 0, "mean_batch": 17.25},
            {"case": "raw_asgi", "clients": 1, "rps": None, "p50_ms": float("nan")}]
    lines = render_table(rows).splitlines()
    assert len(lines) == 4
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == [h for h, _, _ in TABLE_COLUMNS]
    first = [c.strip() for c in lines[2].strip("|").split("|")]
    assert first[:7] == ["ringserve (batching)", "64", "12,346", "4.50", "12.35", "0", "17.2"]
    second = [c.strip() for c in lines[3].strip("|").split("|")]
    assert second[:4] == ["raw_asgi", "1", "-", "-"]


def test_write_json_is_strict_unless_cleaned(tmp_path):
    path = write_json(tmp_path / "a" / "b" / "r.json", {"x": 1})
    assert json.loads(path.read_text()) == {"x": 1}
    with pytest.raises(ValueError):
        write_json(tmp_path / "nan.json", {"x": float("nan")})
    cleaned = write_json(tmp_path / "clean.json", {"x": [float("inf"), 1.0]}, clean=True)
    assert json.loads(cleaned.read_text()) == {"x": [None, 1.0]}


def test_machine_info_names_the_machine():
    info = machine_info()
    assert info["nproc"] == os.cpu_count()
    assert info["python"] == sys.version.split()[0]
    assert "onnxruntime" in (info["onnxruntime"] or "")
    json.dumps(info, allow_nan=False)


# -- command line ---------------------------------------------------------------------------
def test_every_suite_has_a_subcommand_and_mlp_is_the_default():
    choices = set(build_parser()._subparsers._group_actions[0].choices)
    assert {"mlp", "compute", "encoder", "recovery", "soak", "profile", "scaling", "protocols", "all"} <= choices
    assert DEFAULT_SUITE == "mlp"


def test_all_runs_every_suite_with_the_shared_flags(monkeypatch, tmp_path):
    import importlib

    import bench.__main__ as entry

    calls = []
    monkeypatch.setattr(entry.signal, "signal", lambda *args: None)  # main() would take SIGTERM over
    for module in ("mlp", "compute", "encoder", "recovery", "soak", "profile", "scaling", "protocols"):
        monkeypatch.setattr(importlib.import_module(f"bench.{module}"), "main",
                            lambda args, argv=None: calls.append(argv) or {})
    # bench/protocol.py has its own test; it is left out here.
    assert entry.main(["all", "--quick", "--out-dir", str(tmp_path), "--soak-s", "7", "--skip", "protocol"]) == 0
    assert [argv[0] for argv in calls] == ["mlp", "compute", "encoder", "recovery", "soak", "profile", "scaling",
                                           "protocols"]
    assert all("--quick" in argv and str(tmp_path) in argv for argv in calls)
    assert ["--soak-s", "7.0"] == calls[4][-2:]
    with pytest.raises(SystemExit):
        entry.main(["all", "--skip", "nonsense"])


def test_no_suite_named_means_mlp(monkeypatch):
    import bench.__main__ as entry
    import bench.mlp

    seen = []
    monkeypatch.setattr(entry.signal, "signal", lambda *args: None)
    monkeypatch.setattr(bench.mlp, "main", lambda args, argv=None: seen.append(argv) or {})
    assert entry.main(["--quick", "--concurrency", "2"]) == 0
    assert seen == [["mlp", "--quick", "--concurrency", "2"]]


def test_quick_mode_and_explicit_flags():
    quick = resolve_common(parse("mlp", "--quick"), {"duration_s": 8.0, "warmup_s": 2.0, "repeats": 3},
                           {"duration_s": 1.0, "warmup_s": 0.0, "repeats": 1})
    assert (quick.duration_s, quick.warmup_s, quick.repeats, quick.quiet_wait_s) == (1.0, 0.0, 1, 0.0)
    full = resolve_common(parse("mlp"), {"duration_s": 8.0, "warmup_s": 2.0, "repeats": 3}, {})
    assert (full.duration_s, full.warmup_s, full.repeats, full.quiet_wait_s) == (8.0, 2.0, 3, 20.0)
    mixed = resolve_common(parse("mlp", "--quick", "--repeats", "2"), {"duration_s": 8.0, "warmup_s": 2.0,
                                                                       "repeats": 3}, {"repeats": 1})
    assert mixed.repeats == 2
    assert parse("mlp", "--concurrency", "2,8").concurrency == [2, 8]


def test_baseline_adds_a_ringserve_case_served_from_a_worktree_of_that_revision(tmp_path):
    from bench.mlp import baseline_checkout, selected_cases

    assert selected_cases(parse("mlp", "--cases", "ringserve,raw_asgi", "--baseline", "HEAD")) == [
        "ringserve", "ringserve_baseline", "raw_asgi"]
    assert "ringserve_baseline" not in selected_cases(parse("mlp"))
    document: dict = {}
    with baseline_checkout("HEAD", tmp_path, document) as checkout:
        assert (checkout / "gateway" / "__main__.py").is_file() and (checkout / "cli" / "__main__.py").is_file()
        assert len(document["baseline"]["commit"]) == 40
    assert not checkout.exists()  # the worktree is removed afterwards


def test_bad_levels_are_refused():
    with pytest.raises(SystemExit):
        parse("mlp", "--concurrency", "1,zero")
    with pytest.raises(SystemExit):
        parse("compute", "--concurrency", "0")
    with pytest.raises(SystemExit):
        parse("mlp", "--rates", "-5")


# -- model repositories -----------------------------------------------------------------------
def test_unbatched_config_sets_max_batch_size_1_and_drops_dynamic_batching():
    original = {"name": "mlp", "max_batch_size": 64, "dynamic_batching": {"max_queue_delay_microseconds": 0}}
    doc = unbatched_config(original)
    assert doc["max_batch_size"] == 1 and "dynamic_batching" not in doc
    assert original["max_batch_size"] == 64 and "dynamic_batching" in original  # a copy, not an edit


def test_case_configs_are_loadable(tmp_path, demo_repo):
    import shutil

    shutil.copytree(demo_repo / "mlp", tmp_path / "mlp")
    rewrite_config_unbatched(tmp_path / "mlp")
    assert load_model(tmp_path, "mlp").max_batch_size == 1
    no_buckets = load_model(case_repository(tmp_path / "x", demo_repo, "encoder", "nb", without_buckets), "encoder")
    assert no_buckets.dynamic_batching.sequence_buckets == () and no_buckets.dynamic_batching.padding is not None
    target = load_model(case_repository(tmp_path / "x", demo_repo, "mlp", "t", with_latency_target(50)), "mlp")
    assert target.dynamic_batching.latency_target_ms == 50.0


def test_case_repositories_hold_only_mlp(tmp_path):
    repos = build_case_repositories(tmp_path)
    batched, unbatched = (scan_repository(repos[case]).defaults() for case in ("batched", "unbatched"))
    assert list(batched) == ["mlp"] and list(unbatched) == ["mlp"]
    assert batched["mlp"].max_batch_size == 64 and unbatched["mlp"].max_batch_size == 1


def test_mlp_large_is_a_loadable_onnx_graph_with_mlps_interface(tmp_path):
    import onnx
    import onnxruntime as ort

    model = mlp_large_model(width=32, layers=3)
    assert model.ir_version == 10
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": np.ones((3, 512), np.float32)})
    assert y.shape == (3, 10) and np.isfinite(y).all()


def test_busy_model_is_weightless_and_loadable(tmp_path):
    import onnx
    import onnxruntime as ort

    from bench.models import build_busy_model

    path = build_busy_model(tmp_path, width=16, rounds=2)
    assert not [t for t in onnx.load(str(path)).graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    assert load_model(tmp_path, "busy").max_batch_size == 64
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": np.full((3, 16), 0.5, np.float32)})
    assert y.shape == (3, 16) and np.allclose(y, 1.0, atol=1e-3)  # saturated, never denormal


# -- bodies, /metrics ---------------------------------------------------------------------------
def test_infer_body_is_fixed_and_well_formed():
    body = make_infer_body()
    assert body == make_infer_body()
    (tensor,) = json.loads(body)["inputs"]
    assert (tensor["name"], tensor["shape"], tensor["datatype"]) == ("x", [1, 512], "FP32")
    assert len(tensor["data"]) == 512 and len(set(tensor["data"])) > 500
    assert np.array_equal(np.asarray(tensor["data"], np.float32).astype(np.float64), tensor["data"])  # float32s
    assert len(make_infer_body(decimals=6)) < len(body)


def test_length_mix_is_fixed_and_covers_the_range():
    payload, lengths = length_mix(64, 512)
    assert payload.bodies == length_mix(64, 512)[0].bodies
    assert 1 <= min(lengths) and max(lengths) <= 512 and len(set(lengths)) > 30
    doc = json.loads(payload.bodies[0])
    assert [t["name"] for t in doc["inputs"]] == ["input_ids", "attention_mask"]
    assert doc["inputs"][0]["shape"] == [1, lengths[0]]


SCRAPE = """# TYPE ringserve_batch_size histogram
ringserve_batch_size_bucket{le="1.0",model="mlp"} 3.0
ringserve_batch_size_bucket{le="2.0",model="mlp"} 3.0
ringserve_batch_size_bucket{le="16.0",model="mlp"} 10.0
ringserve_batch_size_bucket{le="+Inf",model="mlp"} 10.0
ringserve_batch_size_count{model="mlp"} 10.0
ringserve_batch_size_sum{model="mlp"} 40.0
ringserve_batch_size_count{model="encoder"} 99.0
ringserve_compute_seconds_sum{model="mlp"} 0.5
ringserve_requests_total{code="200",model="mlp"} 40.0
ringserve_requests_total{model="mlp",code="503"} 2.0
ringserve_real_elements_total{model="mlp"} 100.0
ringserve_padded_elements_total{model="mlp"} 25.0
ringserve_worker_restarts_total{worker="0",reason="SIGKILL"} 3.0
"""


def test_parse_prometheus_reads_labels_in_any_order():
    samples = parse_prometheus(SCRAPE)
    assert samples[("ringserve_requests_total", frozenset({("model", "mlp"), ("code", "503")}))] == 2.0
    counters = ServerCounters.from_text(SCRAPE, "mlp")
    assert (counters.batches, counters.batch_rows, counters.compute_s, counters.restarts) == (10.0, 40.0, 0.5, 3.0)
    assert counters.requests_by_code == {"200": 40.0, "503": 2.0}
    assert batch_histogram(counters.batch_buckets) == [[0.0, 1.0, 3.0], [2.0, 16.0, 7.0]]


def test_counters_delta_gives_the_windows_batches_and_waste():
    before = ServerCounters.from_text(SCRAPE, "mlp")
    after = ServerCounters(batch_rows=136.0, batches=16.0, requests_by_code={"200": 136.0, "503": 2.0},
                           batch_buckets={"1.0": 3.0, "16.0": 16.0}, compute_s=0.8, real_elements=300.0,
                           padded_elements=75.0, restarts=3.0)
    delta = counters_delta(before, after)
    assert (delta["batches"], delta["batch_rows"], delta["mean_batch"]) == (6.0, 96.0, 16.0)
    assert delta["server_requests_by_code"] == {"200": 96.0}
    assert delta["compute_ms_per_batch"] == pytest.approx(50.0)
    assert delta["padding_waste"] == pytest.approx(0.25)
    assert counters_delta(None, after)["mean_batch"] is None


# -- the load generators against a stand-in server ---------------------------------------------
async def _stand_in(handler_calls: dict):
    async def infer(request: web.Request) -> web.Response:
        await request.read()
        handler_calls["infer"] += 1
        handler_calls["peers"].add(request.transport.get_extra_info("peername"))
        if handler_calls["infer"] % 5 == 0:
            return web.json_response({"error": "busy"}, status=503)
        return web.json_response({"outputs": [{"name": "y", "shape": [1, 10], "data": [0.0] * 10}]})

    app = web.Application()
    app.router.add_post("/v2/models/mlp/infer", infer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v2/models/mlp/infer"


class Hooks:
    def __init__(self) -> None:
        self.calls = []

    def start(self) -> None:
        self.calls.append("start")

    def end(self) -> None:
        self.calls.append("end")


def test_closed_loop_measures_counts_errors_and_calls_the_window_hooks():
    seen = {"infer": 0, "peers": set()}
    hooks = Hooks()

    async def scenario():
        runner, url = await _stand_in(seen)
        try:
            return await run_load_async(url, Payload.single(make_infer_body()), concurrency=3, duration_s=0.5,
                                        warmup_s=0.1, window=hooks)
        finally:
            await runner.cleanup()

    result = asyncio.run(scenario())
    assert (result.generator, result.mode, result.clients) == ("aiohttp", "closed", 3)
    assert result.requests > 0 and result.rps > 0
    assert result.errors > 0 and set(result.errors_by_kind) == {"http_503"}
    assert result.requests + result.warmup_requests + result.tail_requests + result.errors == seen["infer"]
    assert len(seen["peers"]) == 3  # one keep-alive connection per client
    assert 0 < result.p50_ms <= result.p99_ms <= result.max_ms
    assert hooks.calls == ["start", "end"]
    json.dumps(result.to_json(), allow_nan=False)


def test_open_loop_sends_at_the_rate_whatever_the_server_does():
    seen = {"infer": 0, "peers": set()}

    async def scenario():
        runner, url = await _stand_in(seen)
        try:
            return await run_open_loop_async(url, Payload.single(make_infer_body()), rate=200.0, duration_s=0.5,
                                             warmup_s=0.1)
        finally:
            await runner.cleanup()

    result = asyncio.run(scenario())
    assert (result.mode, result.rate) == ("open", 200.0)
    assert 40 <= seen["infer"] <= 260  # ~120 expected from a Poisson process at 200/s over 0.6 s
    assert result.requests + result.warmup_requests + result.tail_requests + result.errors == seen["infer"]
    assert result.sent_late_ms_p99 is not None


def test_wrk_script_and_output_parsing(tmp_path):
    payload = Payload(bodies=(b'{"a":1}', b"\x00binary\xff"), headers=({"x-one": "1"}, {"x-two": "2"}))
    script = write_script(tmp_path, payload)
    text = script.read_text()
    assert "request = function()" in text and '"x-two"' in text and "WRK_JSON" in text
    assert (tmp_path / "body-1.bin").read_bytes() == b"\x00binary\xff"
    line = ('WRK_JSON {"requests":110,"duration_us":2000000,"bytes":1,"errors":{"connect":0,"read":0,"write":0,'
            '"status":10,"timeout":0},"latency_mean_us":1500.0,"latency_max_us":9000,'
            '"percentiles_us":[[50,1000],[90,2000],[99,5000],[100,0]]}')
    doc = parse_output("Running 2s test\n" + line + "\n")
    result = result_from_wrk(doc, 4, cpu_s=0.5, wall_s=2.0)
    assert (result.requests, result.rps, result.p50_ms, result.p99_ms) == (100, 50.0, 1.0, 5.0)
    assert result.errors_by_kind == {"http_non_2xx_3xx": 10} and result.gen_cpu_pct == 25.0
    assert result.cdf[-1] == [100, 9.0]  # wrk's percentile(100) is 0: the maximum stands in
    with pytest.raises(ValueError):
        parse_output("no json here")


@pytest.mark.skipif(wrk_path() is None, reason="wrk is not installed")
def test_wrk_run_against_a_stand_in_server():
    import threading

    seen = {"infer": 0, "peers": set()}
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box = {}

    def serve():
        asyncio.set_event_loop(loop)
        box["runner"], box["url"] = loop.run_until_complete(_stand_in(seen))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    started.wait(10)
    try:
        hooks = Hooks()
        result = run_wrk(box["url"], Payload.single(make_infer_body()), concurrency=2, duration_s=1, warmup_s=0,
                         window=hooks)
    finally:
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
    assert result.generator == "wrk" and result.requests > 0
    assert result.errors_by_kind.get("http_non_2xx_3xx", 0) > 0  # every 5th is a 503
    assert hooks.calls == ["start", "end"]


# -- in-process ceiling, profile, soak, recovery ------------------------------------------------
def test_ceiling_fit_interpolation_and_efficiency():
    timings = {"1": {"s_per_batch": 0.001}, "4": {"s_per_batch": 0.002}, "16": {"s_per_batch": 0.008}}
    assert interpolate_s(timings, 4) == 0.002
    assert interpolate_s(timings, 10) == pytest.approx(0.005)
    assert interpolate_s(timings, 32) == pytest.approx(0.016)  # the last segment, extended
    fit = fit_linear({int(b): v for b, v in timings.items()})
    assert fit["per_row_s"] > 0
    ceiling = {"by_batch": timings, "fit": fit}
    by_mean = efficiency(ceiling, 4.0, 1000.0)
    assert by_mean["ceiling_items_per_s"] == pytest.approx(2000.0) and by_mean["efficiency"] == pytest.approx(0.5)
    exact = efficiency(ceiling, 4.0, 1000.0, {"1": {"batches": 2}, "16": {"batches": 1}})  # 18 rows in 10 ms
    assert exact["ceiling_items_per_s"] == pytest.approx(1800.0)
    assert efficiency(ceiling, None, 1000.0)["efficiency"] is None


def test_time_batches_on_a_tiny_model(tmp_path):
    import onnx

    onnx.save(mlp_large_model(width=16, layers=1), str(tmp_path / "m.onnx"))
    from bench.inprocess import float_rows

    timings = time_batches(tmp_path / "m.onnx", float_rows("x", 512), [1, 4], seconds_per_size=0.02, blocks=2)
    assert set(timings) == {1, 4} and all(v["items_per_s"] > 0 for v in timings.values())


def test_profile_samples_go_to_the_innermost_known_part():
    raw = ("main (gateway/__main__.py:1);Runner.run (asyncio/runners.py:118) 10\n"
           "main (gateway/__main__.py:1);Endpoints.infer (gateway/http/routes.py:67);"
           "parse_infer_request (gateway/codec/parse.py:104);_to_array (gateway/codec/parse.py:90) 5\n"
           "main (gateway/__main__.py:1);Endpoints.infer (gateway/http/routes.py:67);"
           "encode_response (gateway/codec/encode.py:47);_json_data (gateway/codec/encode.py:80) 4\n"
           "main (gateway/__main__.py:1);Scheduler.pump (gateway/dispatch/scheduler.py:270);"
           "Link.send_batch (gateway/dispatch/link.py:90);Socket.send (zmq/sugar/socket.py:700) 3\n"
           "main (gateway/__main__.py:1);Scheduler.pump (gateway/dispatch/scheduler.py:275) 2\n")
    stacks = parse_collapsed(raw)
    assert sum(stacks.values()) == 24
    categories = categorize(stacks)
    assert categories["event loop + socket I/O + HTTP parsing (uvloop/httptools, C)"] == 10
    assert categories["codec: parse body -> numpy (orjson, np.asarray, checks)"] == 5
    assert categories["codec: encode response"] == 4
    assert categories["ZeroMQ send/recv (pyzmq, gateway/dispatch/link.py)"] == 3
    assert categories["scheduler: submit, pump, replies, requeue (dispatch, fleet, catalog)"] == 2
    assert top_functions(stacks, inclusive=False)[0] == ("Runner.run (asyncio/runners.py)", 10)
    assert dict(top_functions(stacks, inclusive=True))["Scheduler.pump (gateway/dispatch/scheduler.py)"] == 5


def test_soak_judges_growth_after_the_settling_time():
    assert slope_per_min([(0.0, 10.0), (60.0, 11.0), (120.0, 12.0)]) == pytest.approx(1.0)
    assert slope_per_min([(0.0, 1.0)]) is None
    samples = [{"t_s": t, "rss_mib": 100.0 + (5 if t < 10 else 0), "uss_mib": 50.0,
                "by_role": {"gateway": {"rss_mib": 60.0, "uss_mib": 30.0}}} for t in range(0, 60, 5)]
    rows = {(r["process"], r["memory"]): r for r in judge(samples, settle_s=10.0)}
    assert rows[("total", "RSS")]["growth_mib"] == 0.0 and rows[("total", "RSS")]["max_mib"] == 105.0
    assert rows[("gateway", "USS")]["slope_mib_per_min"] == 0.0
    assert ("worker", "RSS") not in rows


def test_recovery_summary_has_medians_per_case_their_ratio_to_a_fresh_import_and_the_issues_checks():
    runs = [{"spare": spare, "load": load, "signal": sig, "i": i, "seconds": base + i / 10}
            for spare, base in ((True, 0.1), (False, 1.0)) for load in ("idle", "16 clients")
            for sig in ("SIGKILL", "SIGSTOP") for i in range(5)]
    runs.append({"spare": True, "load": "16 clients", "signal": "SIGKILL", "i": 5, "failed": "no primed spare"})
    soak = [{"spare": True, "share_503": 0.02, "lost": 0, "wrong": 0}, {"spare": False, "share_503": 0.4,
                                                                          "lost": 0, "wrong": 0}]
    document = {"runs": runs, "import_s": {"idle": [0.5, 0.6, 0.4]}, "soak": soak,
                "settings": {"hang_timeout_s": 0.1}}

    s = summarize_recovery(document)

    rows = {(r["spare"], r["load"], r["signal"]): r for r in s["rows"]}
    loaded_kill = rows[(True, "16 clients", "SIGKILL")]
    assert (loaded_kill["n"], loaded_kill["failed"]) == (5, 1)
    assert loaded_kill["median"] == pytest.approx(0.3) and loaded_kill["vs_import"] == pytest.approx(0.6)
    assert rows[(False, "idle", "SIGSTOP")]["p90"] == pytest.approx(1.36)
    assert s["checks"] == {"sigkill_loaded_vs_import_le_0.5": False, "sigstop_loaded_within_hang_plus_1s": True,
                           "soak_503_le_15pct_none_lost_or_wrong": True}
    assert s["runs_failed"] == 1


# -- every suite once, for real, in --quick mode --------------------------------------------------
SUITES = ("mlp", "compute", "encoder", "recovery", "soak", "profile")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:  # SIGTERM first: the bench then stops its servers
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory):
    """Every suite in --quick mode, all at once (their windows are fixed-length, so they overlap well):
    each starts its servers, drives them, stops them and writes its JSON and Markdown."""
    out = tmp_path_factory.mktemp("bench-results")
    processes = {suite: subprocess.Popen([sys.executable, "-m", "bench", suite, "--quick", "--out-dir", str(out)],
                                         cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for suite in SUITES}
    outputs = {}
    try:
        for suite, process in processes.items():
            outputs[suite], _ = process.communicate(timeout=150)
    finally:
        for process in processes.values():
            _stop(process)
    for suite, process in processes.items():
        assert process.returncode == 0, f"{suite}:\n{outputs.get(suite, '')[-4000:]}"
    return out, {suite: json.loads((out / f"{suite}.json").read_text()) for suite in SUITES}


@pytest.mark.integration
def test_every_suite_writes_its_results_and_stops_its_servers(quick_results):
    out, docs = quick_results
    for suite, doc in docs.items():
        assert doc["suite"] == suite and doc["settings"]["quick"] is True, suite
        assert (out / f"{suite}.md").read_text().startswith("## "), suite
        assert doc["services"], suite
        for name, service in doc["services"].items():
            stop = service.get("stop", {})
            assert stop.get("returncode") in (0, -signal.SIGTERM) and not stop.get("forced"), (suite, name, stop)
            assert not stop.get("killed_children") and not stop.get("removed_leftovers"), (suite, name, stop)
            pid = stop["pid"]
            assert not psutil_pid_alive(pid), (suite, name)
            assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"ringserve-{pid}-")], (suite, name)


def psutil_pid_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.integration
def test_quick_mlp_has_every_case_ratio_ceiling_and_plot(quick_results):
    out, docs = quick_results
    mlp = docs["mlp"]
    cases = ("ringserve", "ringserve_mbs1", "ringserve_binary", "raw_asgi", "raw_asgi_send_once", "starlette")
    closed = {(r["case"], r["clients"]): r for r in mlp["summary"] if r["mode"] == "closed"}
    assert set(closed) == {(c, n) for c in cases for n in (1, 4)}
    for key, row in closed.items():
        assert row["rps"] > 0 and row["errors"] == 0 and row["p99_ms"] >= row["p50_ms"] > 0, key
    assert all(r["mean_batch"] == 1.0 for r in mlp["runs"] if r["case"] == "ringserve_mbs1")
    assert {r["case"] for r in mlp["summary"] if r["mode"] == "open"} == {"ringserve", "ringserve_mbs1"}
    assert mlp["inprocess"]["by_batch"] and all(0 < r["efficiency"] for r in mlp["runs"] if r["case"] == "ringserve")
    assert {r["vs"] for r in mlp["ratios"]} == set(cases) - {"ringserve"}
    assert (out / "mlp-throughput.png").exists() and (out / "mlp-latency-cdf.png").exists()


@pytest.mark.integration
def test_quick_compute_encoder_recovery_soak_profile(quick_results):
    _, docs = quick_results
    compute = docs["compute"]
    assert {r["case"] for r in compute["summary"]} == {"batched", "unbatched", "target"}
    assert compute["ratios"][0]["batched_vs_unbatched"] > 0 and compute["inprocess"]["by_batch"]
    assert all(r["padding_waste"] is not None for r in docs["encoder"]["summary"])
    recovery = docs["recovery"]
    assert recovery["summary"]["runs_failed"] == 0, [r.get("failed") for r in recovery["runs"]]
    assert {(r["spare"], r["load"], r["signal"]) for r in recovery["summary"]["rows"]} == {
        (spare, load, sig) for spare in (True, False) for load in ("idle", "16 clients") for sig in ("SIGKILL", "SIGSTOP")}
    assert all(s["lost"] == 0 and s["wrong"] == 0 and s["answers"] > 0 for s in recovery["soak"]), recovery["soak"]
    assert recovery["import_s"]["idle"] and recovery["import_s"]["loaded"]
    soak = docs["soak"]
    assert soak["load"]["requests"] > 0 and {r["process"] for r in soak["summary"]} >= {"gateway", "worker", "total"}
    profile = docs["profile"]
    if "skipped" not in profile:
        assert set(profile["profiles"]["ringserve"]["roles"]) == {"gateway", "worker"}
        assert profile["profiles"]["ringserve"]["roles"]["gateway"]["samples"] > 0


# -- the scaling suite's derived tables and per-gateway counts ------------------------------------
def _row(case, clients, rps, roles=None, p99=5.0, gen=10.0):
    return {"case": case, "mode": "closed", "clients": clients, "level": clients, "rps": rps, "p99_ms": p99,
            "p50_ms": 1.0, "errors": 0, "cpu_us_by_role": roles or {}, "gen_cpu_pct": gen, "gateways": []}


def test_scaling_ratios_listening_and_projection():
    from bench.scaling import gateway_ratios, listening_rows, projection

    summary = [_row("g1_cpu_json", 64, 4000.0, {"gateway": 250.0, "worker": 80.0, "supervisor": 5.0}),
               _row("g2_cpu_json", 64, 3900.0), _row("g4_cpu_json", 64, 7000.0),
               _row("g2rp_cpu_json", 64, 3800.0), _row("g1_cpu_json", 1, 500.0), _row("triton_json", 64, 1000.0)]
    summary[3]["gateways"] = [{"share": 0.7}, {"share": 0.3}]
    ratios = {(r["gateways"], r["clients"]): r for r in gateway_ratios(summary)}
    assert set(ratios) == {(2, 64), (4, 64)}
    assert ratios[(2, 64)]["rps_ratio"] == pytest.approx(0.975)
    assert ratios[(4, 64)]["scaling_efficiency"] == pytest.approx(7000 / 4000 / 4)
    listening = listening_rows(summary, 2)
    assert [r["mode"] for r in listening] == ["SO_REUSEPORT, a socket per gateway", "one shared socket"]
    assert listening[0]["shares"] == "70% / 30%"
    rows = {r["gateways"]: r for r in projection(summary, [1, 2], cores=16)}
    assert set(rows) == {1, 2, 4, 8}
    assert rows[1]["projected_rps"] == pytest.approx(1e6 / 250) and rows[1]["bound_by"] == "gateways"
    assert rows[2]["projected_rps"] == pytest.approx(2e6 / 250)
    assert rows[8]["bound_by"] == "worker" and rows[8]["projected_rps"] == pytest.approx(1e6 / 80)
    assert rows[4]["vs_g1"] == pytest.approx(1e6 / 80 / 4000)


def test_gateway_counters_scrape_each_gateways_unix_socket_else_split_by_cpu(tmp_path, monkeypatch):
    import http.server
    import socketserver
    import threading
    from types import SimpleNamespace

    import bench.scaling as scaling

    counts = {0: [10.0], 1: [4.0]}

    def handler_for(index):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                assert self.path == "/metrics?scope=gateway"
                body = (f'ringserve_requests_total{{model="mlp",code="200"}} {counts[index][0]}\n'
                        f'ringserve_batch_size_count{{model="mlp"}} {counts[index][0] / 2}\n'
                        f'ringserve_batch_size_sum{{model="mlp"}} {counts[index][0]}\n').encode()
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def address_string(self):
                return "unix"

            def log_message(self, *args):
                pass
        return Handler

    servers = []
    for k in (0, 1):
        server = socketserver.UnixStreamServer(str(tmp_path / f"gateway-{k}.http"), handler_for(k))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    gateways = {101: {"index": 0, "runtime_dir": str(tmp_path)}, 102: {"index": 1, "runtime_dir": str(tmp_path)}}
    monkeypatch.setattr(scaling, "gateway_processes", lambda service: gateways)
    try:
        extra = scaling.GatewayCounters(SimpleNamespace(), "mlp")
        extra.start()
        counts[0][0] += 30.0
        counts[1][0] += 10.0
        extra.end()
        window = SimpleNamespace(cpu0={101: ("gateway", 1.0), 102: ("gateway", 1.0)},
                                 cpu1={101: ("gateway", 1.3), 102: ("gateway", 1.1)})
        out = extra.result(SimpleNamespace(requests=40), window)
        assert out["gateway_requests_source"].startswith("gateway-scope /metrics")
        assert [g["requests"] for g in out["gateways"]] == [30.0, 10.0]
        assert out["gateway_balance"] == pytest.approx(1.5) and out["mean_batch_gateways"] == pytest.approx(2.0)
        assert out["gateways"][0]["cpu_us_per_request"] == pytest.approx(0.3 / 30 * 1e6)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    # No socket answers: each gateway's share of the gateways' CPU stands in for its share of the requests.
    extra = scaling.GatewayCounters(SimpleNamespace(), "mlp")
    extra.start()
    extra.end()
    out = extra.result(SimpleNamespace(requests=40), window)
    assert out["gateway_requests_source"].startswith("each gateway process's share")
    assert [round(g["requests"]) for g in out["gateways"]] == [30, 10] and out["gateway_balance"] == pytest.approx(1.5)


def test_scaling_flags():
    args = parse("scaling", "--gateways", "1,2,4,8", "--providers", "cpu,cuda", "--payloads", "json")
    assert (args.gateways, args.providers, args.payloads, args.reuse_port_at) == ([1, 2, 4, 8], ["cpu", "cuda"],
                                                                                  ["json"], 2)
    with pytest.raises(SystemExit):
        parse("scaling", "--providers", "tpu")


# perf_analyzer 2.60's report of one concurrency, as it printed it against ringserve's gRPC
PA_REPORT = """Request concurrency: 4
  Client: 
    Request count: 6369
    Throughput: 1755.9 infer/sec
    p50 latency: 2127 usec
    p90 latency: 3086 usec
    p95 latency: 3489 usec
    p99 latency: 4794 usec
    Avg gRPC time: 2257 usec ((un)marshal request/response 4 usec + response wait 2253 usec)
  Server: 
    Inference count: 6370
    Execution count: 3987
    Successful request count: 6370
"""


def test_perf_analyzers_report_is_read_into_its_numbers_and_one_it_lacks_is_named():
    report = parse_report(PA_REPORT)
    assert (report["client_requests"], report["throughput"], report["p99_us"], report["mean_us"]) == (
        6369, 1755.9, 4794, 2257)
    assert report["inferences"] / report["executions"] == pytest.approx(1.598, abs=1e-3)
    with pytest.raises(KeyError, match="p90_us"):
        parse_report(PA_REPORT.replace("p90 latency", "p90"))

