"""`python -m bench.private_inputs`: what a Python model's private (writable) inputs cost per batch.

A batch's fixed-size inputs are read (worker/requests.py: read_batch_inputs) three ways, over a real
ring segment in /dev/shm, for input sizes from 4 KiB to 64 MiB:
  view     read-only numpy views over the slot (ONNX models; Python models before issue 40 item 6)
  mapped   a copy-on-write mapping of the slot (mmap MAP_PRIVATE), at every size
  copy     a copy of each input
(Python models get a copy below worker/requests.py's PRIVATE_MAPPING_MIN_BYTES, the mapping from it)
each followed by what a model does with it: nothing (`none`), a read of every byte (`read`: sum), or a
write of every element in place (`write`: x *= 2; a view cannot, so it is timed on a copy of the view
there). The median of --repeats runs, in microseconds per batch, in one table; the kinds alternate run
by run, so that a noisy machine disturbs each alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from ringserve.common import messages, wire
from ringserve.shm import layout
from ringserve.shm.segment import Segment
from ringserve.worker import requests
from ringserve.worker.requests import read_batch_inputs

SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)
USES = ("none", "read", "write")


def batch_of(nbytes: int) -> messages.Batch:
    ref = wire.TensorRef("x", "FP32", (nbytes // 4,), 0)
    return messages.Batch(
        batch_id=1, model="m", version=1, attempt=1, slot_index=0, generation=0, inputs=[ref.to_wire()], output_offset=0
    )


def use(array: np.ndarray, how: str) -> None:
    if how == "read":
        array.sum()
    elif how == "write":
        (array if array.flags.writeable else array.copy()).__imul__(2)


def timed_us(segment: Segment, batch: messages.Batch, kind: str, how: str) -> float:
    started = time.perf_counter()
    if kind == "copy":
        inputs = {k: v.copy() for k, v in read_batch_inputs(segment, batch).items()}
    else:
        inputs = read_batch_inputs(segment, batch, private=kind == "mapped")
    use(inputs["x"], how)
    del inputs  # the private mapping is unmapped here, as at the end of a batch
    return (time.perf_counter() - started) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=31)
    args = parser.parse_args()
    requests.PRIVATE_MAPPING_MIN_BYTES = 0  # "mapped" at every size
    segment = Segment.create_unique(f"{os.getpid()}", "bench", slot_count=1, slot_bytes=max(SIZES) + layout.PAGE_BYTES)
    try:
        segment.tensor(0, 0, np.uint8, (max(SIZES),))[:] = 1
        print(f"{'bytes':>10} {'use':>6} {'view us':>10} {'mapped us':>10} {'copy us':>10}")
        for nbytes in SIZES:
            batch = batch_of(nbytes)
            for how in USES:
                runs: dict[str, list[float]] = {"view": [], "mapped": [], "copy": []}
                for _ in range(args.repeats):
                    for kind in runs:
                        runs[kind].append(timed_us(segment, batch, kind, how))
                med = {kind: statistics.median(v) for kind, v in runs.items()}
                print(f"{nbytes:>10} {how:>6} {med['view']:>10.1f} {med['mapped']:>10.1f} {med['copy']:>10.1f}")
    finally:
        segment.close()
        segment.unlink()


if __name__ == "__main__":
    main()
