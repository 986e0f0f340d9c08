"""Triton's own generate-endpoint QA (qa/L0_http/generate_endpoint_test.py, vendored unchanged in tests/triton_qa/)
against ringserve: the generate stage of L0_http/test.sh, its 18 tests in one run against one server, serving
qa/python_models/generate_models (mock_llm, a decoupled Python model) on localhost:8000 in a network namespace
of its own (tests/support/triton_qa_runner.py)."""
from __future__ import annotations

import shutil

import pytest

from tests.support.netns import NoNamespace
from tests.support.triton_qa_models import QA
from tests.support.triton_qa_runner import run_case

pytestmark = [pytest.mark.integration, pytest.mark.triton_qa]


@pytest.mark.timeout(600)
def test_triton_s_generate_endpoint_qa_passes_against_ringserve(tmp_path):
    repo = tmp_path / "generate_models"
    shutil.copytree(QA / "python_models" / "generate_models", repo)
    try:
        result = run_case(repo, "L0_http/generate_endpoint_test.py", "GenerateEndpointTest", {}, tmp_path / "run")
    except NoNamespace as exc:
        pytest.skip(f"Triton's QA needs localhost:8000 of its own: {exc}")

    report = (f"stage {result['stage']}, exit {result['returncode']}, results {result['results']}\n"
              f"--- client ---\n{result['output'][-8000:]}\n--- server log ---\n{result['server_log'][-3000:]}")
    print(report)
    assert result["stage"] == "test", report
    assert result["returncode"] == 0 and result["results"] == {"total": 18, "errors": 0, "failures": 0}, report
