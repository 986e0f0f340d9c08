"""Ensembles: Triton's `platform: "ensemble"`, its ensemble_scheduling steps run in one worker.

An ensemble is batched like any model (the gateway's batcher, one slot, one BATCH). The worker
runs its steps one after the other (common/repository/kinds.py orders them so that each step follows
the steps that make its tensors) on the models its registry serves (worker/bls.py), so tensors go
from step to step without leaving the process: an ONNX step gets the batch's rows stacked, a
Python step one request per client request. A request a step fails (its own error) leaves the
batch there with its message; the others go on. The ensemble's outputs are written once into
the slot, per request (worker/requests.py). A crash in any step is the worker's death: the
gateway requeues the ensemble's batch and bisects it, as for any model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from ringserve.common import messages
from ringserve.common.errors import ConfigError
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.kinds import check_ensemble
from ringserve.common.repository.warmup import WarmupSample
from ringserve.shm.segment import Segment

from . import faults
from .bls import Runtime
from .errors import ModelNotServed
from .requests import (
    Answer,
    AnswerError,
    Emit,
    Outcome,
    check_tensor,
    failed,
    read_batch_inputs,
    split_requests,
    write_tensors,
)
from .runner import BatchRun


class EnsembleSession:
    """One loaded ensemble version: its steps, checked against the step models this worker serves."""

    provider = "ensemble"

    def __init__(self, config: ModelConfig, runtime: Runtime) -> None:
        self.config, self.runtime = config, runtime
        steps: dict[tuple[str, int], ModelConfig] = {}
        for step in config.ensemble_steps:
            try:
                steps[step.model_name, step.model_version] = runtime.config(step.model_name, step.model_version)
            except ModelNotServed as exc:
                raise ConfigError(config.name, "ensemble_scheduling.step.model_name", str(exc)) from None
            if steps[step.model_name, step.model_version].decoupled:
                raise ConfigError(
                    config.name,
                    "ensemble_scheduling.step.model_name",
                    f"step model {step.model_name!r} is decoupled; ensemble steps answer once",
                )
        # What the gateway could not check (a step's config completed by its model.py) is checked here.
        check_ensemble(
            config,
            {name: c for (name, v), c in steps.items() if v == -1},
            {(c.name, c.version): c for c in steps.values()},
        )

    def run_batch(self, segment: Segment, batch: messages.Batch, emit: Emit | None = None) -> BatchRun:
        if batch.faults:
            faults.trigger_for_batch(batch)
        answers, compute_s = self.run_on_slot(segment, batch, emit)
        # Outputs first, then the generation that vouches for them (see shm/layout.py).
        segment.set_output_generation(batch.slot_index, batch.generation)
        return [], compute_s, answers

    def run_warmup(self, sample: WarmupSample, one: dict[str, np.ndarray]) -> list[str]:
        return []  # (none: an ensemble's config refuses model_warmup; its steps' models warm up as they load)

    def run_on_slot(
        self, segment: Segment, batch: messages.Batch, emit: Emit | None = None
    ) -> tuple[list[Answer], float]:
        infos = batch.requests or (messages.RequestInfo(rows=1),)
        own = split_requests(self.config, read_batch_inputs(segment, batch, private=True), infos)
        started = time.perf_counter()
        outcomes = self.run_requests(own, infos)
        compute_s = time.perf_counter() - started
        answers: list[Answer] = []
        offset = batch.output_offset
        for info, outcome in zip(infos, outcomes):  # noqa: B007 - info is read in the loop body's error branch only
            try:
                if isinstance(outcome, AnswerError):
                    raise outcome
                tensors = [(name, check_tensor(self.config, name, array), array) for name, array in outcome.items()]
                refs, offset = write_tensors(segment, batch.slot_index, offset, tensors)
            except AnswerError as exc:
                answers.append(failed(str(exc), exc.status))
                continue
            answers.append([refs, None, 0])
        return answers, compute_s

    def run_requests(
        self, feeds: Sequence[dict[str, np.ndarray]], infos: Sequence[messages.RequestInfo]
    ) -> list[Outcome]:
        """Every step on the requests still standing; each request's requested ensemble outputs."""
        values = [dict(feed) for feed in feeds]  # per request: ensemble tensor name -> array
        errors: dict[int, AnswerError] = {}
        for step in self.config.ensemble_steps:
            alive = [k for k in range(len(values)) if k not in errors]
            if not alive:
                break
            step_feeds = [{inner: values[k][outer] for inner, outer in step.input_map.items()} for k in alive]
            step_infos = [
                messages.RequestInfo(
                    rows=infos[k].rows, id=infos[k].id, parameters=infos[k].parameters, outputs=list(step.output_map)
                )
                for k in alive
            ]
            for k, outcome in zip(alive, self.runtime.run(step.model_name, step.model_version, step_feeds, step_infos)):
                if isinstance(outcome, AnswerError):
                    errors[k] = AnswerError(
                        f"ensemble {self.config.name!r}, step {step.model_name!r}: {outcome}", outcome.status
                    )
                    continue
                for inner, outer in step.output_map.items():
                    values[k][outer] = outcome[inner]
        outcomes: list[Outcome] = []
        for k, info in enumerate(infos):
            if k in errors:
                outcomes.append(errors[k])
                continue
            names = info.outputs or [t.name for t in self.config.outputs]
            outcomes.append({name: values[k][name] for name in names})
        return outcomes
