"""cli.py: --version, help that shows every default, and what is refused before any process starts."""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ringserve import cli


def serve_options() -> list[argparse.Action]:
    (subparsers,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return [a for parser in subparsers.choices.values() for a in parser._actions
            if a.option_strings and a.dest != "help"]


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"ringserve {importlib.metadata.version('ringserve')}"


def test_every_flag_has_help_that_shows_its_default() -> None:
    options = serve_options()
    assert len(options) >= 25
    silent = [a.option_strings[0] for a in options if "default" not in (a.help or "").lower()]
    assert silent == []
    help_text = cli.build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    for shown in ("(default: 127.0.0.1)", "(default: 8000)", "(default: INFO)", "(default: off)"):
        assert shown in " ".join(help_text.split())


@pytest.mark.parametrize("level", ["verbose", "trace", "5"])
def test_an_unknown_log_level_is_refused_by_the_parser(
        tmp_path: Path, level: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--model-repository", str(tmp_path), "--log-level", level])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--log-level: invalid choice" in err and "Traceback" not in err


def test_the_log_level_is_case_insensitive(tmp_path: Path) -> None:
    args = cli.build_parser().parse_args(["serve", "--model-repository", str(tmp_path), "--log-level", "debug"])
    assert cli.settings_from_args(args).log_level == "DEBUG"


@pytest.mark.parametrize("make", [lambda p: None, lambda p: p.write_text("not a folder")],
                         ids=["missing", "a file"])
def test_a_repository_that_is_not_a_directory_is_refused_before_the_supervisor_starts(
        tmp_path: Path, make, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import ringserve.supervisor

    def no_supervisor(settings):
        raise AssertionError("the supervisor was started")

    monkeypatch.setattr(ringserve.supervisor, "Supervisor", no_supervisor)
    repo = tmp_path / "models"
    make(repo)
    assert cli.main(["serve", "--model-repository", str(repo)]) == 2
    assert capsys.readouterr().err == f"ringserve serve: --model-repository: {repo} is not a directory\n"


class StatusHandler(BaseHTTPRequestHandler):
    # Larger than a pipe's buffer (64 KiB): the writer is still writing when `head` leaves.
    document = json.dumps({
        "ready": True, "draining": False, "slots": {"free": 8, "total": 8},
        "workers": [{"index": 0, "pid": 1, "generation": 1, "state": "ready", "restarts_total": 0,
                     "restarts": {}, "last_exit": None}],
        "models": {f"model-{i:05d}": {"ready": True, "queue_depth": 0, "requeued_batches": 0}
                   for i in range(3000)}}).encode()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(self.document)))
        self.end_headers()
        self.wfile.write(self.document)

    def log_message(self, *args: object) -> None:
        pass


def test_status_into_a_pipe_closed_early_prints_no_traceback() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StatusHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with subprocess.Popen([sys.executable, "-P", "-m", "ringserve.cli", "status", "--url", url],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) as status:
            first = status.stdout.readline()
            status.stdout.close()  # what `| head -1` does after its line
            err = status.stderr.read().decode()
            assert status.wait(30) == 0, err
    finally:
        server.shutdown()
        server.server_close()
    assert first.startswith(b"ready: True")
    assert err == ""


def test_status_prints_the_warm_spare_of_each_device_with_its_memory_takeovers_and_own_deaths(capsys) -> None:
    from ringserve.cli.status import _print_spares

    _print_spares({"spares": [
        {"device": 0, "pid": 4242, "state": "ready", "rss_bytes": 90 * 2**20, "takeovers": 3, "deaths": {}},
        {"device": 1, "pid": 0, "state": "none", "rss_bytes": 0, "takeovers": 0, "deaths": {"hung": 1, "SIGKILL": 2}},
    ]})

    header, first, second = capsys.readouterr().out.splitlines()
    assert header.split()[:5] == ["spare", "pid", "state", "RSS", "MiB"]
    assert first.split() == ["dev", "0", "4242", "ready", "90.0", "3", "-"]
    assert second.split() == ["dev", "1", "-", "none", "0.0", "0", "SIGKILL=2,", "hung=1"]
