"""File descriptors bounded per process (`laminar.log.storage.OpenFiles`): storages past the
budget close their idle files, and read, write, truncate and sync correctly once reopened;
a whole segmented log works through a budget smaller than its files."""

from __future__ import annotations

import os
import resource
import threading
from pathlib import Path

import pytest

from laminar.log import LogConfig, Record, SegmentedLog, decode_batch, encode_batch
from laminar.log.errors import StorageError
from laminar.log.storage import OPEN_FILES, FileDirectory, FileStorage, OpenFiles


def test_files_past_the_budget_are_closed_and_reopened_on_use(tmp_path: Path) -> None:
    files = OpenFiles(budget=2)
    storages = []
    for i in range(5):
        storage = FileStorage(str(tmp_path / f"f{i}"), create=True, files=files)
        storage.write(0, (f"file {i} ".encode(), b"payload"))
        storages.append(storage)
    assert len(files) == 2 and files.evictions == 3
    assert [s.holds_descriptor for s in storages] == [False, False, False, True, True]
    for i, storage in enumerate(storages):  # each read reopens one, closing another
        assert storage.read(0, storage.size) == f"file {i} payload".encode()
        storage.sync()
        assert storage.holds_descriptor and len(files) == 2
    storages[0].truncate(6)
    storages[0].write(6, (b"!",))
    assert storages[0].read(0, 7) == b"file 0!"
    assert (tmp_path / "f0").read_bytes() == b"file 0!"  # on disk, not only in this object
    for storage in storages:
        storage.close()
    assert len(files) == 0
    with pytest.raises(StorageError, match="closed"):
        storages[0].read(0, 1)


def test_a_segmented_log_works_through_a_budget_smaller_than_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logs of many small segments, with fewer descriptors than files: every record reads
    back after its files were closed, and after the logs are opened again."""
    monkeypatch.setattr(OPEN_FILES, "budget", 3)
    evicted = OPEN_FILES.evictions
    config = LogConfig(segment_bytes=4096)
    logs = [SegmentedLog.open(FileDirectory(str(tmp_path / f"log{i}")), config) for i in range(4)]
    for n in range(40):
        for i, log in enumerate(logs):
            log.append(encode_batch([Record(value=_value(i, n))]))
    for log in logs:
        log.sync()
    assert len(list(tmp_path.glob("log*/*.log"))) > 12  # many more files than descriptors
    assert OPEN_FILES.evictions > evicted
    held = [f for f in Path("/proc/self/fd").iterdir() if str(tmp_path) in _target(f)]
    assert len(held) <= 3
    for log in logs:
        log.close()
    logs = [SegmentedLog.open(FileDirectory(str(tmp_path / f"log{i}")), config) for i in range(4)]
    for i, log in enumerate(logs):
        values = [decode_batch(log.read(n).data)[0].value for n in range(log.next_index)]
        assert values == [_value(i, n) for n in range(40)]
    for log in logs:
        log.close()


def test_storages_used_from_threads_past_the_budget_keep_their_bytes(tmp_path: Path) -> None:
    """Threads writing and syncing their own files while others' use closes them."""
    files = OpenFiles(budget=2)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            storage = FileStorage(str(tmp_path / f"t{i}"), create=True, files=files)
            for n in range(200):
                storage.write(n * 4, (n.to_bytes(4, "little"),))
                if n % 50 == 0:
                    storage.sync()
            data = storage.read(0, 800)
            assert [int.from_bytes(data[k : k + 4], "little") for k in range(0, 800, 4)] == list(
                range(200)
            )
            storage.close()
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(files) == 0


def test_the_budget_leaves_room_for_sockets() -> None:
    assert OpenFiles.for_limit(20_000) == 15_000
    assert OpenFiles.for_limit(1024) == 16  # (the minimum)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert OPEN_FILES.budget <= OpenFiles.for_limit(max(soft, 1024))


def _value(i: int, n: int) -> bytes:
    return f"log {i} record {n} ".encode() * 20


def _target(link: Path) -> str:
    try:
        return os.readlink(link)
    except OSError:  # (closed meanwhile)
        return ""
