"""common/runtime_settings.py: Triton's log and trace settings as one state, applied to this process's logging."""
from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringserve.common import runtime_settings
from ringserve.common.logfmt import JsonFormatter, LineHandler
from ringserve.common.runtime_settings import ChangeRuntimeSettings, LogSettings, State, TraceSettings
from ringserve.common.settings import Settings


@pytest.fixture
def root_log() -> Iterator[io.StringIO]:
    """The root logger with one LineHandler into a buffer; logging and the module's state put back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    state, initial = runtime_settings.current, runtime_settings.initial
    out = io.StringIO()
    root.handlers = [LineHandler(out)]
    try:
        yield out
    finally:
        # (pytest's own capture handlers join root's during each phase, and adopting gave them the switch too:
        # taken off every one, or a later test's DEBUG line would meet this test's switch)
        for handler in {*root.handlers, *handlers}:
            for switch in [f for f in handler.filters if isinstance(f, runtime_settings.LevelSwitch)]:
                handler.removeFilter(switch)
        root.handlers, runtime_settings.current, runtime_settings.initial = handlers, state, initial
        root.setLevel(level)
        runtime_settings.sampler.reset()


def change(**fields) -> ChangeRuntimeSettings:
    return ChangeRuntimeSettings(token="t", gateway_index=0, **fields)


@pytest.mark.parametrize(("level", "expected"), [
    ("DEBUG", LogSettings(log_verbose_level=1)),
    ("INFO", LogSettings()),
    ("WARNING", LogSettings(log_info=False)),
    ("CRITICAL", LogSettings(log_info=False, log_warning=False, log_error=False)),
])
def test_the_log_level_flag_reads_as_tritons_switches(level: str, expected: LogSettings) -> None:
    assert LogSettings.from_flags(level, "text") == expected
    assert LogSettings.from_flags(level, "json").log_format == "json"


def test_switches_let_lines_out_by_level_and_a_critical_line_always_leaves() -> None:
    only_errors = LogSettings(log_info=False, log_warning=False)
    assert [only_errors.lets_out(n) for n in (10, 20, 30, 40, 50)] == [False, False, False, True, True]
    info_without_warnings = LogSettings(log_warning=False)  # (Triton's switches need not be contiguous)
    assert [info_without_warnings.lets_out(n) for n in (10, 20, 30, 40)] == [False, True, False, True]
    assert LogSettings(log_error=False, log_info=False, log_warning=False).lets_out(logging.CRITICAL)


def test_a_change_merges_one_revision_on_and_a_models_null_gives_it_back_to_the_global_setting() -> None:
    state = State().merged(change(log={"log_verbose_level": 2}))
    assert (state.revision, state.log.log_verbose_level, state.log.log_info) == (1, 2, True)
    state = state.merged(change(trace={"trace_rate": 10}, model="mlp"))
    assert state.trace_of("mlp").trace_rate == 10 and state.trace_of("other").trace_rate == 1
    state = state.merged(change(trace={"trace_count": 7}))  # the global count: mlp follows it, keeping its rate
    assert (state.trace_of("mlp").trace_rate, state.trace_of("mlp").trace_count) == (10, 7)
    state = state.merged(change(trace={"trace_rate": None}, model="mlp"))
    assert state.model_traces == {} and state.revision == 4
    assert State.of(state.message()) == state


def test_the_sampler_traces_one_request_in_rate_until_count_is_spent_counting_a_model_with_its_own_apart(
        root_log) -> None:
    runtime_settings.adopt(State(1, trace=TraceSettings(trace_rate=2, trace_count=2)).message())
    assert [runtime_settings.sampler.admit("a") for _ in range(6)] == [False, True, False, True, False, False]
    assert runtime_settings.sampler.count_left(None) == 0
    runtime_settings.adopt(State(2, trace=TraceSettings(trace_level=("OFF",)),
                                 model_traces={"b": {"trace_level": ["TIMESTAMPS"]}}).message())
    assert not runtime_settings.sampler.admit("a") and runtime_settings.sampler.admit("b")


def test_adopting_sets_the_root_level_the_switch_and_the_format_and_ignores_an_older_revision(root_log) -> None:
    runtime_settings.begin(Settings(model_repository="/m", log_level="INFO"), role="gateway", index=1,
                           generation=2, runtime_dir="")
    log = logging.getLogger("ringserve.test")
    log.debug("hidden")
    assert runtime_settings.adopt(State(3, log=LogSettings(log_verbose_level=1, log_format="json")).message())
    log.debug("shown")
    assert not runtime_settings.adopt(State(2).message())  # (heard again from another gateway: older)
    runtime_settings.adopt(State(4, log=LogSettings(log_info=False, log_format="json")).message())
    log.info("hidden too")
    log.error("an error")
    lines = root_log.getvalue().splitlines()
    assert not any("hidden" in line for line in lines)
    assert any('"level":"DEBUG"' in line and '"message":"shown"' in line and '"index":1' in line for line in lines)
    assert '"level":"ERROR"' in lines[-1] and isinstance(logging.getLogger().handlers[0].formatter, JsonFormatter)
    assert logging.getLogger().level == logging.WARNING


def test_a_process_started_later_reads_the_saved_state(root_log, tmp_path: Path) -> None:
    saved = State().merged(change(log={"log_verbose_level": 1}))
    runtime_settings.save(str(tmp_path), saved)
    started = runtime_settings.begin(Settings(model_repository="/m", runtime_dir=str(tmp_path)), role="worker")
    assert started == saved and logging.getLogger().level == logging.DEBUG
    assert "revision 1" in root_log.getvalue()


def test_the_access_log_keeps_its_lines_when_info_is_switched_off(root_log) -> None:
    """--access-log's logger sets INFO itself: its lines show under --log-level WARNING, and log_info false."""
    runtime_settings.adopt(State(1, log=LogSettings(log_info=False)).message())
    access = logging.getLogger("ringserve.access")
    access.setLevel(logging.INFO)
    try:
        access.info("GET /v2 200")
        logging.getLogger("ringserve.test.other").info("not this one")
    finally:
        access.setLevel(logging.NOTSET)
    assert "GET /v2 200" in root_log.getvalue() and "not this one" not in root_log.getvalue()


def test_the_supervisor_ignores_a_change_it_cannot_make_and_saves_and_sends_one_it_can(root_log, tmp_path: Path) -> None:
    from ringserve.supervision.runtime_settings import RuntimeSettingsKeeper

    sent: list = []
    keeper = RuntimeSettingsKeeper(str(tmp_path), type("Events", (), {"send": lambda self, m: sent.append(m)})())
    keeper.change(change(log={"log_nonsense": 1}))
    assert sent == [] and runtime_settings.current.revision == 0 and "ignoring" in root_log.getvalue()
    keeper.change(change(log={"log_verbose_level": 1}))
    assert [(m.revision, m.token, m.log["log_verbose_level"]) for m in sent] == [(1, "t", 1)]
    assert runtime_settings.read_saved(str(tmp_path)).log.log_verbose_level == 1
