"""One accepted inference request (InferRequest), and the bytes it takes in a slot.

gateway/codec/parse.py makes it (HTTP's body; gRPC's through the same document), the lanes queue it,
slots.py copies its rows into a slot, and gateway/codec/encode.py (HTTP) or grpc_codec.py (gRPC)
answers it. The size rule below is the one both the 413 check (parse.py) and the batcher
(lanes.py) count with, so a request that was accepted always fits a batch.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np

from ringserve.common.repository.config import ModelConfig
from ringserve.gateway.core.regions import OutputRegion, Region
from ringserve.shm.layout import ALIGN_BYTES


@dataclass(eq=False, slots=True)
class InferRequest:
    """One accepted inference request, from parse to its single response."""

    model: ModelConfig
    inputs: dict[str, np.ndarray]  # batched models: leading dim = this request's rows
    rows: int
    shape_key: tuple  # non-batch shapes of every input: requests batch only when equal
    kserve_id: str | None  # the KServe body's `id`, echoed in the response body and nothing else
    requested_outputs: list[str] | None
    fault: str | None
    future: asyncio.Future
    enqueued_at: float = 0.0
    # time.perf_counter_ns() when the front end first saw it (before reading its body) and when it was
    # queued: Triton's statistics (gateway/observe/stats.py); 0 = not set
    arrived_ns: int = 0
    queued_ns: int = 0
    stages: Any = None  # answered from a RESULT: its batch's stamps, for its success (gateway/observe/stats.py)
    deadline: float = 0.0
    done: bool = False  # answered (result, error or expiry); skip it wherever it still sits
    held: bool = False  # accepted while no worker was ready (hold policy): expiry means 503
    group: tuple = ()  # the batcher's group key (shape or length bucket), set when queued
    hard_deadline: float = 0.0  # the server's bound; a DELAYed request still gets 504 here
    disconnected: Any = None  # () -> bool: has the client gone away? (None: never asked)
    outcome: tuple = (None, None)  # (result, error) once finished
    priority: int = 0  # parameters.priority: 1 = highest; 0 = the model's default level
    timeout_us: int = 0  # parameters.timeout (µs); 0 = the model's default
    binary_outputs: frozenset = frozenset()  # outputs answered as binary tensors
    # BYTES inputs in KServe's binary BYTES form, as the slot holds them; None without BYTES inputs.
    serialized: dict[str, bytes] | None = None
    # System shared memory (gateway/core/regions.py); None when the request names no region.
    # The regions its inputs view and its outputs go to, held until it is answered (an unregister
    # meanwhile drops only the name), and checked again before its inputs are copied into a slot:
    shm_regions: list[Region] | None = None
    # Requested outputs to be written into a region (the scheduler writes them from the slot):
    output_regions: dict[str, OutputRegion] | None = None
    # Outputs answered as their top K classes (gateway/codec/classification.py): name -> K; None for none.
    classes: dict[str, int] | None = None
    # The request id of logs and answers: the client's X-Request-ID, or one the gateway made
    # (gateway/observe/access.py). Not `kserve_id`.
    request_id: str = ""
    batch_size: int = 0  # rows of the batch it ran in, once answered (the access log's)
    span: Any = None  # its tracing span (common/tracing.py); None while tracing is off
    parameters: dict | None = None  # the request's `parameters` as sent (a Python model reads them)
    # A decoupled model's request: each response as it comes, (outputs, None) or (None, error); the
    # future gets None once the model said it was the last (gRPC ModelStreamInfer).
    stream: Any = None
    streamed: int = 0  # responses passed to `stream` so far (a worker death does not send them again)
    # Of the response being answered (the last one, or the one `stream` is handed now): the parameters the
    # model set on it (InferenceResponse(parameters=...)), and whether it was the request's final one.
    response_parameters: dict | None = None
    response_final: bool = False
    # A sequence model's step (gateway/batching/sequences.py: Step): its sequence id, flags and state; else None.
    sequence: Any = None
    # A worker's call (gateway/calls/front.py) is part of a batch already running: while its model has no
    # ready worker it is held this long (at least), as a requeued batch waits, instead of a 503 at once.
    hold_s: float = 0.0


def alignment_slack_bytes(config: ModelConfig) -> int:
    """Most bytes lost to 64-byte alignment in one batch: one per tensor (inputs, generated
    batch_input and sequence tensors, outputs)."""
    return ALIGN_BYTES * (len(config.inputs) + config.generated_tensor_count + len(config.outputs))


def serialized_extra_bytes(inputs: dict[str, np.ndarray], serialized: dict[str, bytes]) -> int:
    """What BYTES inputs take in a slot beyond their arrays' nbytes (which counts 8 bytes per pointer)."""
    # (a sequence's STRING state or CORRID is in `serialized` only: the gateway writes it, not the client)
    return sum(len(data) - (inputs[name].nbytes if name in inputs else 0) for name, data in serialized.items())


def input_slot_bytes(request: InferRequest) -> int:
    """Bytes a request's inputs take in a slot before alignment: BYTES inputs as serialized."""
    needed = 0
    for array in request.inputs.values():
        needed += array.nbytes
    if request.serialized is not None:
        needed += serialized_extra_bytes(request.inputs, request.serialized)
    return needed
