"""The import layering: import-linter's contracts (pyproject.toml; the fast paths' fence in
importlinter-fast-paths.ini), and no import circle in the gateway."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import ringserve.gateway

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = Path(ringserve.gateway.__path__[0])
PACKAGE = "ringserve.gateway"


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).parent / "lint-imports"

    run = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)

    assert run.returncode == 0, f"lint-imports exited {run.returncode}:\n{run.stdout}\n{run.stderr}"


def test_only_the_fast_paths_import_private_names_of_uvicorn_and_grpcio():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    config = ROOT / "importlinter-fast-paths.ini"

    run = subprocess.run([str(lint_imports), "--no-cache", "--config", str(config)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)

    assert run.returncode == 0, f"lint-imports exited {run.returncode}:\n{run.stdout}\n{run.stderr}"
    assert "2 kept" in run.stdout


def module_name(path: Path) -> str:
    """gateway/dispatch/scheduler.py -> 'dispatch.scheduler' (its name under ringserve.gateway)."""
    return ".".join(path.relative_to(GATEWAY).with_suffix("").parts)


def gateway_imports(path: Path) -> set[str]:
    """Every gateway module the file imports, wherever the import is (`if TYPE_CHECKING:` and
    function bodies included), as names under ringserve.gateway ('dispatch.scheduler')."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith(PACKAGE + ".")}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: the gateway imports absolutely (from ringserve.gateway.x.y import z)"
            base = node.module or ""
            if base.startswith(PACKAGE + "."):
                found.add(base)
    return {name[len(PACKAGE) + 1:] for name in found}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph, as the modules along it, or None."""
    state: dict[str, str] = {}  # module -> "open" while on the path, "done" after
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == "open":
                return path[path.index(imported):] + [imported]
            if imported not in state and (cycle := visit(imported)) is not None:
                return cycle
        state[module] = "done"
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def test_no_gateway_module_imports_one_that_imports_it_back():
    graph = {module_name(path): gateway_imports(path) for path in GATEWAY.rglob("*.py")}
    assert "batching.slots" in graph["dispatch.scheduler"]  # (the parser sees the imports)

    cycle = find_cycle(graph)

    assert cycle is None, "import circle in the gateway: " + " -> ".join(cycle)


def test_the_circle_finder_finds_a_circle_through_several_modules():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_folder_of_the_gateway_holds_more_than_twelve_modules():
    folders = {path.parent for path in GATEWAY.rglob("*.py")}
    crowded = {str(folder.relative_to(GATEWAY.parent)): n for folder in folders
               if (n := len([p for p in folder.glob("*.py") if p.name != "__init__.py"])) > 12}

    assert len(folders) >= 8 and not crowded, crowded


def test_every_gateway_folder_says_what_it_holds():
    """Each package's __init__ docstring is its map: it names every module of its folder."""
    for init in GATEWAY.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        missing = [p.stem for p in init.parent.glob("*.py") if p.name != "__init__.py" and p.stem not in doc]
        assert not missing, f"{init.relative_to(GATEWAY.parent)}'s docstring names no {missing}"


# -- the whole product: no import circle (type-only imports counted) -----------------------------------------
PRODUCT_FOLDERS = ("gateway", "worker", "common", "shm", "supervision", "cli")
PRODUCT_FILES = ("supervisor.py", "tritonserver.py")
# Circles left, each through imports made only for annotations (`if TYPE_CHECKING:`). None now: a module that
# its caller hands itself to names what it reads as a Protocol (common/repository/kinds.py: KindedConfig,
# warmup.py: WarmupTarget, worker/requests.py: CancelFlags) instead of importing the caller back. This set may
# only shrink: it stays empty.
TYPE_ONLY_CIRCLES: set[frozenset[str]] = set()


def product_module(path: Path) -> str:
    """worker/loop.py -> 'worker.loop'; a package's __init__.py -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_imports(path: Path, modules: set[str]) -> set[str]:
    """Every product module the file imports, absolutely (ringserve.x.y) or relatively, anywhere in it."""
    me = product_module(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name[len("ringserve."):] for alias in node.names if alias.name.startswith("ringserve.")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if package else []
                module = ".".join([*base, *([node.module] if node.module else [])])
            elif (node.module or "").startswith("ringserve."):
                module = node.module[len("ringserve."):]
            else:
                continue
            for alias in node.names:  # `from . import x` names a module; `from .m import f` names m
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module)
    return {m for m in found if m in modules and m != me}


def test_no_product_module_imports_one_that_imports_it_back():
    paths = [p for folder in PRODUCT_FOLDERS for p in (ROOT / folder).rglob("*.py")]
    paths += [ROOT / name for name in PRODUCT_FILES]
    modules = {product_module(p) for p in paths}
    graph = {product_module(p): product_imports(p, modules) for p in paths}
    assert "worker.threads" in graph["worker.loop"] and "common.messages" in graph["gateway.dispatch.link"]

    circles = []
    while (cycle := find_cycle(graph)) is not None:  # each circle once: drop its closing edge, look again
        circles.append(frozenset(cycle))
        graph[cycle[-2]].discard(cycle[-1])

    unlisted = [sorted(c) for c in circles if c not in TYPE_ONLY_CIRCLES]
    assert not unlisted, f"import circles: {unlisted}"
    gone = [sorted(c) for c in TYPE_ONLY_CIRCLES if c not in circles]
    assert not gone, f"no longer circles: {gone}; take them out of TYPE_ONLY_CIRCLES"
