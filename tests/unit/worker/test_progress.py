"""worker/progress.py: the calls into model code a heartbeat carries, and their bounds (a model's parameter,
else the flag's default; execute's default only for Python models and ensembles)."""
from __future__ import annotations

import pytest

from ringserve.common.errors import ConfigError
from ringserve.common.repository.call_bounds import read_call_bounds
from ringserve.common.repository.config import ModelConfig
from ringserve.common.settings import Settings
from ringserve.worker.progress import Progress


def config(backend: str | None = None, **parameters: str) -> ModelConfig:
    doc: dict = {"name": "m", "max_batch_size": 0, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
                 "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}
    doc.update({"backend": backend} if backend else {"platform": "onnxruntime_onnx"})
    if parameters:
        doc["parameters"] = {k: {"string_value": v} for k, v in parameters.items()}
    return ModelConfig.from_json("m", doc, version=1, model_path="/repo/m/1/model.onnx")


def progress() -> Progress:
    calls = Progress()
    calls.configure(Settings(model_repository="/m", load_timeout_s=60, execute_timeout_s=20, finalize_timeout_s=5))
    return calls


def test_a_models_parameter_overrides_the_flag_and_executes_default_bounds_python_models_only() -> None:
    calls = progress()
    assert calls.bound_s(config("python"), "execute") == 20.0
    assert calls.bound_s(config(), "execute") == 0.0  # ONNX: its own parameter only
    assert calls.bound_s(config(execute_timeout_s="2.5"), "execute") == 2.5
    assert calls.bound_s(config("python", execute_timeout_s="0"), "execute") == 0.0  # unbounded
    assert calls.bound_s(config(), "load") == 60.0 and calls.bound_s(config("python"), "finalize") == 5.0


def test_a_running_call_is_recorded_with_its_start_and_bound_nested_calls_too_and_dropped_when_it_returns() -> None:
    calls = progress()
    with calls.call(config("python"), "execute"):
        with calls.call(config(), "load"):
            running = calls.running()
        with calls.call(config(), "execute"):  # unbounded: not recorded
            assert len(calls.running()) == 1
    assert [(hook, model, bound) for hook, model, _, bound in running] == [("execute", "m", 20.0), ("load", "m", 60.0)]
    assert calls.running() == []
    with pytest.raises(RuntimeError), calls.call(config("python"), "execute"):
        raise RuntimeError
    assert calls.running() == []


@pytest.mark.parametrize("value", ["-1", "soon", "nan", True])
def test_a_bound_that_is_no_number_of_seconds_is_refused_at_config_load(value) -> None:
    with pytest.raises(ConfigError, match="execute_timeout_s"):
        read_call_bounds({"execute_timeout_s": {"string_value": value}})
    with pytest.raises(ConfigError, match="load_timeout_s"):
        config("python", load_timeout_s="-3")
