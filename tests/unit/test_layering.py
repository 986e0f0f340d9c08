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
