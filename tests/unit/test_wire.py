"""common/wire.py: three-frame control messages, tensor refs, worker identities."""
from __future__ import annotations

import orjson
import pytest

from ringserve.common import wire
from ringserve.common.wire import PROTOCOL_VERSION, TensorRef, WireError

BODIES = {
    "READY": {"worker": 0, "generation": 3, "pid": 4321, "models": {"mlp": "CPUExecutionProvider"},
              "failed_models": {}},
    "HEARTBEAT": {"worker": 1, "generation": 2, "busy": False},
    "BATCH": {"batch_id": 7, "model": "mlp", "attempt": 1, "slot": 2, "generation": 9,
              "inputs": [["x", "FP32", [3, 4], 0]], "output_offset": 64},
    "RESULT": {"batch_id": 7, "attempt": 1, "outputs": [["y", "FP32", [3, 4], 64]], "compute_s": 0.25},
    "ERROR": {"batch_id": 7, "attempt": 0, "error": "Invalid rank for input: x"},
    "WORKER_STARTED": {"worker": 0, "pid": 99, "generation": 4, "restarts": {"SIGSEGV": 1}},
    "WORKER_EXITED": {"worker": 0, "pid": 99, "generation": 4, "reason": "SIGSEGV", "at": 12.5,
                      "restarts": {"SIGSEGV": 2}, "last_exit": None},
    "SNAPSHOT": {"supervisor_pid": 1, "workers": [{"worker": 0, "generation": 4, "restarts": {}}]},
    "KILL_WORKER": {"worker": 0, "generation": 4, "reason": "heartbeat timeout"},
    "MODEL_QUARANTINED": {"model": "mlp", "reason": "it crashed the worker 3 times while loading"},
}


@pytest.mark.parametrize("kind", sorted(wire.KINDS))
def test_encode_then_decode_gives_back_kind_and_body(kind):
    body = BODIES.get(kind, {"kind": kind, "nested": {"list": [1, 2.5, None, "x"]}})
    frames = wire.encode(kind, body)

    assert len(frames) == 3
    assert frames[0] == PROTOCOL_VERSION
    assert frames[1] == kind.encode()
    assert wire.decode(frames) == (kind, body)


def test_decode_accepts_zero_copy_frames():
    # pyzmq hands out memoryviews (Frame.buffer) when asked not to copy.
    frames = [memoryview(f) for f in wire.encode("ERROR", BODIES["ERROR"])]

    assert wire.decode(frames) == ("ERROR", BODIES["ERROR"])


def test_other_protocol_version_is_refused():
    frames = [b"rs0", *wire.encode("READY", BODIES["READY"])[1:]]

    with pytest.raises(WireError, match="rs0"):
        wire.decode(frames)


def test_unknown_kind_is_refused():
    with pytest.raises(WireError, match="HELLO"):
        wire.decode([PROTOCOL_VERSION, b"HELLO", b"{}"])


@pytest.mark.parametrize("count", [0, 2, 4])
def test_wrong_frame_count_is_refused(count):
    frames = (wire.encode("READY", BODIES["READY"]) + [b"extra"])[:count]

    with pytest.raises(WireError, match=f"got {count}"):
        wire.decode(frames)


@pytest.mark.parametrize("body, problem", [
    (b"[1, 2]", "must be an object"),
    (b'"text"', "must be an object"),
    (b"{not json", "not JSON"),
])
def test_body_that_is_not_a_json_object_is_refused(body, problem):
    with pytest.raises(WireError, match=problem):
        wire.decode([PROTOCOL_VERSION, b"RESULT", body])


def test_wire_error_is_a_value_error():
    assert issubclass(WireError, ValueError)


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


def test_worker_identity_differs_per_generation():
    assert wire.worker_identity(1, 2) == b"w1.g2"
    assert wire.worker_identity(1, 2) != wire.worker_identity(1, 3)
    assert wire.worker_identity(1, 23) != wire.worker_identity(12, 3)


def test_endpoint_is_an_ipc_socket_in_the_runtime_dir():
    assert wire.endpoint("/run/ringserve-1", "dispatch") == "ipc:///run/ringserve-1/dispatch.sock"
