"""bench/disk_bench.py on a real disk (a few rounds): every case measured, its JSON complete,
its files removed, its bounds refused when out of range."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import disk_bench


def test_every_case_is_measured_and_nothing_is_left_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk_bench, "CHECKPOINT_ROUNDS", 2)  # the files behind the journal too
    assert disk_bench.main(["--dir", str(tmp_path), "--rounds", "5", "--max-seconds", "20"]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    cases = [f"one_file_{kib}kib" for kib in disk_bench.SIZES_KIB]
    cases += [f"spread_{files}_files" for files in disk_bench.SPREADS]
    cases += ["files_extending", "files_zeroed", "journal_extending", "journal_zeroed"]
    for case in cases:
        measured = result[case]
        assert 1 <= measured["rounds"] <= 5, case
        assert 0 < measured["p50_us"] <= measured["p90_us"], case
    assert result["spread_4_over_1"] > 0 and result["journal_zeroed_over_files"] > 0
    assert list(tmp_path.iterdir()) == []  # its directory and files are gone


def test_bounds_out_of_range_are_refused(tmp_path: Path) -> None:
    for bound in (
        ["--rounds", "0"],
        ["--rounds", str(disk_bench.MAX_ROUNDS + 1)],
        ["--max-seconds", "0"],
        ["--max-seconds", "3601"],
    ):
        with pytest.raises(SystemExit) as exited:
            disk_bench.main(["--dir", str(tmp_path), *bound])
        assert exited.value.code == 2, bound
    assert list(tmp_path.iterdir()) == []


def test_writes_into_zeros_go_round_and_never_grow_the_file(tmp_path: Path) -> None:
    """What the zeroed cases measure: no write changes the file's size."""
    work = disk_bench.Round(tmp_path, "zeroed", 1, 4096, 3 * 4096)
    try:
        positions = []
        for _ in range(7):
            positions.append(work.positions[0])
            work.one(0)
        assert positions == [0, 4096, 8192, 0, 4096, 8192, 0]
        assert (tmp_path / "zeroed-0").stat().st_size == 3 * 4096
    finally:
        work.close()


def test_a_file_appended_to_is_emptied_at_its_bound_and_grows_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk_bench, "MAX_FILE_BYTES", 3 * 4096)
    work = disk_bench.Round(tmp_path, "appended", 1, 4096, 0)
    try:
        sizes = []
        for _ in range(5):
            work.one(0)
            sizes.append((tmp_path / "appended-0").stat().st_size)
        assert sizes == [4096, 8192, 0, 4096, 8192]  # emptied after the third
    finally:
        work.close()
