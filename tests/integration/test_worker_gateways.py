"""One real worker process serving two gateways, each played by a real ROUTER in the test.

The worker is started as the supervisor starts it (settings file, no segment); each fake
gateway answers Ready with Attach, naming its own ring segment, as gateway k does. Batches
run through real shared memory and ONNX Runtime, and answers are compared with an ORT
session run here. Fault injection is on, so a batch with the `slow` fault holds the worker
for worker/faults.py's SLOW_FAULT_S while the test lines up what it wants queued: the test waits
for the worker's own log line that it has started that batch (`Stack.started`), not for a sleep.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import zmq

from ringserve.common import messages, wire
from ringserve.common.repository.demo import MLP_IN, MLP_OUT, build_demo_models
from ringserve.common.settings import Settings
from ringserve.shm.segment import Segment

from tests.support.lifecycle_models import build_versioned
from tests.support.stack import poll_for
from tests.unit.conftest import make_segment

SLOTS = 16
SLOT_BYTES = 1 << 16
OUTPUT_OFFSET = 1 << 15
WORKER = wire.worker_identity(0, 1)
LOADER = wire.control_identity(0, 1)
DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}


class FakeGateway:
    """Gateway k's dispatch ROUTER, with its own ring."""

    def __init__(self, context: zmq.Context, runtime_dir: Path, index: int, segment: Segment) -> None:
        self.index, self.segment = index, segment
        self.router = context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # as gateway/dispatch/link.py
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.router.bind(wire.gateway_endpoint(str(runtime_dir), "dispatch", index))
        self.states: list[tuple[bytes, messages.ModelState]] = []  # model state changes, in arrival order
        self.replies: list[messages.Message] = []  # everything else after Ready

    def receive(self, timeout_s: float = 30) -> tuple[bytes, messages.Message]:
        assert self.router.poll(int(timeout_s * 1000)), f"gateway {self.index}: the worker sent nothing"
        identity, *frames = self.router.recv_multipart()
        message = messages.decode(frames)
        if isinstance(message, messages.ModelState):
            self.states.append((identity, message))
        return identity, message

    def ready(self, timeout_s: float = 30) -> messages.Ready:
        """The worker's Ready, answered with Attach as gateway k does."""
        deadline = time.monotonic() + timeout_s
        while True:
            identity, message = self.receive(max(0.0, deadline - time.monotonic()))
            if isinstance(message, messages.Ready):
                assert identity == WORKER
                self.send(WORKER, messages.Attach(gateway_index=self.index, segment=self.segment.name))
                return message
            if not isinstance(message, messages.ModelState):
                self.replies.append(message)

    def reply(self, timeout_s: float = 30) -> messages.Result | messages.Error:
        while True:
            identity, message = self.receive(timeout_s)
            if not isinstance(message, messages.ModelState):
                assert identity == WORKER
                self.replies.append(message)
                return message

    def quiet(self, seconds: float) -> list[messages.Message]:
        """Whatever but model states arrives within `seconds`."""
        got, deadline = [], time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.router.poll(int(left * 1000)):
                _, message = self.receive(0)
                if not isinstance(message, messages.ModelState):
                    got.append(message)
        return got

    def send(self, identity: bytes, message: messages.Message) -> None:
        self.router.send_multipart([identity, *message.encode()])

    def batch(self, batch_id: int, slot: int, x: np.ndarray | dict[str, np.ndarray], *,
              faults: list[str] | None = None, model: str = "mlp", attempt: int = 0) -> messages.Batch:
        """`x` (the input x, or inputs by name) written into `slot` of this gateway's ring, and the
        Batch that names it."""
        generation = batch_id + 1000
        self.segment.set_generation(slot, generation)
        self.segment.set_output_generation(slot, 0)
        refs, offset = [], 0
        for name, array in ({"x": x} if isinstance(x, np.ndarray) else x).items():
            self.segment.tensor(slot, offset, array.dtype, array.shape)[:] = array
            refs.append(wire.TensorRef(name, DATATYPES[array.dtype], array.shape, offset).to_wire())
            offset += 1 << 12
        return messages.Batch(batch_id=batch_id, model=model, version=1, attempt=attempt, slot_index=slot,
                              generation=generation, inputs=refs, output_offset=OUTPUT_OFFSET, faults=faults)

    def output(self, result: messages.Result, slot: int) -> np.ndarray:
        (ref,) = [wire.TensorRef.from_wire(item) for item in result.outputs]
        assert self.segment.output_generation(slot) == self.segment.generation(slot)
        return self.segment.tensor(slot, ref.offset, np.float32, ref.shape).copy()

    def close(self) -> None:
        self.router.close(linger=0)


class Stack:
    def __init__(self, tmp_path: Path) -> None:
        self.runtime_dir = tmp_path
        self.repo = tmp_path / "models"
        build_demo_models(self.repo)
        build_versioned(self.repo, "lazy", weight_bytes=4096, model_load_policy="lazy")
        self.context = zmq.Context()
        self.gateways: list[FakeGateway] = []
        self.process: subprocess.Popen | None = None
        self.mlp = ort.InferenceSession(str(self.repo / "mlp" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])

    def start_worker(self, gateways: int, env: dict[str, str] | None = None, **settings: object) -> None:
        path = self.runtime_dir / "settings.json"
        Settings(model_repository=str(self.repo), runtime_dir=str(self.runtime_dir), cpu_only=True,
                 gateways=gateways, intra_op_threads=1, **settings).write(path)  # type: ignore[arg-type]
        self.log = self.runtime_dir / "worker.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-P", "-m", "ringserve.worker", "--settings", str(path),
                 "--index", "0", "--generation", "1", "--parent-pid", str(os.getpid())],
                env={**os.environ, "RINGSERVE_FAULT_INJECTION": "1", **(env or {})}, stderr=log)

    def started(self, batch_id: int) -> None:
        """Waits until the worker says it has started batch `batch_id` (worker/faults.py logs each injected
        fault as its batch begins to run), so that what the test sends next queues behind it."""
        line = f"batch {batch_id} of model ".encode()
        poll_for(lambda: line in self.log.read_bytes(), timeout=30, what=f"the worker to start batch {batch_id}")

    def expected(self, x: np.ndarray) -> np.ndarray:
        return self.mlp.run(None, {"x": x})[0]

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
        for gateway in self.gateways:
            gateway.close()
        self.context.destroy(linger=0)


@contextlib.contextmanager
def two_gateways(stack: Stack) -> Iterator[Stack]:
    """`stack`'s worker started against two FakeGateways with a ring each, and a spare ring (for a
    restarted gateway 1) in `stack.spare`; everything closed after."""
    with make_segment(SLOTS, SLOT_BYTES) as ring0, make_segment(SLOTS, SLOT_BYTES) as ring1, \
            make_segment(SLOTS, SLOT_BYTES) as spare:
        stack.spare = spare
        try:
            stack.gateways = [FakeGateway(stack.context, stack.runtime_dir, k, ring)
                              for k, ring in enumerate((ring0, ring1))]
            stack.start_worker(gateways=2)
            yield stack
        finally:
            stack.close()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """Two gateways with a ring each (and a spare ring for a restarted gateway 1), one worker."""
    with two_gateways(Stack(tmp_path)) as stack:
        yield stack


def rows(seed: int, count: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, MLP_IN)).astype(np.float32)


def test_the_worker_says_ready_to_both_gateways_and_answers_each_in_its_own_ring(stack):
    g0, g1 = stack.gateways
    ready0, ready1 = g0.ready(), g1.ready()
    assert ready0.models["mlp"] == ready1.models["mlp"] == "CPUExecutionProvider"
    assert ready0.models["lazy"] is None

    # The same slot index and batch id in both rings: only the ring tells them apart.
    x0, x1 = rows(0), rows(1, count=5)
    g0.send(WORKER, g0.batch(7, 2, x0))
    g1.send(WORKER, g1.batch(7, 2, x1))
    r0, r1 = g0.reply(), g1.reply()

    assert isinstance(r0, messages.Result) and isinstance(r1, messages.Result)
    assert (r0.batch_id, r1.batch_id) == (7, 7)
    np.testing.assert_allclose(g0.output(r0, 2), stack.expected(x0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g1.output(r1, 2), stack.expected(x1), rtol=1e-5, atol=1e-6)
    assert g0.output(r0, 2).shape == (3, MLP_OUT) and g1.output(r1, 2).shape == (5, MLP_OUT)


def test_a_batch_before_attach_is_refused_and_one_in_a_stale_slot_is_an_error(stack):
    g0, g1 = stack.gateways
    g0.ready()
    _, ready = g1.receive()  # Ready, not answered with Attach yet
    assert isinstance(ready, messages.Ready)
    g1.send(WORKER, g1.batch(1, 0, rows(2)))
    error = g1.reply()
    assert isinstance(error, messages.Error) and "before attaching its ring" in error.error

    g1.send(WORKER, messages.Attach(gateway_index=1, segment=g1.segment.name))
    stale = g1.batch(2, 0, rows(2))
    g1.send(WORKER, messages.Batch(**{**stale.__dict__, "generation": stale.generation - 1}))
    assert isinstance(g1.reply(), messages.Error)
    g1.send(WORKER, g1.batch(3, 0, rows(2)))
    assert isinstance(g1.reply(), messages.Result)


def test_a_flooding_gateway_does_not_starve_the_other(stack):
    g0, g1 = stack.gateways
    g0.ready(), g1.ready()
    # The slow batch holds the worker while gateway 0's flood and then gateway 1's two batches
    # (slow too) queue up behind it. Taken in turn, gateway 0's next batch waits for gateway 1's
    # first; served in arrival order (or gateway 0 first), all ten would answer at once. Each is
    # a requeued batch (attempt 1), and those always run alone: no fusion here.
    g0.send(WORKER, g0.batch(100, 0, rows(0), faults=["slow"], attempt=1))
    stack.started(100)
    for i in range(1, 11):
        g0.send(WORKER, g0.batch(100 + i, i, rows(i), attempt=1))
    time.sleep(0.1)
    g1.send(WORKER, g1.batch(200, 0, rows(20), faults=["slow"], attempt=1))
    g1.send(WORKER, g1.batch(201, 1, rows(21), faults=["slow"], attempt=1))

    answered = {}
    for _ in range(11):
        batch_id = g0.reply().batch_id  # (before the clock: `d[f()] = g()` calls g first)
        answered[batch_id] = time.monotonic()
    assert list(answered) == list(range(100, 111))  # gateway 0's own batches in its order
    assert answered[101] - answered[100] > 1.0  # 200 ran between them
    assert answered[102] - answered[101] > 1.0  # and 201 between these
    assert answered[110] - answered[102] < 1.0  # gateway 1 had nothing left: the rest at once
    assert [g1.reply(0).batch_id, g1.reply(0).batch_id] == [200, 201]


def test_a_gateway_that_restarts_gets_ready_again_and_its_old_batches_are_dropped(stack):
    g0, g1 = stack.gateways
    g0.ready(), g1.ready()
    # Gateway 1's batches queue in the worker behind gateway 0's slow one; then its own slow
    # batch runs, with three more in its queue, when gateway 1 dies. (Attempt 1: each runs alone.)
    g0.send(WORKER, g0.batch(299, 0, rows(29), faults=["slow"]))
    stack.started(299)
    running = g1.batch(300, 0, rows(30), faults=["slow"], attempt=1)
    g1.send(WORKER, running)
    for i in range(1, 4):
        g1.send(WORKER, g1.batch(300 + i, i, rows(30 + i), attempt=1))
    assert g0.reply().batch_id == 299  # the worker has read gateway 1's four and started 300
    stack.started(300)
    old_ring = g1.segment
    g1.close()  # gateway 1 dies...
    g0.send(WORKER, g0.batch(400, 0, rows(40)))  # ...and gateway 0 keeps being served

    successor = FakeGateway(stack.context, stack.runtime_dir, 1, stack.spare)  # ...and comes back, new ring
    stack.gateways[1] = successor
    ready = successor.ready()
    assert ready.models["mlp"] == "CPUExecutionProvider"
    x = rows(50)
    successor.send(WORKER, successor.batch(500, 0, x))
    result = successor.reply()
    assert isinstance(result, messages.Result) and result.batch_id == 500
    np.testing.assert_allclose(successor.output(result, 0), stack.expected(x), rtol=1e-5, atol=1e-6)

    # No answer to any batch of the old gateway, the running one's included, before or after Ready.
    assert [m.batch_id for m in successor.replies + successor.quiet(0.5)] == [500]
    assert old_ring.output_generation(0) == running.generation  # it ran (it was running at the disconnect)
    assert [old_ring.output_generation(i) for i in range(1, 4)] == [0, 0, 0]  # the queued ones never ran
    r0 = g0.reply()
    assert isinstance(r0, messages.Result) and r0.batch_id == 400


def test_batches_of_both_gateways_waiting_together_run_as_one_execution(stack):
    g0, g1 = stack.gateways
    g0.ready(), g1.ready()
    g0.send(WORKER, g0.batch(800, 0, rows(80), faults=["slow"]))  # holds the worker while the rest queue
    stack.started(800)
    xs = {801: rows(81, 3), 901: rows(91, 5), 902: rows(92, 2)}
    g0.send(WORKER, g0.batch(801, 1, xs[801]))
    g1.send(WORKER, g1.batch(901, 1, xs[901]))
    g1.send(WORKER, g1.batch(902, 2, xs[902]))

    assert g0.reply().batch_id == 800
    results = {r.batch_id: r for r in (g0.reply(), g1.reply(), g1.reply())}

    # Gateway 1's turn: 901 leads, then the other gateway's head (801), then its own next (902).
    assert {k: (r.fused, r.execution_rows) for k, r in results.items()} == {901: (3, 10), 801: (3, 0), 902: (3, 0)}
    assert len({r.compute_s for r in results.values()}) == 1
    for batch_id, gateway, slot in ((801, g0, 1), (901, g1, 1), (902, g1, 2)):
        np.testing.assert_allclose(gateway.output(results[batch_id], slot), stack.expected(xs[batch_id]),
                                   rtol=1e-5, atol=1e-6)


def test_when_the_fused_run_fails_each_batch_runs_alone_and_only_the_bad_one_errs(stack):
    g0, g1 = stack.gateways
    g0.ready(), g1.ready()
    ids = np.arange(1, 33, dtype=np.int64).reshape(2, 16)
    good = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    bad = {"input_ids": ids + 990, "attention_mask": np.ones_like(ids)}  # ids past the vocabulary: Gather fails
    g0.send(WORKER, g0.batch(1000, 0, rows(100), faults=["slow"]))
    stack.started(1000)
    g0.send(WORKER, g0.batch(1001, 1, good, model="encoder"))
    g1.send(WORKER, g1.batch(1101, 1, bad, model="encoder"))

    assert g0.reply().batch_id == 1000
    answer, error = g0.reply(), g1.reply()
    assert isinstance(answer, messages.Result) and (answer.batch_id, answer.fused) == (1001, 1)
    assert isinstance(error, messages.Error) and error.batch_id == 1101 and error.kind is None


def test_model_states_reach_both_gateways_and_two_loads_of_one_lazy_model_load_it_once(stack):
    g0, g1 = stack.gateways
    g0.ready(), g1.ready()
    g0.send(LOADER, messages.Load(model="lazy", version=1))
    g1.send(LOADER, messages.Load(model="lazy", version=1))

    def changes(gateway: FakeGateway) -> list[tuple[str, bool]]:
        deadline = time.monotonic() + 30
        while len(gateway.states) < 3 and time.monotonic() < deadline:
            gateway.receive(max(0.0, deadline - time.monotonic()))
        gateway.quiet(0.3)
        return [(m.report.state, m.loaded) for _, m in gateway.states]

    # One load (one `loading`, one finished load), then the second Load only reports its state.
    assert changes(g0) == changes(g1) == [("loading", False), ("ready", True), ("ready", False)]
    assert {identity for identity, _ in g0.states + g1.states} == {LOADER}

    # The batch loop's changes go to both as well: a first batch holding `lazy` is a new peak.
    x = np.ones((2, 4), np.float32)
    g1.send(WORKER, g1.batch(600, 0, x, model="lazy"))
    assert isinstance(g1.reply(), messages.Result)
    g0.quiet(0.3)
    for gateway in (g0, g1):
        assert [(i, m.cause) for i, m in gateway.states[3:]] == [(WORKER, "peak")]


def test_sigterm_finishes_the_running_batch_then_the_worker_exits(stack):
    g0, g1 = stack.gateways
    g0.ready(), g1.ready()
    g0.send(WORKER, g0.batch(700, 0, rows(70), faults=["slow"]))
    stack.started(700)
    stack.process.terminate()
    result = g0.reply()
    assert isinstance(result, messages.Result) and result.batch_id == 700
    assert stack.process.wait(15) == 0
