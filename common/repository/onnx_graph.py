"""An ONNX model's graph, read without its weights: its inputs (overridable initializers flagged) and
outputs; a config's max_batch_size, input and output auto-completed from it as Triton's ORT backend does;
and what a config declares checked against it. common/repository/scan.py reads each model.onnx here."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import onnx

from ringserve.common.errors import ConfigError
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.datatypes import kserve_from_onnx
from ringserve.common.repository.fields import as_int

# Triton's ORT backend also picks a default batch size when the graph's batch dim is symbolic.
AUTO_MAX_BATCH_SIZE = 64


class GraphTensor(NamedTuple):
    name: str
    datatype: str
    shape: tuple[int, ...]  # full shape, batch dim included; -1 = symbolic or unknown
    # An input that is also an initializer: ONNX Runtime's "overridable initializer", fed only when a
    # request gives it (a config may declare it, optional as Triton's ORT backend takes it).
    initializer: bool = False


def read_graph(model_path: Path) -> tuple[list[GraphTensor], list[GraphTensor]]:
    """Inputs (overridable initializers flagged) and outputs of the ONNX graph, without loading weights."""
    try:
        graph = onnx.load(str(model_path), load_external_data=False).graph
    except Exception as e:  # protobuf raises a zoo of types for a corrupt file
        raise ConfigError(None, "model.onnx", f"{model_path} cannot be read: {e}") from e
    initializers = {init.name for init in graph.initializer}

    def tensor(value: onnx.ValueInfoProto, initializer: bool = False) -> GraphTensor:
        elem_type = value.type.tensor_type.elem_type
        datatype = kserve_from_onnx(elem_type)
        if datatype is None:
            type_name = onnx.TensorProto.DataType.Name(elem_type)
            raise ConfigError(None, "model.onnx", f"tensor '{value.name}' has unsupported type {type_name}")
        dims = value.type.tensor_type.shape.dim
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims)
        return GraphTensor(value.name, datatype, shape, initializer)

    inputs = [tensor(v, v.name in initializers) for v in graph.input]
    return inputs, [tensor(v) for v in graph.output]


def autocomplete(doc: Mapping[str, Any], inputs: list[GraphTensor], outputs: list[GraphTensor]) -> dict[str, Any]:
    """Fill max_batch_size, input and output that config.json left out, as Triton does."""
    doc = dict(doc)
    inputs = [t for t in inputs if not t.initializer]  # weights, unless a config names one as an input
    if "max_batch_size" not in doc:
        batchable = all(t.shape and t.shape[0] == -1 for t in inputs + outputs)
        doc["max_batch_size"] = AUTO_MAX_BATCH_SIZE if batchable else 0
        if batchable and "sequence_batching" not in doc:  # (a model has one scheduler)
            doc.setdefault("dynamic_batching", {})
    batch_dims = 1 if as_int(doc["max_batch_size"], "max_batch_size") > 0 else 0
    generated = {name for b in doc.get("batch_input", ()) for name in (b.get("target_name") or [])}
    sequence = doc.get("sequence_batching") or {}
    if isinstance(sequence, Mapping):  # control and state inputs are the sequence batcher's, state outputs too
        generated |= {c.get("name") for c in sequence.get("control_input") or () if isinstance(c, Mapping)}
        generated |= {s.get("input_name") for s in sequence.get("state") or () if isinstance(s, Mapping)}
        state_outputs = {s.get("output_name") for s in sequence.get("state") or () if isinstance(s, Mapping)}
        outputs = [t for t in outputs if t.name not in state_outputs]
    inputs = [t for t in inputs if t.name not in generated]
    for key, tensors in (("input", inputs), ("output", outputs)):
        if key not in doc:
            doc[key] = [{"name": t.name, "datatype": t.datatype, "dims": list(t.shape[batch_dims:])} for t in tensors]
    return doc


def check_against_graph(
    config: ModelConfig, inputs: list[GraphTensor], outputs: list[GraphTensor], source: str = "config.json"
) -> None:
    batch = (-1,) if config.max_batch_size > 0 else ()
    for kind, declared, graph in (("input", config.inputs, inputs), ("output", config.outputs, outputs)):
        by_name = {t.name: t for t in graph}
        for tensor in declared:
            actual = by_name.get(tensor.name)
            if actual is None:
                raise ConfigError(
                    config.name,
                    kind,
                    f"'{tensor.name}' is not an {kind} of the ONNX graph (graph has {sorted(by_name)})",
                )
            if actual.datatype != tensor.datatype:
                raise ConfigError(
                    config.name,
                    kind,
                    f"'{tensor.name}' is {tensor.datatype} in {source} but {actual.datatype} in the ONNX graph",
                )
            if kind == "output" and tensor.name in config.batch_output_sources:
                continue  # its shape is the batch's, cut per request (Triton's backend compares neither)
            # Ragged inputs reach the model concatenated into one 1-D tensor (Triton's ORT backend); a reshape
            # is what the model takes or gives instead of dims.
            shape = (-1,) if tensor.allow_ragged_batch else batch + tensor.model_dims
            # A fixed config dim may narrow a symbolic graph dim, never the other way round.
            if len(shape) != len(actual.shape) or any(g != -1 and g != c for c, g in zip(shape, actual.shape)):
                raise ConfigError(
                    config.name,
                    kind,
                    f"'{tensor.name}' has shape {list(shape)} in {source} "
                    f"(batch dim included) but {list(actual.shape)} in the ONNX graph",
                )
    # Every graph input must be fed; outputs may be a subset (Triton allows that too).
    missing = (
        {t.name for t in inputs if not t.initializer}
        - {t.name for t in config.inputs}
        - {b.target_name for b in config.batch_inputs}
        - set(config.sequence_batching.generated_inputs if config.sequence_batching is not None else ())
    )
    if missing:
        raise ConfigError(config.name, "input", f"the ONNX graph also needs {sorted(missing)}")
