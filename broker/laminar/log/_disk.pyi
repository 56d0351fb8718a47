"""Type stub of the disk threads without the GIL (`_disk.c`); see
`laminar.server.disk_threads`."""

from collections.abc import Sequence

from .batch import Buffer

class Pool:
    def __init__(self, threads: int) -> None: ...
    def submit(
        self,
        token: int,
        fd: int,
        writes: Sequence[tuple[int, Sequence[Buffer]]],
        sync: bool,
        writeback_from: int = 0,
        writeback_to: int = 0,
        chunk: int = 0,
        /,
    ) -> None: ...
    def collect(self) -> list[tuple[int, int, int]]: ...
    def fileno(self) -> int: ...
    def outstanding(self) -> int: ...
    def stop(self) -> None: ...
