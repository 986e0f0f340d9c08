"""worker/python/pb_utils.py and pb_config.py: Triton's triton_python_backend_utils surface, as model.py sees it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ringserve.worker.python import pb_utils
from ringserve.worker.python.pb_config import AutoCompleteConfig as ModelConfig
from ringserve.worker.python.python_model import PB_UTILS_MODULE, install_pb_utils


def test_the_module_answers_to_tritons_name_once_installed():
    install_pb_utils()
    import triton_python_backend_utils as imported  # noqa: PLC0415 - the very import a model.py makes

    assert imported is pb_utils and PB_UTILS_MODULE == "triton_python_backend_utils"


def test_helpers_find_tensors_and_configs_by_name():
    x, y = pb_utils.Tensor("x", np.ones(2, np.float32)), pb_utils.Tensor("y", np.zeros(2, np.int32))
    request = pb_utils.InferenceRequest(model_name="m", inputs=[x, y], requested_output_names=["z"])
    config = {"input": [{"name": "x", "data_type": "TYPE_FP32"}], "output": [{"name": "z", "data_type": "TYPE_INT64"}]}

    assert pb_utils.get_input_tensor_by_name(request, "y") is y
    assert pb_utils.get_input_tensor_by_name(request, "w") is None
    assert pb_utils.get_output_tensor_by_name(pb_utils.InferenceResponse([y]), "y") is y
    assert pb_utils.get_input_config_by_name(config, "x")["data_type"] == "TYPE_FP32"
    assert pb_utils.get_output_config_by_name(config, "q") is None
    assert pb_utils.triton_string_to_numpy("TYPE_INT64") is np.int64
    assert pb_utils.numpy_to_triton_string(np.float16) == "TYPE_FP16"
    assert pb_utils.numpy_to_triton_type(np.object_) == 13 and pb_utils.triton_to_numpy_type(11) is np.float32
    assert not pb_utils.using_decoupled_model_transaction_policy({})
    assert pb_utils.using_decoupled_model_transaction_policy({"model_transaction_policy": {"decoupled": True}})


def test_a_bls_model_name_read_from_a_bytes_tensor_is_decoded():
    request = pb_utils.InferenceRequest(model_name=b"add_sub", inputs=[], requested_output_names=["OUTPUT0"],
                                        parameters={"k": 1})

    assert request.model_name == "add_sub" and json.loads(request.parameters()) == {"k": 1}


def test_bytes_tensors_serialize_as_tritons_helpers_do():
    array = np.array([b"ab", b"", "\u00e9".encode()], dtype=object)

    flat = pb_utils.serialize_byte_tensor(array)

    assert flat.dtype == np.uint8 and bytes(flat[:4]) == b"\x02\x00\x00\x00"
    assert pb_utils.deserialize_bytes_tensor(flat.tobytes()).tolist() == array.tolist()


@pytest.mark.parametrize("error, status", [
    (pb_utils.TritonModelException("bad x"), 400),
    (pb_utils.TritonError("refused"), 400),  # no code given: the model refuses this request
    (pb_utils.TritonError("bad", pb_utils.TritonError.INVALID_ARG), 400),
    (pb_utils.TritonError("later", pb_utils.TritonError.UNAVAILABLE), 503),
    (pb_utils.TritonError("oops", pb_utils.TritonError.INTERNAL), 500),
    (pb_utils.TritonError("stop", pb_utils.TritonError.CANCELLED), 499),
    (KeyError("k"), 500), (ZeroDivisionError(), 500),
])
def test_errors_map_to_the_status_their_requests_get(error, status):
    assert pb_utils.http_status(error) == status


def test_a_triton_error_without_code_still_says_internal_as_tritons_does():
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL


def test_what_is_not_built_refuses_naming_it():
    with pytest.raises(pb_utils.UnsupportedFeature, match="rescheduling"):
        pb_utils.InferenceRequest(model_name="m").set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    with pytest.raises(pb_utils.UnsupportedFeature, match="not decoupled"):
        pb_utils.InferenceRequest(model_name="m").get_response_sender()
    with pytest.raises(AttributeError, match="triton_python_backend_utils.no_such_thing is not supported"):
        pb_utils.no_such_thing  # noqa: B018


def test_dlpack_round_trip_copies_only_a_read_only_input():
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    data.flags.writeable = False
    tensor = pb_utils.Tensor("x", data)

    again = pb_utils.Tensor.from_dlpack("y", tensor.to_dlpack())
    writable = pb_utils.Tensor("w", np.ones(3, np.int64))

    np.testing.assert_array_equal(again.as_numpy(), data)
    assert np.shares_memory(pb_utils.Tensor.from_dlpack("v", writable).as_numpy(), writable.as_numpy())


def test_a_response_sender_refuses_after_its_final_response():
    sent = []
    sender = pb_utils.InferenceResponseSender(lambda response, final: sent.append((response, final)))

    sender.send(pb_utils.InferenceResponse([]))
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    assert [final for _, final in sent] == [False, True]
    with pytest.raises(pb_utils.TritonModelException, match="final response"):
        sender.send(pb_utils.InferenceResponse([]))


# -- pb_utils.ModelConfig: auto_complete_config's view of the config ---------------------------------
def test_auto_complete_adds_tensors_and_batching_as_triton_does():
    config = ModelConfig(json.dumps({"name": "m", "backend": "python"}))

    config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_output({"name": "y", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": False})

    doc = config.as_dict()
    assert doc["max_batch_size"] == 8 and doc["dynamic_batching"] == {}
    assert [t["name"] for t in doc["input"]] == ["x"] and doc["output"][0]["dims"] == [4]
    assert doc["model_transaction_policy"] == {"decoupled": False}


def test_auto_complete_fills_a_declared_tensor_and_refuses_a_disagreeing_one():
    config = ModelConfig({"name": "m", "max_batch_size": 16, "input": [{"name": "x", "data_type": "TYPE_FP32",
                                                                          "dims": []}]})
    config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [3]})
    assert config.as_dict()["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [3]}]

    with pytest.raises(ValueError, match="configuration expects datatype TYPE_FP32 for input 'x'"):
        config.add_input({"name": "x", "data_type": "TYPE_INT32", "dims": [3]})
    with pytest.raises(ValueError, match="expects dims \\[5\\]"):
        config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [5]})
    with pytest.raises(ValueError, match="contains property other than"):
        config.add_output({"name": "y", "data_type": "TYPE_FP32", "dims": [1], "optional": True})
    with pytest.raises(ValueError, match="max_batch_size 16"):
        config.set_max_batch_size(4)  # a config may lower the model's max_batch_size, never raise it


def test_inference_request_takes_tritons_positional_order_and_timeout_is_a_method():
    x = pb_utils.Tensor("x", np.ones(2, np.float32))

    # request_id, correlation_id, inputs, requested_output_names, model_name, model_version, flags, timeout
    request = pb_utils.InferenceRequest("r-1", 7, [x], ["y"], "target", 2, 0, 1500)

    assert (request.request_id(), request.correlation_id(), request.inputs(), request.requested_output_names()) == (
        "r-1", 7, [x], ["y"])
    assert (request.model_name, request.model_version, request.timeout()) == ("target", 2, 1500)
    assert pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[]).timeout() == 0


def test_logger_has_tritons_log_levels_and_logs_each_at_its_own(caplog):
    logger = pb_utils.Logger
    caplog.set_level("DEBUG", logger="ringserve.worker.model")

    logger.log("plain")
    logger.log("warned", logger.LogLevel.WARNING)
    logger.log("failed", pb_utils.Logger.ERROR)
    logger.log("verbose", logger.LogLevel.VERBOSE)

    assert [(r.levelname, r.getMessage().rsplit(": ", 1)[1]) for r in caplog.records] == [
        ("INFO", "plain"), ("WARNING", "warned"), ("ERROR", "failed"), ("DEBUG", "verbose")]
    assert [int(level) for level in logger.LogLevel] == [0, 1, 2, 3]
    with pytest.raises(pb_utils.TritonModelException, match="LogLevel"):
        logger.log("?", 9)
