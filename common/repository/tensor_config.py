"""One input's or output's config (Triton's `input`/`output` entries): TensorConfig, its name, KServe datatype,
dims, ragged/optional flags, labels and reshape; and the checks a model's config shares with it (the most
dims an array may have; ConfigErrors re-raised with the model's name)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ringserve.common.errors import ConfigError
from ringserve.common.repository.datatypes import KSERVE_DATATYPES, kserve_from_triton, numpy_dtype, triton_from_kserve
from ringserve.common.repository.fields import as_int
from ringserve.common.repository.reshape import check_shape_tensor, read_reshape

# The most dims an array may have: numpy's NPY_MAXDIMS (64 from numpy 2, 32 before), which every
# request's tensors become (a request past it got a plain-text 500 from the reshape). Checked where a
# config's dims are read, batch dim included, so such a model is refused at load (400), not served.
MAX_TENSOR_DIMS = 64 if int(np.__version__.split(".")[0]) >= 2 else 32


@contextlib.contextmanager
def naming_model(name: str) -> Iterator[None]:
    """Re-raise ConfigErrors from the per-tensor/per-section checks with the model's name."""
    try:
        yield
    except ConfigError as e:
        if e.model is not None:
            raise
        raise ConfigError(name, e.field, e.problem) from None


def too_many_dims(tensor: str, count: int, *, batched: bool) -> str:
    with_batch = " with the batch dim (max_batch_size > 0)" if batched else ""
    return f"tensor '{tensor}' has {count} dims{with_batch}; a tensor may have at most {MAX_TENSOR_DIMS}"


@dataclass(frozen=True)
class TensorConfig:
    """One input or output: KServe datatype name and dims (-1 = variable)."""

    name: str
    datatype: str  # KServe name, e.g. "FP32"
    dims: tuple[int, ...]  # without the batch dim when max_batch_size > 0; -1 = variable
    # Triton's ragged input: requests may differ in length; the batch concatenates them into
    # one 1-D tensor (the model takes it 1-D) and batch_input entries describe the pieces.
    allow_ragged_batch: bool = False
    # Triton's optional input: a request may leave it out (the ONNX graph's initializer is its value).
    optional: bool = False
    # An output's class labels, one a line in <model dir>/<label_filename> (the classification
    # extension); common/repository/scan.py reads the file into `labels`.
    label_filename: str = ""
    labels: tuple[str, ...] = field(default=(), repr=False)
    # Triton's reshape: the shape the model takes or gives instead of `dims` (common/repository/reshape.py).
    reshape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError(None, "name", "tensor names must be non-empty")
        if self.datatype not in KSERVE_DATATYPES:
            raise ConfigError(None, "data_type", f"tensor '{self.name}': unknown datatype {self.datatype!r}")
        if any(d != -1 and d < 1 for d in self.dims):
            raise ConfigError(None, "dims", f"tensor '{self.name}': entries must be -1 or >= 1, got {list(self.dims)}")
        if len(self.dims) > MAX_TENSOR_DIMS:
            raise ConfigError(None, "dims", too_many_dims(self.name, len(self.dims), batched=False))

    @functools.cached_property
    def np_dtype(self) -> np.dtype:
        return numpy_dtype(self.datatype)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TensorConfig:
        if "data_type" in doc:
            datatype = kserve_from_triton(doc["data_type"])
        elif "datatype" in doc:  # KServe spelling, as /v2/models/{m} metadata shows it
            datatype = doc["datatype"]
        else:
            raise ConfigError(None, "data_type", f"tensor {doc.get('name')!r}: data_type is missing")
        dims = tuple(as_int(d, "dims") for d in doc.get("dims", ()))
        optional, label_filename = doc.get("optional", False), doc.get("label_filename", "")
        if type(optional) is not bool:
            raise ConfigError(None, "optional", f"tensor {doc.get('name')!r}: must be true or false, got {optional!r}")
        if not isinstance(label_filename, str):
            raise ConfigError(
                None, "label_filename", f"tensor {doc.get('name')!r}: must be a file name, got {label_filename!r}"
            )
        name = str(doc.get("name", ""))
        check_shape_tensor(name, doc.get("is_shape_tensor", False))
        return cls(
            name=name,
            datatype=datatype,
            dims=dims,
            allow_ragged_batch=bool(doc.get("allow_ragged_batch", False)),
            optional=optional,
            label_filename=label_filename,
            reshape=read_reshape(doc, name),
        )

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "data_type": triton_from_kserve(self.datatype),
            "dims": list(self.dims),
        }
        if self.allow_ragged_batch:
            doc["allow_ragged_batch"] = True
        if self.optional:
            doc["optional"] = True
        if self.label_filename:
            doc["label_filename"] = self.label_filename
        if self.reshape is not None:
            doc["reshape"] = {"shape": list(self.reshape)}
        return doc

    @property
    def model_dims(self) -> tuple[int, ...]:
        """The dims the model itself takes or gives (without the batch dim): its reshape, else dims."""
        return self.dims if self.reshape is None else self.reshape
