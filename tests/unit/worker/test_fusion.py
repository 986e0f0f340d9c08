"""Worker-side fusion (worker/fusion.py) with real rings, a real registry and ONNX Runtime.

Two segments stand for two gateways' rings. Answers of a fused execution are compared with
ONNX Runtime run on each batch alone, here in the test.
"""
from __future__ import annotations

import dataclasses
import json
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ringserve.common import messages, wire
from ringserve.common.repository.demo import MLP_IN, build_demo_models, make_model
from ringserve.common.repository.batching import BatchInput
from ringserve.common.repository.scan import scan_repository
from ringserve.shm.layout import align_up
from ringserve.shm.segment import Segment
from ringserve.worker import faults, fusion
from ringserve.worker.loop import WorkerLoop
from ringserve.worker.models import ModelRegistry
from ringserve.worker.onnx_model import OnnxModel
from ringserve.worker.session import CPU

from tests.support.models import session_settings
from tests.support.lifecycle_models import build_versioned
from ..conftest import make_segment

OUTPUT_OFFSET = 1 << 16
DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}


def build_pooled(repo: Path) -> None:
    """`pooled`: y [1, 4] = the sum of x [batch, 4] over the batch: outputs that do not follow the rows."""
    nodes = [helper.make_node("ReduceSum", ["x", "axis"], ["y"], keepdims=1)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["one", 4])  # declared per row, as a config wants
    model = make_model("pooled", nodes, [x], [y], {"axis": np.array([0], np.int64)})
    (repo / "pooled" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "pooled" / "1" / "model.onnx"))
    (repo / "pooled" / "config.json").write_text(json.dumps({
        "max_batch_size": 8, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}], "dynamic_batching": {}}))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("fusion")
    build_demo_models(repo)
    build_versioned(repo, "m", (1, 2), weight_bytes=4096, version_policy={"all": {}})
    build_pooled(repo)
    return repo


@pytest.fixture(scope="module")
def registry(repo: Path) -> ModelRegistry:
    settings = session_settings()
    return ModelRegistry(scan_repository(repo).all_versions(),
                         open_session=lambda config: OnnxModel(config, settings, [CPU]))


@pytest.fixture
def rings() -> Iterator[tuple[Segment, Segment]]:
    with make_segment(8, 1 << 17) as ring0, make_segment(8, 1 << 17) as ring1:
        yield ring0, ring1


def alone(repo: Path, model: str, inputs: dict[str, np.ndarray], version: int = 1) -> list[np.ndarray]:
    session = ort.InferenceSession(str(repo / model / str(version) / "model.onnx"), providers=[CPU])
    return session.run(None, inputs)


_ids = iter(range(1, 1 << 30))


def put(ring: Segment, slot: int, model: str, inputs: dict[str, np.ndarray], *, version: int = 1,
        attempt: int = 0, batch_faults: list[str] | None = None) -> messages.Batch:
    """`inputs` written into `slot` as a gateway writes a batch, and the Batch naming them."""
    batch_id = next(_ids)
    ring.set_generation(slot, batch_id)
    ring.set_output_generation(slot, 0)
    refs, offset = [], 0
    for name, array in inputs.items():
        ring.tensor(slot, offset, array.dtype, array.shape)[:] = array
        refs.append(wire.TensorRef(name, DATATYPES[array.dtype], array.shape, offset).to_wire())
        offset = align_up(offset + array.nbytes)
    return messages.Batch(batch_id=batch_id, model=model, version=version, attempt=attempt, slot_index=slot,
                          generation=batch_id, inputs=refs, output_offset=OUTPUT_OFFSET, faults=batch_faults)


def outputs(ring: Segment, batch: messages.Batch, reply: messages.Result) -> list[np.ndarray]:
    assert ring.output_generation(batch.slot_index) == batch.generation
    found = []
    for item in reply.outputs:
        ref = wire.TensorRef.from_wire(item)
        found.append(ring.tensor(batch.slot_index, ref.offset, np.float32, ref.shape).copy())
    return found


def mlp_rows(seed: int, count: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((count, MLP_IN)).astype(np.float32)}


def encoder_rows(seed: int, count: int, seq: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(1, 1000, (count, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones((count, seq), np.int64)}


# -- one execution for several batches --------------------------------------------------------------
def test_fused_mlp_batches_from_two_rings_answer_as_each_alone(repo, registry, rings):
    ring0, ring1 = rings
    inputs = [mlp_rows(1, 3), mlp_rows(2, 5), mlp_rows(3, 1)]
    primary = put(ring0, 0, "mlp", inputs[0])
    other = deque([put(ring1, 0, "mlp", inputs[1])])
    own = deque([put(ring0, 1, "mlp", inputs[2])])
    tail = own[0]

    taken = fusion.companions(primary, [("gateway 1", other), ("gateway 0", own)], registry)

    assert [source for source, _ in taken] == ["gateway 1", "gateway 0"] and not other and not own
    group = [(ring0, primary), (ring1, taken[0][1]), (ring0, tail)]
    replies = fusion.execute(registry, group)
    assert [type(r) for r in replies] == [messages.Result] * 3
    assert [(r.batch_id, r.fused, r.execution_rows) for r in replies] == [
        (primary.batch_id, 3, 9), (taken[0][1].batch_id, 3, 0), (tail.batch_id, 3, 0)]
    assert len({r.compute_s for r in replies}) == 1
    for (ring, batch), reply, sent in zip(group, replies, inputs):
        (got,) = outputs(ring, batch, reply)
        (expected,) = alone(repo, "mlp", sent)
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_padded_encoder_batches_of_one_length_fuse_and_answer_as_alone(repo, registry, rings):
    ring0, ring1 = rings
    inputs = [encoder_rows(4, 2, 16), encoder_rows(5, 3, 16)]
    first, second = put(ring0, 0, "encoder", inputs[0]), put(ring1, 0, "encoder", inputs[1])

    assert fusion.companions(first, [(1, deque([second]))], registry) == [(1, second)]
    replies = fusion.execute(registry, [(ring0, first), (ring1, second)])
    for ring, batch, reply, sent in zip(rings, (first, second), replies, inputs):
        (got,) = outputs(ring, batch, reply)
        np.testing.assert_allclose(got, alone(repo, "encoder", sent)[0], rtol=1e-5, atol=1e-6)


def test_the_faults_of_every_fused_batch_trigger_in_the_execution(registry, rings, monkeypatch):
    ring0, ring1 = rings
    triggered = []
    monkeypatch.setattr(faults, "trigger", triggered.append)
    group = [(ring0, put(ring0, 0, "mlp", mlp_rows(6, 2), batch_faults=["slow"])),
             (ring1, put(ring1, 0, "mlp", mlp_rows(7, 2), batch_faults=["segv"]))]

    replies = fusion.execute(registry, group)

    assert triggered == ["slow", "segv"] and [r.fused for r in replies] == [2, 2]


# -- what does not fuse ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["other version", "other shape", "requeued head", "over max_batch_size",
                                  "other model first"])
def test_batches_that_may_not_share_an_execution_are_left_in_their_queue(registry, rings, case):
    ring0, ring1 = rings
    primary = put(ring0, 0, "mlp", mlp_rows(8, 40))
    if case == "other version":
        primary = put(ring0, 0, "m", {"x": np.ones((2, 4), np.float32)}, version=1)
        heads = [put(ring1, 0, "m", {"x": np.ones((2, 4), np.float32)}, version=2)]
    elif case == "other shape":
        primary = put(ring0, 0, "encoder", encoder_rows(9, 2, 16))
        heads = [put(ring1, 0, "encoder", encoder_rows(9, 2, 32))]
    elif case == "requeued head":
        heads = [put(ring1, 0, "mlp", mlp_rows(9, 1), attempt=1)]
    elif case == "over max_batch_size":  # 40 + 30 > 64
        heads = [put(ring1, 0, "mlp", mlp_rows(9, 30))]
    else:  # a gateway's batches run in its order: a fusable batch behind another model's stays there
        heads = [put(ring1, 0, "encoder", encoder_rows(9, 2, 16)), put(ring1, 1, "mlp", mlp_rows(9, 1))]
    queue = deque(heads)

    assert fusion.companions(primary, [(1, queue)], registry) == []
    assert list(queue) == heads


def test_a_requeued_batch_runs_alone_and_the_limit_is_max_batch_size(registry, rings):
    ring0, ring1 = rings
    fits = deque([put(ring1, 0, "mlp", mlp_rows(10, 24)), put(ring1, 1, "mlp", mlp_rows(11, 1))])
    requeued = put(ring0, 0, "mlp", mlp_rows(12, 40), attempt=1)
    assert fusion.companions(requeued, [(1, fits)], registry) == [] and len(fits) == 2

    primary = put(ring0, 0, "mlp", mlp_rows(12, 40))
    taken = fusion.companions(primary, [(1, fits)], registry)
    assert [fusion.rows(b) for _, b in taken] == [24] and len(fits) == 1  # 40 + 24 = 64; one more would not fit


def test_models_with_ragged_inputs_batch_inputs_or_no_batching_never_fuse(registry):
    config = registry.entry("mlp").config
    assert fusion.fusable(config)
    ragged = dataclasses.replace(config, inputs=(dataclasses.replace(config.inputs[0], allow_ragged_batch=True),))
    generated = dataclasses.replace(config, batch_inputs=(
        BatchInput(kind="BATCH_ACCUMULATED_ELEMENT_COUNT", target_name="counts", datatype="INT32", source_input="x"),))
    unbatched = dataclasses.replace(config, max_batch_size=0, dynamic_batching=None)
    assert not any(fusion.fusable(c) for c in (ragged, generated, unbatched))


# -- falling back to each batch alone ------------------------------------------------------------
def test_outputs_that_do_not_follow_the_rows_make_each_batch_run_alone(repo, registry, rings):
    ring0, ring1 = rings
    inputs = [{"x": np.full((2, 4), 1.0, np.float32)}, {"x": np.full((3, 4), 2.0, np.float32)}]
    first, second = put(ring0, 0, "pooled", inputs[0]), put(ring1, 0, "pooled", inputs[1])
    assert fusion.companions(first, [(1, deque([second]))], registry) == [(1, second)]

    assert fusion.execute(registry, [(ring0, first), (ring1, second)]) is None
    assert ring0.output_generation(0) == ring1.output_generation(0) == 0  # nothing vouched for

    worker = WorkerLoop(context=None, dispatch_endpoints=[], index=0, generation=1, registry=registry, outbox=None)
    for ring, batch, sent in zip(rings, (first, second), inputs):  # what the loop does next
        reply = worker.handle_batch(batch, ring)
        assert (reply.fused, reply.execution_rows) == (1, 0)
        (got,) = outputs(ring, batch, reply)
        np.testing.assert_allclose(got, alone(repo, "pooled", sent)[0])


def test_a_fused_run_that_raises_or_a_stale_slot_makes_each_batch_run_alone(registry, rings):
    ring0, ring1 = rings
    good = put(ring0, 0, "encoder", encoder_rows(13, 2, 16))
    poison = encoder_rows(14, 2, 16)
    poison["input_ids"][1, 3] = 5000  # past the vocabulary: Gather fails
    bad = put(ring1, 0, "encoder", poison)
    assert fusion.execute(registry, [(ring0, good), (ring1, bad)]) is None

    worker = WorkerLoop(context=None, dispatch_endpoints=[], index=0, generation=1, registry=registry, outbox=None)
    assert isinstance(worker.handle_batch(good, ring0), messages.Result)
    assert isinstance(worker.handle_batch(bad, ring1), messages.Error)  # the error stays with its batch

    fresh, stale = put(ring0, 1, "mlp", mlp_rows(15, 2)), put(ring1, 1, "mlp", mlp_rows(16, 2))
    ring1.set_generation(1, stale.generation + 1)  # the gateway reused the slot
    assert fusion.execute(registry, [(ring0, fresh), (ring1, stale)]) is None
    assert ring0.output_generation(1) == 0
