"""A request's requested outputs: which, in which form (binary, classification), and into which
client shared-memory region, with the room checked before the request is queued."""

from __future__ import annotations

import math

from ringserve.common.repository.config import ModelConfig
from ringserve.gateway.codec.classification import PARAM as CLASSIFICATION
from ringserve.gateway.codec.classification import class_count
from ringserve.gateway.core.errors import BadRequest, echo
from ringserve.gateway.core.phrases import say
from ringserve.gateway.core.region_errors import RegionError
from ringserve.gateway.core.region_registry import RegionRegistry
from ringserve.gateway.core.regions import PARAM_REGION, OutputRegion


def requested_outputs(
    config: ModelConfig, doc: dict, params: dict, regions: RegionRegistry | None = None
) -> tuple[list[str] | None, frozenset, dict[str, OutputRegion] | None, dict[str, int] | None]:
    """(requested output names in the order asked, or None for all; names to answer as binary;
    outputs to write into shared-memory regions, or None; outputs answered as their top K classes
    (gateway/codec/classification.py), or None)."""
    binary_default = params.get("binary_data_output", False)
    if type(binary_default) is not bool:
        raise BadRequest(
            say(
                "json_field",
                f"parameters.binary_data_output must be true or false, got {echo(binary_default)}",
                field="binary_data_output",
            )
        )
    outs = doc.get("outputs")
    if outs is None:
        return None, frozenset(t.name for t in config.outputs) if binary_default else frozenset(), None, None
    if not isinstance(outs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in outs):
        raise BadRequest(say("json_field", "'outputs' must be a list of objects with a 'name'", field="outputs"))
    known = config.outputs_by_name
    names = [o["name"] for o in outs]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BadRequest(
            say(
                "unexpected_output",
                f"unknown output(s) {echo(', '.join(unknown), quoted=False)}; model {config.name!r} "
                f"has: {', '.join(sorted(known))}",
                output=echo(unknown[0], quoted=False),
                model=config.name,
            )
        )
    if len(set(names)) != len(names):
        twice = next(n for i, n in enumerate(names) if n in names[:i])
        raise BadRequest(
            say(
                "output_twice",
                f"'outputs' names an output twice: {echo(names)}; name each at most once",
                output=echo(twice, quoted=False),
            )
        )
    binary = set()
    targets = classes = None
    for out in outs:
        out_params = out.get("parameters") or {}
        if not isinstance(out_params, dict):
            raise BadRequest(
                say("json_field", f"output {out['name']!r}: 'parameters' must be an object", field="parameters")
            )
        if PARAM_REGION in out_params:
            if targets is None:
                targets = {}
            targets[out["name"]] = output_region(out["name"], out_params, regions)
            continue
        count = (
            class_count(config, known[out["name"]], out_params[CLASSIFICATION]) if CLASSIFICATION in out_params else 0
        )
        if count:
            classes = {**(classes or {}), out["name"]: count}
        wants_binary = out_params.get("binary_data", binary_default)
        if type(wants_binary) is not bool:
            raise BadRequest(
                say(
                    "json_field",
                    f"output {out['name']!r}: parameters.binary_data must be true or false, got {echo(wants_binary)}",
                    field="binary_data",
                )
            )
        if wants_binary:
            binary.add(out["name"])
    return names, frozenset(binary), targets, classes


def check_output_room(config: ModelConfig, rows: int, targets: dict[str, OutputRegion]) -> None:
    """400 before running the model when a fixed-size output cannot fit the region room it was given
    (an output with a variable dim is checked once its size is known: shm_regions.write_outputs)."""
    for name, target in targets.items():
        tensor = config.outputs_by_name[name]
        if tensor.datatype == "BYTES" or any(d < 0 for d in tensor.dims):
            continue
        shape = ([rows] if config.max_batch_size > 0 else []) + list(tensor.dims)
        needed = math.prod(shape) * tensor.np_dtype.itemsize
        if needed > target.byte_size:
            raise RegionError(
                say(
                    "shm_output_size",
                    f"output {name!r} will be {needed} bytes (shape {shape} "
                    f"{tensor.datatype}); shared_memory_byte_size gives it "
                    f"{target.byte_size} bytes in region {target.region.name!r}: "
                    f"give at least {needed}",
                    output=name,
                    given=target.byte_size,
                    needed=needed,
                )
            )


def output_region(name: str, params: dict, regions: RegionRegistry | None) -> OutputRegion:
    what = f"output {name!r}"
    if CLASSIFICATION in params:
        raise BadRequest(
            say(
                "classification_shm",
                f"{what}: its classes are answered in the response, never "
                "written into a region; ask for one of the two",
            )
        )
    if params.get("binary_data") is True:
        raise BadRequest(say("binary_and_shm", f"{what}: a region holds the output's bytes; ask for one of the two"))
    if regions is None:
        raise BadRequest(f"{what}: shared-memory regions are not accepted on this endpoint")
    return regions.output_region(what, params)
