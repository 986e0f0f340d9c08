"""Python models written as Triton's python_backend docs write them, served by one worker that holds
them all (`--lanes shared`): sibling modules, request.timeout(), InferenceRequest's positional
arguments, custom metrics (MetricFamily) in /metrics, and Logger's LogLevel."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tests.support.python_models import fp32, write_python_model
from tests.support.stack import poll_for, running_stack
from .test_logs import logged_to
from .test_model_kinds import tensor

pytestmark = pytest.mark.integration

# Two models that each ship a utils.py (a different FACTOR) and a helpers package that imports it.
TWIN = """
import numpy as np
import triton_python_backend_utils as pb_utils

import utils
from .utils import FACTOR
from .helpers.offset import OFFSET


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = x * utils.FACTOR + OFFSET
            assert FACTOR == utils.FACTOR
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y.astype(np.float32))]))
        return responses
"""

# Each fidelity item as the python_backend README writes it.
FIDELITY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        self.gauge_family = pb_utils.MetricFamily(
            name="fidelity_last_sum", description="Sum of the last request's x", kind=pb_utils.MetricFamily.GAUGE
        )
        self.histogram_family = pb_utils.MetricFamily(
            name="fidelity_x", description="x[0] of each request", kind=pb_utils.MetricFamily.HISTOGRAM
        )
        self.gauge = self.gauge_family.Metric(labels={"model": "fidelity", "version": "1"})
        self.histogram = self.histogram_family.Metric(labels={"model": "fidelity"}, buckets=[0.0, 1.0, 10.0])

    def execute(self, requests):
        logger = pb_utils.Logger
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            # request_id, correlation_id, inputs, requested_output_names, model_name: Triton's order
            bls = pb_utils.InferenceRequest("bls-1", 0, [pb_utils.Tensor("x", x)], ["y"], "twin_a")
            answer = bls.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            twin = pb_utils.get_output_tensor_by_name(answer, "y").as_numpy()
            self.gauge.set(float(x.sum()))
            self.histogram.observe(float(x[0]))
            logger.log("fidelity saw timeout {}".format(request.timeout()), logger.LogLevel.WARNING)
            logger.log("fidelity verbose line", logger.VERBOSE)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("timeout", np.array([request.timeout()], np.int64)),
                pb_utils.Tensor("twin", twin.astype(np.float32)),
            ]))
        return responses
"""


def build_twin(repo: Path, name: str, factor: float, offset: float) -> None:
    folder = write_python_model(repo, name, TWIN, {"max_batch_size": 0, "input": [fp32("x", [2])],
                                                   "output": [fp32("y", [2])]})
    (folder / "1" / "utils.py").write_text(f"FACTOR = {factor}\n")
    (folder / "1" / "helpers").mkdir()
    (folder / "1" / "helpers" / "__init__.py").write_text("")
    (folder / "1" / "helpers" / "offset.py").write_text(f"import utils\n\nOFFSET = {offset} * utils.FACTOR\n")


@pytest.fixture(scope="module")
def fidelity_stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("fidelity")
    log = tmp_path_factory.mktemp("logs") / "stack.log"
    build_twin(repo, "twin_a", 2.0, 1.0)
    build_twin(repo, "twin_b", 3.0, 10.0)
    write_python_model(repo, "fidelity", FIDELITY, {
        "max_batch_size": 0, "input": [fp32("x", [2])],
        "output": [{"name": "timeout", "data_type": "TYPE_INT64", "dims": [1]}, fp32("twin", [2])]})
    # --hold-when-unavailable-s: at the start gateway 0 accepts before it has heard the worker's READY (it answers
    # the health probe), so with 2 gateways the first requests after "ready" may reach it a moment early
    # (a 503 "workers are starting" under a loaded CI machine); held, they wait for the READY instead.
    with running_stack(repo, "--workers", "1", "--lanes", "shared", "--gateways", "2", "--hold-when-unavailable-s", "10",
                       stack_class=logged_to(log)) as stack:
        yield stack, log


def infer(stack, model: str, x: list[float], **parameters: int) -> dict[str, list]:
    body = {"inputs": [tensor("x", np.array(x, np.float32), "FP32")]}
    if parameters:
        body["parameters"] = parameters
    status, answer = stack.post(f"/v2/models/{model}/infer", body)
    assert status == 200, answer
    return {o["name"]: o["data"] for o in answer["outputs"]}


def test_two_models_in_one_worker_each_import_their_own_utils_py_and_their_package(fidelity_stack) -> None:
    stack, _ = fidelity_stack
    assert len(poll_for(lambda: stack.status()["workers"], 30, what="the worker in /admin/status")) == 1

    assert infer(stack, "twin_a", [1.0, 2.0])["y"] == [2 * 1 + 1 * 2, 2 * 2 + 1 * 2]
    assert infer(stack, "twin_b", [1.0, 2.0])["y"] == [3 * 1 + 10 * 3, 3 * 2 + 10 * 3]
    assert infer(stack, "twin_a", [0.0, 0.0])["y"] == [2.0, 2.0]


def test_request_timeout_is_a_method_giving_the_clients_timeout_in_microseconds(fidelity_stack) -> None:
    stack, _ = fidelity_stack

    assert infer(stack, "fidelity", [1.0, 2.0], timeout=5_000_000)["timeout"] == [5_000_000]
    assert infer(stack, "fidelity", [1.0, 2.0])["timeout"] == [0]


def test_a_bls_request_built_with_tritons_positional_arguments_reaches_its_model(fidelity_stack) -> None:
    stack, _ = fidelity_stack

    assert infer(stack, "fidelity", [1.0, 2.0])["twin"] == [4.0, 6.0]


def histogram_counts(stack) -> tuple[int, dict[str, int]]:
    text = stack.get("/metrics")[1]
    counts = re.findall(r'^fidelity_x_count\{model="fidelity"\} (\d+)$', text, re.MULTILINE)
    buckets = dict(re.findall(r'^fidelity_x_bucket\{model="fidelity",le="([^"]+)"\} (\d+)$', text, re.MULTILINE))
    assert len(counts) == 1, text  # one series, whichever of the two gateways answered
    # (prometheus-cpp writes a bucket's `le` after the series' own labels)
    return int(counts[0]), {le: int(n) for le, n in buckets.items()}


def test_custom_gauge_and_histogram_show_in_metrics_once_as_triton_writes_them(fidelity_stack) -> None:
    stack, _ = fidelity_stack
    count_before, buckets_before = histogram_counts(stack)

    infer(stack, "fidelity", [0.5, 2.0])
    infer(stack, "fidelity", [20.0, 1.0])

    text = stack.get("/metrics")[1]
    assert "# HELP fidelity_last_sum Sum of the last request's x\n# TYPE fidelity_last_sum gauge\n" in text
    assert 'fidelity_last_sum{model="fidelity",version="1"} 21\n' in text
    assert "# TYPE fidelity_x histogram\n" in text
    count, buckets = histogram_counts(stack)
    assert count - count_before == 2 and buckets["+Inf"] == count
    assert buckets["1"] - buckets_before.get("1", 0) == 1 and buckets["10"] - buckets_before.get("10", 0) == 1


def test_logger_levels_reach_the_workers_log_and_verbose_waits_for_debug(fidelity_stack) -> None:
    stack, log = fidelity_stack
    infer(stack, "fidelity", [1.0, 1.0], timeout=7)

    line = poll_for(lambda: next((l for l in log.read_text().splitlines() if "fidelity saw timeout 7" in l), None),
                    timeout=10, what="the model's warning line")

    assert "WARNING" in line and "model fidelity" in line
    assert "fidelity verbose line" not in log.read_text()
