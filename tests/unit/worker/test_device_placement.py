"""Where sessions run: CUDA provider options per worker and per model, CPU thread split (no GPU needed)."""
from __future__ import annotations

import argparse

import pytest

from ringserve.cli import parse_gpus
from ringserve.common.repository.batching import DynamicBatching
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.common.settings import Settings
from ringserve.worker.session import CPU, CUDA, cuda_options, model_providers, model_parameters

from tests.support.models import session_settings


def config(**extra) -> ModelConfig:
    return ModelConfig(name="m", max_batch_size=4, inputs=(TensorConfig("x", "FP32", (4,)),),
                       outputs=(TensorConfig("y", "FP32", (4,)),), dynamic_batching=DynamicBatching(),
                       version=1, model_path="/models/m/1/model.onnx", extra=extra)


SERVER = [(CUDA, cuda_options(session_settings(use_cuda=True, cuda_device_id=1, cuda_arena_extend_strategy="kSameAsRequested",
                                              cudnn_conv_algo_search="HEURISTIC"))), CPU]


def test_the_server_options_give_each_worker_its_device_and_the_cuda_options():
    assert SERVER[0] == (CUDA, {"device_id": "1", "arena_extend_strategy": "kSameAsRequested",
                                "cudnn_conv_algo_search": "HEURISTIC"})
    assert cuda_options(session_settings(use_cuda=True)) == {"device_id": "0"}  # ORT's defaults otherwise


def test_a_model_overrides_its_device_and_options_with_tritons_parameters():
    c = config(parameters={"cudnn_conv_algo_search": {"string_value": "2"},
                           "arena_extend_strategy": {"string_value": "0"},
                           "gpu_mem_limit": {"string_value": "1073741824"}})
    providers = model_providers(c, model_parameters(c), SERVER, device_id=3)
    assert providers == [(CUDA, {"device_id": "3", "arena_extend_strategy": "kNextPowerOfTwo",
                                 "cudnn_conv_algo_search": "DEFAULT", "gpu_mem_limit": "1073741824"}), CPU]
    assert model_providers(c, model_parameters(c), [CPU], device_id=3) == [CPU]  # no CUDA: nothing to place


def test_a_kind_cpu_model_stays_on_the_cpu_where_cuda_works():
    c = config(instance_group=[{"count": 1, "kind": "KIND_CPU"}])
    assert model_providers(c, {}, SERVER) == [CPU]


@pytest.mark.parametrize("workers, standby, gateways, cpus, threads", [
    (1, 0, 1, 16, 15), (4, 0, 1, 16, 3), (2, 1, 1, 16, 5), (1, 0, 1, 2, 1), (8, 0, 1, 4, 1),
    (1, 0, 0, 16, 12),  # auto: 4 gateways on 16 CPUs
    (1, 0, 0, 2, 1), (2, 0, 4, 16, 6)])
def test_cpu_threads_are_split_across_the_workers_leaving_a_cpu_for_each_gateway(
        monkeypatch, workers, standby, gateways, cpus, threads):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cpus)))
    settings = Settings(model_repository="/r", workers=workers, standby_workers=standby, gateways=gateways)
    assert settings.worker_intra_op_threads() == threads
    assert Settings(model_repository="/r", intra_op_threads=2).worker_intra_op_threads() == 2


def test_gpus_flag():
    assert parse_gpus("0,1") == (0, 1) and parse_gpus("2") == (2,)
    for bad in ("", "a", "-1", "0,,x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_gpus(bad)


@pytest.mark.parametrize("cpus, gateways", [(1, 1), (2, 1), (4, 1), (7, 1), (8, 2), (16, 4), (32, 8), (96, 8)])
def test_the_gateway_count_follows_the_cpus_unless_given(monkeypatch, cpus, gateways):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cpus)))
    assert Settings(model_repository="/r").gateway_count() == gateways
    assert Settings(model_repository="/r", gateways=3).gateway_count() == 3
