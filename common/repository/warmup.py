"""Triton's model_warmup: requests a model runs at each load, before it is ready (worker/warmup.py runs them).

    "model_warmup": [{"name": "sample", "batch_size": 2, "count": 3,
                      "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [16], "zero_data": true}}}]

- Each sample is `batch_size` requests of one row each (Triton builds them so), run as one execution,
  `count` times (0 means once). An input's data is zeros (`zero_data`), random bytes (`random_data`; zeros
  for TYPE_STRING, as Triton), or the bytes of `<model dir>/warmup/<input_data_file>`, row-major (TYPE_STRING:
  each element a 4-byte length, then its bytes). As in Triton, the oneof's value is not read: `zero_data:
  false` is zeros too.
- A sample that fails fails the load, with Triton's words: "failed to run warmup sample 'zero sample':
  An Error Occurred; ". A batch_size of 0 is skipped, as Triton skips it.
- ringserve's own `"warmup": true` (config.json) is one sample of zeros of every input, variable dims 1,
  run once; zeros are not every model's valid input, so its failure is logged and the model serves.

What can be checked without the model's files is checked here, when the config is built (ConfigError).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ringserve.common.errors import ConfigError
from ringserve.common.repository.datatypes import kserve_from_triton
from ringserve.common.repository.fields import as_int

if TYPE_CHECKING:
    from ringserve.common.repository.lifecycle import Lifecycle
    from ringserve.common.repository.sequences import SequenceBatching
    from ringserve.common.repository.tensor_config import TensorConfig

WarmupData = Literal["zero_data", "random_data", "input_data_file"]
WARMUP_DATA: tuple[WarmupData, ...] = ("zero_data", "random_data", "input_data_file")
WARMUP_FOLDER = "warmup"  # Triton's kWarmupDataFolder, in the model's directory
OWN_SAMPLE = "warmup"  # the name of the sample `warmup: true` stands for


@dataclass(frozen=True)
class WarmupInput:
    """One input of a sample: its datatype (KServe's name), dims without the batch dim, where its bytes come from."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    data: WarmupData
    data_file: str = ""  # input_data_file: a name inside <model dir>/warmup/


@dataclass(frozen=True)
class WarmupSample:
    name: str
    batch_size: int
    inputs: tuple[WarmupInput, ...]
    count: int = 1  # executions (Triton's count, at least 1)
    required: bool = True  # False for `warmup: true`: its failure is logged, not the load's


def _sample_input(sample: str, name: str, doc: Any) -> WarmupInput:
    if not isinstance(doc, Mapping):
        raise ConfigError(None, "model_warmup.inputs", f"sample '{sample}': input '{name}' must be an object")
    data = [key for key in WARMUP_DATA if key in doc]
    if len(data) != 1:
        # Triton's words for none; protobuf's oneof keeps only the last of several, JSON has them all.
        problem = "to have input_data_type set" if not data else f"to have one input_data_type, got {data}"
        raise ConfigError(None, "model_warmup.inputs", f"warmup setting expects input '{name}' {problem}")
    dims = doc.get("dims", [])
    dims = [dims] if isinstance(dims, (int, str)) else dims
    dims = tuple(as_int(d, "model_warmup.inputs.dims") for d in dims)
    if any(d < 0 for d in dims):
        raise ConfigError(
            None,
            "model_warmup.inputs.dims",
            f"warmup setting expects all variable-size dimensions are specified for input '{name}'",
        )
    data_file = doc.get("input_data_file", "")
    if data[0] == "input_data_file":
        path = PurePath(str(data_file))
        if not data_file or path.is_absolute() or ".." in path.parts:
            raise ConfigError(
                None,
                "model_warmup.inputs.input_data_file",
                f"input '{name}': {data_file!r} must name a file inside the model's {WARMUP_FOLDER}/ folder",
            )
    return WarmupInput(
        name=name,
        datatype=kserve_from_triton(doc.get("data_type", "TYPE_INVALID")),
        dims=dims,
        data=data[0],
        data_file=str(data_file),
    )


def _sample(doc: Any, index: int) -> WarmupSample:
    if not isinstance(doc, Mapping):
        raise ConfigError(None, "model_warmup", f"entries must be objects, got {doc!r}")
    name = str(doc.get("name", ""))
    inputs = doc.get("inputs", {})
    if not isinstance(inputs, Mapping):
        raise ConfigError(None, "model_warmup.inputs", f"sample '{name}': must map input names to their data")
    batch_size = as_int(doc.get("batch_size", 0), "model_warmup.batch_size")
    count = as_int(doc.get("count", 0), "model_warmup.count")
    if batch_size < 0 or count < 0:
        raise ConfigError(None, "model_warmup", f"sample '{name}': batch_size and count must be >= 0")
    return WarmupSample(
        name=name or f"sample {index}",
        batch_size=batch_size,
        inputs=tuple(_sample_input(name, k, v) for k, v in inputs.items()),
        count=max(count, 1),
    )


class WarmupTarget(Protocol):
    """What a config's warm-up samples are checked against: common/repository/config.py's ModelConfig, which
    reads its samples from here (so this module names what it reads instead of importing config.py back)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def extra(self) -> Mapping[str, Any]: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def inputs(self) -> tuple[TensorConfig, ...]: ...
    @property
    def required_inputs(self) -> tuple[str, ...]: ...
    @property
    def sequence_batching(self) -> SequenceBatching | None: ...
    @property
    def lifecycle(self) -> Lifecycle: ...


def _own_sample(config: WarmupTarget) -> WarmupSample:
    """`warmup: true`: zeros of every request input, variable dims 1, one request."""
    inputs = tuple(
        WarmupInput(t.name, t.datatype, tuple(1 if d == -1 else d for d in t.dims), "zero_data")
        for t in config.inputs
        if not t.optional
    )
    return WarmupSample(OWN_SAMPLE, 1, inputs, required=False)


def _fits(dims: tuple[int, ...], config_dims: tuple[int, ...]) -> bool:
    return len(dims) == len(config_dims) and all(c in (-1, d) for d, c in zip(dims, config_dims))


def samples_of(config: WarmupTarget) -> tuple[WarmupSample, ...]:
    """The samples each load of `config` runs, checked against its inputs and max_batch_size."""
    docs = config.extra.get("model_warmup") or []
    if not isinstance(docs, list):
        raise ConfigError(None, "model_warmup", f"must be a list of samples, got {docs!r}")
    if docs and config.kind == "ensemble":
        raise ConfigError(None, "model_warmup", f"model_warmup can not be specified for ensemble '{config.name}'")
    samples = [s for s in (_sample(doc, i) for i, doc in enumerate(docs)) if s.batch_size > 0]
    sequence = config.sequence_batching
    known = {t.name: t for t in config.inputs}
    generated = set(sequence.generated_inputs) if sequence is not None else set()
    for sample in samples:
        limit = max(config.max_batch_size, 1)
        if sample.batch_size > limit:
            why = f"max_batch_size {config.max_batch_size}" if config.max_batch_size else "1: the model does not batch"
            raise ConfigError(
                None, "model_warmup.batch_size", f"sample '{sample.name}': batch_size {sample.batch_size} exceeds {why}"
            )
        for given in sample.inputs:
            tensor = known.get(given.name)
            if tensor is None and given.name not in generated:
                raise ConfigError(
                    None,
                    "model_warmup.inputs",
                    f"sample '{sample.name}': '{given.name}' is not an input of model '{config.name}' "
                    f"(inputs: {sorted(known) + sorted(generated)})",
                )
            if tensor is not None and given.datatype != tensor.datatype:
                raise ConfigError(
                    None,
                    "model_warmup.inputs",
                    f"sample '{sample.name}': input '{given.name}' data-type is '{given.datatype}', but model "
                    f"'{config.name}' expects '{tensor.datatype}'",
                )
            if tensor is not None and not tensor.allow_ragged_batch and not _fits(given.dims, tensor.dims):
                raise ConfigError(
                    None,
                    "model_warmup.inputs.dims",
                    f"sample '{sample.name}': unexpected shape for input '{given.name}' for model '{config.name}'. "
                    f"Expected {list(tensor.dims)}, got {list(given.dims)}",
                )
        missing = [name for name in config.required_inputs if name not in {i.name for i in sample.inputs}]
        if missing:
            raise ConfigError(
                None,
                "model_warmup.inputs",
                f"sample '{sample.name}': expected {len(config.required_inputs)} inputs but got "
                f"{len(sample.inputs)} inputs for model '{config.name}'; missing required input(s) {missing}",
            )
    if config.lifecycle.warmup and config.kind != "ensemble":
        samples.append(_own_sample(config))
    return tuple(samples)
