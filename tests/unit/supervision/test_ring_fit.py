"""supervision/ring_fit.py: the rings cut to the shared memory there is, and the one refusal left; and
supervision/gateways.py: a restart waits for room for its ring."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ringserve.common.exits import EXIT_NO_SHARED_MEMORY
from ringserve.common.repository.config import ModelConfig
from ringserve.common.settings import Settings
from ringserve.common.repository.demo import build_demo_models
from ringserve.shm import layout
from ringserve.shm.errors import SharedMemoryFull
from ringserve.supervision import gateways
from ringserve.supervision.children import Children
from ringserve.supervision.listeners import Listeners
from ringserve.supervision.ring_fit import (
    HEADROOM_BYTES,
    MIB,
    RingSize,
    RingsDoNotFit,
    choose_rings,
    fit_rings,
    model_slot_bytes,
    repository_slot_bytes,
)

DEFAULT = RingSize(8, 16 * MIB)  # --slot-count 8 --slot-mb 16
MLP_SLOT_BYTES = 4096  # a made-up largest model: one page


def test_rings_that_fit_are_made_as_configured() -> None:
    assert fit_rings(DEFAULT, DEFAULT.segment_bytes, 1, MLP_SLOT_BYTES) == DEFAULT


def test_where_fewer_slots_of_the_configured_size_fit_the_slots_keep_their_size() -> None:
    """Docker's 64 MiB for one gateway: 1 MiB left to others and the header page, 3 slots of 16 MiB."""
    assert fit_rings(DEFAULT, 64 * MIB, 1, MLP_SLOT_BYTES) == RingSize(3, 16 * MIB)


def test_each_gateway_gets_a_ring_of_its_own_in_the_cut() -> None:
    """64 MiB for 3 gateways: 21 MiB a ring holds one 16 MiB slot, not two: two slots of 10.5 MiB less a page."""
    size = fit_rings(DEFAULT, 64 * MIB, 3, MLP_SLOT_BYTES)
    assert size == RingSize(2, 10 * MIB + 512 * 1024 - layout.PAGE_BYTES)
    assert 3 * size.segment_bytes <= 64 * MIB - HEADROOM_BYTES < 3 * (size.segment_bytes + 2 * layout.PAGE_BYTES)


def test_slots_never_shrink_below_one_full_batch_of_the_largest_model() -> None:
    """13 MiB for 1 gateway: two 6 MiB slots would not hold a 7 MiB batch; one 12 MiB slot does."""
    assert fit_rings(DEFAULT, 13 * MIB + layout.PAGE_BYTES, 1, 7 * MIB) == RingSize(1, 12 * MIB)


def test_the_headroom_left_to_others_never_costs_the_last_slot() -> None:
    assert fit_rings(DEFAULT, 5 * MIB + layout.PAGE_BYTES, 1, 5 * MIB) == RingSize(1, 5 * MIB)


def test_not_even_one_slot_of_the_largest_model_is_refused() -> None:
    assert fit_rings(DEFAULT, 5 * MIB, 1, 5 * MIB) is None


def test_the_cut_is_logged_with_what_was_cut_and_how_to_give_more(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert choose_rings(DEFAULT, 1, lambda: MLP_SLOT_BYTES, 64 * MIB) == RingSize(3, 16 * MIB)
    (record,) = caplog.records
    assert ("/dev/shm has 64 MiB free: the ring of the 1 gateway cut from 8 slots of 16 MiB to 3 slots of 16 MiB "
            "each (configured: --slot-count 8 --slot-mb 16)") in record.getMessage()
    assert "--shm-size=129m" in record.getMessage() and "--slot-count/--slot-mb" in record.getMessage()


def test_rings_that_fit_read_no_model_and_log_nothing(caplog: pytest.LogCaptureFixture) -> None:
    def no_repository() -> int:
        raise AssertionError("the repository is read only when the rings must shrink")

    with caplog.at_level(logging.WARNING):
        assert choose_rings(DEFAULT, 1, no_repository, 24 * 1024 * MIB) == DEFAULT
        assert choose_rings(DEFAULT, 1, no_repository, None) == DEFAULT  # (no tmpfs to ask)
    assert caplog.records == []


def test_the_refusal_says_how_much_shared_memory_is_needed() -> None:
    with pytest.raises(RingsDoNotFit) as refused:
        choose_rings(DEFAULT, 2, lambda: 5 * MIB, 8 * MIB)
    assert refused.value.needed_bytes == 2 * (layout.PAGE_BYTES + 5 * MIB)
    assert str(refused.value) == (
        "/dev/shm has 8 MiB free; one slot of the largest model needs 5 MiB, so 2 gateway rings of one slot need "
        "at least 10.008 MiB: give /dev/shm more (docker run --shm-size=, or the tmpfs mount's size=; the "
        "configured rings need 256.008 MiB), or fewer --gateways"
    )


def test_a_models_slot_holds_a_full_batch_of_its_inputs_and_outputs() -> None:
    """mlp: 64 rows of x (512 FP32) and y (10 FP32), the slot header and a 64-byte alignment per tensor."""
    config = ModelConfig.from_json("m", {
        "max_batch_size": 64,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [512]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [10]}],
    }, version=1, model_path="/m/m/1/model.onnx")
    assert model_slot_bytes(config) == layout.SLOT_HEADER_BYTES + 64 * (512 + 10) * 4 + 2 * 64


def test_a_variable_dim_counts_at_its_max_shapes_bound() -> None:
    doc = {"max_batch_size": 8,
           "input": [{"name": "ids", "data_type": "TYPE_INT64", "dims": [-1]}],
           "output": [{"name": "e", "data_type": "TYPE_FP32", "dims": [4]}]}
    unbounded = model_slot_bytes(ModelConfig.from_json("m", doc, version=1, model_path="/m/m/1/model.onnx"))
    bounded = model_slot_bytes(
        ModelConfig.from_json("m", {**doc, "parameters": {"max_shapes": {"string_value": "ids:8x512"}}},
                              version=1, model_path="/m/m/1/model.onnx"))
    assert bounded - unbounded == 8 * 511 * 8


def test_the_largest_demo_model_sets_the_smallest_slot(tmp_path: Path) -> None:
    build_demo_models(tmp_path)
    assert repository_slot_bytes(str(tmp_path)) == layout.SLOT_HEADER_BYTES + 64 * (512 + 10) * 4 + 2 * 64


class RingRoomLater:
    """Gateways.spawn's stand-in: no room for the ring `refusals` times (a worker still maps the old one)."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.spawned: list[tuple[int, int]] = []

    def __call__(self, index: int = 0, generation: int = 0) -> None:
        if self.refusals:
            self.refusals -= 1
            raise SharedMemoryFull("ringserve-1-x-ring", 16 * MIB, 0, 64 * MIB, "/dev/shm")
        self.spawned.append((index, generation))


def test_a_restarted_gateway_waits_for_room_for_its_ring_then_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(gateways.time, "monotonic", lambda: clock[0])
    group = gateways.Gateways(1, Settings(model_repository="/m"), Children(), Listeners())
    group.spawn = RingRoomLater(refusals=2)  # type: ignore[method-assign]
    group.records[0].restart_at = clock[0]
    for _ in range(3):
        assert group.restart_due() is None
        clock[0] += gateways.RING_RETRY_S
    assert group.spawn.spawned == [(0, 1)] and group.records[0].generation == 1  # type: ignore[attr-defined]
    assert group.ring_wait_since == {}


def test_a_restart_that_never_finds_room_for_its_ring_stops_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(gateways.time, "monotonic", lambda: clock[0])
    group = gateways.Gateways(1, Settings(model_repository="/m"), Children(), Listeners())
    group.spawn = RingRoomLater(refusals=10**6)  # type: ignore[method-assign]
    group.records[0].restart_at = clock[0]
    while clock[0] < 100.0 + gateways.RING_WAIT_S:
        assert group.restart_due() is None
        clock[0] += 1.0
    assert group.restart_due() == EXIT_NO_SHARED_MEMORY
