"""What the worker asks of a loaded version, whatever its kind: a Runner. The batch loop runs a batch on
its slot, BLS and ensemble steps run requests, and a load runs the warm-up samples, each through the
registry's session, which is the version's Runner:

    kind      Runner                                 run_batch answers with
    onnx      worker/onnx_model.py: OnnxModel        the batch's outputs (rows stacked), in its slot
    python    worker/python/python_model.py          one answer per request (or a decoupled stream's)
    ensemble  worker/ensemble.py: EnsembleSession    one answer per request
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ringserve.common import messages
from ringserve.common.repository.warmup import WarmupSample
from ringserve.shm.segment import Segment

from .requests import Answer, Emit, Outcome

# (the batch's outputs as TensorRef wire forms, compute seconds, one answer per request or None)
BatchRun = tuple[list[list[Any]], float, list[Answer] | None]


class Runner(Protocol):
    """A loaded version of any kind (the table above)."""

    provider: str

    def run_batch(self, segment: Segment, batch: messages.Batch, emit: Emit | None) -> BatchRun:
        """The batch on its slot, the outputs written back and vouched for by the output generation (a
        decoupled stream's at its end): (outputs, compute seconds, None) for a model that runs the batch as
        one; ([], compute seconds, one answer per request) for one that answers each request."""
        ...

    def run_requests(
        self, feeds: Sequence[dict[str, np.ndarray]], infos: Sequence[messages.RequestInfo]
    ) -> list[Outcome]:
        """Requests made inside the worker (BLS, an ensemble's steps): each one's outputs or its error."""
        ...

    def run_warmup(self, sample: WarmupSample, one: dict[str, np.ndarray]) -> list[str]:
        """One iteration of a warm-up sample (`one`: a request's tensors); what failed, [] when it ran."""
        ...
