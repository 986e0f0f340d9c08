"""gateway/kserve/repository.py against a fake dispatcher (a real catalog): index states, unload, load (config swap,
quarantine lift)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ringserve.common.repository.demo import build_demo_models
from ringserve.common.repository.scan import scan_repository
from ringserve.gateway.dispatch.catalog import Catalog
from ringserve.gateway.core.errors import BadRequest, LoadFailed, ModelNotFound, Unavailable
from ringserve.gateway.kserve.repository import Repository, check_model_name


class FakeDispatcher:
    def __init__(self, configs) -> None:
        self.quarantined: dict[str, str] = {}
        self.catalog = Catalog(configs, 1 << 20)  # a real one: the config swap is its
        self.queues = self.catalog.queues
        self.no_worker: set[str] = set()
        self.lifted: list[str] = []  # quarantines lifted, here and (the dispatcher's job) at the supervisor

    def lift_quarantine(self, model: str) -> bool:
        if self.quarantined.pop(model, None) is None:
            return False
        self.lifted.append(model)
        return True

    def check_available(self, model: str) -> None:
        if model in self.quarantined:
            raise Unavailable(f"model {model!r} is quarantined: {self.quarantined[model]}")
        if model in self.no_worker:
            raise Unavailable(f"no inference worker is ready for model {model!r}")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    build_demo_models(tmp_path)
    return tmp_path


@pytest.fixture
def repository(repo: Path) -> Repository:
    configs = scan_repository(repo).defaults()
    return Repository(str(repo), configs, FakeDispatcher(configs))


def states(repository: Repository) -> dict[str, tuple[str, str]]:
    return {e["name"]: (e["state"], e["reason"]) for e in repository.index(ready_only=False)}


def test_index_says_why_a_model_is_unavailable(repository: Repository, repo: Path):
    repository.dispatcher.quarantined["mlp"] = "3 crashes"
    repository.dispatcher.no_worker.add("encoder")
    (repo / "late" / "1").mkdir(parents=True)

    got = states(repository)

    assert got["mlp"] == ("UNAVAILABLE", "model 'mlp' is quarantined: 3 crashes")
    assert got["encoder"] == ("UNAVAILABLE", "no inference worker is ready for model 'encoder'")
    assert got["late"][0] == "UNAVAILABLE" and "added to the repository after the server started" in got["late"][1]
    assert repository.index(ready_only=True) == []


def test_unload_then_load_lifts_the_unload_and_a_quarantine(repository: Repository):
    repository.unload("mlp")
    repository.dispatcher.quarantined["mlp"] = "poison"
    assert states(repository)["mlp"][0] == "UNAVAILABLE"

    asyncio.run(repository.load("mlp", {}))

    assert states(repository)["mlp"] == ("READY", "")
    assert "mlp" not in repository.dispatcher.quarantined
    assert repository.dispatcher.lifted == ["mlp"]  # the supervisor's lifts too (test_dispatch pins that)


def test_load_swaps_the_config_and_a_fresh_queue_when_config_json_changed(repository: Repository, repo: Path):
    doc = json.loads((repo / "mlp" / "config.json").read_text())
    doc["dynamic_batching"]["max_queue_delay_microseconds"] = 500
    (repo / "mlp" / "config.json").write_text(json.dumps(doc))
    old_queue = repository.dispatcher.queues["mlp"]

    asyncio.run(repository.load("mlp", {}))

    assert repository.configs["mlp"].dynamic_batching.max_queue_delay_us == 500
    assert repository.dispatcher.queues["mlp"] is not old_queue
    assert repository.dispatcher.queues["mlp"].config is repository.configs["mlp"]


@pytest.mark.parametrize("change, says", [
    (lambda repo: (repo / "mlp" / "2").mkdir() or (repo / "mlp" / "2" / "model.onnx").write_bytes(
        (repo / "mlp" / "1" / "model.onnx").read_bytes()), r"its version changed on disk \(1 -> 2\)"),
    (lambda repo: (repo / "mlp" / "config.json").write_text("{"), "cannot be read as JSON"),
])
def test_load_refuses_what_the_workers_cannot_serve_yet(repository: Repository, repo: Path, change, says):
    change(repo)
    with pytest.raises(LoadFailed, match=says):
        asyncio.run(repository.load("mlp", {}))


def test_load_and_unload_of_unknown_models(repository: Repository, repo: Path):
    with pytest.raises(ModelNotFound):
        repository.unload("ghost")
    for name in TRITON_VALID_NAMES:  # qa/L0_input_validation: a valid name that is not there
        with pytest.raises(ModelNotFound, match="failed to poll from model repository"):
            asyncio.run(repository.load(name, {}))
    with pytest.raises(BadRequest, match="must not contain path traversal characters"):
        asyncio.run(repository.load("../etc", {}))
    with pytest.raises(ModelNotFound) as unloaded:  # Triton's unload checks no name: it is just not served
        repository.unload("../etc")
    assert "path traversal" not in str(unloaded.value)
    (repo / "late" / "1").mkdir(parents=True)
    with pytest.raises(LoadFailed, match="added to the repository after the server started"):
        asyncio.run(repository.load("late", {}))


# Triton's qa/L0_input_validation ModelNameValidationTest: names that pass its traversal check, and
# those it refuses with "model name must not contain path traversal characters" or as empty.
TRITON_VALID_NAMES = ["model123", "model.version1", "...", "..my_model", "model..1", "model....1"]
TRITON_TRAVERSAL_NAMES = ["../etc", "a/../b", "../../etc/passwd", "../../../../etc", "model/..", "..", "/etc/passwd",
                          "model/subdir", "model/", " ..", ".. "]
TRITON_EMPTY_NAMES = ["", " ", "   ", "\t", "\n", "\r", "\f", "\v", " \t \n "]


@pytest.mark.parametrize("name", ["mlp", "model-2.onnx_v1", "A", ".hidden", "a b", "-x", *TRITON_VALID_NAMES])
def test_every_name_triton_accepts_is_valid(name):
    check_model_name(name)


@pytest.mark.parametrize("name", [*TRITON_TRAVERSAL_NAMES, ".", " . ", "a\x00b"])
def test_a_name_that_leaves_the_repository_is_refused_in_tritons_words(name):
    with pytest.raises(BadRequest) as refused:
        check_model_name(name)
    assert str(refused.value).startswith(f"invalid model name '{name}', model name must not contain path traversal "
                                         "characters")


@pytest.mark.parametrize("name", TRITON_EMPTY_NAMES)
def test_an_empty_name_is_refused_in_tritons_words(name):
    with pytest.raises(BadRequest, match="Model name cannot be empty. Please enter a valid name to deploy."):
        check_model_name(name)
