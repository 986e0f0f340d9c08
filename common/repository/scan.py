"""The model repository: which models and versions it holds, their configs auto-completed from ONNX.

Layout (Triton's): `<repo>/<model>/config.json` or `config.pbtxt` (optional; Triton's text
format, read into the same document by common/repository/pbtxt.py) and `<repo>/<model>/<N>/model.onnx`.
Whatever the config leaves out (max_batch_size, input, output) is read from the ONNX graph,
as Triton's ORT backend does, and what it declares is checked against the graph. The graph
is read without its weights (common/repository/onnx_graph.py).

Python models (`backend: "python"`, `<N>/model.py`) and ensembles (`platform: "ensemble"`) are
read here too (common/repository/kinds.py), but a Python model's config may be completed only by its
model.py's `auto_complete_config`, and model.py is imported by workers alone: the worker passes
`complete` (worker/python/python_model.py), and elsewhere (gateway, supervisor) such a config is
`awaiting` until a worker reports what it completed (READY's `configs`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringserve.common.errors import ConfigError
from ringserve.common.repository.config import ModelConfig, TensorConfig, naming_model
from ringserve.common.repository.kinds import MODEL_FILE, PYTHON_BACKEND, ModelKind, check_ensemble, kind_of
from ringserve.common.repository.lifecycle import Lifecycle
from ringserve.common.repository.onnx_graph import autocomplete, check_against_graph, read_graph
from ringserve.common.repository.pbtxt import PBTXT, read_config_text, read_pbtxt

# A worker's completion of a Python model's config document: (doc, model.py, model key) -> doc.
Complete = Callable[[dict[str, Any], Path, str], dict[str, Any]]

logger = logging.getLogger(__name__)


class AwaitingWorkerConfig(ConfigError):
    """A Python model's config that only its model.py's auto_complete_config completes, in a worker."""

    def __init__(self, name: str) -> None:
        super().__init__(
            name,
            "input",
            "its config declares no input or output: model.py's auto_complete_config "
            "completes it in a worker, and no worker has reported it yet",
        )


def _build(
    name: str,
    doc: Mapping[str, Any],
    model_path: Path,
    version: int,
    *,
    default_version: bool = True,
    unreadable_graph_ok: bool = False,
    source: str = "config.json",
    kind: ModelKind = "onnx",
    complete: Complete | None = None,
) -> ModelConfig:
    """The config of one version; `unreadable_graph_ok`: a config.json that declares every tensor is
    taken as written when the graph cannot be read, so that the runtime's load says what is wrong."""
    if kind != "onnx":
        return _build_other(name, doc, model_path, version, default_version, source, kind, complete)
    with naming_model(name):
        try:
            inputs, outputs = read_graph(model_path)
        except ConfigError:
            if not (unreadable_graph_ok and {"max_batch_size", "input", "output"} <= doc.keys()):
                raise
            inputs = outputs = None
        if inputs is not None:
            doc = autocomplete(doc, inputs, outputs)
    config = ModelConfig.from_json(
        name,
        doc,
        version=version,
        model_path=str(Path(model_path).absolute()),
        default_version=default_version,
        source=source,
    )
    if inputs is not None:
        check_against_graph(config, inputs, outputs, source)
    if any(t.label_filename for t in config.outputs):
        config = dataclasses.replace(
            config, outputs=tuple(_with_labels(t, Path(model_path).parent.parent, name) for t in config.outputs)
        )
    return config


MAX_LABEL_FILE_BYTES = 64 << 20  # a label file is read whole into every gateway and worker


def _with_labels(tensor: TensorConfig, model_dir: Path, name: str) -> TensorConfig:
    """The output with its labels read from <model dir>/<label_filename>, one a line as Triton reads them
    (std::getline: split at '\n', a last line without one counts, a '\r' stays)."""
    if not tensor.label_filename:
        return tensor
    path = model_dir / tensor.label_filename
    try:
        if model_dir.resolve() not in path.resolve().parents:
            raise OSError("it lies outside the model's directory")
        if path.stat().st_size > MAX_LABEL_FILE_BYTES:
            raise OSError(f"it is over {MAX_LABEL_FILE_BYTES} bytes")
        text = path.read_bytes().decode("utf-8")  # (read_text would turn "\r\n" into "\n": Triton keeps the "\r")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(name, "label_filename", f"output '{tensor.name}': {path} cannot be read: {exc}") from exc
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return dataclasses.replace(tensor, labels=tuple(lines))


def _build_other(
    name: str,
    doc: Mapping[str, Any],
    model_path: Path,
    version: int,
    default_version: bool,
    source: str,
    kind: ModelKind,
    complete: Complete | None,
) -> ModelConfig:
    """A Python model's config (completed by the worker's `complete`, else taken as written) or an
    ensemble's: no graph to read; the worker imports model.py, never this process."""
    if kind == "python" and complete is not None:
        key = name if default_version else f"{name}/{version}"
        doc = complete(dict(doc), Path(model_path), key)
    if kind == "python" and not (doc.get("input") and doc.get("output")):
        if complete is None:
            raise AwaitingWorkerConfig(name)
        raise ConfigError(
            name,
            "input",
            "its config declares no input or output, and its model.py's auto_complete_config (if any) added none",
        )
    return ModelConfig.from_json(
        name,
        doc,
        version=version,
        model_path=str(Path(model_path).absolute()),
        default_version=default_version,
        source=source,
    )


def _kind(doc: dict[str, Any], model_dir: Path, name: str) -> ModelKind:
    """The kind the config names, or (no platform nor backend) the one its version folders hold: a
    model.py and no model.onnx is a Python model, as Triton finds the backend of a config-less model."""
    if doc.get("platform") or doc.get("backend"):
        with naming_model(name):
            return kind_of(doc.get("platform") or "", doc.get("backend"))
    versions = [d for d in model_dir.iterdir() if d.name.isascii() and d.name.isdigit()]
    if any((d / "model.py").is_file() for d in versions) and not any((d / "model.onnx").is_file() for d in versions):
        doc["backend"] = PYTHON_BACKEND
        return "python"
    return "onnx"


def _versions_on_disk(model_dir: Path, kind: ModelKind = "onnx") -> dict[int, Path]:
    """Version -> its model file (an ensemble's: the version folder itself)."""
    filename = MODEL_FILE[kind]
    return {
        int(d.name): d / filename if filename else d
        for d in model_dir.iterdir()
        if d.name.isascii() and d.name.isdigit() and (d / filename if filename else d).exists()
    }


def _no_versions_found(model_dir: Path, kind: ModelKind = "onnx") -> str:
    """Why `model_dir` holds no version: what was found instead, and the layout that is expected."""
    filename = MODEL_FILE[kind] or ""
    expected = f"expected {model_dir}/<version>/{filename}, e.g. {model_dir}/1/{filename} (Triton's layout)"
    onnx_files = sorted(p.name for p in model_dir.glob("*.onnx" if kind == "onnx" else "*.py"))
    if onnx_files:
        return f"found {', '.join(onnx_files)} directly in {model_dir}, outside a version folder; {expected}"
    numbered = sorted(d.name for d in model_dir.iterdir() if d.is_dir() and d.name.isdigit())
    if numbered:
        return f"version folder(s) {', '.join(numbered)} hold no {filename}; {expected}"
    return f"no version folder; {expected}"


def read_config_doc(model_dir: Path, name: str) -> tuple[dict[str, Any], str]:
    """The model's config document and the file it came from (config.json when there is none)."""
    config_path = model_dir / "config.json"
    pbtxt_path = model_dir / PBTXT
    if pbtxt_path.exists():
        if config_path.exists():
            raise ConfigError(
                name,
                "config",
                f"{model_dir} holds both config.json and {PBTXT}; keep one of them "
                "(they are two spellings of the same config)",
            )
        return read_pbtxt(pbtxt_path, name), PBTXT
    if not config_path.exists():
        return {}, "config.json"
    text = read_config_text(config_path, name)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(name, "config.json", f"cannot be read as JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(name, "config.json", f"must hold a JSON object, got {type(doc).__name__}")
    return doc, "config.json"


def _served_versions(repo: Path, name: str) -> tuple[dict[str, Any], str, list[tuple[int, Path]], ModelKind]:
    """The config document, its file's name, the (version, model path) pairs its version_policy
    serves, ascending, and the model's kind."""
    model_dir = Path(repo) / name
    doc, source = read_config_doc(model_dir, name)
    kind = _kind(doc, model_dir, name)
    on_disk = _versions_on_disk(model_dir, kind)
    if not on_disk:
        raise ConfigError(name, "version", _no_versions_found(model_dir, kind))
    with naming_model(name):
        policy = Lifecycle.from_config_doc({k: v for k, v in doc.items() if k == "version_policy"}).version_policy
    chosen = policy.select(list(on_disk))
    if not chosen:
        raise ConfigError(
            name, "version_policy", f"{policy.to_json()} selects none of the versions on disk ({sorted(on_disk)})"
        )
    return doc, source, [(v, on_disk[v]) for v in chosen], kind


def load_model(repo: Path, name: str) -> ModelConfig:
    """Config of the default version of `<repo>/<name>`: the highest one its version_policy serves
    (AwaitingWorkerConfig for a Python model that only its model.py completes)."""
    doc, source, versions, kind = _served_versions(repo, name)
    version, model_path = versions[-1]
    config = _build(name, doc, model_path, version, source=source, kind=kind)
    logger.info("model %s: version %d, max_batch_size %d", name, version, config.max_batch_size)
    return config


def _looks_like_model(path: Path) -> bool:
    # A directory with no config.json (or config.pbtxt), numbered subdirectory or .onnx file is not a model
    # (e.g. __pycache__, notes/); one that has any of them and is broken should fail loudly,
    # as model.onnx placed beside config.json instead of in 1/ does.
    # A hidden directory is a model like any other (Triton serves '..my_model'); .git and its like
    # hold none of these.
    if not path.is_dir():
        return False
    return (
        (path / "config.json").exists()
        or (path / PBTXT).exists()
        or any(d.name.isdigit() for d in path.iterdir() if d.is_dir())
        or any(path.glob("*.onnx"))
    )


def model_names(repo: Path) -> list[str]:
    """The repository's models by name, sorted (each a directory that looks like a model)."""
    return [path.name for path in _model_dirs(repo)]


def _model_dirs(repo: Path) -> list[Path]:
    repo = Path(repo)
    if not repo.is_dir():
        raise ConfigError(None, "model_repository", f"{repo} is not a directory")
    paths = []
    for path in sorted(repo.iterdir()):
        if _looks_like_model(path):
            paths.append(path)
        else:
            logger.debug("skipping %s: not a model directory", path)
    return paths


@dataclass(frozen=True)
class RepositoryScan:
    """What a server serves from a repository: every version, and what could not be read."""

    versions: dict[str, tuple[ModelConfig, ...]]  # model -> served versions, ascending; the last is the default
    failed: dict[str, str]  # model key ('m' or 'm/2') -> why its config could not be built
    # model key -> why: a Python model's config only a worker completes (AwaitingWorkerConfig)
    awaiting: dict[str, str] = field(default_factory=dict)

    def defaults(self) -> dict[str, ModelConfig]:
        """model -> its default version (the highest one its version_policy serves)."""
        return {name: configs[-1] for name, configs in self.versions.items()}

    def all_versions(self) -> list[ModelConfig]:
        return [config for configs in self.versions.values() for config in configs]


def scan_repository(
    repo: Path, *, unreadable_graph_ok: bool = True, complete: Complete | None = None
) -> RepositoryScan:
    """Every served version of every model; one broken model or version is recorded, not fatal.

    A version whose file the config reader cannot parse, but whose config.json declares every
    tensor, is served as declared: the worker's runtime then fails to load it and says why
    (`unreadable_graph_ok=False`: it fails here, as --exit-on-error wants before any worker starts).
    Requests that name no version reach the highest version that could be built (as Triton
    serves the highest version that loaded). `complete`: a worker's completion of Python configs.
    """
    versions: dict[str, tuple[ModelConfig, ...]] = {}
    failed: dict[str, str] = {}
    awaiting: dict[str, str] = {}
    for path in _model_dirs(repo):
        name = path.name
        try:
            doc, source, chosen, kind = _served_versions(repo, name)
        except ConfigError as exc:
            failed[name] = str(exc)
            logger.error("model %s cannot be served: %s", name, exc)
            continue
        built: list[ModelConfig] = []
        for version, model_path in chosen:
            try:
                built.append(
                    _build(
                        name,
                        doc,
                        model_path,
                        version,
                        default_version=version == chosen[-1][0],
                        unreadable_graph_ok=unreadable_graph_ok,
                        source=source,
                        kind=kind,
                        complete=complete,
                    )
                )
            except AwaitingWorkerConfig as exc:
                awaiting[name if version == chosen[-1][0] else f"{name}/{version}"] = str(exc)
            except ConfigError as exc:
                failed[f"{name}/{version}"] = str(exc)
                logger.error("model %s version %d cannot be served: %s", name, version, exc)
        if not built:
            reasons = [failed.pop(f"{name}/{v}") for v, _ in chosen if f"{name}/{v}" in failed]
            if reasons:
                failed[name] = "; ".join(reasons)
            continue
        versions[name] = (*built[:-1], dataclasses.replace(built[-1], default_version=True))
        logger.info(
            "model %s: versions %s, max_batch_size %d",
            name,
            [c.version for c in built],
            versions[name][-1].max_batch_size,
        )
    _check_ensembles(versions, failed, awaiting)
    return RepositoryScan(versions, failed, awaiting)


def _check_ensembles(
    versions: dict[str, tuple[ModelConfig, ...]], failed: dict[str, str], awaiting: dict[str, str]
) -> None:
    """Each ensemble against the step models it names; one that does not fit them is failed."""
    defaults = {name: configs[-1] for name, configs in versions.items()}
    every = {(c.name, c.version): c for configs in versions.values() for c in configs}
    for name, configs in list(versions.items()):
        if configs[-1].kind != "ensemble":
            continue
        try:
            for config in configs:
                check_ensemble(config, defaults, every, pending=set(awaiting))
        except ConfigError as exc:
            failed[name] = str(exc)
            logger.error("model %s cannot be served: %s", name, exc)
            del versions[name]
