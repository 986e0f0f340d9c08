"""Run one unittest method of Triton's QA (tests/triton_qa/, unchanged) against a fresh ringserve stack.

The QA talks to localhost:8000 (HTTP) and localhost:8001 (gRPC), written into its f-strings, so, as
tests/support/netns.py does for the python_backend examples, the stack and the test run in a network
namespace of their own (`unshare -rn`) where those ports are free. Inside, `python -m
tests.support.triton_qa_runner <spec json>` starts the stack on 8000/8001 with the case's environment
(test.sh exports it for the server and the client alike), runs

    python <qa>/L0_x/<module>.py <Class.method>

from a scratch folder laid out like Triton's qa/ (`../common` is the vendored qa/common, and
`test_results.txt` lands there), stops the stack (nothing may be left behind) and prints one JSON line.
One stack per method, as test.sh restarts the server per method: the tests check statistics that count
from the server's start.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .netns import ROOT, NoNamespace, loopback_up
from .stack import Stack, poll_for
from .triton_qa_models import QA


def run_case(repo: Path, module: str, test: str, env: dict[str, str], workdir: Path,
             serve_flags: tuple[str, ...] = (), timeout_s: float = 540) -> dict:
    """{"stage": "start"|"test", "returncode", "output", "results", "server_log"} of `module` (a path under
    qa/, e.g. "L0_sequence_batcher/sequence_batcher_test.py") running `test` against ringserve on `repo`."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise NoNamespace("no unshare(1) on this machine")
    probe = subprocess.run([unshare, "-rn", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        raise NoNamespace(f"unshare -rn is refused here: {probe.stderr.strip()}")
    spec = {"repo": str(repo), "module": module, "test": test, "env": env, "workdir": str(workdir),
            "serve_flags": list(serve_flags), "client_timeout_s": timeout_s - 60}
    run = subprocess.run([unshare, "-rn", sys.executable, "-m", "tests.support.triton_qa_runner", json.dumps(spec)],
                         cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 or not lines:
        raise AssertionError(f"the namespace runner exited {run.returncode}:\n{run.stdout}\n{run.stderr[-6000:]}")
    return json.loads(lines[-1])


def _scratch(workdir: Path, module: str) -> Path:
    """workdir/qa/{common -> the vendored qa/common, L0_x/}: the cwd test.sh runs the module from."""
    qa = workdir / "qa"
    (qa / module).parent.mkdir(parents=True, exist_ok=True)
    if not (qa / "common").exists():
        (qa / "common").symlink_to(QA / "common")
    return (qa / module).parent


def _start(stack: Stack) -> list[dict]:
    """Start the stack; [] once it is ready, or the repository index's entries (name, state, reason) of the
    models ringserve refused (`model_state: failed`) once every model is READY or refused. Triton refuses
    to start then (--exit-on-error defaults to true) and test.sh stops ("Failed to start"), so a refused
    model fails the case before its test runs."""
    stack.start(wait_ready=False)

    def settled() -> list[dict] | bool:
        ready = stack.is_ready()
        try:
            status, index = stack.post("/v2/repository/index", {})
        except OSError:
            return False
        refused = [m for m in index if m.get("model_state") == "failed"] if status == 200 else []
        if ready:
            return refused or True  # (ready with a model refused: Triton, --exit-on-error, would not start)
        if not refused or any(m.get("state") != "READY" and m.get("model_state") != "failed" for m in index):
            return False  # (UNAVAILABLE while its workers start: not settled)
        return refused

    outcome = poll_for(settled, 120, 0.1, "the stack to be ready or to refuse its models")
    stack.remember_children()
    return [] if outcome is True else outcome


def main(spec: dict) -> int:
    loopback_up()
    workdir = Path(spec["workdir"])
    cwd = _scratch(workdir, spec["module"])
    env = {**os.environ, **spec["env"], "PYTHONPATH": ""}
    log_path = workdir / "server.log"
    result: dict = {"stage": "start", "returncode": None, "output": "", "results": None}
    with log_path.open("w") as log:
        stack = Stack(Path(spec["repo"]), "--grpc-port", "8001", *spec["serve_flags"], env=spec["env"])
        stack.port, stack.url, stack.stderr = 8000, "http://127.0.0.1:8000", log
        try:
            try:
                refused = _start(stack)
            except (RuntimeError, TimeoutError) as exc:
                result["output"] = f"the stack did not become ready: {exc}"
            else:
                result["output"] = f"the stack refused models: {refused}" if refused else ""
            if result["output"] == "":
                result["stage"] = "test"
                run = subprocess.run([sys.executable, str(QA / spec["module"]), spec["test"]], cwd=cwd, env=env,
                                     capture_output=True, text=True, timeout=spec["client_timeout_s"])
                result["returncode"], result["output"] = run.returncode, run.stdout + run.stderr
                results = cwd / "test_results.txt"
                result["results"] = json.loads(results.read_text()) if results.exists() else None
        finally:
            try:
                stack.stop()
            finally:
                stack.kill_everything()
            stack.assert_nothing_left()
    result["server_log"] = log_path.read_text()[-8000:]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
