"""The image's start-up without the image (no base image can be pulled here): the Dockerfile's own
RUN that builds the demo models, its ENTRYPOINT's flags and its HEALTHCHECK command, run against a
real stack on this machine."""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stack import free_port, poll_for, running_stack
from ..unit.cli.test_docker import DOCKERFILES, exec_form, image_settings, stages

pytestmark = pytest.mark.integration


def healthcheck(argv: list[str], image_port: int, port: int) -> int:
    """The HEALTHCHECK command with the image's port swapped for `port` (the test's free one)."""
    code = argv[2].replace(f":{image_port}/", f":{port}/")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30).returncode


def test_the_images_demo_models_entrypoint_and_healthcheck_serve(tmp_path: Path):
    final = stages(DOCKERFILES["cpu"])[-1]
    settings = image_settings(final)
    (demo,) = [shlex.split(part) for run in final.all("RUN") for part in run.split("&&") if "demo-models" in part]
    repo = tmp_path / "models"
    bin_dir = Path(sys.executable).parent
    subprocess.run([str(bin_dir / demo[0]), *demo[1:-1], str(repo)], check=True, timeout=120)
    argv = exec_form(final.all("HEALTHCHECK")[0].partition("CMD ")[2])
    entrypoint = exec_form(final.last("ENTRYPOINT"))

    # Nothing listening yet: unhealthy.
    assert healthcheck(argv, settings.port, free_port()) != 0
    # The entrypoint's flags, then what a test must change: its own ports and the models' directory
    # (the CLI takes the last of a repeated flag, as `docker run IMAGE --flag` relies on).
    overrides = ["--model-repository", str(repo), "--metrics-port", str(free_port()), "--grpc-port", "0"]
    with running_stack(repo, *entrypoint[2:], *overrides) as stack:
        poll_for(lambda: healthcheck(argv, settings.port, stack.port) == 0, 30, 0.2, "the healthcheck to pass")
        assert stack.post("/v2/models/mlp/infer", {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32",
                                                               "data": [0.0] * 512}]})[0] == 200
