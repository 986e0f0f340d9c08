"""Triton's python_backend examples, unchanged (tests/triton_examples/), served by ringserve and
checked by their own client scripts, run unchanged in a network namespace of their own
(tests/support/netns.py: they connect to localhost:8000 and :8001)."""
from __future__ import annotations

import filecmp
import subprocess
from pathlib import Path

import pytest

from tests.support.netns import NoNamespace, run_clients
from tests.support.python_models import (EXAMPLES, build_bls_decoupled_examples, build_custom_metrics_example,
                                         build_decoupled_examples, build_triton_examples)

pytestmark = pytest.mark.integration
UPSTREAM = "f9088ff60944cc5a2e97ff16baba55f1666852bc"


def clients_against(repo: Path, clients: list[tuple[str, str]], *flags: str) -> dict[str, dict]:
    try:
        results = run_clients(repo, [(EXAMPLES / folder, script) for folder, script in clients], list(flags))
    except NoNamespace as exc:
        pytest.skip(f"the example clients need localhost:8000 of their own: {exc}")
    return {r["script"]: r for r in results}


def assert_upstream_byte_for_byte(tmp_path: Path) -> None:
    """The fixture is Triton's files as they are at the noted commit (where a clone of that repository
    is at hand; tests/triton_examples/README.md says where they come from otherwise)."""
    mirror = Path("/work/.mirror/triton-inference-server+python_backend/repo")
    if not mirror.exists():
        return
    for path in sorted(EXAMPLES.rglob("*")):
        relative = path.relative_to(EXAMPLES)
        if path.is_dir() or relative.name == "README.md":
            continue
        upstream = "LICENSE" if relative.name == "LICENSE" else f"examples/{relative}"
        copy = tmp_path / "upstream"
        copy.write_bytes(subprocess.run(["git", "-C", str(mirror), "show", f"{UPSTREAM}:{upstream}"],
                                        capture_output=True, check=True).stdout)
        assert filecmp.cmp(copy, path, shallow=False), f"{relative} differs from upstream {upstream}"


def test_add_sub_bls_and_auto_complete_pass_their_own_clients(tmp_path):
    assert_upstream_byte_for_byte(tmp_path)
    repo = build_triton_examples(tmp_path / "models")

    results = clients_against(repo, [("add_sub", "client.py"), ("bls", "sync_client.py"),
                                     ("bls", "async_client.py"), ("auto_complete", "client.py")])

    for script, expected in (("add_sub/client.py", "PASS: add_sub"), ("bls/sync_client.py", "PASS: BLS Sync"),
                             ("bls/async_client.py", "PASS: BLS Async"),
                             ("auto_complete/client.py", "PASS: auto_complete")):
        result = results[script]
        assert result["returncode"] == 0 and expected in result["output"], result["output"]
    # The BLS example's third call names a model the repository lacks: its error reaches the client.
    assert "Model 'undefined_model' is not ready" in results["bls/sync_client.py"]["output"]


def test_the_decoupled_examples_stream_over_grpc_to_their_own_clients(tmp_path):
    assert_upstream_byte_for_byte(tmp_path)
    repo = build_decoupled_examples(tmp_path / "models")

    results = clients_against(repo, [("decoupled", "square_client.py"), ("decoupled", "repeat_client.py")])

    for script, expected in (("decoupled/square_client.py", "PASS: square_int32"),
                             ("decoupled/repeat_client.py", "PASS: repeat_int32")):
        assert results[script]["returncode"] == 0 and expected in results[script]["output"], results[script]["output"]


def test_the_custom_metrics_example_finds_its_counter_in_metrics_on_tritons_port(tmp_path):
    assert_upstream_byte_for_byte(tmp_path)
    repo = build_custom_metrics_example(tmp_path / "models")

    # Its client reads localhost:8002/metrics, Triton's metrics port.
    results = clients_against(repo, [("custom_metrics", "client.py")], "--metrics-port", "8002")

    result = results["custom_metrics/client.py"]
    assert result["returncode"] == 0 and "PASS: custom_metrics" in result["output"], result["output"]


def test_the_bls_decoupled_examples_sum_a_decoupled_models_responses_for_their_own_clients(tmp_path):
    assert_upstream_byte_for_byte(tmp_path)
    repo = build_bls_decoupled_examples(tmp_path / "models")

    # With lanes (the default) square_int32 has a lane of its own: each exec(decoupled=True) streams its responses
    # back through the gateway (gateway/calls/stream.py).
    results = clients_against(repo, [("bls_decoupled", "sync_client.py"), ("bls_decoupled", "async_client.py")])

    for script, expected in (("bls_decoupled/sync_client.py", "PASS: BLS Decoupled Sync"),
                             ("bls_decoupled/async_client.py", "PASS: BLS Decoupled Async")):
        assert results[script]["returncode"] == 0 and expected in results[script]["output"], results[script]["output"]
