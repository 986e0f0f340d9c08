"""Warm-up: a just-loaded version runs its config's warm-up samples before it is ready (Triton's model_warmup).

Called by the load itself (worker/models.py: ModelRegistry._open), between the session's creation and
the version's `ready`: a version being warmed is `loading`, so it takes no batch, and a worker whose
eager models warm up sends READY only after them. So every process that loads the model warms it before
it serves: each worker and lane at start, the warm spare's takeover, a replacement after a crash, a
lazy load (its first request waits), a reload. The load's bound covers the warm-up with it.

    sample        common/repository/warmup.py: `batch_size` requests of one row each, run as one
                  execution, `count` times; each input's zeros, random bytes or a file's bytes
    ONNX          the requests' rows stacked (a ragged input concatenated), as a batch reaches the
                  model; a graph input the sample does not give (a batch_input, a sequence state or
                  control) gets zeros of its graph shape
    Python        one pb_utils.InferenceRequest per request, through execute (a decoupled model's
                  through response senders, waited for until each request's final response)

A sample that fails raises WarmupFailed with Triton's words ("failed to run warmup sample 'zero
sample': An Error Occurred; "), which fails the load with that reason; `warmup: true`'s own sample only
logs its failure.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ringserve.common import messages, wire
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.datatypes import kserve_datatype_from_ort, numpy_dtype
from ringserve.common.repository.warmup import WARMUP_FOLDER, WarmupInput, WarmupSample

from .errors import WorkerError
from .python import pb_utils
from .python.python_model import PythonModel
from .requests import AnswerError, model_shaped, request_of, response_tensors
from .session import ModelSession

log = logging.getLogger(__name__)


class WarmupFailed(WorkerError):
    """A warm-up sample failed: the load fails with Triton's message."""

    def __init__(self, sample: str, errors: list[str]) -> None:
        self.sample, self.errors = sample, errors
        super().__init__(f"failed to run warmup sample '{sample}': " + "".join(f"{e}; " for e in errors))


def warm_up(config: ModelConfig, session: Any) -> None:
    """Run every warm-up sample of `config` on `session` (its just-loaded ModelSession or PythonModel)."""
    for sample in config.warmup_samples:
        try:
            run_sample(config, session, sample)
        except WarmupFailed as exc:
            if sample.required:
                raise  # (worker/models.py logs the failed load with it)
            log.warning("model %s: warmup on zeros failed (%s); serving it anyway", config.name, exc)


def run_sample(config: ModelConfig, session: Any, sample: WarmupSample) -> None:
    try:
        one = {given.name: request_tensor(config, given) for given in sample.inputs}
    except (OSError, ValueError) as exc:
        raise WarmupFailed(sample.name, [str(exc)]) from None
    for iteration in range(1, sample.count + 1):
        log.info(
            "model '%s' version %d is running warmup sample '%s' for iteration %d",
            config.name,
            config.version,
            sample.name,
            iteration,
        )
        if isinstance(session, ModelSession):
            errors = _run_onnx(config, session, sample, one)
        elif isinstance(session, PythonModel):
            errors = _run_python(config, session, sample, one)
        else:
            return  # an ensemble: its steps' models warm up when they load
        if errors:
            raise WarmupFailed(sample.name, errors)


def request_tensor(config: ModelConfig, given: WarmupInput) -> np.ndarray:
    """One request's tensor of `given`, without the batch dim; BYTES as an object array of bytes."""
    shape = given.dims
    count = int(np.prod(shape, dtype=np.int64))
    if given.data == "input_data_file":
        path = Path(config.model_path).parent.parent / WARMUP_FOLDER / given.data_file
        data = path.read_bytes()
        if given.datatype == "BYTES":
            return wire.deserialize_bytes_tensor(np.frombuffer(data, np.uint8), shape)
        dtype = numpy_dtype(given.datatype)
        need = count * dtype.itemsize
        if len(data) < need:
            raise ValueError(
                f"warmup setting expects {need} bytes, but the data provided from {given.data_file} "
                f"only has {len(data)} bytes"
            )
        return np.frombuffer(data[:need], dtype).reshape(shape).copy()
    if given.datatype == "BYTES":  # random strings are zeros too, as in Triton
        return np.full(shape, b"", dtype=object)
    dtype = numpy_dtype(given.datatype)
    if given.data == "zero_data":
        return np.zeros(shape, dtype)
    rng = np.random.default_rng()
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    return rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8).view(dtype).reshape(shape)


def _run_onnx(
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


def _run_python(config: ModelConfig, model: PythonModel, sample: WarmupSample, one: dict[str, np.ndarray]) -> list[str]:
    batched = config.max_batch_size > 0
    info = messages.RequestInfo(rows=1)
    requests = [
        request_of(
            model_shaped(config, {name: (a[np.newaxis] if batched else a).copy() for name, a in one.items()}), info
        )
        for _ in range(sample.batch_size)
    ]
    if config.decoupled:
        return _run_decoupled(config, model, requests, info)
    try:
        responses = model.execute(requests)
    except Exception as exc:  # noqa: BLE001 - a model's execute may raise anything: the sample's failure
        return [f"{type(exc).__name__}: {exc}"]
    if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
        return [f"execute did not return one response for each of the {len(requests)} requests"]
    errors = []
    for response in responses:
        try:
            response_tensors(config, info, response)
        except AnswerError as exc:
            errors.append(str(exc))
    return errors


def _run_decoupled(
    config: ModelConfig, model: PythonModel, requests: list[pb_utils.InferenceRequest], info: messages.RequestInfo
) -> list[str]:
    """execute with a sender per request that checks what it is sent; waits for every final response."""
    errors: list[str] = []
    finals = [False] * len(requests)
    done = threading.Condition()

    def sender(k: int) -> pb_utils.InferenceResponseSender:
        def send(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            try:
                if response is not None:
                    response_tensors(config, info, response)
            except AnswerError as exc:
                errors.append(str(exc))
            with done:
                finals[k] = finals[k] or final
                done.notify_all()

        return pb_utils.InferenceResponseSender(send)

    for k, request in enumerate(requests):
        request._sender = sender(k)
    try:
        returned = model.execute(requests)
    except Exception as exc:  # noqa: BLE001 - a model's execute may raise anything: the sample's failure
        return [f"{type(exc).__name__}: {exc}"]
    if returned is not None:
        return [f"a decoupled model's execute returns None, got {type(returned).__name__}"]
    with done:
        done.wait_for(lambda: all(finals))  # (the load's bound ends a model that never sends them)
    return errors
