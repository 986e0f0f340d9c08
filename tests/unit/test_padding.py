"""Variable-length batching: padded slot writes, generated masks, outputs cut back, waste metrics."""
from __future__ import annotations

import asyncio

import numpy as np
import orjson
import pytest

from ringserve.common.errors import ConfigError

from ringserve.common.repository.batching import DynamicBatching, Padding

from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.common.wire import TensorRef
from ringserve.gateway.batching.slot_outputs import split_outputs
from ringserve.gateway.batching.slots import SlotBatch, SlotUse, write_batch
from ringserve.gateway.codec.parse import parse_infer_request
from ringserve.gateway.core.request import InferRequest
from ringserve.shm.layout import pack_offsets
from ringserve.shm.ring import Ring
from ringserve.shm.segment import Segment

from .test_batch_controls import Harness, model_config, result_of, rows, seq

PAD_VALUE = -7.0


def encoder(name: str = "enc", **batching) -> ModelConfig:
    """x and mask of any length; y as long as x, pooled fixed at 5 (as long as the longest request below)."""
    return ModelConfig(
        name=name, max_batch_size=4,
        inputs=(TensorConfig("x", "FP32", (-1,)), TensorConfig("mask", "INT64", (-1,))),
        outputs=(TensorConfig("y", "FP32", (-1,)), TensorConfig("pooled", "FP32", (5,))),
        dynamic_batching=DynamicBatching(padding=Padding(value=PAD_VALUE, mask_input="mask"), **batching),
        version=1, model_path=f"/models/{name}/1/model.onnx",
    )


def request(config: ModelConfig, **inputs: np.ndarray) -> InferRequest:
    batched = config.max_batch_size > 0
    return InferRequest(model=config, inputs=inputs, rows=next(iter(inputs.values())).shape[0] if batched else 1,
                        shape_key=tuple(a.shape[1:] for a in inputs.values()), kserve_id=None,
                        requested_outputs=None, fault=None, future=None)


def parsed(config: ModelConfig, x: np.ndarray, loop: asyncio.AbstractEventLoop, capacity_bytes: int = 1 << 20):
    """A request through the real codec, mask left out."""
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                                     "data": x.ravel().tolist()}]})
    return parse_infer_request(config, body, capacity_bytes=capacity_bytes, future=loop.create_future(),
                               allow_faults=False)




def slot_tensor(segment: Segment, lease, ref: TensorRef, dtype) -> np.ndarray:
    return segment.tensor(lease.index, ref.offset, dtype, ref.shape).copy()


# -- writing a padded batch ----------------------------------------------------------------------
def test_write_batch_pads_variable_dims_to_the_longest_with_the_value_and_the_mask_with_zero(segment):
    config = encoder()
    short = request(config, x=seq(3), mask=np.ones((1, 3), dtype=np.int64))
    long = request(config, x=seq(5, first=10.0), mask=np.ones((1, 5), dtype=np.int64))
    lease = Ring(segment).acquire()

    x_ref, mask_ref = write_batch(segment, lease, [short, long])[0]

    assert (x_ref.shape, mask_ref.shape) == ((2, 5), (2, 5))
    x, mask = slot_tensor(segment, lease, x_ref, np.float32), slot_tensor(segment, lease, mask_ref, np.int64)
    assert x.tolist() == [[1, 2, 3, PAD_VALUE, PAD_VALUE], [10, 11, 12, 13, 14]]
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]


def test_a_generated_mask_is_one_on_real_positions_and_zero_on_padding(segment, loop):
    config = encoder()
    short, long = parsed(config, seq(3), loop), parsed(config, seq(5), loop)
    assert short.inputs["mask"].dtype == np.int64
    assert short.inputs["mask"].tolist() == [[1, 1, 1]]
    lease = Ring(segment).acquire()

    _, mask_ref = write_batch(segment, lease, [short, long])[0]

    assert slot_tensor(segment, lease, mask_ref, np.int64).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]


def test_a_mask_input_the_model_does_not_have_is_refused_when_the_config_loads():
    # Refused at load, with the inputs it could have named, instead of failing every request.
    with pytest.raises(ConfigError, match=r"mask_input.*'attention_mask' is not an input; inputs: \['x'\]"):
        model_config("enc", x_dims=(-1,), y_dims=(-1,), padding=Padding(mask_input="attention_mask"))


# -- splitting padded outputs ----------------------------------------------------------------------
def test_split_outputs_cuts_a_variable_output_to_each_request_length_and_leaves_fixed_dims(segment, loop):
    config = encoder()
    short, long = parsed(config, seq(3), loop), parsed(config, seq(5, first=10.0), loop)
    lease = Ring(segment).acquire()
    refs, output_offset = write_batch(segment, lease, [short, long])
    # What a worker would write: y = 2x over the padded batch; pooled is fixed at 5 (= the longest, by chance).
    y = 2 * slot_tensor(segment, lease, refs[0], np.float32)
    pooled = np.arange(10, dtype=np.float32).reshape(2, 5)
    (y_offset, pooled_offset), _ = pack_offsets([y.nbytes, pooled.nbytes], output_offset)
    segment.tensor(lease.index, y_offset, np.float32, y.shape)[:] = y
    segment.tensor(lease.index, pooled_offset, np.float32, pooled.shape)[:] = pooled
    outputs = [TensorRef("y", "FP32", y.shape, y_offset), TensorRef("pooled", "FP32", pooled.shape, pooled_offset)]

    short_out, long_out = split_outputs(segment, SlotBatch(1, config, [short, long], SlotUse(lease), refs, output_offset),
                                        outputs)

    assert short_out["y"].tolist() == [[2, 4, 6]]
    assert long_out["y"].tolist() == [[20, 22, 24, 26, 28]]
    assert short_out["pooled"].tolist() == [[0, 1, 2, 3, 4]]  # config dim 5, not -1: never cut
    assert long_out["pooled"].tolist() == [[5, 6, 7, 8, 9]]


def test_split_outputs_cuts_each_padded_axis_to_the_request_own_extent(segment):
    config = ModelConfig(name="img", max_batch_size=4, inputs=(TensorConfig("x", "FP32", (-1, -1)),),
                         outputs=(TensorConfig("y", "FP32", (-1, -1)),),
                         dynamic_batching=DynamicBatching(padding=Padding()), version=1,
                         model_path="/models/img/1/model.onnx")
    wide = request(config, x=np.ones((1, 3, 5), dtype=np.float32))
    tall = request(config, x=np.ones((1, 5, 4), dtype=np.float32))
    lease = Ring(segment).acquire()
    refs, output_offset = write_batch(segment, lease, [wide, tall])
    assert refs[0].shape == (2, 5, 5)
    y = slot_tensor(segment, lease, refs[0], np.float32)  # an identity model
    (y_offset,), _ = pack_offsets([y.nbytes], output_offset)
    segment.tensor(lease.index, y_offset, np.float32, y.shape)[:] = y

    wide_out, tall_out = split_outputs(segment, SlotBatch(1, config, [wide, tall], SlotUse(lease), refs, output_offset),
                                       [TensorRef("y", "FP32", y.shape, y_offset)])

    assert wide_out["y"].shape == (1, 3, 5)
    assert tall_out["y"].shape == (1, 5, 4)


# -- through the dispatcher: waste metrics and batch-dim padding ------------------------------------
def test_padding_waste_counters_after_a_padded_batch(segment, loop):
    config = encoder()
    h = Harness(segment, loop, config)
    h.ready()
    blocker = h.occupy()
    short = h.submit(parsed(config, seq(3), loop, segment.data_capacity))
    long = h.submit(parsed(config, seq(5), loop, segment.data_capacity))

    h.answer(blocker)

    (sent,) = h.batches("enc")
    # x and mask: 3 + 5 real elements each in a 2 x 5 batch, so 2 padded each.
    real = h.metrics.registry.get_sample_value("ringserve_real_elements_total", {"model": "enc", "version": "1"})
    padded = h.metrics.registry.get_sample_value("ringserve_padded_elements_total", {"model": "enc", "version": "1"})
    assert (real, padded) == (16, 4)
    h.answer(sent, model=lambda inputs: {"y": 2 * inputs["x"], "pooled": np.zeros((2, 5))})
    assert result_of(short).tolist() == [[2, 4, 6]]
    assert result_of(long).tolist() == [[2, 4, 6, 8, 10]]


def test_unpadded_models_count_no_padding_waste(segment, loop):
    config = model_config()
    h = Harness(segment, loop, config)
    h.ready()

    h.submit(h.request(config, rows(2, 0.0)))

    assert len(h.batches()) == 1
    assert h.metrics.registry.get_sample_value("ringserve_real_elements_total", {"model": "mlp", "version": "1"}) is None


def test_pad_to_preferred_batch_size_adds_rows_the_requests_never_see(segment, loop):
    config = model_config(max_batch_size=4, preferred_batch_size=(4,), pad_to_preferred_batch_size=True)
    h = Harness(segment, loop, config)
    h.ready()

    request = h.submit(h.request(config, rows(3, 1.0)))

    (sent,) = h.batches()
    x = h.inputs_of(sent)["x"]
    assert x.shape == (4, 4)
    assert np.array_equal(x[:3], request.inputs["x"])
    assert not x[3].any()  # the padding row: zeros
    h.answer(sent)
    assert np.array_equal(result_of(request), 2 * request.inputs["x"] + 1)  # 3 rows, not 4


def test_pad_to_preferred_batch_size_never_overflows_the_slot(segment, loop):
    # One row is 2 KiB of x and 16 B of y: 3 rows fit the 8128-byte data area, 4 do not.
    config = model_config(max_batch_size=4, x_dims=(512,), preferred_batch_size=(4,),
                          pad_to_preferred_batch_size=True)
    h = Harness(segment, loop, config)
    h.ready()
    assert h.dispatcher.queues["mlp"].max_rows(h.request(config, rows(1, 0.0, width=512))) == 3

    request = h.submit(h.request(config, rows(1, 0.0, width=512)))

    (sent,) = h.batches()
    batch_rows = sent.batch.inputs[0][2][0]
    _, outputs_end = pack_offsets([batch_rows * 16], sent.batch.output_offset)
    assert outputs_end <= segment.data_capacity
    assert np.array_equal(h.inputs_of(sent)["x"][:1], request.inputs["x"])
