"""Property tests: append / truncate / read / reopen / power cut agree with a simple model."""

from __future__ import annotations

import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from laminar.log import LogConfig, MemoryDirectory, SegmentedLog, decode_batch

from .helpers import make_batch

CONFIG = LogConfig(segment_bytes=4096, max_batch_bytes=2048)


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = MemoryDirectory()
        self.log = SegmentedLog.open(self.directory, CONFIG)
        self.model: list[tuple[int, int, int]] = []  # (tag, records, term) per batch
        self.durable_batches = 0
        self.next_tag = 0

    def bases(self) -> list[int]:
        out, index = [], 0
        for _, records, _ in self.model:
            out.append(index)
            index += records
        return out

    @rule(records=st.integers(1, 6), term=st.integers(0, 3), value_bytes=st.integers(0, 300))
    def append(self, records: int, term: int, value_bytes: int) -> None:
        result = self.log.append(make_batch(self.next_tag, records, value_bytes), term=term)
        assert result.base_index == sum(r for _, r, _ in self.model)
        self.model.append((self.next_tag, records, term))
        self.next_tag += 1

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        keep = data.draw(st.integers(0, len(self.model) - 1))
        self.log.truncate(self.bases()[keep])
        del self.model[keep:]
        self.durable_batches = min(self.durable_batches, keep)  # truncate is durable

    @rule()
    def sync(self) -> None:
        self.log.sync()
        self.durable_batches = len(self.model)

    @rule()
    def reopen(self) -> None:
        self.log.close()
        self.log = SegmentedLog.open(self.directory, CONFIG)
        self.durable_batches = len(self.model)
        assert self.log.recovery.cuts == ()

    @rule(seed=st.integers(0, 2**32), torn=st.booleans())
    def power_cut(self, seed: int, torn: bool) -> None:
        self.directory.crash(random.Random(seed) if torn else None)
        self.log = SegmentedLog.open(self.directory, CONFIG)
        # What survives is the durable prefix plus possibly some of what followed it.
        recovered = self.log.next_index
        bases = [*self.bases(), sum(r for _, r, _ in self.model)]
        assert recovered in bases[self.durable_batches :]
        del self.model[bases.index(recovered) :]
        self.durable_batches = len(self.model)

    @invariant()
    def reads_match_the_model(self) -> None:
        assert self.log.next_index == sum(r for _, r, _ in self.model)
        for base, (tag, records, term) in zip(self.bases(), self.model, strict=True):
            probe = base + records // 2
            decoded = decode_batch(self.log.read(probe).data)
            assert [r.index for r in decoded] == list(range(base, base + records))
            assert decoded[0].value is not None
            assert decoded[0].value.rstrip(b".") == f"{tag}.0".encode()
            assert self.log.term_at(probe) == term
            assert self.log.batch_range(probe) == (base, base + records)

    def teardown(self) -> None:
        self.log.close()


TestLogMachine = LogMachine.TestCase
TestLogMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
