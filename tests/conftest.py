from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ringserve.common.repository.demo import build_demo_models

from .support.stack import Stack, shm_segments

# Triton's QA files, vendored unchanged (tests/triton_qa/README.md): their `*_test.py` modules need
# Triton's env (NO_BATCHING, ...) at import and are run by tests/integration/test_triton_sequence_qa.py,
# never collected by pytest itself.
collect_ignore = ["triton_qa"]


@pytest.fixture(scope="session")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("models")
    build_demo_models(repo)
    return repo


@pytest.fixture
def start_stack():
    """Start real stacks; each is stopped in finally and must leave no process or segment."""
    stacks: list[Stack] = []

    def start(repo: Path, *args: str, env: dict[str, str] | None = None) -> Stack:
        stack = Stack(repo, *args, env=env)
        stacks.append(stack)
        return stack.start()

    try:
        yield start
    finally:
        for stack in stacks:
            try:
                stack.stop()
            finally:
                stack.kill_everything()
        for stack in stacks:
            stack.assert_nothing_left()


@pytest.fixture(scope="session", autouse=True)
def no_segments_left_behind():
    """Segments of every stack this session started, and of unit tests, must be gone at the end.

    Only our own: other ringserve servers and test sessions on the machine may be running.
    """
    yield
    leaked = [name for pid in Stack.started_pids for name in shm_segments(pid)]
    leaked += [name for name in shm_segments() if f"-test-{os.getpid()}-" in name]
    assert not leaked, f"the test session leaked shared-memory segments: {sorted(leaked)}"


def copy_model(repo: Path, src: str, dst: str, target: Path) -> Path:
    shutil.copytree(repo / src, target / dst)
    return target / dst
