"""common/wire.py: tensor refs, worker identities, endpoints (the messages: test_messages.py)."""
from __future__ import annotations

import orjson
import pytest

from ringserve.common import wire
from ringserve.common.wire import TensorRef


def test_tensor_ref_survives_the_wire():
    ref = TensorRef("logits", "FP16", (8, 1000), 4096)

    item = orjson.loads(orjson.dumps(ref.to_wire()))

    assert item == ["logits", "FP16", [8, 1000], 4096]
    assert TensorRef.from_wire(item) == ref
    assert TensorRef.from_wire(item).shape == (8, 1000)  # a tuple again, hashable


@pytest.mark.parametrize("index, generation", [(0, 0), (3, 17), (12, 123456)])
def test_worker_identity_round_trip(index, generation):
    identity = wire.worker_identity(index, generation)

    assert isinstance(identity, bytes)
    assert wire.parse_worker_identity(identity) == (index, generation)


def test_control_identity_parses_like_the_worker_identity():
    assert wire.control_identity(1, 2) == b"c1.g2"
    assert wire.parse_worker_identity(wire.control_identity(12, 3)) == (12, 3)


def test_worker_identity_differs_per_generation():
    assert wire.worker_identity(1, 2) == b"w1.g2"
    assert wire.worker_identity(1, 2) != wire.worker_identity(1, 3)
    assert wire.worker_identity(1, 23) != wire.worker_identity(12, 3)


def test_endpoint_is_an_ipc_socket_in_the_runtime_dir():
    assert wire.endpoint("/run/ringserve-1", "dispatch") == "ipc:///run/ringserve-1/dispatch.sock"
