"""Which fields config.json may hold, at every level; anything else refuses the model by name.

The same table rules config.pbtxt (common/repository/pbtxt.py reads it into config.json's document): protobuf
already refuses a field Triton's schema lacks, and this table refuses, by name, Triton's fields
ringserve does not implement. Every field of Triton's ModelConfig is in it (tests/unit/common/test_pbtxt.py).

Triton refuses a config with an unknown field, and so does ringserve: a misspelt
`max_batch_sze` silently left max_batch_size to auto-complete (64 instead of 8). Each section
lists three kinds of field:
- used: Triton's fields that ringserve serves, and ringserve's own extensions;
- ignored: Triton's fields accepted and ignored, because they do not change what an ONNX model
  computes here (`optimization`, `model_operations`, ...), so a Triton user's config loads;
- unsupported: Triton's fields whose meaning ringserve does not implement and must not fake
  (`is_non_linear_format_io`, ...): refused, saying so.
Types and values are checked where the values are read (common/repository/config.py, lifecycle.py).
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ringserve.common.errors import ConfigError


@dataclass(frozen=True)
class Fields:
    """The fields of one object (or of each entry of a list of objects)."""

    used: frozenset[str] = frozenset()
    ignored: frozenset[str] = frozenset()
    unsupported: frozenset[str] = frozenset()
    nested: Mapping[str, Fields] = field(default_factory=dict)  # field -> its object's (or entries') fields
    each_value: Fields | None = None  # a map with keys of the user's choosing (priority levels)

    def known(self) -> list[str]:
        return sorted(self.used | self.ignored | self.nested.keys())


QUEUE_POLICY = Fields(
    frozenset({"timeout_action", "default_timeout_microseconds", "allow_timeout_override", "max_queue_size"})
)
DYNAMIC_BATCHING = Fields(
    used=frozenset(
        {
            "preferred_batch_size",
            "max_queue_delay_microseconds",
            "preserve_ordering",
            "priority_levels",
            "default_priority_level",
            # ringserve's own (docs/models.md)
            "sequence_buckets",
            "pad_to_preferred_batch_size",
            "latency_target_ms",
            "separate_by_inputs",
        }
    ),
    nested={
        "default_queue_policy": QUEUE_POLICY,
        "priority_queue_policy": Fields(each_value=QUEUE_POLICY),
        "padding": Fields(frozenset({"value", "mask_input"})),
    },
)
# `datatype` is KServe's spelling, as /v2/models/{m} metadata shows it.
# reshape and is_shape_tensor: common/repository/reshape.py (is_shape_tensor: true is refused as Triton's core does).
RESHAPE = Fields(frozenset({"shape"}))
INPUT = Fields(
    used=frozenset({"name", "data_type", "datatype", "dims", "allow_ragged_batch", "optional", "is_shape_tensor"}),
    ignored=frozenset({"format", "label_filename"}),
    # is_non_linear_format_io: TensorRT's non-linear I/O formats; ringserve's tensors are linear.
    unsupported=frozenset({"is_non_linear_format_io"}),
    nested={"reshape": RESHAPE},
)
# label_filename: the classification extension's labels (gateway/codec/classification.py).
OUTPUT = Fields(
    used=frozenset({"name", "data_type", "datatype", "dims", "label_filename", "is_shape_tensor"}),
    ignored=frozenset({"format"}),
    unsupported=frozenset({"is_non_linear_format_io"}),
    nested={"reshape": RESHAPE},
)
# Triton's model_warmup (common/repository/warmup.py): samples keyed by input name.
MODEL_WARMUP = Fields(
    used=frozenset({"name", "batch_size", "count"}),
    nested={
        "inputs": Fields(
            each_value=Fields(frozenset({"data_type", "dims", "zero_data", "random_data", "input_data_file"}))
        )
    },
)
VERSION_POLICY = Fields(
    nested={"latest": Fields(frozenset({"num_versions"})), "all": Fields(), "specific": Fields(frozenset({"versions"}))}
)
INSTANCE_GROUP = Fields(
    used=frozenset({"count", "kind", "gpus"}),
    ignored=frozenset({"name", "rate_limiter", "host_policy", "profile"}),
    unsupported=frozenset({"passive", "secondary_devices"}),
)
# Triton's sequence_batching (common/repository/sequences.py); iterative_sequence: true is refused there.
SEQUENCE_BATCHING = Fields(
    used=frozenset({"max_sequence_idle_microseconds", "iterative_sequence"}),
    nested={
        "direct": Fields(frozenset({"max_queue_delay_microseconds", "minimum_slot_utilization"})),
        "oldest": Fields(
            frozenset(
                {"max_candidate_sequences", "preferred_batch_size", "max_queue_delay_microseconds", "preserve_ordering"}
            )
        ),
        "control_input": Fields(
            used=frozenset({"name"}),
            nested={
                "control": Fields(
                    frozenset({"kind", "int32_false_true", "fp32_false_true", "bool_false_true", "data_type"})
                )
            },
        ),
        "state": Fields(
            used=frozenset(
                {
                    "input_name",
                    "output_name",
                    "data_type",
                    "dims",
                    "use_same_buffer_for_input_output",
                    "use_growable_memory",
                }
            ),
            nested={"initial_state": Fields(frozenset({"data_type", "dims", "zero_data", "data_file", "name"}))},
        ),
    },
)
# Triton's ensemble_scheduling (common/repository/kinds.py); max_inflight_requests bounds Triton's own
# pipelining of steps, which ringserve does not do (a batch runs its steps one after the other).
ENSEMBLE_SCHEDULING = Fields(
    ignored=frozenset({"max_inflight_requests"}),
    nested={
        "step": Fields(
            used=frozenset({"model_name", "model_version", "input_map", "output_map"}),
            unsupported=frozenset({"model_namespace"}),
        )
    },
)
MODEL = Fields(
    used=frozenset(
        {
            "name",
            "platform",
            "max_batch_size",
            "backend",  # onnxruntime, or python (model.py; common/repository/kinds.py)
            "parameters",  # the ORT backend's; free-form, read by worker/session.py
            # ringserve's own (common/repository/lifecycle.py)
            "model_load_policy",
            "warmup",
            "ttl_s",
            "eviction_priority",
        }
    ),
    ignored=frozenset(
        {
            "runtime",
            "default_model_filename",
            "cc_model_filenames",
            "metric_tags",
            "optimization",
            "model_operations",
            "model_repository_agents",
            "response_cache",
            "model_metrics",
        }
    ),
    nested={
        "input": INPUT,
        "output": OUTPUT,
        "dynamic_batching": DYNAMIC_BATCHING,
        "sequence_batching": SEQUENCE_BATCHING,
        "batch_input": Fields(frozenset({"kind", "target_name", "data_type", "source_input"})),
        "batch_output": Fields(frozenset({"kind", "target_name", "source_input"})),
        "model_warmup": MODEL_WARMUP,
        "version_policy": VERSION_POLICY,
        "instance_group": INSTANCE_GROUP,
        "ensemble_scheduling": ENSEMBLE_SCHEDULING,
        "model_transaction_policy": Fields(frozenset({"decoupled"})),
        # the first-response histogram's buckets (common/metrics_config.py: first_response_buckets)
        "model_metrics": Fields(
            nested={
                "metric_control": Fields(
                    nested={
                        "metric_identifier": Fields(frozenset({"family"})),
                        "histogram_options": Fields(frozenset({"buckets"})),
                    }
                )
            }
        ),
        "response_cache": Fields(frozenset({"enable"})),  # common/repository/response_cache.py
    },
)


# The files a model's config may come from; at the top level `where` is one of them.
CONFIG_FILES = ("config.json", "config.pbtxt")


def check_fields(doc: Any, fields: Fields = MODEL, where: str = "config.json") -> None:
    """Refuse the first field of `doc` (a config.json object, or a config.pbtxt read into one by
    common/repository/pbtxt.py: one rule for both) that `fields` does not know, naming the closest known one.
    `where`: the file at the top level, then the path to the object. Values of the wrong type are
    left to the code that reads them."""
    if isinstance(doc, list):
        for index, entry in enumerate(doc):
            check_fields(entry, fields, f"{where}[{index}]")
        return
    if not isinstance(doc, Mapping):
        return
    for key, value in doc.items():
        if fields.each_value is not None:
            check_fields(value, fields.each_value, f"{where}.{key}")
        elif key in fields.nested:
            check_fields(value, fields.nested[key], key if where in CONFIG_FILES else f"{where}.{key}")
        elif key in fields.unsupported:
            raise ConfigError(None, where, f"Triton's field {key!r} is not supported by ringserve")
        elif key not in fields.used and key not in fields.ignored:
            close = difflib.get_close_matches(str(key), fields.known(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(None, where, f"unknown field {key!r}{hint}")


def as_int(value: Any, field_name: str) -> int:
    # Triton's protobuf JSON writes int64/uint64 as strings ("dims": ["-1", "3"]).
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ConfigError(None, field_name, f"must be an integer, got {value!r}")
