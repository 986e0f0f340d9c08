"""common/messages.py: one dataclass per message kind, three frames on the wire."""
from __future__ import annotations

import orjson
import pytest

from ringserve.common import messages, runtime_settings, supervisor_messages, vocabulary
from ringserve.common.messages import PROTOCOL_VERSION, WireError

REPORT = messages.ModelStateReport(model="mlp", version=2, key="mlp/2", state="ready", memory_bytes=4096,
                                   load_s=0.125, seq=3, policy="lazy", provider="CPUExecutionProvider")
EXIT = supervisor_messages.ExitInfo(reason="SIGSEGV", at=12.5, pid=99, generation=4)
READY = messages.Ready(worker_index=0, generation=3, pid=4321, models={"mlp": "CPUExecutionProvider", "mlp/2": None},
                       failed_models={"broken": "INVALID_PROTOBUF"}, model_states=(REPORT,),
                       memory_budget_bytes=1 << 30)
ERROR = messages.Error(batch_id=7, attempt=0, error="Invalid rank for input: x")
MODEL_STATE = messages.ModelState(report=REPORT, cause="api", loaded=True, budget_bytes=1 << 30, used_bytes=4096)
BATCH = messages.Batch(batch_id=7, model="mlp", version=1, attempt=1, slot_index=2, generation=9,
                       inputs=[["x", "FP32", [3, 4], 0], ["text", "BYTES", [2], 48, 13]], output_offset=64,
                       faults=["segfault"])
EXITED = supervisor_messages.WorkerExited(worker_index=0, pid=99, generation=4, reason="SIGSEGV", at=12.5, restarts={"SIGSEGV": 2},
                               loading_model="mlp/2")
SNAPSHOT = supervisor_messages.Snapshot(supervisor_pid=1, quarantined={"mlp/2": "it crashed the worker 3 times"}, workers=(
    supervisor_messages.WorkerInfo(worker_index=0, generation=4, restarts={"SIGSEGV": 2}, last_exit=EXIT, rss_bytes=1 << 20),
    supervisor_messages.WorkerInfo(worker_index=1, generation=1)),
    gateways=(supervisor_messages.GatewayInfo(gateway_index=0, pid=77, generation=2, restarts={"SIGKILL": 2}, last_exit=EXIT),),
    spares=(supervisor_messages.SpareInfo(device=0, pid=88, state="ready", rss_bytes=90 << 20, takeovers=3,
                               deaths={"SIGKILL": 1}),))
TAKE_OVER = supervisor_messages.TakeOver(worker_index=1, generation=7, skip_models=["bad model/2", "crashy"])

EXAMPLES = [
    READY,
    messages.Result(batch_id=7, attempt=1, outputs=[["y", "FP32", [3, 4], 64]], compute_s=0.25),
    ERROR,
    messages.Error(batch_id=8, attempt=0, error="model memory budget exhausted", kind="budget"),
    MODEL_STATE,
    BATCH,
    messages.Load(model="mlp", version=2, cause="api"),
    messages.Unload(model="mlp", version=2),
    supervisor_messages.Heartbeat(worker_index=1, generation=2, pid=77, batches=1000, ready=True,
                                  calls=(("execute", "m", 12.5, 300.0),)),
    supervisor_messages.WorkerSilent(worker_index=0, generation=3, silent=True),
    supervisor_messages.SpareHeartbeat(device=1, pid=88, primed=True),
    TAKE_OVER,
    supervisor_messages.WorkerStarted(worker_index=0, pid=99, generation=5, restarts={"SIGSEGV": 1}, replaces=4, reason="reload"),
    EXITED,
    SNAPSHOT,
    supervisor_messages.ModelQuarantined(model="mlp", reason="it crashed the worker 3 times while loading"),
    supervisor_messages.ModelUnquarantined(model="mlp"),
    supervisor_messages.Reload(model_repository="/srv/models"),
    supervisor_messages.KillWorker(worker_index=0, generation=4, reason="batch_timeout"),
    supervisor_messages.WorkerRetired(worker_index=0, generation=4, gateway_index=1),
    supervisor_messages.QuarantineModel(model="m", reason="3 requests isolated as poison in 60 s"),
    supervisor_messages.RepositoryChanged(model="m", action="unload", gateway_index=1),
    messages.Attach(gateway_index=1, segment="ringserve-1-0123456789abcdef-ring"),
    messages.Call(call_id=3, model="mlp", version=-1, header_length=120),
    messages.CallReply(call_id=3, status=503, error="no inference worker is ready for model 'mlp'"),
    messages.Call(call_id=4, model="square", version=1, header_length=80, stream=True),
    messages.CallReply(call_id=4, status=200, header_length=64, final=False),
    messages.CallCancel(call_id=4),
    messages.Result(batch_id=8, attempt=0, outputs=[], compute_s=0.5, fused=2, execution_rows=12),
    supervisor_messages.Unquarantine(model="mlp"),
    supervisor_messages.ReloadWorkers(model="mlp"),
    supervisor_messages.ReloadRepository(model="mlp", gateway_index=1),
    runtime_settings.ChangeRuntimeSettings(token="0.1.2", gateway_index=1, log={"log_verbose_level": 1},
                                           trace={"trace_rate": None}, model="mlp"),
    runtime_settings.State().merged(runtime_settings.ChangeRuntimeSettings("0.1.3", 0, {"log_info": False})).message(
        "0.1.3"),
    messages.Ready(worker_index=0, generation=1, pid=5, models={"pre": None}, configs=(messages.CompletedConfig(
        key="pre", version=1, model_path="/m/pre/1/model.py", config={"name": "pre", "max_batch_size": 4}),)),
    messages.Batch(batch_id=9, model="pre", version=1, attempt=0, slot_index=0, generation=2, inputs=[], output_offset=0,
                   requests=(messages.RequestInfo(rows=2, id="a", parameters={"k": 1}, outputs=["y"]),
                             messages.RequestInfo(rows=1, shapes={"x": [5]}))),
    messages.Result(batch_id=9, attempt=0, outputs=[], answers=[[[["y", "FP32", [2], 0]], None, 0],
                                                                [[], "bad input", 400]]),
    messages.StreamResponse(batch_id=9, attempt=0, request_index=1, outputs=[["OUT", "INT32", [1], 128]], final=True),
    messages.Executed(batch_id=9, attempt=1, compute_s=0.002),
    messages.Cancel(batch_id=9, attempt=1, request_indexes=[0, 2]),
]


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def test_every_message_class_is_in_the_registry_under_its_own_kind():
    classes = list(_all_subclasses(messages.Message))

    assert len({cls.KIND for cls in classes}) == len(classes)
    assert messages.BY_KIND == {cls.KIND.encode(): cls for cls in classes}


def test_a_kind_taken_twice_is_refused_when_the_class_is_defined():
    with pytest.raises(TypeError, match="KIND 'READY' of Twin is Ready's already"):
        type("Twin", (messages.Message,), {"KIND": "READY"})
    with pytest.raises(TypeError, match="Kindless has no KIND"):
        type("Kindless", (messages.Message,), {})


def test_every_message_class_has_an_example():
    assert {type(m) for m in EXAMPLES} == set(messages.BY_KIND.values())


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: f"{m.KIND}")
def test_encode_then_decode_gives_back_an_equal_message(message):
    frames = message.encode()

    assert frames[:2] == [PROTOCOL_VERSION, message.KIND.encode()]
    assert messages.decode(frames) == message
    assert type(messages.decode(frames)) is type(message)


def test_nested_messages_decode_into_their_dataclasses():
    snapshot = messages.decode(SNAPSHOT.encode())
    state = messages.decode(MODEL_STATE.encode())

    assert isinstance(snapshot.workers, tuple) and snapshot.workers[0].last_exit == EXIT
    assert snapshot.workers[1].last_exit is None
    assert state.report == REPORT


def test_a_worker_exit_names_its_last_exit_without_sending_it_twice():
    assert EXITED.last_exit == EXIT
    assert "last_exit" not in orjson.loads(EXITED.encode()[2])


def test_fields_left_out_by_the_sender_take_their_defaults():
    frames = [PROTOCOL_VERSION, b"HEARTBEAT", b'{"worker_index": 1, "generation": 2, "pid": 3}']

    assert messages.decode(frames) == supervisor_messages.Heartbeat(worker_index=1, generation=2, pid=3, batches=0)


def test_a_snapshot_decodes_its_spares_into_their_dataclass():
    snapshot = messages.decode(SNAPSHOT.encode())

    assert snapshot.spares == SNAPSHOT.spares and isinstance(snapshot.spares[0], supervisor_messages.SpareInfo)


def test_a_takeover_goes_through_a_pipe_as_one_line_and_comes_back_equal():
    line = TAKE_OVER.encode_line()

    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert messages.decode_line(line) == TAKE_OVER


def test_a_line_that_is_no_message_is_refused():
    with pytest.raises(WireError):
        messages.decode_line(b"hello\n")
    with pytest.raises(WireError, match="TAKE_OVER body does not match"):
        messages.decode_line(PROTOCOL_VERSION + b' TAKE_OVER {"worker_index": 1}\n')


def test_decoded_messages_are_frozen():
    heartbeat = messages.decode(supervisor_messages.Heartbeat(worker_index=1, generation=2, pid=3).encode())

    with pytest.raises(AttributeError):
        heartbeat.batches = 5


def test_decode_accepts_zero_copy_frames():
    # pyzmq hands out memoryviews (Frame.buffer) when asked not to copy.
    frames = [memoryview(f) for f in ERROR.encode()]

    assert messages.decode(frames) == ERROR


def test_other_protocol_version_is_refused():
    frames = [b"rs0", *READY.encode()[1:]]

    with pytest.raises(WireError, match="rs0"):
        messages.decode(frames)


def test_unknown_kind_is_refused():
    with pytest.raises(WireError, match="HELLO"):
        messages.decode([PROTOCOL_VERSION, b"HELLO", b"{}"])


@pytest.mark.parametrize("count", [0, 2, 4])
def test_wrong_frame_count_is_refused(count):
    frames = (READY.encode() + [b"extra"])[:count]

    with pytest.raises(WireError, match=f"got {count}"):
        messages.decode(frames)


@pytest.mark.parametrize("body, problem", [
    (b"[1, 2]", "RESULT body must be an object, got list"),
    (b'"text"', "RESULT body must be an object, got str"),
    (b"{not json", "RESULT body is not JSON"),
])
def test_body_that_is_not_a_json_object_is_refused(body, problem):
    with pytest.raises(WireError, match=problem):
        messages.decode([PROTOCOL_VERSION, b"RESULT", body])


def body_of(message: messages.Message) -> dict:
    return orjson.loads(message.encode()[2])


def decode_body(kind: str, body: dict) -> messages.Message:
    return messages.decode([PROTOCOL_VERSION, kind.encode(), orjson.dumps(body)])


@pytest.mark.parametrize("message, missing", [
    (BATCH, "generation"), (READY, "pid"), (MODEL_STATE, "report"), (SNAPSHOT, "supervisor_pid")],
    ids=lambda value: getattr(value, "KIND", value))
def test_a_missing_field_is_refused_by_name(message, missing):
    body = body_of(message)
    del body[missing]

    with pytest.raises(WireError, match=rf"{message.KIND} body does not match its fields \(.*\): .*'{missing}'"):
        decode_body(message.KIND, body)


@pytest.mark.parametrize("leave_out", [["faults"], []], ids=["as many fields as a Batch", "one field more"])
def test_an_unknown_field_is_refused_by_name(leave_out):
    body = body_of(BATCH)
    for name in leave_out:
        del body[name]
    body["busy"] = False

    with pytest.raises(WireError, match=r"BATCH body does not match its fields \(batch_id, .*\): .*'busy'"):
        decode_body("BATCH", body)


def test_an_unknown_field_in_a_nested_report_is_refused():
    body = body_of(MODEL_STATE)
    body["report"]["colour"] = "blue"

    with pytest.raises(WireError, match="MODEL_STATE body does not match its fields .*'colour'"):
        decode_body("MODEL_STATE", body)


def test_wire_error_is_a_value_error():
    assert issubclass(WireError, ValueError)


def test_error_kinds_not_run_are_the_error_kind_values():
    assert vocabulary.ERROR_KINDS_NOT_RUN == {"budget", "load_failed", "not_served"}
