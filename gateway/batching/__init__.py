"""A model's queue and how its batches form.

queues     priority lanes, groups that may share a batch, Triton's queue policy
deadlines  one loop timer per queue for its earliest waiting deadline
slots      a batch in its shared-memory slot: tensors in, halves, outputs out
padding    variable-length inputs: length buckets, padded batch shapes
ragged     Triton's ragged batching
sizing     latency-target batch sizing (AIMD on the batch-size cap)
"""
