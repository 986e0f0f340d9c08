"""Each Python model's own module namespace, in a worker that may hold several of them.

Triton's stub (pb_stub.cc: ModelContext::StubSetup) is a process per model instance: it appends the
version folder and the model folder to sys.path and imports `<version>.model`, so a model.py may write
`from .utils import helper` (its package is the version folder) and `import utils` (the folder is on
sys.path). A ringserve worker holds several models in one interpreter (`--lanes shared`: every model),
where sys.path and sys.modules are shared: two models' `utils.py` would be one module, the first
imported. So here each load of a model.py gets a package of its own:

    _ringserve_models.<model>_<version>_<n>          __path__ = [version folder, model folder]
    _ringserve_models.<model>_<version>_<n>.model    the model.py
    _ringserve_models.<model>_<version>_<n>.utils    a sibling, however model.py imports it

- Relative imports (`from .utils import helper`) resolve in that package.
- Absolute imports of a sibling (`import utils`, `from utils import x`, `import helpers.sub`) made by the
  package's code go to the package's own module: every module of the package is executed with a
  `__builtins__` whose `__import__` maps a sibling's name to `<package>.<name>`. Chosen over swapping
  sys.modules entries around each call into model code: the mapping belongs to the module, not to a
  thread or a moment, so a model's own threads, a BLS call from one model into another, and a load on the
  loader thread while a batch runs each resolve to their own modules with no lock, and sys.modules never
  holds a bare `utils` that a second model could be handed.
- A name that is installed (numpy, json, a package on sys.path) wins over a sibling of the same name, as
  on Triton's sys.path, where the version folder comes last.
- Each load is a fresh package (n counts loads), as Triton's new stub process imports the files again;
  an unload forgets the package's modules.

The version folder is still appended to sys.path, as Triton's stub does, for code that imports by a
bare name without the import statement (`importlib.import_module("utils")`): that path is shared by the
worker's models, and the first model whose folder holds the name wins there.
"""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import re
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = "_ringserve_models"
_loads = itertools.count(1)
_namespaces: dict[str, Namespace] = {}  # package name -> its namespace
_lock = threading.Lock()
_import = builtins.__import__


class Namespace:
    """One load of one model.py: its package, and the `__builtins__` its modules run with."""

    def __init__(self, package: str, folders: list[str]) -> None:
        self.package = package
        self.folders = folders
        self._siblings: dict[str, bool] = {}  # top-level name -> is it this package's own module?
        self.builtins: dict[str, Any] = dict(vars(builtins))
        self.builtins["__import__"] = self.import_

    def import_(
        self,
        name: str,
        globals: dict[str, Any] | None = None,  # noqa: A002 - __import__'s own parameter names
        locals: dict[str, Any] | None = None,  # noqa: A002
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> ModuleType:
        """`__import__` for the package's modules: a sibling's absolute name is imported as the package's."""
        head = name.partition(".")[0]
        if level != 0 or not self.is_sibling(head):
            return _import(name, globals, locals, fromlist, level)
        module = _import(f"{self.package}.{name}", globals, locals, fromlist, 0)
        # With a fromlist __import__ returns the named module itself; without one, the top of the dotted
        # name, which is the sibling here (not the _ringserve_models root the dotted import returned).
        return module if fromlist else sys.modules[f"{self.package}.{head}"]

    def is_sibling(self, name: str) -> bool:
        known = self._siblings.get(name)
        if known is None:
            known = self._siblings[name] = self._find_sibling(name)
        return known

    def _find_sibling(self, name: str) -> bool:
        if not name or importlib.machinery.PathFinder.find_spec(name, self.folders) is None:
            return False
        return not _installed(name)


def _installed(name: str) -> bool:
    """Is `name` importable from outside every model's folder (the standard library, site-packages)?"""
    if name in sys.builtin_module_names or importlib.machinery.FrozenImporter.find_spec(name) is not None:
        return True
    folders = {folder for n in list(_namespaces.values()) for folder in n.folders}
    path = [entry for entry in sys.path if entry not in folders]
    return importlib.machinery.PathFinder.find_spec(name, path) is not None


class _ScopedLoader(importlib.abc.Loader):
    """A module of a model's package, executed with the package's `__builtins__` (its own imports)."""

    def __init__(self, loader: Any, namespace: Namespace) -> None:
        self.loader, self.namespace = loader, namespace

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__builtins__ = self.namespace.builtins  # type: ignore[attr-defined]
        self.loader.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # get_source (tracebacks), get_resource_reader, ...
        return getattr(self.loader, name)


class _PackageFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of models' packages as the path finder would, with their namespace's loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(ROOT + "."):
            return None
        namespace = _namespaces.get(".".join(fullname.split(".")[:2]))
        if namespace is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and isinstance(
            spec.loader, importlib.machinery.SourceFileLoader | importlib.machinery.SourcelessFileLoader
        ):
            spec.loader = _ScopedLoader(spec.loader, namespace)
        return spec


_finder = _PackageFinder()


def _package(name: str, folders: list[str]) -> ModuleType:
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = list(folders)
    module = importlib.util.module_from_spec(spec)
    module.__path__ = list(folders)
    return module


def _install() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    if ROOT not in sys.modules:
        sys.modules[ROOT] = _package(ROOT, [])


def package_name(model: str, version: str) -> str:
    token = re.sub(r"\W", "_", f"{model}_{version}")
    return f"{ROOT}.{token}_{next(_loads)}"


def import_model(path: Path) -> ModuleType:
    """A fresh import of `<model>/<version>/model.py` as `<its package>.model` (see the module's docstring)."""
    version_folder, model_folder = path.parent, path.parent.parent
    with _lock:
        _install()
        package = package_name(model_folder.name, version_folder.name)
        namespace = Namespace(package, [str(version_folder), str(model_folder)])
        _namespaces[package] = namespace
        sys.modules[package] = _package(package, namespace.folders)
        if str(version_folder) not in sys.path:  # (Triton's stub appends it: see the module's docstring)
            sys.path.append(str(version_folder))
    name = f"{package}.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        forget(package)
        raise ImportError(f"{path} cannot be imported as a Python module")
    spec.loader = _ScopedLoader(spec.loader, namespace)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses, pickle and typing look a class's module up there)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        forget(package)
        raise
    return module


def package_of(module: ModuleType) -> str:
    return module.__name__.rpartition(".")[0]


def forget(package: str) -> None:
    """An unloaded model's modules leave sys.modules (a later load imports its files again)."""
    with _lock:
        _namespaces.pop(package, None)
        for name in [n for n in list(sys.modules) if n == package or n.startswith(package + ".")]:
            del sys.modules[name]
