"""Storage backends: positional byte files in a directory, on disk or in memory.

The log above sees only `Directory` and `Storage`. `FileDirectory` uses real files, pwritev,
fdatasync and directory fsync. `MemoryDirectory` keeps bytes in memory and models durability
exactly: `crash()` throws away every byte and every file creation or removal that was not synced,
optionally leaving a torn prefix of the unsynced tail, as a power cut would. Given a capacity,
it also models a full disk: a write that would grow its files past it fails (`NoSpaceError`).

Open descriptors are bounded per process (`OpenFiles`): a broker hosts thousands of
partitions, each with a few files, against `ulimit -n`. A `FileStorage` opens its file when
used, and the least recently used idle ones close theirs once more than the budget are
open. Closing a file with written but unsynced bytes loses nothing: the bytes are in the
page cache of the file (not of the descriptor), and a later fdatasync through a new
descriptor writes them out (and reports a writeback error that no descriptor saw yet).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

from .batch import Buffer
from .errors import StorageError

#: a write-back before a sync (`FileStorage.direct`'s `writeback`) goes to the disk in pieces of
#: this many bytes, each waited for before the next: a journal checkpoint's log syncs then do
#: not queue megabytes in front of the rounds' journal syncs. 256 KiB pieces took the RF 3 p99
#: at 5,000 msg/s from 33 to 23-27 ms against whole syncs one at a time, and 64 KiB ones did
#: no better (bench/RESULTS.md, issue 22, twenty-seventh sitting).
WRITEBACK_CHUNK_BYTES = 256 << 10


class NoSpaceError(StorageError, OSError):
    """A write refused for want of space (errno ENOSPC), by a `MemoryDirectory` given a
    capacity: both the log's storage error and the OSError a real full disk raises."""


def no_space(error: BaseException | None) -> bool:
    """Whether `error` is, or was raised from, a write refused with ENOSPC."""
    for _ in range(32):  # the layers wrap it with `raise ... from`
        if error is None:
            return False
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        error = error.__cause__ or error.__context__
    return False


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


#: descriptors `OpenFiles.for_limit` leaves to sockets and everything else: at least this many,
#: or this share of the limit
RESERVED_FDS = 1024
RESERVED_SHARE = 0.25
MIN_OPEN_FILES = 16


class OpenFiles:
    """The `FileStorage`s holding a descriptor, least recently used first, at most `budget`
    of them: past it, idle ones close theirs (one in use, by another thread, is skipped).
    Thread-safe: storages are used from the event loop and from I/O threads."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._lock = threading.Lock()
        self._open: OrderedDict[FileStorage, None] = OrderedDict()
        #: descriptors closed to stay within the budget (for tests and metrics)
        self.evictions = 0

    @staticmethod
    def for_limit(soft_limit: int) -> int:
        """The budget for files under a `RLIMIT_NOFILE` soft limit of `soft_limit`."""
        reserved = max(RESERVED_FDS, int(soft_limit * RESERVED_SHARE))
        return max(MIN_OPEN_FILES, soft_limit - reserved)

    def __len__(self) -> int:
        return len(self._open)

    def used(self, storage: FileStorage) -> None:
        """`storage` (its lock held by the caller) holds a descriptor and was just used."""
        with self._lock:
            self._open[storage] = None
            self._open.move_to_end(storage)
            if len(self._open) > self.budget:
                self._evict(len(self._open) - self.budget)

    def forget(self, storage: FileStorage) -> None:
        """`storage` closed its descriptor."""
        with self._lock:
            self._open.pop(storage, None)

    def shrink(self, count: int) -> int:
        """Close up to `count` idle descriptors now (the system ran out); how many closed."""
        with self._lock:
            return self._evict(count)

    def _evict(self, count: int) -> int:
        """Close the descriptors of up to `count` storages not in use, least recently used
        first (the pool's lock held); how many closed."""
        closed: list[FileStorage] = []
        for victim in self._open:  # oldest first; stops at `count`
            if len(closed) >= count:
                break
            if victim._lock.acquire(blocking=False):  # not in use: in no syscall now
                try:
                    if victim._pins:  # a DirectWrite's thread uses it
                        continue
                    victim._release()
                finally:
                    victim._lock.release()
                closed.append(victim)
        for victim in closed:
            del self._open[victim]
        self.evictions += len(closed)
        return len(closed)


def _nofile_soft_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


#: this process's file descriptors for storages (`raise_open_files_limit` resizes it)
OPEN_FILES = OpenFiles(OpenFiles.for_limit(_nofile_soft_limit()))


def raise_open_files_limit() -> int:
    """Raise this process's soft `RLIMIT_NOFILE` to its hard limit (as Go's runtime does at
    start) and size `OPEN_FILES` to it; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else _nr_open()
    if soft != resource.RLIM_INFINITY and soft < target:
        # (refused if the hard limit is above fs.nr_open: the soft limit stands)
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = _nofile_soft_limit()
    OPEN_FILES.budget = OpenFiles.for_limit(soft)
    return soft


def _nr_open() -> int:
    """The kernel's ceiling on a process's descriptors (fs.nr_open)."""
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


class FileStorage:
    """A real file, written with pwritev and made durable with fdatasync. Its descriptor is
    opened when used and may be closed while idle (`OpenFiles`)."""

    def __init__(self, path: str, *, create: bool, files: OpenFiles | None = None) -> None:
        self.name = os.path.basename(path)
        self._path = path
        self._files = OPEN_FILES if files is None else files
        #: held while the descriptor is in use (and while the pool closes it)
        self._lock = threading.Lock()
        self._fd = -1
        self._closed = False
        #: DirectWrites in flight on the descriptor: the pool does not close it meanwhile
        self._pins = 0
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        with self._lock:
            self._fd = self._open_fd(flags)
            try:
                self._size = os.fstat(self._fd).st_size
            except OSError as e:
                self._release()
                raise StorageError(f"cannot open {path}: {e}") from e
            #: where the bytes written since the last sync start, as far as this storage
            #: knows: only a hint, for `direct`'s write-back (its fdatasync covers the file)
            self._synced_to = self._size
            self._files.used(self)

    def _open_fd(self, flags: int) -> int:
        """Open the file (this storage's lock held); out of descriptors, close idle ones
        and retry once, then fail with what to do."""
        flags |= getattr(os, "O_CLOEXEC", 0)
        try:
            return os.open(self._path, flags, 0o644)
        except OSError as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE) or not self._files.shrink(
                max(1, len(self._files) // 8)
            ):
                raise StorageError(f"cannot open {self._path}: {_explain(e)}") from e
        try:  # (a failed open created nothing: the same flags again)
            return os.open(self._path, flags, 0o644)
        except OSError as e:
            raise StorageError(f"cannot open {self._path}: {_explain(e)}") from e

    def _fd_in_use(self) -> int:
        """The descriptor, opened again if the pool closed it (this storage's lock held)."""
        if self._fd < 0:
            if self._closed:
                raise StorageError(f"{self._path} is closed")
            self._fd = self._open_fd(os.O_RDWR)
        self._files.used(self)
        return self._fd

    def _release(self) -> None:
        """Close the descriptor (this storage's lock held): idle, or closing."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    @property
    def size(self) -> int:
        return self._size

    def write(self, position: int, parts: Sequence[Buffer]) -> None:
        with self._lock:
            fd = self._fd_in_use()
            try:
                expected = sum(len(p) for p in parts)
                written = os.pwritev(fd, parts, position)
                if written != expected:
                    # Short writes happen only on a full disk or a signal; finish or fail
                    # loudly.
                    data = b"".join(bytes(p) for p in parts)
                    while written < expected:
                        n = os.pwrite(fd, data[written:], position + written)
                        if n <= 0:
                            raise OSError("short write")
                        written += n
            except OSError as e:
                raise StorageError(f"write to {self._path} at {position} failed: {e}") from e
            self._size = max(self._size, position + expected)

    def read(self, position: int, length: int) -> bytes:
        with self._lock:
            fd = self._fd_in_use()
            try:
                data = os.pread(fd, length, position)
            except OSError as e:
                raise StorageError(f"read of {self._path} at {position} failed: {e}") from e
        if len(data) != length:
            raise StorageError(
                f"short read of {self._path}: {len(data)} of {length} bytes at {position}"
            )
        return data

    def truncate(self, size: int) -> None:
        with self._lock:
            fd = self._fd_in_use()
            try:
                os.ftruncate(fd, size)
            except OSError as e:
                raise StorageError(f"truncate of {self._path} to {size} failed: {e}") from e
            self._size = size
            self._synced_to = min(self._synced_to, size)

    def sync(self) -> None:
        with self._lock:
            fd = self._fd_in_use()
            try:
                os.fdatasync(fd)
            except OSError as e:
                raise StorageError(f"fdatasync of {self._path} failed: {e}") from e
            self._synced_to = self._size

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._pins:  # the last DirectWrite to finish closes it
                return
            held = self._fd >= 0
            self._release()
        if held:
            self._files.forget(self)

    def direct(
        self,
        writes: Sequence[tuple[int, Sequence[Buffer]]],
        *,
        sync: bool,
        then: Callable[[], None] | None = None,
        writeback: bool = False,
    ) -> DirectWrite | None:
        """`writes` ((position, parts) each), then an fdatasync if `sync`, for threads that
        run them on the descriptor itself (`laminar.server.disk_threads`): it stays open
        until the DirectWrite is `finish`ed, which calls `then` if they succeeded. None if
        the descriptor is not open (opening it is disk work too: the Python threads do it).
        With `writeback`, the sync first writes back the bytes written since the last one, in
        pieces of `WRITEBACK_CHUNK_BYTES`, each waited for."""
        with self._lock:
            if self._fd < 0:
                return None
            self._files.used(self)
            self._pins += 1
            direct = DirectWrite(self, self._fd, writes, sync, then)
            if sync:
                direct.synced_to = self._size
                if writeback and self._synced_to < self._size:
                    direct.writeback = (self._synced_to, self._size)
            return direct

    def _unpin(self, end: int, synced_to: int = -1) -> None:
        """A DirectWrite finished; its writes ended at `end` (0: it wrote nothing), and its
        sync made the file durable to `synced_to` at least (-1: none did)."""
        with self._lock:
            self._pins -= 1
            self._size = max(self._size, end)
            if synced_to >= 0:  # (a truncate meanwhile lowered the size: the hint with it)
                self._synced_to = min(max(self._synced_to, synced_to, end), self._size)
            if not (self._closed and self._pins == 0):
                return
            held = self._fd >= 0
            self._release()
        if held:
            self._files.forget(self)

    @property
    def holds_descriptor(self) -> bool:
        """Whether its file is open now (else the next use opens it)."""
        return self._fd >= 0


class DirectWrite:
    """A file's writes and fdatasync handed to threads as a descriptor and buffers
    (`FileStorage.direct`). The threads report an errno; `finish`, on the thread that
    handed it over, ends it and turns a failure into the StorageError `write` or `sync`
    would have raised."""

    __slots__ = ("fd", "storage", "sync", "synced_to", "then", "writeback", "writes")

    def __init__(
        self,
        storage: FileStorage,
        fd: int,
        writes: Sequence[tuple[int, Sequence[Buffer]]],
        sync: bool,
        then: Callable[[], None] | None,
    ) -> None:
        self.storage = storage
        self.fd = fd
        self.writes = writes
        self.sync = sync
        self.then = then
        #: the range its sync writes back in pieces first (`FileStorage.direct`), if any
        self.writeback: tuple[int, int] | None = None
        #: the file's size when it was handed over: durable once its sync is done
        self.synced_to = -1

    def abandon(self) -> None:
        """End it unrun (the threads refused it)."""
        self.storage._unpin(0)

    def finish(self, error: int, failed: int) -> StorageError | None:
        """The threads' result: `error` an errno (0: done), `failed` the write that failed,
        or len(writes) for the fdatasync."""
        writes = self.writes
        end = 0
        if error == 0:
            end = max((p + sum(len(part) for part in parts) for p, parts in writes), default=0)
        self.storage._unpin(end, self.synced_to if error == 0 else -1)
        if error == 0:
            if self.then is not None:
                self.then()
            return None
        path = self.storage._path
        if failed < len(writes):
            return StorageError(
                f"write to {path} at {writes[failed][0]} failed: [Errno {error}] "
                f"{os.strerror(error)}"
            )
        return StorageError(f"fdatasync of {path} failed: [Errno {error}] {os.strerror(error)}")


def _explain(error: OSError) -> str:
    if error.errno in (errno.EMFILE, errno.ENFILE):
        return (
            f"{error} (the limit on open files is reached: raise `ulimit -n`, or the "
            "container's nofile limit, above what the broker's partitions and connections "
            "need)"
        )
    return str(error)


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
