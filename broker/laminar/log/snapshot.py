"""A read-only view of a log directory: opening a log through it never changes the disk.

`laminar inspect` opens a log to describe it, and opening a log recovers it (cuts a torn tail,
rebuilds an index, removes orphan files). Through a `SnapshotDirectory` those repairs happen
on copies in memory: a file is read from disk until the log first changes it, and only then
copied (so a clean log costs no copies, a torn one a copy of its damaged segment). The report
says what recovery *would* do, and the directory is left as it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from .batch import Buffer
from .errors import StorageError
from .storage import MemoryStorage


class _DiskFile:
    """A file read through a read-only descriptor until written, then a copy in memory
    (handed to `on_copy`, so that opening the file again finds the changed copy)."""

    def __init__(self, path: str, on_copy: Callable[[MemoryStorage], None]) -> None:
        self.name = os.path.basename(path)
        self._path = path
        self._on_copy = on_copy
        self._copy: MemoryStorage | None = None
        try:
            self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise StorageError(f"cannot open {path}: {e.strerror}") from e

    @property
    def size(self) -> int:
        if self._copy is not None:
            return self._copy.size
        try:
            return os.fstat(self._fd).st_size
        except OSError as e:
            raise StorageError(f"cannot stat {self._path}: {e.strerror}") from e

    def _copied(self) -> MemoryStorage:
        """The in-memory copy the log changes from now on (made at the first change)."""
        if self._copy is None:
            copy = MemoryStorage(self.name)
            copy.data = bytearray(self.read(0, self.size))
            self._copy = copy
            self._on_copy(copy)
        return self._copy

    def write(self, position: int, parts: Sequence[Buffer]) -> None:
        self._copied().write(position, parts)

    def read(self, position: int, length: int) -> bytes:
        if self._copy is not None:
            return self._copy.read(position, length)
        try:
            data = os.pread(self._fd, length, position)
        except OSError as e:
            raise StorageError(f"cannot read {self._path}: {e.strerror}") from e
        if len(data) != length:
            raise StorageError(
                f"short read of {self.name}: {length} bytes at {position}, got {len(data)}"
            )
        return data

    def truncate(self, size: int) -> None:
        self._copied().truncate(size)

    def sync(self) -> None:
        """Nothing reaches the disk."""

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class SnapshotDirectory:
    """A `Directory` over the real directory `path` whose changes stay in memory.

    It never creates the directory: a missing one is a StorageError, as is one that cannot be
    listed."""

    def __init__(self, path: str) -> None:
        if not os.path.isdir(path):
            raise StorageError(f"{path} is not a directory")
        self.path = path
        self._created: dict[str, MemoryStorage] = {}  # made (or renamed to) in memory
        self._hidden: set[str] = set()  # disk files removed or renamed away

    def names(self) -> list[str]:
        try:
            on_disk = set(os.listdir(self.path)) - self._hidden
        except OSError as e:
            raise StorageError(f"cannot list {self.path}: {e.strerror}") from e
        return sorted(on_disk | set(self._created))

    def open(self, name: str, *, create: bool) -> MemoryStorage | _DiskFile:
        if name in self._created:
            if create:
                raise StorageError(f"{name} already exists")
            storage = self._created[name]
            storage.closed = False
            return storage
        if create:
            if name not in self._hidden and os.path.exists(os.path.join(self.path, name)):
                raise StorageError(f"{name} already exists")
            self._created[name] = MemoryStorage(name)
            return self._created[name]
        if name in self._hidden:
            raise StorageError(f"{name} does not exist")
        return _DiskFile(os.path.join(self.path, name), self._keep)

    def _keep(self, copy: MemoryStorage) -> None:
        self._created[copy.name] = copy

    def remove(self, name: str) -> None:
        self._created.pop(name, None)
        self._hidden.add(name)

    def rename(self, old: str, new: str) -> None:
        if old in self._created:
            storage = self._created.pop(old)
        else:
            source = self.open(old, create=False)
            try:
                storage = MemoryStorage(new)
                storage.data = bytearray(source.read(0, source.size))
            finally:
                source.close()
        storage.name = new
        self._hidden.add(old)
        self._hidden.discard(new)
        self._created[new] = storage

    def sync(self) -> None:
        """Nothing reaches the disk."""
