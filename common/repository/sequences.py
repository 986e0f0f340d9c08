"""Triton's `sequence_batching` section as frozen dataclasses: strategies, control inputs, implicit state.

Names, defaults and the configs refused are Triton's (common protobuf/model_config.proto, core
src/model_config_utils.cc and sequence_batch_scheduler.cc), and so are the refusals' words: a Triton
user's config.pbtxt loads unchanged or is refused for the reason Triton gives. The gateway acts on it
(gateway/batching/sequences.py): control inputs and the state inputs are tensors the gateway writes
into the slot beside the request's own; the state outputs are outputs the gateway commits to the state
store (shm/states.py) when the step's result arrives.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ringserve.common.errors import ConfigError
from ringserve.common.repository.datatypes import kserve_from_triton, numpy_dtype, triton_from_kserve
from ringserve.common.repository.fields import as_int

ControlKind = Literal["START", "END", "READY", "CORRID"]
Strategy = Literal["direct", "oldest"]

IDLE_DEFAULT_US = 1_000_000  # Triton's SEQUENCE_IDLE_DEFAULT_MICROSECONDS
MAX_STRING_ID_CHARS = 128  # Triton: "string correlation ID cannot be longer than 128 characters"
CORRID_DATATYPES = ("UINT64", "INT64", "UINT32", "INT32", "BYTES")
# A state dim of -1 grows with the sequence; its slot in the store is sized by this bound unless
# parameters.max_shapes gives one (the session's window).
DEFAULT_STATE_WINDOW = 1024
INITIAL_STATE_FOLDER = "initial_state"  # Triton's kInitialStateFolder, under the model's directory
STRING_STATE_ELEMENT_BYTES = 1024  # a STRING state's element, at most (the store keeps room for each)


def _kind_name(kind: str) -> str:
    return f"CONTROL_SEQUENCE_{kind}"


@dataclass(frozen=True)
class Control:
    """One control input: the tensor `name` carries `kind` (START/END/READY as false/true values in
    `datatype`; CORRID as the sequence id in `datatype`)."""

    name: str
    kind: ControlKind
    datatype: str  # KServe name: INT32, FP32, BOOL for flags; the CORRID's type otherwise
    false_true: tuple[float, float] = (0, 1)

    def value(self, flag: bool) -> float:
        return self.false_true[1] if flag else self.false_true[0]

    def to_json(self) -> dict[str, Any]:
        control: dict[str, Any] = {"kind": _kind_name(self.kind)}
        if self.kind == "CORRID":
            control["data_type"] = triton_from_kserve(self.datatype)
        else:
            key = {"INT32": "int32_false_true", "FP32": "fp32_false_true", "BOOL": "bool_false_true"}[self.datatype]
            values = [bool(v) for v in self.false_true] if self.datatype == "BOOL" else list(self.false_true)
            control[key] = values
        return {"name": self.name, "control": [control]}


@dataclass(frozen=True)
class State:
    """Triton's implicit state: `input_name` is fed the sequence's state, `output_name` is its next state."""

    input_name: str
    output_name: str
    datatype: str  # KServe name
    dims: tuple[int, ...]  # without the batch dim; -1 = grows up to `window`
    initial: bytes | None = None  # initial_state's bytes (zero_data: zeros), None: zeros of dims with -1 as 1
    initial_dims: tuple[int, ...] = ()
    window: tuple[int, ...] = ()  # dims with every -1 bounded: the largest state the store keeps
    source: Mapping[str, Any] | None = None  # the section as written (to_json gives it back)

    @functools.cached_property
    def np_dtype(self) -> np.dtype:
        return numpy_dtype(self.datatype)

    @functools.cached_property
    def fixed_shape(self) -> tuple[int, ...] | None:
        """Its dims where none is -1 (every committed state has that shape), else None."""
        return None if -1 in self.dims else self.dims

    @property
    def max_bytes(self) -> int:
        """The most bytes the store keeps of it: a STRING state's elements in KServe's BYTES form, each
        its 4-byte length and up to STRING_STATE_ELEMENT_BYTES."""
        if self.datatype == "BYTES":
            return (4 + STRING_STATE_ELEMENT_BYTES) * math.prod(self.window)
        return self.np_dtype.itemsize * math.prod(self.window)

    def start_shape(self) -> tuple[int, ...]:
        """The state's shape at a sequence's START (Triton: initial_state's dims, else dims with -1 as 1)."""
        if self.initial is not None:
            return self.initial_dims
        return tuple(1 if d == -1 else d for d in self.dims)

    def start_value(self) -> np.ndarray:
        shape = self.start_shape()
        if self.datatype == "BYTES":  # Triton zeroes a string state whatever its initial_state holds
            return np.full(shape, b"", dtype=object)
        if self.initial is not None:
            return np.frombuffer(self.initial, self.np_dtype, count=math.prod(shape)).reshape(shape)
        return np.zeros(shape, self.np_dtype)


@dataclass(frozen=True)
class SequenceBatching:
    """Triton's sequence_batching: one step per sequence per batch, steps in order, state between them."""

    strategy: Strategy = "direct"
    max_sequence_idle_us: int = IDLE_DEFAULT_US
    controls: tuple[Control, ...] = ()
    states: tuple[State, ...] = ()
    # oldest:
    max_candidate_sequences: int = 1
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    # direct:
    minimum_slot_utilization: float = 0.0
    source: Mapping[str, Any] | None = None  # the section as written, completed with Triton's defaults

    def control(self, kind: ControlKind) -> Control | None:
        for control in self.controls:
            if control.kind == kind:
                return control
        return None

    @property
    def generated_inputs(self) -> tuple[str, ...]:
        """Inputs the gateway writes, never the client: control tensors, then the state inputs."""
        return tuple(c.name for c in self.controls) + tuple(s.input_name for s in self.states)

    @property
    def state_outputs(self) -> frozenset[str]:
        return frozenset(s.output_name for s in self.states)

    def candidate_slots(self, max_batch_size: int, instances: int) -> int:
        """How many sequences may hold state at once; the others wait in the backlog (Triton's slots:
        max_batch_size per instance with Direct, max_candidate_sequences per instance with Oldest)."""
        per_instance = self.max_candidate_sequences if self.strategy == "oldest" else max(max_batch_size, 1)
        return max(per_instance, 1) * max(instances, 1)

    def row_bytes(self) -> int:
        """What one step takes in a slot beyond its request's own inputs: its control values and its
        state, in and out, at their largest."""
        controls = sum(
            4 + 4 * MAX_STRING_ID_CHARS if c.datatype == "BYTES" else numpy_dtype(c.datatype).itemsize
            for c in self.controls
        )
        return controls + 2 * sum(s.max_bytes for s in self.states)

    def to_json(self) -> dict[str, Any]:
        return dict(self.source or {})


def from_json(
    doc: Mapping[str, Any],
    model: str,
    max_batch_size: int,
    model_dir: Path | None,
    max_dims: Mapping[str, tuple[int, ...]] | None = None,
) -> SequenceBatching:
    """The section, validated as Triton validates it (its messages), with Triton's defaults filled in."""
    if not isinstance(doc, Mapping):
        raise ConfigError(None, "sequence_batching", f"must be an object, got {doc!r}")
    if doc.get("iterative_sequence"):
        raise ConfigError(None, "sequence_batching.iterative_sequence", "iterative sequences are not supported")
    if "direct" in doc and "oldest" in doc:
        raise ConfigError(None, "sequence_batching", "set one strategy: 'direct' or 'oldest', not both")
    strategy: Strategy = "oldest" if "oldest" in doc else "direct"
    idle_us = as_int(doc.get("max_sequence_idle_microseconds", 0), "sequence_batching.max_sequence_idle_microseconds")
    idle_us = idle_us or IDLE_DEFAULT_US
    controls = _controls(doc.get("control_input") or [], model)
    states = _states(doc.get("state") or [], model, max_batch_size, model_dir, max_dims or {})
    source = {**doc, "max_sequence_idle_microseconds": idle_us}
    if strategy == "oldest":
        oldest = doc.get("oldest") or {}
        preferred = tuple(
            as_int(s, "sequence_batching.oldest.preferred_batch_size") for s in oldest.get("preferred_batch_size", ())
        )
        for size in preferred:
            if size <= 0:
                raise ConfigError(
                    None, "sequence_batching", f"sequence batching preferred batch size must be positive for {model}"
                )
            if size > max_batch_size:
                raise ConfigError(
                    None,
                    "sequence_batching",
                    f"sequence batching preferred batch size must be <= max batch size for {model}",
                )
        if not preferred and max_batch_size > 0:
            preferred = (max_batch_size,)  # Triton's normalization
        candidates = as_int(
            oldest.get("max_candidate_sequences", 1), "sequence_batching.oldest.max_candidate_sequences"
        )
        if candidates < 1:
            raise ConfigError(
                None, "sequence_batching.oldest.max_candidate_sequences", f"must be >= 1, got {candidates}"
            )
        source["oldest"] = {**oldest, "preferred_batch_size": list(preferred), "max_candidate_sequences": candidates}
        return SequenceBatching(
            strategy=strategy,
            max_sequence_idle_us=idle_us,
            controls=controls,
            states=states,
            max_candidate_sequences=candidates,
            preferred_batch_size=preferred,
            max_queue_delay_us=as_int(
                oldest.get("max_queue_delay_microseconds", 0), "sequence_batching.oldest.max_queue_delay_microseconds"
            ),
            preserve_ordering=bool(oldest.get("preserve_ordering", False)),
            source=source,
        )
    direct = doc.get("direct") or {}
    utilization = float(direct.get("minimum_slot_utilization", 0.0))
    if not 0.0 <= utilization <= 1.0:
        raise ConfigError(
            None,
            "sequence_batching",
            f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {model}",
        )
    return SequenceBatching(
        strategy=strategy,
        max_sequence_idle_us=idle_us,
        controls=controls,
        states=states,
        max_queue_delay_us=as_int(
            direct.get("max_queue_delay_microseconds", 0), "sequence_batching.direct.max_queue_delay_microseconds"
        ),
        minimum_slot_utilization=utilization,
        source=source,
    )


_FLAG_VALUES = (("int32_false_true", "INT32"), ("fp32_false_true", "FP32"), ("bool_false_true", "BOOL"))


def _controls(entries: Any, model: str) -> tuple[Control, ...]:
    """Triton's GetBooleanSequenceControlProperties / GetTypedSequenceControlProperties, in its words."""
    if not isinstance(entries, list):
        raise ConfigError(None, "sequence_batching.control_input", f"must be a list, got {entries!r}")
    seen_names: set[str] = set()
    seen_kinds: set[str] = set()
    controls = []
    for entry in entries:
        name = entry.get("name", "") if isinstance(entry, Mapping) else ""
        if not name:
            raise ConfigError(
                None, "sequence_batching", f"sequence batching control tensor must have a name for {model}"
            )
        if name in seen_names:
            raise ConfigError(
                None,
                "sequence_batching",
                f"sequence batching control tensor '{name}' is specified for multiple control kinds for {model}",
            )
        seen_names.add(name)
        for control in entry.get("control", ()):
            controls.append(_control(name, control, model, seen_kinds))
    return tuple(controls)


def _control(name: str, doc: Mapping[str, Any], model: str, seen_kinds: set[str]) -> Control:
    kind_name = str(doc.get("kind", "CONTROL_SEQUENCE_START"))
    kind = kind_name.removeprefix("CONTROL_SEQUENCE_")
    if kind not in ("START", "END", "READY", "CORRID"):
        raise ConfigError(None, "sequence_batching.control_input.control.kind", f"unknown kind {kind_name!r}")
    if kind in seen_kinds:
        raise ConfigError(
            None, "sequence_batching", f"sequence batching specifies multiple {kind_name} tensors for {model}"
        )
    seen_kinds.add(kind)
    given = [(key, datatype) for key, datatype in _FLAG_VALUES if doc.get(key)]
    if kind == "CORRID":
        if given:
            raise ConfigError(
                None,
                "sequence_batching",
                "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
                f"'bool_false_true' for {kind_name} for {model}",
            )
        datatype = kserve_from_triton(doc.get("data_type", "TYPE_INVALID")) if doc.get("data_type") else "INVALID"
        if datatype not in CORRID_DATATYPES:
            raise ConfigError(
                None,
                "sequence_batching",
                f"unexpected data type for control {kind_name} for {model}. Allowed data types are TYPE_UINT64, "
                "TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
            )
        return Control(name, "CORRID", datatype)
    if not given:
        raise ConfigError(
            None,
            "sequence_batching",
            f"sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for "
            f"{kind_name} for {model}",
        )
    if len(given) > 1:
        raise ConfigError(
            None,
            "sequence_batching",
            "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
            f"'bool_false_true' for {kind_name} for {model}",
        )
    key, datatype = given[0]
    values = doc[key]
    if len(values) != 2:
        raise ConfigError(
            None,
            "sequence_batching",
            f"sequence batching control '{key}' must have exactly 2 entries for {kind_name} for {model}",
        )
    return Control(name, kind, datatype, (float(values[0]), float(values[1])))  # type: ignore[arg-type]


def _states(
    entries: Any, model: str, max_batch_size: int, model_dir: Path | None, max_dims: Mapping[str, tuple[int, ...]]
) -> tuple[State, ...]:
    if not isinstance(entries, list):
        raise ConfigError(None, "sequence_batching.state", f"must be a list, got {entries!r}")
    states: list[State] = []
    for doc in entries:
        input_name, output_name = doc.get("input_name", ""), doc.get("output_name", "")
        if not input_name or not output_name:
            raise ConfigError(None, "sequence_batching.state", "every state needs 'input_name' and 'output_name'")
        if any(s.input_name == input_name for s in states):
            raise ConfigError(
                None, "sequence_batching.state", f"State input name '{input_name}' specified more than once."
            )
        if doc.get("use_growable_memory"):
            raise ConfigError(
                None,
                "sequence_batching.state",
                "'use_growable_memory' can only work with KIND_GPU model instances right now. Please either change "
                f"the instance type to KIND_GPU or set 'use_growable_memory' to false for state input '{input_name}'.",
            )
        datatype = kserve_from_triton(doc.get("data_type", "TYPE_INVALID"))
        dims = tuple(as_int(d, "sequence_batching.state.dims") for d in doc.get("dims", ()))
        if any(d != -1 and d < 1 for d in dims):
            raise ConfigError(None, "sequence_batching.state.dims", f"state '{input_name}': entries must be -1 or >= 1")
        bound = max_dims.get(input_name)
        window = tuple(
            (bound[i] if bound is not None and i < len(bound) and bound[i] > 0 else DEFAULT_STATE_WINDOW)
            if d == -1
            else d
            for i, d in enumerate(dims)
        )
        initial, initial_dims = _initial_state(doc, input_name, datatype, dims, model_dir)
        states.append(State(input_name, output_name, datatype, dims, initial, initial_dims, window, doc))
    return tuple(states)


def _initial_state(
    doc: Mapping[str, Any], input_name: str, datatype: str, dims: tuple[int, ...], model_dir: Path | None
) -> tuple[bytes | None, tuple[int, ...]]:
    """Triton's GenerateInitialStateData, in its words: zeros or a file from <model>/initial_state/."""
    entries = doc.get("initial_state") or []
    if isinstance(entries, Mapping):
        entries = [entries]
    if len(entries) > 1:
        raise ConfigError(
            None,
            "sequence_batching.state.initial_state",
            f"initial_state field for state input '{input_name}' must contain exactly one or zero element. "
            f"Found '{len(entries)}' elements.",
        )
    if not entries:
        return None, ()
    initial = entries[0]
    if kserve_from_triton(initial.get("data_type", "TYPE_INVALID")) != datatype:
        raise ConfigError(
            None,
            "sequence_batching.state.initial_state",
            f"The data type used for 'initial_state' field of state '{input_name}' does not match the state data type.",
        )
    if not initial.get("name"):
        raise ConfigError(
            None,
            "sequence_batching.state.initial_state",
            f"Field 'name' must be set when using initial_state for state input '{input_name}'.",
        )
    initial_dims = tuple(as_int(d, "sequence_batching.state.initial_state.dims") for d in initial.get("dims", ()))
    if len(initial_dims) != len(dims):
        raise ConfigError(
            None,
            "sequence_batching.state.initial_state",
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state input "
            f"'{input_name}'. {len(initial_dims)} != {len(dims)}",
        )
    for initial_dim, state_dim in zip(initial_dims, dims):
        if initial_dim == -1:
            raise ConfigError(
                None,
                "sequence_batching.state.initial_state",
                f"'initial_state' field for state input name '{input_name}' contains variable dimensions.",
            )
        if state_dim != -1 and initial_dim != state_dim:
            raise ConfigError(
                None,
                "sequence_batching.state.initial_state",
                f"'initial_state' dim for input name '{input_name}' doesn't match 'state' dim description. "
                f"{initial_dim} != {state_dim}",
            )
    if datatype == "BYTES":
        return None, initial_dims  # (Triton zeroes string states: start_value)
    total = numpy_dtype(datatype).itemsize * math.prod(initial_dims)
    if initial.get("zero_data"):
        return bytes(total), initial_dims
    data_file = initial.get("data_file")
    if not data_file:
        raise ConfigError(
            None,
            "sequence_batching.state.initial_state",
            f"initial_state setting expects state'{input_name}' to have state_data set",
        )
    if model_dir is None:
        return bytes(total), initial_dims
    path = Path(model_dir) / INITIAL_STATE_FOLDER / str(data_file)
    if Path(str(data_file)).is_absolute() or ".." in Path(str(data_file)).parts:
        raise ConfigError(
            None,
            "sequence_batching.state.initial_state.data_file",
            f"{data_file!r} must name a file in {INITIAL_STATE_FOLDER}/",
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            None, "sequence_batching.state.initial_state.data_file", f"cannot read {path}: {exc.strerror}"
        ) from None
    if total > len(data):
        raise ConfigError(
            None,
            "sequence_batching.state.initial_state",
            f"initial_state setting expects {total} bytes, but the data provided from {data_file}only has "
            f"{len(data)} bytes.",
        )
    return data[:total], initial_dims
