"""Storage backends: positional byte files in a directory, on disk or in memory.

The log above sees only `Directory` and `Storage`. `FileDirectory` uses real files, pwritev,
fdatasync and directory fsync. `MemoryDirectory` keeps bytes in memory and models durability
exactly: `crash()` throws away every byte and every file creation or removal that was not synced,
optionally leaving a torn prefix of the unsynced tail, as a power cut would. Given a capacity,
it also models a full disk: a write that would grow its files past it fails (`NoSpaceError`).
"""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Sequence
from typing import Protocol

from .batch import Buffer
from .errors import StorageError


class NoSpaceError(StorageError, OSError):
    """A write refused for want of space (errno ENOSPC), by a `MemoryDirectory` given a
    capacity: both the log's storage error and the OSError a real full disk raises."""


class Storage(Protocol):
    """One file: positional writes and reads, truncate, and fdatasync."""

    name: str

    @property
    def size(self) -> int: ...
    def write(self, position: int, parts: Sequence[Buffer]) -> None: ...
    def read(self, position: int, length: int) -> bytes: ...
    def truncate(self, size: int) -> None: ...
    def sync(self) -> None: ...
    def close(self) -> None: ...


class Directory(Protocol):
    """A folder of storages; creations and removals are durable only after `sync()`."""

    def names(self) -> list[str]: ...
    def open(self, name: str, *, create: bool) -> Storage: ...
    def remove(self, name: str) -> None: ...
    def rename(self, old: str, new: str) -> None: ...
    def sync(self) -> None: ...


class FileStorage:
    """A real file, written with pwritev and made durable with fdatasync."""

    def __init__(self, path: str, *, create: bool) -> None:
        self.name = os.path.basename(path)
        self._path = path
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            self._fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
            self._size = os.fstat(self._fd).st_size
        except OSError as e:
            raise StorageError(f"cannot open {path}: {e}") from e

    @property
    def size(self) -> int:
        return self._size

    def write(self, position: int, parts: Sequence[Buffer]) -> None:
        try:
            expected = sum(len(p) for p in parts)
            written = os.pwritev(self._fd, parts, position)
            if written != expected:
                # Short writes happen only on a full disk or a signal; finish or fail loudly.
                data = b"".join(bytes(p) for p in parts)
                while written < expected:
                    n = os.pwrite(self._fd, data[written:], position + written)
                    if n <= 0:
                        raise OSError("short write")
                    written += n
        except OSError as e:
            raise StorageError(f"write to {self._path} at {position} failed: {e}") from e
        self._size = max(self._size, position + expected)

    def read(self, position: int, length: int) -> bytes:
        try:
            data = os.pread(self._fd, length, position)
        except OSError as e:
            raise StorageError(f"read of {self._path} at {position} failed: {e}") from e
        if len(data) != length:
            raise StorageError(
                f"short read of {self._path}: {len(data)} of {length} bytes at {position}"
            )
        return data

    def truncate(self, size: int) -> None:
        try:
            os.ftruncate(self._fd, size)
        except OSError as e:
            raise StorageError(f"truncate of {self._path} to {size} failed: {e}") from e
        self._size = size

    def sync(self) -> None:
        try:
            os.fdatasync(self._fd)
        except OSError as e:
            raise StorageError(f"fdatasync of {self._path} failed: {e}") from e

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class FileDirectory:
    """A real directory; `sync()` fsyncs the directory itself."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create directory {path}: {e}") from e

    def names(self) -> list[str]:
        return sorted(os.listdir(self.path))

    def open(self, name: str, *, create: bool) -> FileStorage:
        return FileStorage(os.path.join(self.path, name), create=create)

    def remove(self, name: str) -> None:
        try:
            os.unlink(os.path.join(self.path, name))
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StorageError(f"cannot remove {name} in {self.path}: {e}") from e

    def rename(self, old: str, new: str) -> None:
        """Atomically replace `new` with `old` (durable after `sync()`)."""
        try:
            os.replace(os.path.join(self.path, old), os.path.join(self.path, new))
        except OSError as e:
            raise StorageError(f"cannot rename {old} to {new} in {self.path}: {e}") from e

    def sync(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise StorageError(f"fsync of directory {self.path} failed: {e}") from e


class MemoryStorage:
    """An in-memory file that remembers what was synced."""

    def __init__(self, name: str, directory: MemoryDirectory | None = None) -> None:
        self.name = name
        self._directory = directory  # whose capacity its writes count against
        self.data = bytearray()
        self.durable = bytearray()
        self._dirty_from: int | None = None  # lowest position changed since the last sync
        self.closed = False

    @property
    def size(self) -> int:
        return len(self.data)

    def _touch(self, position: int) -> None:
        if self.closed:
            raise StorageError(f"{self.name} is closed")
        if self._dirty_from is None or position < self._dirty_from:
            self._dirty_from = position

    def _reserve(self, end: int) -> None:
        """Refuse (ENOSPC) to grow to `end` bytes past the directory's capacity."""
        directory, growth = self._directory, end - len(self.data)
        if directory is None or directory.capacity_bytes is None or growth <= 0:
            return
        if directory.used_bytes() + growth > directory.capacity_bytes:
            raise NoSpaceError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.name)

    def write(self, position: int, parts: Sequence[Buffer]) -> None:
        self._touch(position)
        self._reserve(position + sum(len(part) for part in parts))
        if position > len(self.data):
            self.data.extend(bytes(position - len(self.data)))
        for part in parts:
            self.data[position : position + len(part)] = part
            position += len(part)

    def read(self, position: int, length: int) -> bytes:
        if self.closed:
            raise StorageError(f"{self.name} is closed")
        if position + length > len(self.data):
            raise StorageError(
                f"short read of {self.name}: {length} bytes at {position} of {len(self.data)}"
            )
        return bytes(self.data[position : position + length])

    def truncate(self, size: int) -> None:
        self._touch(min(size, len(self.data)))
        self._reserve(size)
        if size < len(self.data):
            del self.data[size:]
        else:
            self.data.extend(bytes(size - len(self.data)))

    def sync(self) -> None:
        if self._dirty_from is not None:
            self.durable[self._dirty_from :] = self.data[self._dirty_from :]
            self._dirty_from = None

    def close(self) -> None:
        self.closed = True

    def crash(self, rng: random.Random | None) -> None:
        """Forget unsynced changes; with `rng`, keep a torn prefix of unsynced appended bytes."""
        torn = b""
        if rng is not None and len(self.data) > len(self.durable):
            tail = self.data[len(self.durable) :]
            torn = bytes(tail[: rng.randrange(len(tail) + 1)])
        self.data = bytearray(self.durable) + torn
        self._dirty_from = len(self.durable) if torn else None
        self.closed = False


class MemoryDirectory:
    """An in-memory directory whose creations and removals are durable only after `sync()`."""

    def __init__(self, capacity_bytes: int | None = None) -> None:
        self.files: dict[str, MemoryStorage] = {}
        self._durable_files: dict[str, MemoryStorage] = {}
        #: the bytes its files may hold in all (None: no limit); may change at any time
        self.capacity_bytes = capacity_bytes

    def names(self) -> list[str]:
        return sorted(self.files)

    def used_bytes(self) -> int:
        return sum(len(storage.data) for storage in self.files.values())

    def open(self, name: str, *, create: bool) -> MemoryStorage:
        if create:
            if name in self.files:
                raise StorageError(f"{name} already exists")
            self.files[name] = MemoryStorage(name, self)
        elif name not in self.files:
            raise StorageError(f"{name} does not exist")
        storage = self.files[name]
        storage.closed = False
        return storage

    def remove(self, name: str) -> None:
        self.files.pop(name, None)

    def rename(self, old: str, new: str) -> None:
        if old not in self.files:
            raise StorageError(f"{old} does not exist")
        storage = self.files.pop(old)
        storage.name = new
        self.files[new] = storage

    def sync(self) -> None:
        self._durable_files = dict(self.files)

    def crash(self, rng: random.Random | None = None) -> None:
        """Lose everything not synced, as a power cut would; the directory can be reopened."""
        self.files = dict(self._durable_files)
        for storage in self.files.values():
            storage.crash(rng)
