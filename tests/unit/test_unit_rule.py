"""tests/unit starts no server process: the rule in tests/unit/conftest.py holds and can fail."""
from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import server_part


def test_server_modules_are_recognised_and_tools_are_not():
    assert server_part([sys.executable, "-P", "-m", "ringserve.worker", "--index", "0"]) == "ringserve.worker"
    assert server_part([sys.executable, "-m", "ringserve.gateway"]) == "ringserve.gateway"
    assert server_part([sys.executable, "-m", "bench", "lanes", "--quick"]) == "bench"
    assert server_part(f"{sys.executable} -P -m ringserve.cli serve --port 0") == "ringserve.cli"
    assert server_part([sys.executable, "-P", "-m", "ringserve.cli", "status", "--url", "x"]) is None
    assert server_part([sys.executable, "-c", "import time"]) is None
    assert server_part(["make", "-n", "test"]) is None


def test_starting_a_worker_from_a_unit_test_fails_the_test():
    with pytest.raises(pytest.fail.Exception, match="ringserve.worker"):
        subprocess.Popen([sys.executable, "-P", "-m", "ringserve.worker", "--help"])
