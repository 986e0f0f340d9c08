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
from pathlib import Path

import numpy as np

from ringserve.common import wire
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.datatypes import numpy_dtype
from ringserve.common.repository.warmup import WARMUP_FOLDER, WarmupInput, WarmupSample

from .errors import WorkerError
from .runner import Runner

log = logging.getLogger(__name__)


class WarmupFailed(WorkerError):
    """A warm-up sample failed: the load fails with Triton's message."""

    def __init__(self, sample: str, errors: list[str]) -> None:
        self.sample, self.errors = sample, errors
        super().__init__(f"failed to run warmup sample '{sample}': " + "".join(f"{e}; " for e in errors))


def warm_up(config: ModelConfig, session: Runner) -> None:
    """Run every warm-up sample of `config` on `session`, its just-loaded Runner (worker/runner.py)."""
    for sample in config.warmup_samples:
        try:
            run_sample(config, session, sample)
        except WarmupFailed as exc:
            if sample.required:
                raise  # (worker/models.py logs the failed load with it)
            log.warning("model %s: warmup on zeros failed (%s); serving it anyway", config.name, exc)


def run_sample(config: ModelConfig, session: Runner, sample: WarmupSample) -> None:
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
        errors = session.run_warmup(sample, one)  # (an ensemble has none: its steps' models warm up as they load)
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
