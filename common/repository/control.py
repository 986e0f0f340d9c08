"""Triton's model control: which models of the repository are served, and what a load may carry.

In explicit mode (`--model-control-mode explicit`) every process scans the served repository
(Settings.served_repository), a folder of the runtime dir with one entry per loaded model:

    <runtime>/repository/<m>  -> <repo>/<m>                     a plain load: a link to the model's folder
    <runtime>/repository/<m>  -> <runtime>/overrides/<m>.<n>/   a load with a `config` override or `file:` contents

An override folder holds config.json (the override: Triton's JSON form of its ModelConfig, which
common/repository/config.py reads) and, with `file:<version>/<name>` contents, those files alone (Triton's
rule: the override is then the whole model folder); without them, links to every other entry of the model's
folder. A change replaces one link with rename(2), so a scan that runs meanwhile sees the old entry or the new
one, never a half-made folder. What reads the served repository is unchanged: the workers' and the gateways'
scans, and the reload that replaces the workers without downtime (SIGHUP's, docs/architecture.md).

Poll mode needs no served folder: the repository itself is served, and the supervisor reloads when its
`fingerprint` changes (supervision/repository_poll.py).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringserve.common.errors import ConfigError
from ringserve.common.repository.scan import model_names, read_config_doc

log = logging.getLogger(__name__)

OVERRIDES_DIR = "overrides"  # in the runtime dir, beside the served repository
FILE_PREFIX = "file:"
_CONFIG_FILES = ("config.json", "config.pbtxt")


class LoadParameterError(ValueError):
    """A load's parameters that Triton refuses too; the message is Triton's."""


@dataclass(frozen=True)
class LoadRequest:
    """A repository load's parameters: Triton's `config` override and `file:` contents."""

    config: dict[str, Any] | None = None
    files: dict[str, bytes] = field(default_factory=dict)  # path within the model folder -> contents

    @property
    def overrides(self) -> bool:
        return self.config is not None or bool(self.files)


def _parameter_type(value: Any) -> str:
    """Triton's name of a parameter's type (TRITONSERVER_ParameterTypeString)."""
    if isinstance(value, bool):
        return "BOOL"
    if isinstance(value, int):
        return "INT"
    if isinstance(value, float):
        return "DOUBLE"
    if isinstance(value, bytes):
        return "BYTES"
    return "STRING"


def parse_load_parameters(params: Mapping[str, Any]) -> LoadRequest:
    """Triton's load parameters (core model_repository_manager.cc): `config`, a JSON string, and
    `file:<path>`, the contents (bytes over gRPC, base64 over HTTP). Anything else is refused."""
    config: dict[str, Any] | None = None
    files: dict[str, bytes] = {}
    for name, value in params.items():
        if name == "config" and isinstance(value, str):
            try:
                doc = json.loads(value)
            except json.JSONDecodeError as exc:
                raise LoadParameterError(f"Invalid config override: failed to parse the config JSON: {exc}") from None
            if not isinstance(doc, dict):
                raise LoadParameterError(
                    f"Invalid config override: the config must be a JSON object, got {type(doc).__name__}"
                )
            config = doc
        elif name.startswith(FILE_PREFIX):
            files[_file_path(name)] = _file_contents(name, value)
        else:
            raise LoadParameterError(f"Unrecognized load parameter '{name}' with type '{_parameter_type(value)}'")
    if files and config is None:
        raise LoadParameterError("Load parameter 'config' must be specified for model file override")
    return LoadRequest(config, files)


def _file_path(name: str) -> str:
    """The path of a `file:` parameter within the model folder; refused when it would leave it (Triton's check)."""
    relative = name[len(FILE_PREFIX) :]
    normalized = os.path.normpath(relative)
    if not relative or os.path.isabs(relative) or normalized == "." or normalized.split(os.sep)[0] == "..":
        raise LoadParameterError(
            f"Invalid file parameter '{name}' with normalized path '{normalized}' must stay within model directory."
        )
    return normalized


def _file_contents(name: str, value: Any) -> bytes:
    if isinstance(value, bytes):  # gRPC's bytes_param
        return value
    if isinstance(value, str):  # HTTP's JSON: base64, as tritonclient's http load_model sends it
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise LoadParameterError(f"File parameter '{name}' must have base64-encoded contents") from None
    raise LoadParameterError(f"File parameter '{name}' must have bytes type for its value")


class ServedRepository:
    """The folder of the models explicit mode serves (see the module's docstring); one per server.

    Written by the supervisor at the start (--load-model) and by the gateway that takes a load or an unload;
    read by every scan. Each change is one rename over a model's link.
    """

    def __init__(self, served: Path | str, repository: Path | str) -> None:
        self.served = Path(served)
        self.repository = Path(repository)
        self.overrides = self.served.parent / OVERRIDES_DIR
        self._serial = itertools.count()

    def create(self, names: Iterable[str]) -> list[str]:
        """An empty served repository, then a link for each of `names` ('*': every model); the names missing
        from the repository, which are not served."""
        shutil.rmtree(self.served, ignore_errors=True)
        shutil.rmtree(self.overrides, ignore_errors=True)
        self.served.mkdir(mode=0o700)
        self.overrides.mkdir(mode=0o700)
        names = list(names)
        if "*" in names:
            names = model_names(self.repository)
        missing = []
        for name in dict.fromkeys(names):
            if self.in_repository(name):
                self.link(name)
            else:
                missing.append(name)
        return missing

    def names(self) -> list[str]:
        """The models served now, sorted."""
        return sorted(p.name for p in self.served.iterdir()) if self.served.is_dir() else []

    def in_repository(self, name: str) -> bool:
        return (self.repository / name).is_dir()

    def link(self, name: str) -> None:
        """Serve `<repo>/<name>` as it is on disk."""
        self._point(name, self.repository.resolve() / name)

    def override(self, name: str, request: LoadRequest) -> None:
        """Serve `name` from an override folder: the `config` override, with the `file:` contents alone, or
        else beside the links to every other entry of the model's folder in the repository."""
        folder = self.overrides / f"{name}.{os.getpid()}.{next(self._serial)}"
        folder.mkdir(mode=0o700)
        try:
            if not request.files:
                source = self.repository.resolve() / name
                for entry in source.iterdir():
                    if entry.name not in _CONFIG_FILES:
                        (folder / entry.name).symlink_to(entry)
            for path, contents in request.files.items():
                if path in _CONFIG_FILES:
                    continue  # the `config` parameter is the config (Triton writes it over any config file)
                target = folder / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(contents)
            (folder / "config.json").write_text(json.dumps({**(request.config or {}), "name": name}))
        except OSError:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._point(name, folder)

    def remove(self, name: str) -> bool:
        """Stop serving `name`; False when it was not served."""
        entry = self.served / name
        if not entry.is_symlink():
            return False
        old = Path(os.readlink(entry))
        entry.unlink()
        self._drop_override(old)
        return True

    def ensemble_steps(self, name: str) -> list[str]:
        """The models an ensemble's steps name (Triton loads them with it); [] for any other model."""
        try:
            doc, _ = read_config_doc(self.served / name, name)
        except (ConfigError, OSError):
            return []
        scheduling = doc.get("ensemble_scheduling") if doc.get("platform") == "ensemble" else None
        steps = scheduling.get("step") if isinstance(scheduling, dict) else None
        if not isinstance(steps, list):
            return []
        return [s["model_name"] for s in steps if isinstance(s, dict) and isinstance(s.get("model_name"), str)]

    def _point(self, name: str, target: Path) -> None:
        entry = self.served / name
        old = Path(os.readlink(entry)) if entry.is_symlink() else None
        temporary = self.served.parent / f".{name}.{os.getpid()}.{next(self._serial)}.link"
        temporary.symlink_to(target, target_is_directory=True)
        os.replace(temporary, entry)  # one rename: a scan sees the old entry or the new one
        if old is not None and old != target:
            self._drop_override(old)
        log.info("model control: serving %s from %s", name, target)

    def _drop_override(self, target: Path) -> None:
        """An override folder no entry names any more (a worker that loaded from it holds its files open)."""
        if target.parent == self.overrides:
            shutil.rmtree(target, ignore_errors=True)


def fingerprint(repository: Path | str) -> dict[str, tuple[tuple[str, int, int], ...]]:
    """Model -> (path, mtime ns, size) of every file in its folder: what poll mode compares (Triton's poll
    compares the folder's and the config's modification times; a new weights file changes neither of those
    when it is written in place, so every file is looked at)."""
    found: dict[str, tuple[tuple[str, int, int], ...]] = {}
    try:
        names = model_names(Path(repository))
    except ConfigError:
        return found
    for name in names:
        folder = Path(repository) / name
        files = []
        for root, dirs, filenames in os.walk(folder, followlinks=True):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for filename in sorted(filenames):
                path = Path(root) / filename
                try:
                    stat = path.stat()
                except OSError:
                    continue
                files.append((str(path.relative_to(folder)), stat.st_mtime_ns, stat.st_size))
        found[name] = tuple(files)
    return found
