"""A Python model's inputs (worker/requests.py: read_batch_inputs with private=True): writable, and what
is written never reaches the slot, whether they are copied (small) or mapped copy-on-write (large)."""
from __future__ import annotations

import numpy as np
import pytest

from ringserve.common import messages, wire
from ringserve.worker import requests
from ringserve.worker.requests import read_batch_inputs


def batch_of(*refs: wire.TensorRef) -> messages.Batch:
    return messages.Batch(batch_id=1, model="m", version=1, attempt=1, slot_index=1, generation=0,
                          inputs=[r.to_wire() for r in refs], output_offset=0)


@pytest.mark.parametrize("threshold, owns", [(1 << 30, True), (0, False)], ids=["copied", "mapped"])
def test_private_inputs_are_writable_and_leave_the_slot_as_the_client_sent_it(segment, monkeypatch, threshold, owns):
    monkeypatch.setattr(requests, "PRIVATE_MAPPING_MIN_BYTES", threshold)
    sent = {"x": np.arange(8, dtype=np.float32).reshape(2, 4), "n": np.array([[7], [9]], np.int64)}
    segment.tensor(1, 64, np.float32, (2, 4))[:] = sent["x"]
    segment.tensor(1, 192, np.int64, (2, 1))[:] = sent["n"]
    batch = batch_of(wire.TensorRef("x", "FP32", (2, 4), 64), wire.TensorRef("n", "INT64", (2, 1), 192))

    inputs = read_batch_inputs(segment, batch, private=True)
    assert all(a.flags.writeable and a.flags.owndata == owns for a in inputs.values())
    inputs["x"] /= 255
    inputs["n"] *= 2

    again = read_batch_inputs(segment, batch, private=True)  # what a replay reads
    np.testing.assert_array_equal(again["x"], sent["x"])
    np.testing.assert_array_equal(again["n"], sent["n"])
    np.testing.assert_array_equal(inputs["x"], sent["x"] / np.float32(255))


def test_onnx_inputs_stay_read_only_views_of_the_slot(segment):
    segment.tensor(1, 0, np.float32, (4,))[:] = 1.0
    x = read_batch_inputs(segment, batch_of(wire.TensorRef("x", "FP32", (4,), 0)))["x"]
    assert not x.flags.writeable and not x.flags.owndata
