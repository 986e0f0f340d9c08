"""The wheel, as a new user installs it: one import name, and no working directory can shadow it.

Builds the wheel from this checkout, installs it into a new virtualenv outside the checkout
(its dependencies come from the test environment's site-packages through a .pth line, so
nothing is downloaded), and runs the installed `ringserve` from a directory that holds
hostile `worker/`, `common/`, `gateway/` and `ringserve/` packages: each of them, if it ever
ran, would leave a marker file.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
import pytest

from tests.support.stack import free_port, poll_for, shm_segments

REPO_ROOT = Path(__file__).resolve().parents[2]
HOSTILE_PACKAGES = ("worker", "common", "gateway", "shm", "ringserve", "ringserve/gateway", "ringserve/worker")

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin/ of a new virtualenv with the wheel of this checkout installed."""
    work = tmp_path_factory.mktemp("packaging")
    source = work / "source"  # a copy: setuptools builds in the source tree (build/, *.egg-info)
    shutil.copytree(REPO_ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "models", "*.egg-info", "__pycache__", ".pytest_cache", "results", ".peers"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work / "dist"), str(source)],
                   check=True, timeout=600, cwd=work)
    (wheel,) = (work / "dist").glob("ringserve-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    before = set(os.listdir(site))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, timeout=300)
    added = set(os.listdir(site)) - before
    assert {name for name in added if not name.endswith(".dist-info")} == {"ringserve"}, added
    # The dependencies (numpy, onnxruntime, ...) from the test environment, after the venv's own.
    (site / "zz-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin"


def hostile_directory(path: Path) -> Path:
    """A directory whose packages shadow ours if the working directory ever goes on sys.path."""
    for package in HOSTILE_PACKAGES:
        folder = path / package
        folder.mkdir(parents=True, exist_ok=True)
        marker = path / f"ran-{package.replace('/', '.')}"
        code = f"open({str(marker)!r}, 'w').close()\nraise SystemExit('hostile {package} ran')\n"
        (folder / "__init__.py").write_text(code)
        (folder / "__main__.py").write_text(code)
    return path


def test_the_wheel_installs_one_import_name_and_nothing_else(installed: Path) -> None:
    code = ("import importlib.metadata as m, json; d = m.distribution('ringserve'); "
            "print(json.dumps([str(f) for f in d.files]))")
    files = json.loads(subprocess.run([str(installed / "python"), "-c", code], check=True, capture_output=True,
                                      text=True, cwd=installed).stdout)
    top_level = {f.split("/")[0] for f in files if not f.startswith("..") and ".dist-info/" not in f}
    assert top_level == {"ringserve"}
    assert not [f for f in files if f.startswith(("ringserve/bench", "ringserve/tests"))]


def test_the_installed_server_serves_from_a_hostile_directory_and_stops_clean(installed: Path, tmp_path: Path) -> None:
    cwd = hostile_directory(tmp_path / "hostile")
    ringserve = str(installed / "ringserve")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    subprocess.run([ringserve, "demo-models", "models"], check=True, cwd=cwd, env=env, timeout=120)
    port = free_port()
    process = subprocess.Popen([ringserve, "serve", "--model-repository", "models", "--port", str(port),
                                "--grpc-port", "0", "--log-level", "WARNING"], cwd=cwd, env=env)
    url = f"http://127.0.0.1:{port}"
    children: set[int] = set()
    try:
        poll_for(lambda: _ready(url, process), 90, 0.1, "the installed server to be ready")

        # The gateway, a worker (lane) per demo model (--lanes model: encoder, mlp and normalize each run in
        # a process of their own) and, once they are up, the warm spare.
        def commands() -> list[list[str]]:
            tree = psutil.Process(process.pid).children(recursive=True)
            children.update(p.pid for p in tree)
            return [p.cmdline() for p in tree if "ringserve." in " ".join(p.cmdline())]

        def all_five() -> list[list[str]] | None:
            found = commands()
            return found if len(found) == 5 else None

        started = poll_for(all_five, 60, 0.1, "the gateway, the three lanes and the warm spare")
        assert sorted(c[c.index("-m") + 1] + (" spare" if "--spare-device" in c else "") for c in started) == [
            "ringserve.gateway", "ringserve.worker", "ringserve.worker", "ringserve.worker",
            "ringserve.worker spare"], started
        assert sorted(list(w["models"]) for w in _get_json(f"{url}/admin/status")["workers"]) == [
            ["encoder"], ["mlp"], ["normalize"]]
        assert all(c[0].startswith(str(installed)) and "-P" in c for c in started), started
        x = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32)
        status, answer = _post(f"{url}/v2/models/mlp/infer", {"inputs": [
            {"name": "x", "shape": [2, 512], "datatype": "FP32", "data": x.ravel().tolist()}]})
        assert status == 200, answer
        session = ort.InferenceSession(str(cwd / "models/mlp/1/model.onnx"), providers=["CPUExecutionProvider"])
        (output,) = answer["outputs"]
        np.testing.assert_allclose(np.array(output["data"], np.float32).reshape(output["shape"]),
                                   session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert not sorted(p.name for p in cwd.glob("ran-*")), "a package of the working directory ran"
    poll_for(lambda: not [p for p in children if psutil.pid_exists(p)] and not shm_segments(process.pid), 10,
             what="the children and the ring to be gone")


def _ready(url: str, process: subprocess.Popen) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"ringserve exited with {process.returncode} before it was ready")
    try:
        return _get(f"{url}/v2/health/ready") == 200
    except OSError:
        return False


def _get(url: str) -> int:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status


def _get_json(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _post(url: str, doc: dict) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=json.dumps(doc).encode(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
