"""common/settings.py: one default per setting, the settings file, and what each child builds from it."""
from __future__ import annotations

import argparse
import dataclasses
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from ringserve.cli import build_parser, main, settings_from_args
from ringserve.common.errors import ConfigError, SettingError
from ringserve.common.settings import Settings
from ringserve.gateway.core.region_errors import MAX_REGIONS
from ringserve.gateway.process import GatewaySettings
from ringserve.gateway.__main__ import parse_args as gateway_args
from ringserve.supervision.children import Child
from ringserve.supervisor import Supervisor
from ringserve.worker.__main__ import parse_args as worker_args
from ringserve.worker.session import SessionSettings

NO_FLAG = {
    "api_key",
    "max_inflight_per_worker",
    "retry_after_s",
    "quarantine_poison_requests",
    "quarantine_window_s",
    "state_store_prefix",
    "response_cache_segment",  # (the supervisor names the cache segment it made: shm/cache.py)
}


def serve_actions() -> list[argparse.Action]:
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [a for a in subparsers.choices["serve"]._actions if a.option_strings and a.dest != "help"]


def parse(*flags: str) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", *flags]))


def test_no_serve_flag_has_a_default_of_its_own():
    for action in serve_actions():
        assert action.default is argparse.SUPPRESS, action.option_strings


def test_every_flag_sets_a_settings_field_and_every_field_but_the_internal_ones_has_a_flag():
    fields = {f.name for f in dataclasses.fields(Settings)}
    dests = {a.dest for a in serve_actions()} - {"api_key_file"}
    assert dests <= fields
    assert fields - dests == NO_FLAG


def test_every_cli_flag_default_equals_the_settings_default(monkeypatch):
    monkeypatch.delenv("RINGSERVE_API_KEY", raising=False)
    assert parse("--model-repository", "/m") == Settings(model_repository="/m")


def test_help_shows_the_default_from_settings():
    helps = {a.option_strings[0]: a.help for a in serve_actions()}
    assert helps["--request-timeout-s"].endswith("(default: 30.0)")
    assert helps["--max-request-bytes"].endswith("(default: 256MiB)")
    assert helps["--port"].endswith("(default: 8000)")


def test_the_settings_file_round_trips_and_only_its_owner_reads_it(tmp_path: Path):
    settings = Settings(model_repository="/m", gpus=(0, 1), api_key="s3cret", cpu_only=True,
                        cuda_arena_extend_strategy="kSameAsRequested", runtime_dir=str(tmp_path))
    path = tmp_path / "settings.json"
    settings.write(path)

    assert Settings.read(path) == settings
    assert Settings.read(path).gpus == (0, 1)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_child_without_a_runtime_dir_in_the_file_uses_the_files_dir(tmp_path: Path):
    Settings(model_repository="/m").write(tmp_path / "settings.json")
    assert Settings.read(tmp_path / "settings.json").runtime_dir == str(tmp_path)


def test_the_key_never_shows_in_a_repr():
    assert "s3cret" not in repr(Settings(model_repository="/m", api_key="s3cret"))


@pytest.mark.parametrize("change, says", [
    ({"workers": 0}, "setting 'workers': must be >= 1, got 0"),
    ({"drain_timeout_s": -1.0}, "setting 'drain_timeout_s': must be >= 0 (0 = off), got -1.0"),
    ({"request_timeout_s": 0.0}, "setting 'request_timeout_s': must be > 0, got 0.0"),
    ({"port": 70000}, "setting 'port': must be a TCP port (0-65535), got 70000"),
    ({"workers": "2"}, "setting 'workers': must be int, got str '2'"),
    ({"cpu_only": 1}, "setting 'cpu_only': must be bool, got int 1"),
    ({"gpus": (0, -1)}, "setting 'gpus': must be CUDA device ids (>= 0), got [0, -1]"),
    ({"cudnn_conv_algo_search": "FAST"}, "setting 'cudnn_conv_algo_search': must be one of '', 'EXHAUSTIVE'"),
    ({"api_key": " "}, "setting 'api_key': is empty"),
])
def test_settings_refuse_nonsense_with_the_setting_named(change, says):
    with pytest.raises(ConfigError) as raised:
        Settings(model_repository="/m", **change)
    assert str(raised.value).startswith(says)


def test_an_int_for_a_float_setting_becomes_a_float():
    assert type(Settings(model_repository="/m", request_timeout_s=5).request_timeout_s) is float


def test_a_settings_file_with_an_unknown_key_is_refused():
    with pytest.raises(SettingError, match="setting 'settings': unknown: 'slots'"):
        Settings.from_json({"model_repository": "/m", "slots": 3})


def test_a_bad_flag_value_is_a_usage_error_that_names_the_flag(tmp_path: Path, capsys):
    assert main(["serve", "--model-repository", str(tmp_path), "--hang-timeout-s", "0"]) == 2
    assert capsys.readouterr().err == "ringserve serve: --hang-timeout-s: must be > 0, got 0.0\n"


def test_the_api_key_comes_from_the_file_else_the_environment(tmp_path: Path, monkeypatch):
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    monkeypatch.setenv("RINGSERVE_API_KEY", "from-env")
    assert parse("--model-repository", "/m").api_key == "from-env"
    assert parse("--model-repository", "/m", "--api-key-file", str(key_file)).api_key == "from-file"
    key_file.write_text("\n")
    with pytest.raises(SettingError, match="is empty") as raised:
        parse("--model-repository", "/m", "--api-key-file", str(key_file))
    assert raised.value.field == "api_key_file"


USER_FLAGS = ("--host", "0.0.0.0", "--port", "9001", "--workers", "2", "--standby-workers", "1",
              "--request-timeout-s", "12.5", "--max-attempts", "4", "--batch-timeout-s", "3",
              "--hold-when-unavailable-s", "2", "--drain-timeout-s", "7", "--max-request-bytes", "1MiB",
              "--body-timeout-s", "9", "--api-key-everywhere", "--intra-op-threads", "3", "--cpu-only",
              "--gpus", "4,5", "--cuda-arena-extend-strategy", "kSameAsRequested",
              "--cudnn-conv-algo-search", "HEURISTIC", "--log-level", "DEBUG", "--strict-readiness",
              "--max-tensor-bytes", "2MiB", "--grpc-max-connections", "9", "--grpc-stream-max-in-flight", "7")


def test_a_child_given_only_the_settings_file_gets_the_values_the_user_passed(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RINGSERVE_API_KEY", "k3y")
    user = parse("--model-repository", str(tmp_path), *USER_FLAGS)
    path = tmp_path / "settings.json"
    dataclasses.replace(user, runtime_dir=str(tmp_path)).write(path)  # as Supervisor.setup does

    args = gateway_args(["--settings", str(path), "--segment", "ring", "--index", "1"])
    gateway = GatewaySettings.from_settings(Settings.read(args.settings), args.segment, args.index, 0, MAX_REGIONS)
    assert (gateway.runtime_dir, gateway.segment_name, gateway.model_repository) == (str(tmp_path), "ring",
                                                                                     str(tmp_path))
    assert (gateway.max_request_bytes, gateway.body_timeout_s, gateway.api_key, gateway.api_key_everywhere) == (
        2**20, 9.0, "k3y", True)
    assert dataclasses.asdict(gateway.dispatch) == {
        "gateway": 1, "request_timeout_s": 12.5, "max_attempts": 4, "max_inflight_per_worker": 2, "retry_after_s": 1,
        "batch_timeout_s": 3.0, "hold_when_unavailable_s": 2.0, "quarantine_poison_requests": 3,
        "quarantine_window_s": 60.0, "active_workers": 2, "strict_readiness": True, "max_shm_regions": 512,
        "state_store_prefix": "", "model_control_mode": ""}
    assert gateway.max_tensor_bytes == 2**21
    read = Settings.read(args.settings)
    assert (read.grpc_max_connections, read.grpc_stream_max_in_flight) == (9, 7)

    args = worker_args(["--settings", str(path), "--segment", "ring", "--index", "1", "--generation", "3"])
    session = SessionSettings.from_settings(Settings.read(args.settings), args.index)
    assert (session.intra_op_threads, session.use_cuda, session.cuda_device_id) == (3, False, 5)
    assert (session.cuda_arena_extend_strategy, session.cudnn_conv_algo_search) == ("kSameAsRequested", "HEURISTIC")


def test_children_get_the_settings_file_and_only_per_process_arguments_on_argv(tmp_path: Path, monkeypatch):
    supervisor = Supervisor(Settings(model_repository="/m", api_key="s3cret", workers=2))
    supervisor.children.settings_path = str(tmp_path / "settings.json")
    supervisor.gateways.rings.made = {0: SimpleNamespace(name="ring")}
    supervisor.listeners.listen_fd, supervisor.quarantine.loading = 3, {"bad": "why"}
    spawned: list[list[str]] = []

    def spawn(role: str, index: int, generation: int, args: list[str], pass_fds: tuple[int, ...] = ()) -> Child:
        spawned.append(args)
        return Child(role, index, generation, SimpleNamespace(pid=1), 0.0, 0.0)

    monkeypatch.setattr(supervisor.children, "start", spawn)
    monkeypatch.setattr(supervisor.events, "send", lambda event: None)
    supervisor.gateways.spawn()
    supervisor.workers.spawn(1)

    common = ["--settings", supervisor.children.settings_path, "--parent-pid", str(os.getpid())]
    # A gateway gets its index and its own ring; workers learn the rings from the gateways (ATTACH).
    assert spawned[0][-10:] == [*common, "--index", "0", "--segment", "ring", "--fd", "3"]
    assert spawned[1][-10:] == [*common, "--index", "1", "--generation", "1", "--skip-model", "bad"]
    assert not any("s3cret" in arg for args in spawned for arg in args)


def test_tritons_readiness_flags_take_an_optional_value_and_default_to_off():
    assert (parse("--model-repository", "/m").strict_readiness, parse("--model-repository", "/m").exit_on_error) == (
        False, False)
    both = parse("--model-repository", "/m", "--strict-readiness", "--exit-on-error=true")
    assert (both.strict_readiness, both.exit_on_error) == (True, True)
    assert parse("--model-repository", "/m", "--strict-readiness=false").strict_readiness is False


def test_client_shared_memory_is_off_by_default_and_its_key_prefixes_reach_the_gateway(tmp_path: Path):
    assert parse("--model-repository", "/m").allow_client_shm is False
    user = parse("--model-repository", str(tmp_path), "--allow-client-shm", "--client-shm-key-prefix", "/app-",
                 "--client-shm-key-prefix", "batch_")
    path = tmp_path / "settings.json"
    dataclasses.replace(user, runtime_dir=str(tmp_path)).write(path)

    gateway = GatewaySettings.from_settings(Settings.read(path), "ring", 0, 0, MAX_REGIONS)
    assert (gateway.allow_client_shm, gateway.client_shm_key_prefixes) == (True, ("/app-", "batch_"))
    assert parse("--model-repository", "/m", "--allow-client-shm=false").allow_client_shm is False


@pytest.mark.parametrize("flags, says", [
    (["--client-shm-key-prefix", "/app-"], "narrows client shared memory, which is off: add --allow-client-shm"),
    (["--allow-client-shm", "--client-shm-key-prefix", "/a/b"], "'/a/b' is not the start of a shared-memory key"),
    (["--allow-client-shm", "--client-shm-key-prefix", "/"], "'/' is not the start of a shared-memory key"),
])
def test_key_prefixes_without_client_shared_memory_or_that_no_key_can_have_are_refused(flags, says):
    with pytest.raises(SettingError, match=says) as caught:
        parse("--model-repository", "/m", *flags)
    assert caught.value.field == "client_shm_key_prefixes"
