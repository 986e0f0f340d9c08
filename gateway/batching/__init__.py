"""A model's queue and how its batches form.

queues     priority lanes, groups that may share a batch, Triton's queue policy
deadlines  one loop timer per queue for its earliest waiting deadline
slots      a batch in its shared-memory slot: tensors in, halves
slot_outputs  a batch's outputs out of its slot, each request's own
padding    variable-length inputs: length buckets, padded batch shapes
ragged     Triton's ragged batching
sizing     latency-target batch sizing (AIMD on the batch-size cap)
sequences  Triton's sequence batcher: a sequence model's queue, its candidate slots and backlog
state_stores  the sequence models' state stores, each opened once, and their callbacks into the scheduler
steps      a sequence step: its parameters, its control and state tensors in a slot, its state committed back
"""
