"""A transactional producer's identity in a batch header (docs/transactions.md).

The coordinator gives each transactional id a producer number and, at every (re)start, a new
epoch that fences the old one. Both travel in the batch header's `producer_id`: the number in
the high 48 bits, the epoch in the low 16. So every epoch is a producer of its own for the
idempotent deduplication (its sequence starts at 0), and a partition tells a zombie (an
older epoch of the same number) from its successor.
"""

from __future__ import annotations

from typing import NamedTuple

EPOCH_BITS = 16
MAX_EPOCH = (1 << EPOCH_BITS) - 1
MAX_PRODUCER_NUMBER = (1 << (64 - EPOCH_BITS)) - 1


class TxnProducer(NamedTuple):
    """A transactional producer: its number (1..MAX_PRODUCER_NUMBER) and epoch."""

    number: int
    epoch: int

    @property
    def producer_id(self) -> int:
        """The batch header's producer_id."""
        return self.number << EPOCH_BITS | self.epoch

    @classmethod
    def of(cls, producer_id: int) -> TxnProducer:
        """The producer a transactional batch's producer_id names."""
        return cls(producer_id >> EPOCH_BITS, producer_id & MAX_EPOCH)

    def check(self) -> TxnProducer:
        """Itself; ValueError when a field is out of range."""
        if not 1 <= self.number <= MAX_PRODUCER_NUMBER:
            raise ValueError(f"producer number {self.number} is not in [1, {MAX_PRODUCER_NUMBER}]")
        if not 0 <= self.epoch <= MAX_EPOCH:
            raise ValueError(f"epoch {self.epoch} is not in [0, {MAX_EPOCH}]")
        return self
