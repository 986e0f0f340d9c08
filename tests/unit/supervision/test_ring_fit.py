"""supervision/ring_fit.py: the rings cut to the shared memory there is, and the one refusal left."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.demo import build_demo_models
from ringserve.shm import layout
from ringserve.supervision.ring_fit import (
    HEADROOM_BYTES,
    MIB,
    RingFit,
    RingSize,
    RingsDoNotFit,
    choose_rings,
    fit_rings,
    model_slot_bytes,
    repository_slot_bytes,
)

DEFAULT = RingSize(8, 16 * MIB)  # --slot-count 8 --slot-mb 16
MLP_SLOT_BYTES = 4096  # a made-up largest model: one page


def test_rings_that_fit_with_room_for_a_gateway_restart_are_made_as_configured() -> None:
    assert fit_rings(DEFAULT, 2 * DEFAULT.segment_bytes, 1, MLP_SLOT_BYTES) == RingFit(DEFAULT, restart_room=True)


def test_where_fewer_slots_of_the_configured_size_fit_the_slots_keep_their_size() -> None:
    """256 MiB for one gateway and its restart: 128 MiB each, less the header page, holds 7 slots of 16 MiB."""
    assert fit_rings(DEFAULT, 256 * MIB, 1, MLP_SLOT_BYTES) == RingFit(RingSize(7, 16 * MIB), restart_room=True)


def test_dockers_64_mib_cuts_the_default_ring_to_two_smaller_slots() -> None:
    """32 MiB a ring (it and a restart's): one 16 MiB slot and the header page leave no room for a second,
    so two slots of just under 16 MiB, page-aligned."""
    fit = fit_rings(DEFAULT, 64 * MIB, 1, MLP_SLOT_BYTES)
    assert fit == RingFit(RingSize(2, 16 * MIB - layout.PAGE_BYTES), restart_room=True)
    assert 2 * fit.size.segment_bytes <= 64 * MIB


def test_each_gateway_gets_a_ring_of_its_own_in_the_cut() -> None:
    fit = fit_rings(DEFAULT, 64 * MIB, 3, MLP_SLOT_BYTES)
    assert fit is not None and fit.size.slot_count == 2
    assert 4 * fit.size.segment_bytes <= 64 * MIB < 4 * (fit.size.segment_bytes + 2 * layout.PAGE_BYTES)


def test_slots_never_shrink_below_one_full_batch_of_the_largest_model() -> None:
    """12 MiB for 1 gateway: two 3 MiB slots would not hold a 5 MiB batch; one 6 MiB slot a ring does."""
    assert fit_rings(DEFAULT, 12 * MIB + 2 * layout.PAGE_BYTES, 1, 5 * MIB) == RingFit(
        RingSize(1, 6 * MIB), restart_room=True
    )


def test_without_room_for_a_restart_the_rings_of_the_running_gateways_still_fit() -> None:
    assert fit_rings(DEFAULT, 6 * MIB, 1, 5 * MIB) == RingFit(RingSize(1, 6 * MIB - layout.PAGE_BYTES), False)


def test_not_even_one_slot_of_the_largest_model_is_refused() -> None:
    assert fit_rings(DEFAULT, 5 * MIB, 1, 5 * MIB) is None


def test_the_cut_is_logged_with_what_was_cut_and_how_to_give_more(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        size = choose_rings(DEFAULT, 1, lambda: MLP_SLOT_BYTES, 64 * MIB)
    assert size == fit_rings(DEFAULT, 64 * MIB - HEADROOM_BYTES, 1, MLP_SLOT_BYTES).size
    (record,) = caplog.records
    assert "/dev/shm has 64 MiB free: the ring of the 1 gateway cut from 8 slots of 16 MiB to 2 slots of" in (
        record.getMessage()
    )
    assert "--shm-size=257m" in record.getMessage() and "--slot-count/--slot-mb" in record.getMessage()


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
    assert str(refused.value).startswith(
        "/dev/shm has 8 MiB free; one slot of the largest model needs 5 MiB, so 2 gateway rings of one slot "
        "need 10.008 MiB (16.012 MiB with room for a gateway restart)"
    )
    assert "--shm-size=17m" in str(refused.value)


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
