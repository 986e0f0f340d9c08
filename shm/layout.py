"""Byte layout of a ringserve shared-memory segment.

One segment holds a header page and `slot_count` slots of `slot_bytes` each. The
supervisor creates it; the gateway and the workers attach. Only the gateway allocates
slots; a worker touches a slot only while it holds a BATCH naming that slot.

    offset 0                    4096                 4096 + slot_bytes
    +---------------------------+--------------------+--------------------+---
    | segment header (64 B)     | slot 0             | slot 1             | ...
    | magic, layout version,    |                    |                    |
    | slot_count, slot_bytes,   |                    |                    |
    | creator pid               |                    |                    |
    +---------------------------+--------------------+--------------------+---

    one slot:
    +------------------+------------------------------+------------------------------+
    | slot header 64 B | inputs: tensor 0, tensor 1,  | outputs: written by the      |
    | generation,      | ... each 64-byte aligned,    | worker after the inputs,     |
    | output_generation| written once by the gateway  | each 64-byte aligned         |
    +------------------+------------------------------+------------------------------+

    A fixed-size tensor is its raw little-endian elements, row-major. A BYTES (string) tensor is
    KServe's binary BYTES form: per element, row-major, a 4-byte little-endian length, then the
    bytes; its TensorRef (common/wire.py) carries its length in bytes.

Slot states (kept by the gateway's Ring; the header carries only generations):

    state      | who moves it on        | to
    -----------+------------------------+----------------------------------------------
    FREE       | gateway: acquire()     | WRITING (generation += 1, written to header)
    WRITING    | gateway: BATCH sent    | IN_FLIGHT
    IN_FLIGHT  | worker: RESULT/ERROR   | FREE, once the gateway has copied outputs out
    IN_FLIGHT  | worker died            | IN_FLIGHT on the next worker (same bytes,
               |                        | attempt + 1: inputs are never modified)

Ordering rule: a worker writes every output byte first and `output_generation` last;
the gateway reads outputs only after a RESULT whose generation equals both the slot's
generation and `output_generation`, so a half-written output from a worker that died
mid-write is never read.
"""

from __future__ import annotations

import struct

MAGIC = b"RSRING01"
LAYOUT_VERSION = 1
PAGE_BYTES = 4096
ALIGN_BYTES = 64
SEGMENT_HEADER_BYTES = PAGE_BYTES
SLOT_HEADER_BYTES = 64

# magic, layout version, slot_count, slot_bytes, creator pid
SEGMENT_HEADER = struct.Struct("<8sIIQQ")
# generation, output_generation
SLOT_HEADER = struct.Struct("<QQ")
SLOT_GENERATION_OFFSET = 0
SLOT_OUTPUT_GENERATION_OFFSET = 8


def align_up(n: int, alignment: int = ALIGN_BYTES) -> int:
    return (n + alignment - 1) // alignment * alignment


def segment_bytes(slot_count: int, slot_bytes: int) -> int:
    return SEGMENT_HEADER_BYTES + slot_count * slot_bytes


def slot_offset(index: int, slot_bytes: int) -> int:
    """Byte offset of slot `index` from the start of the segment."""
    return SEGMENT_HEADER_BYTES + index * slot_bytes


def data_capacity(slot_bytes: int) -> int:
    """Bytes a slot offers to tensors (inputs and outputs together)."""
    return slot_bytes - SLOT_HEADER_BYTES


def pack_offsets(nbytes: list[int], start: int = 0) -> tuple[list[int], int]:
    """Place tensors of the given sizes one after another, each 64-byte aligned.

    Returns the offsets (relative to the slot's data area) and the end offset.
    """
    offsets = []
    cursor = align_up(start)
    for n in nbytes:
        offsets.append(cursor)
        cursor = align_up(cursor + n)
    return offsets, cursor
