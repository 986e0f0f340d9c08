"""The demo's text models, behind the OpenAI routes (gateway/openai/); `ringserve demo-models --text` (make serve):

    echo        a decoupled Python model that streams its prompt back a word at a time (a deterministic
                stand-in for a language model, not one: it shows streaming, usage and the chat template)
    embed       an ensemble: wordllama_tokenizer (Python, the tokenizer) -> wordllama_encoder (ONNX Runtime)

`embed` is WordLlama's default model (the PyPI package `wordllama`, MIT), built from the files its wheel ships:
weights/l2_supercat_256.safetensors (a 32000 x 256 float16 token table, 16 MiB) and
tokenizers/l2_supercat_tokenizer_config.json (the Llama 2 tokenizer). Nothing is downloaded, at build or at run
time. Its encode is a table lookup, a mean over the tokens and (OpenAI's vectors are unit length) an L2
normalization: the ONNX graph below, which equals the package's WordLlamaInference.embed(texts, norm=True).
Without the package (pip install 'ringserve[text]') only `echo` is built.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from ringserve.common.repository.demo import DEMO_MAX_BATCH_SIZE, make_model, write_model_dir

EMBED_MAX_TOKENS = 256  # the tokenizer pads every text to this (an ensemble stacks equal rows); longer: 400
WORDLLAMA_WEIGHTS = "weights/l2_supercat_256.safetensors"
WORDLLAMA_TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"
ECHO_TOKEN_DELAY_MS = 5
# ChatML, the template Hugging Face's docs use as their example; echo's tokenizer folder ships it.
ECHO_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

ECHO_MODEL_PY = '''"""echo: streams its prompt back, one word per response, `token_delay_ms` apart (the config's
parameter, or a request parameter of that name). Not a language model: a deterministic stand-in that speaks
Triton's OpenAI tensor names (text_input, max_tokens, stream -> text_output, num_input_tokens, num_output_tokens)."""
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


def response(text, prompt_tokens, tokens):
    return pb_utils.InferenceResponse([
        pb_utils.Tensor("text_output", np.array([text.encode()], dtype=object)),
        pb_utils.Tensor("num_input_tokens", np.array([prompt_tokens], np.int32)),
        pb_utils.Tensor("num_output_tokens", np.array([tokens], np.int32)),
    ])


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.delay_ms = float(parameters.get("token_delay_ms", {}).get("string_value", "5"))

    def execute(self, requests):
        for request in requests:  # each streams from a thread of its own: execute returns at once
            threading.Thread(target=self.generate, args=(request,), daemon=True).start()
        return None

    def generate(self, request):
        sender = request.get_response_sender()
        words = scalar(request, "text_input", b"").decode("utf-8", "replace").split()
        max_tokens = int(scalar(request, "max_tokens", 16))
        delay_s = float(json.loads(request.parameters() or "{}").get("token_delay_ms", self.delay_ms)) / 1000
        answer = words[:max_tokens]
        if not bool(scalar(request, "stream", False)):
            time.sleep(delay_s * len(answer))
            sender.send(response(" ".join(answer), len(words), len(answer)),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        for k, word in enumerate(answer):
            time.sleep(delay_s)
            if request.is_cancelled():
                break
            sender.send(response(word if k == 0 else " " + word, len(words), 1))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

TOKENIZER_MODEL_PY = '''"""wordllama_tokenizer: each text -> WordLlama's token ids (the Llama 2 tokenizer,
tokenizer.json in the model's folder), padded to max_tokens with a mask, and its token count. As the package
tokenizes: no special tokens added."""
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.max_tokens = int(parameters["max_tokens"]["string_value"])
        self.tokenizer = Tokenizer.from_file(os.path.join(args["model_repository"], "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
            strings = [t.decode("utf-8", "replace") for t in texts]
            encoded = self.tokenizer.encode_batch(strings, add_special_tokens=False)
            longest = max(len(e.ids) for e in encoded)
            if longest > self.max_tokens:
                raise pb_utils.TritonModelException(
                    f"a text of {longest} tokens; this model embeds at most {self.max_tokens}")
            ids = np.zeros((len(texts), self.max_tokens), np.int64)
            mask = np.zeros((len(texts), self.max_tokens), np.int64)
            for row, e in enumerate(encoded):
                ids[row, : len(e.ids)] = e.ids
                mask[row, : len(e.ids)] = 1
            counts = mask.sum(axis=1, keepdims=True).astype(np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("input_ids", ids), pb_utils.Tensor("attention_mask", mask),
                pb_utils.Tensor("num_input_tokens", counts)]))
        return responses
'''


def build_demo_text_models(repo_dir: Path) -> list[str]:
    """Write `echo`, and where the wordllama package is installed `wordllama_tokenizer`, `wordllama_encoder` and
    `embed`, into `repo_dir`; returns their names."""
    names = [build_echo_model(Path(repo_dir))]
    package = wordllama_folder()
    if package is not None:
        names += build_embed_models(Path(repo_dir), package)
    return names


def wordllama_folder() -> Path | None:
    try:
        import wordllama  # noqa: PLC0415 - optional: the `text` extra
    except ImportError:
        return None
    return Path(wordllama.__file__).parent


def build_echo_model(
    repo: Path, name: str = "echo", token_delay_ms: float = ECHO_TOKEN_DELAY_MS, chat_template: bool = True
) -> str:
    """`echo` (see the module's doc), with a tokenizer folder holding ECHO_CHAT_TEMPLATE unless not `chat_template`."""
    config = {
        "name": name,
        "backend": "python",
        "max_batch_size": 0,
        "model_transaction_policy": {"decoupled": True},
        "input": [
            _tensor("text_input", "TYPE_STRING", [1]),
            {**_tensor("max_tokens", "TYPE_INT32", [1]), "optional": True},
            {**_tensor("stream", "TYPE_BOOL", [1]), "optional": True},
        ],
        "output": [
            _tensor("text_output", "TYPE_STRING", [1]),
            _tensor("num_input_tokens", "TYPE_INT32", [1]),
            _tensor("num_output_tokens", "TYPE_INT32", [1]),
        ],
        "parameters": {"token_delay_ms": {"string_value": str(token_delay_ms)}},
    }
    _write_python(repo, name, ECHO_MODEL_PY, config)
    if not chat_template:
        return name
    tokenizer = repo / name / "tokenizer"
    tokenizer.mkdir(exist_ok=True)
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"chat_template": ECHO_CHAT_TEMPLATE}, indent=2) + "\n")
    return name


def build_embed_models(repo: Path, package: Path) -> list[str]:
    """The tokenizer, the encoder and the `embed` ensemble of them, from the wordllama package's own files."""
    from safetensors.numpy import load_file  # noqa: PLC0415 - a dependency of wordllama

    table = load_file(str(package / WORDLLAMA_WEIGHTS))["embedding.weight"]  # float16 [32000, 256]
    width = int(table.shape[1])
    _write_python(
        repo,
        "wordllama_tokenizer",
        TOKENIZER_MODEL_PY,
        {
            "name": "wordllama_tokenizer",
            "backend": "python",
            "max_batch_size": DEMO_MAX_BATCH_SIZE,
            "input": [_tensor("text_input", "TYPE_STRING", [1])],
            "output": [
                _tensor("input_ids", "TYPE_INT64", [EMBED_MAX_TOKENS]),
                _tensor("attention_mask", "TYPE_INT64", [EMBED_MAX_TOKENS]),
                _tensor("num_input_tokens", "TYPE_INT32", [1]),
            ],
            "parameters": {"max_tokens": {"string_value": str(EMBED_MAX_TOKENS)}},
            "dynamic_batching": {"max_queue_delay_microseconds": 0},
        },
    )
    shutil.copyfile(package / WORDLLAMA_TOKENIZER, repo / "wordllama_tokenizer" / "tokenizer.json")
    encoder_config = {
        "name": "wordllama_encoder",
        "platform": "onnxruntime_onnx",
        "max_batch_size": DEMO_MAX_BATCH_SIZE,
        "input": [_tensor("input_ids", "TYPE_INT64", [-1]), _tensor("attention_mask", "TYPE_INT64", [-1])],
        "output": [_tensor("embedding", "TYPE_FP32", [width])],
        "dynamic_batching": {
            "max_queue_delay_microseconds": 0,
            "padding": {"value": 0, "mask_input": "attention_mask"},
        },
    }
    write_model_dir(repo, "wordllama_encoder", wordllama_encoder(table), encoder_config)
    ensemble = {
        "name": "embed",
        "platform": "ensemble",
        "max_batch_size": DEMO_MAX_BATCH_SIZE,
        "input": [_tensor("text_input", "TYPE_STRING", [1])],
        "output": [_tensor("embedding", "TYPE_FP32", [width]), _tensor("num_input_tokens", "TYPE_INT32", [1])],
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": "wordllama_tokenizer",
                    "model_version": -1,
                    "input_map": {"text_input": "text_input"},
                    "output_map": {
                        "input_ids": "input_ids",
                        "attention_mask": "attention_mask",
                        "num_input_tokens": "num_input_tokens",
                    },
                },
                {
                    "model_name": "wordllama_encoder",
                    "model_version": -1,
                    "input_map": {"input_ids": "input_ids", "attention_mask": "attention_mask"},
                    "output_map": {"embedding": "embedding"},
                },
            ]
        },
    }
    (repo / "embed" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "embed" / "config.json").write_text(json.dumps(ensemble, indent=2) + "\n")
    return ["wordllama_tokenizer", "wordllama_encoder", "embed"]


def wordllama_encoder(table: np.ndarray) -> Any:
    """input_ids, attention_mask [batch, seq] -> embedding [batch, width]: the table's rows of the ids (float16,
    as shipped, then float32 as the package computes), their mean over the unmasked tokens, L2-normalized."""
    weights = {
        "table": table,
        "axis_seq": np.array([1], dtype=np.int64),
        "axis_last": np.array([2], dtype=np.int64),
        "one": np.array(1.0, dtype=np.float32),
        "tiny": np.array(1e-12, dtype=np.float32),
    }
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["rows16"], axis=0),
        helper.make_node("Cast", ["rows16"], ["rows"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask", "axis_last"], ["mask_3d"]),
        helper.make_node("Mul", ["rows", "mask_3d"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis_seq"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask", "axis_seq"], ["count"], keepdims=1),
        helper.make_node("Max", ["count", "one"], ["count_at_least_one"]),
        helper.make_node("Div", ["summed", "count_at_least_one"], ["mean"]),
        helper.make_node("Mul", ["mean", "mean"], ["squares"]),
        helper.make_node("ReduceSum", ["squares", "axis_seq"], ["square_sum"], keepdims=1),
        helper.make_node("Sqrt", ["square_sum"], ["norm"]),
        helper.make_node("Max", ["norm", "tiny"], ["norm_not_zero"]),  # (an empty text: zeros, not NaN)
        helper.make_node("Div", ["mean", "norm_not_zero"], ["embedding"]),
    ]
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in ("input_ids", "attention_mask")
    ]
    output = helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", int(table.shape[1])])
    return make_model("wordllama_encoder", nodes, inputs, [output], weights)


def _tensor(name: str, data_type: str, dims: list[int]) -> dict[str, Any]:
    return {"name": name, "data_type": data_type, "dims": dims}


def _write_python(repo: Path, name: str, source: str, config: dict[str, Any]) -> None:
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.py").write_text(source)
    (repo / name / "config.json").write_text(json.dumps(config, indent=2) + "\n")
