"""Stateful sequences against a real stack: Triton's clients unchanged, over HTTP and gRPC (unary and streams).

The accumulator (tests/support/sequence_models.py) answers the running sum of its sequence's inputs, so
every answer below is checked against numpy's cumsum of what the test sent.
"""

from __future__ import annotations

import os
import random
import signal
import threading


import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.sequence_models import (
    build_accumulator,
    build_python_accumulator,
    build_python_strings,
    expected_sums,
)
from tests.support.stack import Stack, free_port, poll_for, running_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("sequences")
    build_accumulator(repo)
    build_accumulator(repo, "idle_acc", max_sequence_idle_us=300_000)
    build_accumulator(repo, "one_slot", candidates=1, max_batch_size=4)
    with running_stack(repo, "--grpc-port", str(free_port())) as stack:
        stack.grpc_port = int(stack.args[stack.args.index("--grpc-port") + 1])
        yield stack


def http_step(client, model: str, key, value: float, **flags) -> float:
    tensor = httpclient.InferInput("INPUT", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], np.float32))
    result = client.infer(model, [tensor], sequence_id=key, **flags)
    return float(result.as_numpy("OUTPUT")[0, 0])


def grpc_step(client, model: str, key, value: float, **flags) -> float:
    tensor = grpcclient.InferInput("INPUT", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], np.float32))
    result = client.infer(model, [tensor], sequence_id=key, **flags)
    return float(result.as_numpy("OUTPUT")[0, 0])


def test_sequences_over_http_and_grpc_each_carry_their_own_state(stack: Stack):
    rng = random.Random(1)
    values = {key: [float(rng.randint(1, 9)) for _ in range(12)] for key in (11, 12, 13, 14)}
    got: dict[int, list[float]] = {key: [] for key in values}
    with httpclient.InferenceServerClient(f"127.0.0.1:{stack.port}") as http, grpcclient.InferenceServerClient(
        f"127.0.0.1:{stack.grpc_port}"
    ) as grpc:
        for k in range(12):  # the steps of four sequences interleaved, alternating the protocol
            for key, sequence in values.items():
                send = http_step if (k + key) % 2 else grpc_step
                last = k == len(sequence) - 1
                got[key].append(send(http if send is http_step else grpc, "accumulator", key, sequence[k],
                                     sequence_start=k == 0, sequence_end=last))
    for key, sequence in values.items():
        assert got[key] == [float(x) for x in np.cumsum(np.array(sequence, np.float32))], key


def test_hundreds_of_sequence_steps_on_one_grpc_connection_are_each_answered(stack: Stack):
    """An answered step may stay in its queue's deadline heap a while; what ties it to the client's call must
    not: grpcio refuses a connection's new streams (RST_STREAM, REFUSED_STREAM) while 256 of its calls are
    still alive, which perf_analyzer's sequence mode hit after 257 steps."""
    with grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}") as client:
        for key in range(300):
            assert grpc_step(client, "accumulator", 90_000 + key, 2.0, sequence_start=True, sequence_end=True) == 2.0


def test_a_grpc_stream_sends_every_step_before_reading_and_gets_them_in_order(stack: Stack):
    rng = random.Random(2)
    streams = {100 + i: [float(rng.randint(1, 9)) for _ in range(20)] for i in range(6)}
    answers: dict[int, list] = {}

    def run(key: int, values: list[float]) -> None:
        got, done = [], threading.Event()

        def callback(result, error) -> None:
            got.append(error if error is not None else float(result.as_numpy("OUTPUT")[0, 0]))
            if len(got) == len(values):
                done.set()

        with grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}") as client:
            client.start_stream(callback=callback)
            for k, value in enumerate(values):
                tensor = grpcclient.InferInput("INPUT", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.array([[value]], np.float32))
                client.async_stream_infer("accumulator", [tensor], sequence_id=key, sequence_start=k == 0,
                                          sequence_end=k == len(values) - 1)
            done.wait(30)
            client.stop_stream()
        answers[key] = got

    threads = [threading.Thread(target=run, args=item) for item in streams.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for key, values in streams.items():
        assert answers[key] == [float(x) for x in np.cumsum(np.array(values, np.float32))], key


def test_a_second_start_restarts_the_state_after_the_steps_before_it(stack: Stack):
    with httpclient.InferenceServerClient(f"127.0.0.1:{stack.port}") as client:
        assert http_step(client, "accumulator", 4566, 1, sequence_start=True) == 1
        assert http_step(client, "accumulator", 4566, 2) == 3
        assert http_step(client, "accumulator", 4566, 42, sequence_start=True) == 42
        assert http_step(client, "accumulator", 4566, 9, sequence_end=True) == 51


def test_the_control_inputs_reach_the_model(stack: Stack):
    with httpclient.InferenceServerClient(f"127.0.0.1:{stack.port}") as client:
        tensor = httpclient.InferInput("INPUT", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[1]], np.float32))
        result = client.infer("accumulator", [tensor], sequence_id=2**63 + 5, sequence_start=True, sequence_end=True)
    assert result.as_numpy("SEEN_CORRID").tolist() == [[2**63 + 5]]


def refused(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_steps_triton_refuses_get_its_status_and_words(stack: Stack):
    with httpclient.InferenceServerClient(f"127.0.0.1:{stack.port}") as client:
        error = refused(lambda: http_step(client, "accumulator", 37469245, 1))
        assert error.status() == "400"
        assert error.message().startswith(
            "inference request for sequence 37469245 to model 'accumulator' must specify the START flag on the "
            "first request of the sequence"
        )
        error = refused(lambda: http_step(client, "accumulator", 0, 1, sequence_start=True))
        assert error.message().startswith(
            "inference request to model 'accumulator' must specify a non-zero or non-empty correlation ID"
        )
        tensor = httpclient.InferInput("INPUT", [2, 1], "FP32")
        tensor.set_data_from_numpy(np.ones((2, 1), np.float32))
        error = refused(lambda: client.infer("accumulator", [tensor], sequence_id=3, sequence_start=True))
        assert error.message().startswith(
            "inference request to model 'accumulator' must specify batch-size 1 due to requirements of sequence "
            "batcher"
        )
        error = refused(lambda: http_step(client, "accumulator", "x" * 129, 1, sequence_start=True))
        assert error.status() == "501"
        output = httpclient.InferRequestedOutput("OUTPUT_STATE")
        one = httpclient.InferInput("INPUT", [1, 1], "FP32")
        one.set_data_from_numpy(np.ones((1, 1), np.float32))
        error = refused(lambda: client.infer("accumulator", [one], sequence_id=3, outputs=[output]))
        assert "unexpected inference output 'OUTPUT_STATE' for model" in error.message()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}") as client:
        error = refused(lambda: grpc_step(client, "accumulator", 555, 1))
        assert "must specify the START flag on the first request of the sequence" in error.message()


def test_an_idle_sequence_is_released_and_its_late_step_refused(stack: Stack):
    with httpclient.InferenceServerClient(f"127.0.0.1:{stack.port}") as client:
        assert http_step(client, "idle_acc", 1001, 5, sequence_start=True) == 5
        poll_for(lambda: stack.status()["models"]["idle_acc"]["sequences"]["idle_releases"] >= 1, 10,
                 what="the idle sequence's release")
        error = refused(lambda: http_step(client, "idle_acc", 1001, 1))
        assert "must specify the START flag on the first request of the sequence" in error.message()
    assert stack.metric("ringserve_sequence_idle_releases_total", model="idle_acc", version="1") >= 1


def test_a_sequence_beyond_the_candidate_slots_waits_for_one_and_then_runs(stack: Stack):
    results: list[float] = []
    with httpclient.InferenceServerClient(f"127.0.0.1:{stack.port}") as first:
        assert http_step(first, "one_slot", 1, 1, sequence_start=True) == 1

        def second() -> None:
            with httpclient.InferenceServerClient(f"127.0.0.1:{stack.port}") as client:
                results.append(http_step(client, "one_slot", 2, 10, sequence_start=True, sequence_end=True))

        waiter = threading.Thread(target=second)
        waiter.start()
        poll_for(lambda: stack.status()["models"]["one_slot"]["sequences"]["backlog"] == 1, 10,
                 what="the second sequence in the backlog")
        assert results == []
        assert http_step(first, "one_slot", 1, 2, sequence_end=True) == 3  # its END frees the slot
        waiter.join(10)
    assert results == [10.0]


def test_the_config_carries_the_block_over_http_and_grpc_and_v2_lists_the_extension(stack: Stack):
    _, config = stack.get("/v2/models/accumulator/config")
    assert config["sequence_batching"]["max_sequence_idle_microseconds"] == 5_000_000
    with grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}") as client:
        block = client.get_model_config("accumulator").config.sequence_batching
        assert block.max_sequence_idle_microseconds == 5_000_000
        assert [c.name for c in block.control_input] == ["START", "READY", "CORRID"]
        assert block.state[0].output_name == "OUTPUT_STATE"
    _, server = stack.get("/v2")
    assert "sequence" in server["extensions"]
    status = stack.status()["models"]["accumulator"]["sequences"]
    assert status["state_bytes"] > 0


def test_statistics_count_one_execution_per_formed_batch(stack: Stack):
    with grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}") as client:
        before = client.get_inference_statistics("one_slot", "1").model_stats[0]
    with httpclient.InferenceServerClient(f"127.0.0.1:{stack.port}") as client:
        for k in range(3):
            http_step(client, "one_slot", 77, 1, sequence_start=k == 0, sequence_end=k == 2)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}") as client:
        after = client.get_inference_statistics("one_slot", "1").model_stats[0]
    assert (after.execution_count - before.execution_count, after.inference_count - before.inference_count) == (3, 3)



def test_a_python_model_gets_tritons_correlation_id_and_flags_and_keeps_its_state_in_the_server(tmp_path):
    build_python_accumulator(tmp_path)
    values = [3.0, 4.0, 5.0]
    with running_stack(tmp_path) as stack, httpclient.InferenceServerClient(f"127.0.0.1:{stack.port}") as client:
        answers, seen = [], []
        for k, value in enumerate(values):
            tensor = httpclient.InferInput("INPUT", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[value]], np.float32))
            result = client.infer("py_accumulator", [tensor], sequence_id=42, sequence_start=k == 0,
                                  sequence_end=k == 2)
            answers.append(float(result.as_numpy("OUTPUT")[0, 0]))
            seen.append(result.as_numpy("SEEN")[0].tolist())
            if k == 1:  # the model's process dies between steps: Triton's python backend would lose the sum
                victim = stack.worker_pid()
                os.kill(victim, signal.SIGKILL)
                poll_for(lambda: stack.status()["workers"][0]["pid"] not in (None, victim)
                         and stack.is_ready(), 60, what="a new worker")
    assert answers == expected_sums(values)
    assert seen == [[42, 1], [42, 0], [42, 2]]  # correlation_id(); flags(): START = 1, END = 2


def test_a_string_state_and_a_string_sequence_id_are_kept_and_passed_on(tmp_path):
    build_python_strings(tmp_path)
    with running_stack(tmp_path) as stack, httpclient.InferenceServerClient(f"127.0.0.1:{stack.port}") as client:
        texts = []
        for k, word in enumerate(["sessions", "survive", "crashes"]):
            tensor = httpclient.InferInput("WORD", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[word.encode()]], dtype=object))
            result = client.infer("py_strings", [tensor], sequence_id="user-7", sequence_start=k == 0,
                                  sequence_end=k == 2)
            texts.append(result.as_numpy("TEXT")[0, 0])
            assert result.as_numpy("SEEN_CORRID")[0, 0] == b"user-7"
        error = refused(lambda: client.infer("py_strings", [tensor], sequence_id=7, sequence_start=True))
        assert "sequence batching control 'CORRID' data-type is 'UINT64', but model 'py_strings' expects" in (
            error.message())
    assert texts == [b"sessions", b"sessions survive", b"sessions survive crashes"]
