"""Triton's `config.pbtxt` read into the config.json document ringserve already serves.

The text is parsed by protobuf's own text-format parser into Triton's ModelConfig message
(`tritonclient.grpc.model_config_pb2`, the schema Triton itself ships), so a misspelt field or a
bad value fails exactly as in Triton, with protobuf's line:column. The message is then written
as Triton's JSON (`json_format.MessageToDict`, proto field names), which is what config.json
holds, and from there the config.json path applies unchanged: the same field table
(common/repository/fields.py) refuses by name what ringserve does not implement, the same checks run.

Three things protobuf's JSON does differently from a hand-written config.json, undone here:
- int64/uint64 fields come out as strings ("dims": ["-1"]); they are turned back into ints, so
  /v2/models/{m}/config shows the same numbers either way;
- a scalar at its default is left out, so `max_batch_size: 0` would read as "not written" and
  be auto-completed from the graph (64 for a batchable one); it is kept when the text writes it;
- an enum at its zero value is left out: batch_input's `kind: BATCH_ELEMENT_COUNT` is put back.

tritonclient's grpc package needs grpcio to import, so it is imported only when a model
directory holds a config.pbtxt: a repository of config.json models never loads grpc.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf.descriptor import FieldDescriptor  # protobuf is onnx's dependency too: loaded anyway

from ringserve.common.errors import ConfigError

PBTXT = "config.pbtxt"
# Triton's configs run to a few KiB. Parsing is pure Python, about 1 s per MiB of text here, so a
# 9 MB config.pbtxt kept a reloaded worker from its first heartbeat long enough to be killed as hung.
MAX_CONFIG_BYTES = 1 << 20

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
        FieldDescriptor.TYPE_SINT64,
    }
)


def _written_top_level_fields(text: str) -> set[str]:
    """The field names the text writes at the top level, read with protobuf's own tokenizer
    (it skips comments and knows strings); called only on text that already parsed."""
    from google.protobuf import text_format  # noqa: PLC0415 - protobuf is imported only for a config.pbtxt

    tokenizer = text_format.Tokenizer(text.splitlines())
    names: set[str] = set()
    depth, previous = 0, None
    while not tokenizer.AtEnd():
        token = tokenizer.token
        if token in ("{", "<", "["):
            depth += 1
        elif token in ("}", ">", "]"):
            depth -= 1
        elif depth == 0 and previous != ":" and token[:1].isidentifier():
            names.add(token)
        previous = token
        tokenizer.NextToken()
    return names


def _ints(descriptor: Any, doc: Any) -> Any:
    """`doc` (MessageToDict's output for a message of `descriptor`) with int64 strings as ints."""
    if not isinstance(doc, dict):
        return doc
    for key, value in doc.items():
        field = descriptor.fields_by_name.get(key)
        if field is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            if value_field.message_type is not None:
                doc[key] = {k: _ints(value_field.message_type, v) for k, v in value.items()}
            elif value_field.type in _INT64_TYPES:
                doc[key] = {k: int(v) for k, v in value.items()}
        elif field.message_type is not None:
            if isinstance(value, list):
                doc[key] = [_ints(field.message_type, v) for v in value]
            else:
                doc[key] = _ints(field.message_type, value)
        elif field.type in _INT64_TYPES:
            doc[key] = [int(v) for v in value] if isinstance(value, list) else int(value)
    return doc


def read_config_text(path: Path, name: str) -> str:
    """A config file's text (config.json or config.pbtxt); ConfigError when it cannot be read or is
    over MAX_CONFIG_BYTES (found before reading past the limit)."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(
                name,
                path.name,
                f"{path} is {max(path.stat().st_size, len(data))} bytes; a model "
                f"config may have at most {MAX_CONFIG_BYTES} bytes (Triton's run to a "
                "few KiB): keep long lists (labels, parameters) in files of their own",
            )
        return data.decode()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(name, path.name, f"{path} cannot be read: {e}") from e


def read_pbtxt(path: Path, name: str) -> dict[str, Any]:
    """The config.json document that `path` (a config.pbtxt) means; ConfigError if it does not parse."""
    text = read_config_text(path, name)
    try:
        from google.protobuf import json_format, text_format  # noqa: PLC0415 - protobuf is imported only for a config.pbtxt
        from tritonclient.grpc import model_config_pb2  # noqa: PLC0415 - protobuf is imported only for a config.pbtxt
    except (ImportError, RuntimeError) as e:  # tritonclient raises RuntimeError without grpcio
        raise ConfigError(name, PBTXT, f"reading {path} needs tritonclient[grpc] (a ringserve dependency): {e}") from e
    message = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as e:
        # protobuf's message starts with line:column, e.g. '4:1 : Message type "inference.ModelConfig"
        # has no field named "max_batch_sze".'
        raise ConfigError(name, PBTXT, f"{path}:{e} (Triton's ModelConfig in protobuf text format)") from None
    doc = _ints(message.DESCRIPTOR, json_format.MessageToDict(message, preserving_proto_field_name=True))
    if "max_batch_size" not in doc and "max_batch_size" in _written_top_level_fields(text):
        doc["max_batch_size"] = 0
    for batch_input in doc.get("batch_input", ()):
        batch_input.setdefault("kind", "BATCH_ELEMENT_COUNT")
    return doc
