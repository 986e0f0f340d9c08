"""tritonserver.py: tritonserver's command line mapped onto ringserve's settings, and what it refuses by name."""
from __future__ import annotations

from pathlib import Path

import pytest

from ringserve import cli, tritonserver


def settings_for(*argv: str):
    return tritonserver.settings_from_triton_args(tritonserver.build_parser().parse_args(list(argv)))


def test_kserves_command_line_maps_to_tritons_defaults_on_every_address(tmp_path: Path):
    settings = settings_for(f"--model-store={tmp_path}", "--grpc-port=9000", "--http-port=8080",
                            "--allow-grpc=true", "--allow-http=true")

    assert (settings.model_repository, settings.host, settings.port, settings.grpc_port, settings.metrics_port) == (
        str(tmp_path.resolve()), "0.0.0.0", 8080, 9000, 8002)
    assert settings.strict_readiness and settings.exit_on_error and settings.model_control_mode == "none"


def test_model_analyzers_flags_map_to_explicit_mode_and_the_rest(tmp_path: Path):
    settings = settings_for("--model-repository", str(tmp_path), "--model-control-mode", "explicit",
                            "--load-model", "a", "--load-model=b", "--allow-metrics=false", "--allow-grpc", "false",
                            "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--strict-model-config=false",
                            "--log-verbose=1", "--exit-timeout-secs", "5", "--strict-readiness=false")

    assert (settings.model_control_mode, settings.load_models, settings.metrics_port, settings.grpc_port) == (
        "explicit", ("a", "b"), 0, 0)
    assert (settings.host, settings.log_level, settings.drain_timeout_s, settings.strict_readiness) == (
        "127.0.0.1", "DEBUG", 5.0, False)


def test_model_analyzers_local_mode_command_line_is_taken_as_it_writes_it(tmp_path: Path):
    # model_analyzer/triton/server/server_factory.py's local mode, in TritonServerConfig.to_args_list's spelling.
    settings = settings_for(f"--model-repository={tmp_path}", "--strict-model-config=false", "--http-port=8000",
                            "--grpc-port=8001", "--metrics-port=8002", "--model-control-mode=explicit",
                            "--metrics-interval-ms=1000")

    assert (settings.model_control_mode, settings.load_models, settings.metrics_port) == ("explicit", (), 8002)


@pytest.mark.parametrize("argv", [["--cache-config", "local,size=1048576"], ["--cache-config=local,size=1048576"],
                                  ["--response-cache-byte-size", "1048576"]])
def test_tritons_response_cache_flags_set_the_cache_size(tmp_path: Path, argv):
    assert settings_for(f"--model-repository={tmp_path}", *argv).response_cache_bytes == 1048576


def test_a_cache_other_than_tritons_local_one_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        tritonserver.main([f"--model-repository={tmp_path}", "--cache-config=redis,host=localhost"])

    assert exited.value.code == 2 and "cache 'redis' is not served" in capsys.readouterr().err


def test_the_serve_commands_cache_flags_take_sizes_with_units(tmp_path: Path):
    args = cli.build_parser().parse_args(["serve", "--model-repository", str(tmp_path), "--cache-config", "local,size=2MiB"])

    assert cli.settings_from_args(args).response_cache_bytes == 2 << 20


@pytest.mark.parametrize(("argv", "words"), [
    (["--grpc-use-ssl=true"], "--grpc-use-ssl is tritonserver's and not served by ringserve"),
    (["--backend-config", "onnxruntime,enable-global-threadpool=1"], "--backend-config is tritonserver's"),
    (["--allow-http=false"], "--allow-http: ringserve always serves HTTP"),
    (["--strict-model-config=true"], "--strict-model-config: true is not served"),
    (["--grpc-address=10.0.0.1"], "--grpc-address: must equal --http-address (0.0.0.0)"),
    (["--model-repository=/a"], "--model-repository: give exactly one"),
    (["--load-model=a"], "--load-model: names the models to serve at the start in explicit mode"),
    # L0_response_cache's test.sh: both flags fail the start
    (["--response-cache-byte-size=12345", "--cache-config=local,size=67890"],
     "Incompatible flags --response-cache-byte-size and --cache-config both provided"),
])
def test_what_ringserve_does_not_serve_is_refused_naming_the_flag(tmp_path, capsys, argv, words):
    assert tritonserver.main([f"--model-repository={tmp_path}", *argv]) == 2

    assert words in capsys.readouterr().err


def test_ringserve_tritonserver_is_the_same_command(tmp_path, capsys):
    assert cli.main(["tritonserver", f"--model-store={tmp_path / 'missing'}"]) == 2

    assert "ringserve-tritonserver: --model-repository: " in capsys.readouterr().err
