"""Worker-side fusion: batches of one model version, from several gateways, run as one execution.

Why: each of G gateways batches only its own share of the requests, so its batches are about
1/G as big as one gateway's would be. On a GPU that is G times the launches for the same work.
The worker sees every gateway's batches, so it puts them back together: with a batch chosen
to run (the primary, worker/loop.py's round-robin), `companions` takes from the heads of the
gateways' deques (the next gateway's first, the primary's own last) every batch that can share
its execution, and `execute` runs them as one.

When batches may fuse (all must hold; any doubt means the batch runs alone):
- the same model and version;
- attempt == 0: a requeued batch runs alone, so an innocent batch is never retried beside a
  poison one, and the gateway's bisection sees the batch it sent;
- an ONNX model (Python models and ensembles answer each request: their batches run alone);
- the model batches (max_batch_size > 0) and the total rows fit max_batch_size;
- the model has no ragged input and no batch_input (those tensors describe one batch's pieces
  and cannot be concatenated), and no separate_by_inputs (its batches must not mix values);
- every input has the same name, datatype and shape past dim 0, in the same order (padded
  models: the same padded length).
Only heads are taken: a gateway's batches still run in the order it sent them.

How: the inputs of each batch are read as views over its own slot (in its own gateway's
ring) and concatenated (one copy per input: the price of the larger execution); one
session.run; each output is split by rows and written into each batch's own slot at its
output_offset, then that slot's output generation. Every batch gets its own Result, with
the execution's compute_s, `fused` = batches in the execution, and `execution_rows` = its
rows on the first Result only (the gateway counts the execution once).

Fallback: if the fused run raises, or an output's dim 0 is not the total rows (a model whose
outputs do not follow the batch), `execute` returns None and each batch runs alone: an error
stays with the batch that caused it, where the gateway's bisection expects it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from ringserve.common import messages
from ringserve.common.logfmt import batch_fields
from ringserve.common.repository.config import ModelConfig
from ringserve.shm.segment import Segment

from . import faults
from .errors import WorkerError
from .models import ModelRegistry
from .progress import CALLS
from .session import ModelSession
from .slots import check_generation, read_inputs, write_outputs

log = logging.getLogger(__name__)

Source = TypeVar("Source")


class NotPerRow(WorkerError):
    def __init__(self, model: str, name: str, shape: tuple[int, ...], rows: int) -> None:
        super().__init__(f"model {model!r}: output {name!r} of a fused execution has shape {shape}, not {rows} rows")


def fusable(config: ModelConfig) -> bool:
    """Whether batches of this model version may ever share an execution."""
    batching = config.dynamic_batching
    return (
        config.kind == "onnx"
        and config.max_batch_size > 0
        and not config.ragged_inputs
        and not config.batch_inputs
        and not config.batch_outputs
        and not (batching is not None and batching.separate_by_inputs)
    )


def layout(batch: messages.Batch) -> tuple[tuple[Any, ...], ...]:
    """What must be equal for two batches to be concatenated: each input's name, datatype and
    shape past dim 0 (TensorRef wire form: [name, datatype, shape, offset(, nbytes)])."""
    return tuple((item[0], item[1], tuple(item[2][1:])) for item in batch.inputs)


def rows(batch: messages.Batch) -> int:
    """The batch's rows: dim 0 of its inputs (0 when it has no input with a batch dim)."""
    return batch.inputs[0][2][0] if batch.inputs and batch.inputs[0][2] else 0


def companions(
    primary: messages.Batch, sources: Sequence[tuple[Source, deque[messages.Batch]]], registry: ModelRegistry
) -> list[tuple[Source, messages.Batch]]:
    """Take from the heads of `sources` (in that order) the batches that may run with `primary`;
    each comes with the source it was taken from. [] when none may (nothing is taken then)."""
    if primary.attempt:
        return []
    try:
        config = registry.entry(primary.model, primary.version).config
    except WorkerError:
        return []
    total, limit = rows(primary), config.max_batch_size
    if not total or total >= limit or not fusable(config):
        return []
    model, version, shape = primary.model, primary.version, layout(primary)
    taken = []
    for source, queue in sources:
        while queue:
            head = queue[0]
            count = rows(head)
            if (
                head.model != model
                or head.version != version
                or head.attempt
                or not count
                or total + count > limit
                or layout(head) != shape
            ):
                break
            taken.append((source, queue.popleft()))
            total += count
    return taken


def execute(
    registry: ModelRegistry, group: list[tuple[Segment, messages.Batch]]
) -> list[messages.Result | messages.Error] | None:
    """Run the batches of `group` as one execution: one reply per batch, in order; None when they
    must run alone instead (the version is not available, a slot is stale, the fused run raised or
    its outputs do not split by rows)."""
    first = group[0][1]
    try:
        entry = registry.acquire(first.model, first.version)
    except Exception:  # noqa: BLE001 - not loadable: running alone gives each batch its own Error
        return None
    try:
        with CALLS.call(entry.config, "execute"):  # (an ONNX model's own bound, if it sets one)
            return run_fused(entry.session, group)
    except Exception as exc:  # noqa: BLE001 - whatever a fused run raises, each batch still runs alone
        log.info(
            "a fused execution of %d batches of model %s failed (%s); running each alone",
            len(group),
            first.model,
            exc,
            extra={"request_ids": [i for _, b in group for i in b.request_ids or ()]},
        )
        return None
    finally:
        registry.release(entry)


def run_fused(
    session: ModelSession, group: list[tuple[Segment, messages.Batch]]
) -> list[messages.Result | messages.Error]:
    """Raises instead of answering when the execution as a whole failed (the caller runs each alone)."""
    feeds = []
    for segment, batch in group:
        check_generation(segment, batch)
        feeds.append(read_inputs(segment, batch))
    counts = [rows(batch) for _, batch in group]
    total = sum(counts)
    inputs = {name: np.concatenate([feed[name] for feed in feeds]) for name in feeds[0]}
    for _, batch in group:
        faults.trigger_for_batch(batch)
    started = time.perf_counter()
    results = session.run(inputs)
    compute_s = time.perf_counter() - started
    for name, result in zip(session.output_names, results):
        if result.ndim == 0 or result.shape[0] != total:
            raise NotPerRow(session.config.name, name, result.shape, total)
    replies: list[messages.Result | messages.Error] = []
    start, reported = 0, False
    for (segment, batch), count in zip(group, counts):
        end = start + count
        try:
            refs = write_outputs(
                segment, session, batch.slot_index, batch.output_offset, [r[start:end] for r in results]
            )
        except Exception as exc:  # noqa: BLE001 - this batch's outputs do not fit its slot: its own error
            log.warning(
                "batch %s of model %s failed: %s",
                batch.batch_id,
                batch.model,
                exc,
                extra=batch_fields(batch.batch_id, batch.request_ids),
            )
            replies.append(messages.Error(batch_id=batch.batch_id, attempt=batch.attempt, error=str(exc)))
        else:
            # Outputs first, then the generation that vouches for them (see shm/layout.py).
            segment.set_output_generation(batch.slot_index, batch.generation)
            replies.append(
                messages.Result(
                    batch_id=batch.batch_id,
                    attempt=batch.attempt,
                    outputs=refs,
                    compute_s=compute_s,
                    fused=len(group),
                    execution_rows=0 if reported else total,
                )
            )
            reported = True
        start = end
    return replies
