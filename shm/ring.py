"""Slot allocation over a Segment. Runs in the gateway only (the single allocator)."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import StaleLease
from .segment import Segment


@dataclass(frozen=True, slots=True)
class SlotLease:
    """The right to use one slot until it is released: index plus generation."""

    index: int
    generation: int


class Ring:
    """Hands out free slots in ring order and checks generations on release.

    Each acquire bumps the slot's generation and writes it into the slot header, so a
    worker can check that a BATCH names the slot's current contents, and a release with
    an old lease (a reply from a worker generation that already died) is refused.
    """

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self.slot_count = segment.slot_count
        self._next_index = 0
        self._free = [True] * self.slot_count
        self._generations = [segment.generation(i) for i in range(self.slot_count)]

    @property
    def free_count(self) -> int:
        return sum(self._free)

    def acquire(self) -> SlotLease | None:
        """The next free slot after the last one handed out, or None when all are taken."""
        for step in range(self.slot_count):
            index = (self._next_index + step) % self.slot_count
            if self._free[index]:
                self._free[index] = False
                self._next_index = (index + 1) % self.slot_count
                generation = self._generations[index] + 1
                self._generations[index] = generation
                self.segment.set_generation(index, generation)
                self.segment.set_output_generation(index, 0)
                return SlotLease(index, generation)
        return None

    def check(self, lease: SlotLease) -> None:
        current = self._generations[lease.index]
        if self._free[lease.index] or current != lease.generation:
            raise StaleLease(lease.index, lease.generation, current)

    def release(self, lease: SlotLease) -> None:
        self.check(lease)
        self._free[lease.index] = True
