"""Python models: Triton's `model.py` (class TritonPythonModel), imported and run in the worker only.

A model.py is the code most likely to crash, so it lives where crashes are survived: the
worker. The gateway and the supervisor never import it (pyproject's contracts; the gateway
learns a config that model.py completed from READY's `configs`).

    start-up    completer (the scan's hook): import model.py, TritonPythonModel.auto_complete_config(
                pb_utils.ModelConfig) when it has one (the loading marker names the model, so a
                crash here counts against it)
    load        PythonModel: TritonPythonModel(), initialize(args) with Triton's args
    batch       run_on_slot: one pb_utils.InferenceRequest per client request (its tensors are
                views of its rows in the slot), execute(requests) (awaited when `async def`),
                one InferenceResponse per request, each written once into the slot
    unload      finalize()

Errors: an exception from execute fails every request of the batch with its message (400 for
TritonModelException or a TritonError without code, else by code, 500 for any other exception:
pb_utils.http_status); a response carrying an error fails its own request. What is no Exception
(sys.exit(), KeyboardInterrupt) fails its call the same way, in every hook (`contained`:
ModelCodeExited, with its traceback logged). Nothing of that kills the worker; a native crash,
os._exit, an OOM kill or a GIL-holding hang does, and the gateway requeues and bisects as for any
model (worker death is not this module's business).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ringserve.common import messages
from ringserve.common.errors import ConfigError
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.warmup import WarmupSample
from ringserve.shm.segment import Segment

from .. import faults
from ..calls import Outputs
from ..errors import ModelCodeExited, StopRequested
from ..requests import (
    Answer,
    AnswerError,
    Emit,
    Outcome,
    answered,
    failed,
    model_shaped,
    read_batch_inputs,
    request_of,
    response_parameters,
    response_tensors,
    split_requests,
    write_tensors,
)
from ..runner import BatchRun
from . import model_namespace, pb_metrics, pb_utils
from .decoupled import STREAMING, run_decoupled

log = logging.getLogger(__name__)

PB_UTILS_MODULE = "triton_python_backend_utils"
# model.py imported by the scan (completer), kept for that version's first load (imported once, not twice)
_imported: dict[str, ModuleType] = {}


def install_pb_utils() -> None:
    """`import triton_python_backend_utils` resolves to worker/python/pb_utils.py from now on (this process only)."""
    sys.modules.setdefault(PB_UTILS_MODULE, pb_utils)


def import_model_py(path: Path) -> ModuleType:
    """A fresh import of one model.py (each load runs the file again, as Triton's new stub would), as a
    package of its own, so its sibling modules are its own (worker/python/model_namespace.py)."""
    install_pb_utils()
    return model_namespace.import_model(path)


def model_class(module: ModuleType, path: Path) -> type:
    cls = getattr(module, "TritonPythonModel", None)
    if not isinstance(cls, type):
        raise TypeError(f"{path} defines no class TritonPythonModel (Triton's Python backend needs one)")
    return cls


@contextlib.contextmanager
def contained(model: str, hook: str) -> Iterator[None]:
    """Model code's sys.exit(), KeyboardInterrupt or GeneratorExit fails the call it came from, as an
    exception would (ModelCodeExited), with its traceback logged: never the worker, and never the loader
    thread, which a SystemExit would end without a word. Only the worker's own stop passes through."""
    try:
        yield
    except (Exception, StopRequested):
        raise
    except BaseException as exc:  # noqa: BLE001 - the point: whatever a model's code raises is that model's failure
        log.error("model %s: %s raised %s", model, hook, type(exc).__name__, exc_info=True)
        raise ModelCodeExited(hook, exc) from None


@contextlib.contextmanager
def loading(marker: Path | None, key: str) -> Iterator[None]:
    """The supervisor blames a crash on `key` while the marker names it (worker/models.py writes it for loads)."""
    if marker is not None:
        marker.write_text(key)
    try:
        yield
    finally:
        if marker is not None:
            marker.unlink(missing_ok=True)


def completer(
    marker: Path | None, skip: set[str], mine: Callable[[str], bool] | None = None
) -> Callable[[dict[str, Any], Path, str], dict[str, Any]]:
    """The `complete` of common/repository/scan.py's scan, for this worker: runs each model.py's
    auto_complete_config, except for quarantined model keys (`skip`), which are not imported at all.
    Neither is a model of another lane (`mine(name)` false: `--lanes model`) whose config declares its inputs
    and outputs: its own lane imports it, so its import's crash or memory costs no other lane (this one
    only checks BLS calls and ensemble steps against the config as written). One that declares none is
    still completed here: without its tensors no ensemble step could be checked against it."""

    def complete(doc: dict[str, Any], path: Path, key: str) -> dict[str, Any]:
        if key in skip or key.split("/")[0] in skip:
            return doc
        if mine is not None and not mine(key.split("/")[0]) and doc.get("input") and doc.get("output"):
            return doc
        with loading(marker, key):
            try:
                with contained(key, "model.py"):
                    module = import_model_py(path)
                    auto_complete = getattr(model_class(module, path), "auto_complete_config", None)
                if auto_complete is None:
                    _imported[str(path)] = module
                    return doc
                pb_utils.running_model(key)
                with contained(key, "auto_complete_config"):
                    completed = auto_complete(pb_utils.ModelConfig({"name": key.split("/")[0], **doc}))
            except Exception as exc:  # noqa: BLE001 - a model.py's auto_complete_config may raise anything: a config error naming it
                raise ConfigError(key.split("/")[0], "model.py", f"{path}: {type(exc).__name__}: {exc}") from None
            finally:
                pb_utils.running_model(None)
        if not isinstance(completed, pb_utils.ModelConfig):
            raise ConfigError(
                key.split("/")[0],
                "model.py",
                f"{path}: auto_complete_config returned {type(completed).__name__}, not the pb_utils.ModelConfig",
            )
        _imported[str(path)] = module
        return completed.as_dict()

    return complete


def initialize_args(config: ModelConfig, device_id: int) -> dict[str, str]:
    """Triton's `args` of initialize(): every value a string."""
    gpu = any(g.kind == "KIND_GPU" for g in config.lifecycle.instance_groups)
    return {
        "model_config": json.dumps(config.to_json()),
        "model_instance_kind": "GPU" if gpu else "CPU",
        "model_instance_device_id": str(device_id if gpu else 0),
        "model_repository": str(Path(config.model_path).parent.parent),
        "model_version": str(config.version),
        "model_name": config.name,
    }


class PythonModel:
    """One loaded version of a model.py: its TritonPythonModel instance, initialized."""

    provider = "python"

    def __init__(self, config: ModelConfig, device_id: int = 0) -> None:
        self.config = config
        path = Path(config.model_path)
        with contained(config.name, "model.py"):  # its import (a later version's)
            module = _imported.pop(str(path), None) or import_model_py(path)
        self.package = model_namespace.package_of(module)
        self._loop: asyncio.AbstractEventLoop | None = None
        try:
            with self.running("TritonPythonModel()"):
                self.instance = model_class(module, path)()
            if not callable(getattr(self.instance, "execute", None)):
                raise TypeError(f"{path}: TritonPythonModel has no execute(requests)")
            if inspect.iscoroutinefunction(self.instance.execute):
                self._loop = asyncio.new_event_loop()
            initialize = getattr(self.instance, "initialize", None)
            if initialize is not None:
                with self.running("initialize"):
                    initialize(initialize_args(config, device_id))
        except BaseException:
            self._forget()
            raise

    @contextlib.contextmanager
    def running(self, hook: str) -> Iterator[None]:
        """Around each call into the model's code: pb_utils knows which model runs (BLS, logging), and
        what the code raises that is no Exception is contained (ModelCodeExited)."""
        caller = pb_utils.running_model(self.config.name)
        try:
            with contained(self.config.name, hook):
                yield
        finally:
            pb_utils.running_model(caller)
            pb_metrics.registry.publish()  # (before the RESULT: a client that has its answer sees the count)

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> Any:
        with self.running("execute"):
            result = self.instance.execute(requests)
            if self._loop is not None and inspect.isawaitable(result):
                result = self._loop.run_until_complete(result)
        return result

    def close(self) -> None:
        """finalize(), at unload; what it raises is logged, the unload goes on."""
        finalize = getattr(self.instance, "finalize", None)
        try:
            if finalize is not None:
                with self.running("finalize"):
                    finalize()
        except Exception as exc:  # noqa: BLE001 - finalize's failure is logged; the unload goes on
            log.warning(
                "model %s version %d: finalize raised %s: %s",
                self.config.name,
                self.config.version,
                type(exc).__name__,
                exc,
            )
        finally:
            self._forget()

    def _forget(self) -> None:
        if self._loop is not None:
            self._loop.close()
        model_namespace.forget(self.package)

    def run_batch(self, segment: Segment, batch: messages.Batch, emit: Emit | None = None) -> BatchRun:
        if batch.faults:
            faults.trigger_for_batch(batch)
        answers, compute_s = self.run_on_slot(segment, batch, emit)
        if answers is not STREAMING:  # (a stream's RESULT vouches for its slot itself, at its end)
            # Outputs first, then the generation that vouches for them (see shm/layout.py).
            segment.set_output_generation(batch.slot_index, batch.generation)
        return [], compute_s, answers

    def run_requests(
        self, feeds: Sequence[dict[str, np.ndarray]], infos: Sequence[messages.RequestInfo]
    ) -> list[Outcome]:
        return run_python(self.config, self, feeds, infos)

    def run_warmup(self, sample: WarmupSample, one: dict[str, np.ndarray]) -> list[str]:
        return run_sample_python(self.config, self, sample, one)

    def run_on_slot(
        self, segment: Segment, batch: messages.Batch, emit: Emit | None = None
    ) -> tuple[list[Answer], float]:
        """The batch's requests through execute; each request's answer, written into the slot (a
        decoupled model's responses go out through `emit` as it sends them, and its stream outlives
        execute: worker/python/decoupled.py). While execute runs, a CANCEL of a request (to the worker's
        courier, through `emit`) turns its is_cancelled() true."""
        infos = batch.requests or (messages.RequestInfo(rows=1),)
        own = split_requests(self.config, read_batch_inputs(segment, batch, private=True), infos)
        if self.config.decoupled:
            requests = [request_of(tensors, info) for tensors, info in zip(own, infos)]
            return run_decoupled(self, segment, batch, requests, emit)
        watch = emit.watch(batch) if emit is not None else None
        requests = [
            request_of(tensors, info, None if watch is None else watch.flag(k))
            for k, (tensors, info) in enumerate(zip(own, infos))
        ]
        started = time.perf_counter()
        try:
            responses = self.execute(requests)
        except Exception as exc:  # noqa: BLE001 - the model's error fails this batch's requests, never the worker
            message = f"{type(exc).__name__}: {exc}"
            log.warning("model %s: execute raised %s", self.config.name, message)
            return [failed(message, pb_utils.http_status(exc))] * len(requests), time.perf_counter() - started
        finally:
            if emit is not None:
                emit.unwatch(batch)
        compute_s = time.perf_counter() - started
        if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
            got = f"{len(responses)} responses" if isinstance(responses, (list, tuple)) else repr(type(responses))
            message = f"model {self.config.name!r}: execute returned {got} for {len(requests)} requests"
            return [failed(message, 500)] * len(requests), compute_s
        return write_answers(segment, batch, self.config, responses, infos), compute_s


def write_answers(
    segment: Segment,
    batch: messages.Batch,
    config: ModelConfig,
    responses: list[Any],
    infos: tuple[messages.RequestInfo, ...],
) -> list[Answer]:
    """Each response's outputs into the slot, one request after the other; an error stays with its request."""
    answers: list[Answer] = []
    offset = batch.output_offset
    for info, response in zip(infos, responses):
        try:
            refs, offset = write_tensors(segment, batch.slot_index, offset, response_tensors(config, info, response))
            parameters = response_parameters(config, response)
        except AnswerError as exc:
            answers.append(failed(str(exc), exc.status))
            continue
        answers.append(answered(refs, parameters))
    return answers


def run_python(
    config: ModelConfig,
    model: PythonModel,
    feeds: Sequence[dict[str, np.ndarray]],
    infos: Sequence[messages.RequestInfo],
) -> list[Outcome]:
    requests = [request_of(model_shaped(config, feed), info) for feed, info in zip(feeds, infos)]
    try:
        responses = model.execute(requests)
    except Exception as exc:  # noqa: BLE001 - a model's execute may raise anything: that batch's error, never the worker's
        return [AnswerError(f"{type(exc).__name__}: {exc}", pb_utils.http_status(exc))] * len(feeds)
    if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
        return [AnswerError(f"model {config.name!r}: execute did not return one response per request", 500)] * len(
            feeds
        )
    outcomes: list[Outcome] = []
    for info, response in zip(infos, responses):
        try:
            outputs = Outputs((name, array) for name, _, array in response_tensors(config, info, response))
            outputs.parameters = response_parameters(config, response)  # (a BLS caller's response has them)
        except AnswerError as exc:
            outcomes.append(exc)
            continue
        outcomes.append(outputs)
    return outcomes


def run_sample_python(
    config: ModelConfig, model: PythonModel, sample: WarmupSample, one: dict[str, np.ndarray]
) -> list[str]:
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
