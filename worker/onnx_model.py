"""ONNX models: an ONNX Runtime session (worker/session.py) as the worker runs it (worker/runner.py's Runner):
a batch on its slot, requests made inside the worker joined into one batch, warm-up samples.

    run_batch      inputs as views over the slot, one session.run, the outputs written into the slot
    run_requests   BLS requests and ensemble steps: joined into one batch (rows stacked), one session.run,
                   the outputs split by rows
    run_warmup     a sample's batch as the model gets one, strings as str
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ringserve.common import messages
from ringserve.common.messages import RequestInfo
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.datatypes import kserve_datatype_from_ort, numpy_dtype
from ringserve.common.repository.warmup import WarmupSample
from ringserve.shm.segment import Segment

from . import faults
from .requests import AnswerError, Emit, Outcome, join_requests
from .runner import BatchRun
from .session import ModelSession
from .slots import read_inputs, write_outputs


class OnnxModel(ModelSession):
    """A loaded ONNX version: its session, run as the worker asks (the module's table)."""

    def run_batch(self, segment: Segment, batch: messages.Batch, emit: Emit | None = None) -> BatchRun:
        return (*run_on_slot(segment, self, batch), None)

    def run_requests(self, feeds: Sequence[dict[str, np.ndarray]], infos: Sequence[RequestInfo]) -> list[Outcome]:
        return run_onnx(self.config, self, feeds, infos)

    def run_warmup(self, sample: WarmupSample, one: dict[str, np.ndarray]) -> list[str]:
        return run_sample_onnx(self.config, self, sample, one)


def run_on_slot(segment: Segment, session: ModelSession, batch: messages.Batch) -> tuple[list[list[Any]], float]:
    """One batch alone: inputs as views over its slot, outputs into it, then its output generation."""
    inputs = read_inputs(segment, batch)
    if batch.faults:
        faults.trigger_for_batch(batch)
    started = time.perf_counter()
    results = session.run(inputs)
    compute_s = time.perf_counter() - started
    refs = write_outputs(segment, session, batch.slot_index, batch.output_offset, results)
    # Outputs first, then the generation that vouches for them (see shm/layout.py).
    segment.set_output_generation(batch.slot_index, batch.generation)
    return refs, compute_s


def check_feeds(config: ModelConfig, feeds: dict[str, np.ndarray]) -> None:
    """AnswerError (400) unless `feeds` are the model's inputs, each of its datatype."""
    for name, array in feeds.items():
        tensor = config.inputs_by_name.get(name)
        if tensor is None:
            raise AnswerError(
                f"model {config.name!r} has no input {name!r} (inputs: {sorted(config.inputs_by_name)})", 400
            )
        if not isinstance(array, np.ndarray) or (
            array.dtype != tensor.np_dtype
            and not (tensor.datatype == "BYTES" and (array.dtype.hasobject or array.dtype.kind in "SU"))
        ):
            found = array.dtype if isinstance(array, np.ndarray) else type(array).__name__
            raise AnswerError(f"model {config.name!r}: input {name!r} is {found}, it takes {tensor.datatype}", 400)
    missing = sorted(set(config.inputs_by_name) - set(feeds))
    if missing:
        raise AnswerError(f"model {config.name!r} also needs input(s) {missing}", 400)


def _as_text(array: np.ndarray) -> np.ndarray:
    """BYTES for ONNX Runtime: it takes str elements (bytes elements would become "b'...'")."""
    flat = [x.decode() if isinstance(x, bytes) else str(x) for x in array.reshape(-1)]
    return np.array(flat, dtype=object).reshape(array.shape)


def _as_bytes(array: np.ndarray) -> np.ndarray:
    flat = [x.encode() if isinstance(x, str) else x for x in array.reshape(-1)]
    return np.array(flat, dtype=object).reshape(array.shape)


def run_onnx(
    config: ModelConfig, session: ModelSession, feeds: Sequence[dict[str, np.ndarray]], infos: Sequence[RequestInfo]
) -> list[Outcome]:
    try:
        if config.batch_inputs or config.ragged_inputs:
            raise AnswerError(
                f"model {config.name!r} has batch_input or ragged inputs, which a model's own requests cannot give it",
                400,
            )
        for feed in feeds:
            check_feeds(config, feed)
        batched = config.max_batch_size > 0
        joined = join_requests(list(feeds), batched)
        joined = {n: _as_text(a) if a.dtype.hasobject or a.dtype.kind in "SU" else a for n, a in joined.items()}
        try:
            results = dict(zip(session.output_names, session.run(joined)))
        except Exception as exc:  # noqa: BLE001 - ORT's refusal of these tensors: the requests' fault
            raise AnswerError(f"model {config.name!r}: {type(exc).__name__}: {exc}", 400) from None
    except AnswerError as exc:
        return [exc] * len(feeds)
    results = {n: _as_bytes(a) if a.dtype.hasobject else a for n, a in results.items()}
    if len(feeds) == 1:
        return [_requested(config, results, infos[0])]
    rows = [info.rows for info in infos]
    starts = np.cumsum([0, *rows])
    if any(a.ndim == 0 or a.shape[0] != starts[-1] for a in results.values()):
        error = AnswerError(f"model {config.name!r}: its outputs do not have one row per input row", 500)
        return [error] * len(feeds)
    return [
        _requested(config, {n: a[starts[k] : starts[k + 1]] for n, a in results.items()}, info)
        for k, info in enumerate(infos)
    ]


def _requested(config: ModelConfig, results: dict[str, np.ndarray], info: RequestInfo) -> Outcome:
    names = info.outputs or [t.name for t in config.outputs]
    missing = [n for n in names if n not in results]
    if missing:
        return AnswerError(f"model {config.name!r} has no output(s) {missing} (outputs: {sorted(results)})", 400)
    return {n: results[n] for n in names}


def run_sample_onnx(
    config: ModelConfig, session: ModelSession, sample: WarmupSample, one: dict[str, np.ndarray]
) -> list[str]:
    try:
        session.run(_onnx_feeds(config, session, sample, one))
    except Exception as exc:  # noqa: BLE001 - whatever the runtime raises (or a string that is no text) fails the sample
        return [str(exc) or type(exc).__name__]
    return []


def _onnx_feeds(
    config: ModelConfig, session: ModelSession, sample: WarmupSample, one: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The sample's batch as the model gets one: rows stacked (a ragged input concatenated), strings as str (what
    ONNX Runtime takes), and zeros of the graph's shape for what only the batcher gives (batch inputs, states)."""
    batched = config.max_batch_size > 0
    feeds: dict[str, np.ndarray] = {}
    for name, array in one.items():
        if name in config.ragged_inputs:
            array = np.concatenate([array.reshape(-1)] * sample.batch_size)
        elif batched:
            array = np.stack([array] * sample.batch_size)
        if array.dtype.hasobject:
            array = np.array([x.decode() for x in array.reshape(-1)], object).reshape(array.shape)
        feeds[name] = array
    for arg in session.session.get_inputs():
        if arg.name in feeds:
            continue
        dtype = numpy_dtype(kserve_datatype_from_ort(arg.type))
        shape = [
            d if isinstance(d, int) and d > 0 else (sample.batch_size if i == 0 and batched else 1)
            for i, d in enumerate(arg.shape)
        ]
        feeds[arg.name] = np.full(shape, "", dtype=object) if dtype == np.object_ else np.zeros(shape, dtype)
    return feeds
