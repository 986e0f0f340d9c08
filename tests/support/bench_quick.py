"""Run one bench suite with --quick, as its integration test does: the suite must exit 0."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_quick(suite: str, out_dir: Path, result: str | None = None, timeout_s: float = 150) -> dict[str, Any]:
    """`python -m bench <suite> --quick --out-dir out_dir`; its JSON result (`<result or suite>.json`).
    A run past the timeout gets SIGTERM, so that the bench stops its servers before the test fails."""
    process = subprocess.Popen([sys.executable, "-m", "bench", suite, "--quick", "--out-dir", str(out_dir)],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output[-4000:]
    return json.loads((out_dir / f"{result or suite}.json").read_text())
