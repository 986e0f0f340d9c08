"""worker/python/model_namespace.py: each model.py's sibling modules are its own, as in Triton's one process per model."""
from __future__ import annotations

import sys
import textwrap
import threading
from pathlib import Path

from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.worker.python import model_namespace
from ringserve.worker.python.python_model import PythonModel, import_model_py

# Written as Triton's docs write a model.py that ships helpers beside it.
MODEL_PY = """
import triton_python_backend_utils as pb_utils
import utils
from utils import WHO as IMPORTED_WHO
from .utils import WHO as RELATIVE_WHO
from .helpers.names import NAME


class TritonPythonModel:
    def initialize(self, args):
        import utils as later
        self.later = later.WHO

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]


def who_in_a_thread():
    import utils
    return utils.WHO
"""


def model_folder(root: Path, name: str, who: str) -> Path:
    version = root / name / "1"
    (version / "helpers").mkdir(parents=True)
    (version / "model.py").write_text(MODEL_PY)
    (version / "utils.py").write_text(f"WHO = {who!r}\n")
    (version / "helpers" / "__init__.py").write_text("")
    (version / "helpers" / "names.py").write_text("import utils\nNAME = 'helpers of ' + utils.WHO\n")
    return version / "model.py"


def test_two_models_with_a_utils_py_each_import_their_own_by_every_spelling(tmp_path: Path) -> None:
    a, b = import_model_py(model_folder(tmp_path, "a", "A")), import_model_py(model_folder(tmp_path, "b", "B"))

    assert (a.utils.WHO, a.IMPORTED_WHO, a.RELATIVE_WHO, a.NAME) == ("A", "A", "A", "helpers of A")
    assert (b.utils.WHO, b.IMPORTED_WHO, b.RELATIVE_WHO, b.NAME) == ("B", "B", "B", "helpers of B")
    assert "utils" not in sys.modules and a.utils is sys.modules[f"{model_namespace.package_of(a)}.utils"]
    seen: list[str] = []
    threads = [threading.Thread(target=lambda m=m: seen.append(m.who_in_a_thread())) for m in (a, b, a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == ["A", "A", "B", "B"]


def test_an_installed_module_wins_over_a_sibling_of_its_name_as_on_tritons_sys_path(tmp_path: Path) -> None:
    path = model_folder(tmp_path, "m", "M")
    (path.parent / "json.py").write_text("SHADOW = True\n")
    (path.parent / "model.py").write_text(MODEL_PY + "\nimport json\n")

    module = import_model_py(path)

    assert not hasattr(module.json, "SHADOW") and module.json is sys.modules["json"]


def test_a_load_runs_its_files_again_and_an_unload_forgets_them(tmp_path: Path) -> None:
    path = model_folder(tmp_path, "m", "first")
    config = ModelConfig(name="m", max_batch_size=0, inputs=(TensorConfig("x", "FP32", (1,)),),
                         outputs=(TensorConfig("y", "FP32", (1,)),), dynamic_batching=None, version=1,
                         model_path=str(path), platform="", extra={"backend": "python"})
    first = PythonModel(config)
    assert first.instance.later == "first"
    (path.parent / "utils.py").write_text("WHO = 'second'\n")

    second = PythonModel(config)
    first.close()

    assert second.instance.later == "second"
    assert not [n for n in sys.modules if n.startswith(first.package)]
    assert f"{second.package}.utils" in sys.modules
    second.close()
