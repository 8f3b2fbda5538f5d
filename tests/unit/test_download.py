"""The download engine's pure pieces, offline: the range plan, Content-Range parsing, the
error's message, argument checks, and the paths that never open a socket."""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from seedkeeper.errors import SeedkeeperError
from seedkeeper_task.restore.download import (
    SEGMENT_BYTES,
    THREAD_PREFIX,
    DownloadFailed,
    download,
    parse_content_range,
    plan_ranges,
)

MIB = 1024 * 1024
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
PRESIGNED_URL = "https://acct.r2.cloudflarestorage.com/b/backups/x.sqsh?X-Amz-Signature=deadbeef"


@given(
    size=st.integers(min_value=0, max_value=2**34),
    parts=st.integers(min_value=1, max_value=32),
    segment=st.integers(min_value=MIB, max_value=64 * MIB),
    min_range=st.integers(min_value=1, max_value=16 * MIB),
)
def test_plan_ranges_cuts_the_file_into_contiguous_balanced_ranges(
    size: int, parts: int, segment: int, min_range: int
) -> None:
    ranges = plan_ranges(size, parts, segment=segment, min_range=min_range)

    if size == 0:
        assert ranges == []
        return
    assert (ranges[0][0], ranges[-1][1]) == (0, size)
    assert all(end == first for (_, end), (first, _) in itertools.pairwise(ranges))
    lengths = [end - first for first, end in ranges]
    assert max(lengths) - min(lengths) <= 1
    if parts > 1 and size // min_range >= parts:  # large: segments, a multiple of parts
        assert len(ranges) % parts == 0
        assert max(lengths) <= segment
    else:  # small: fewer ranges, none under min_range unless there is only one
        assert len(ranges) == max(1, min(parts, size // min_range))
        assert len(ranges) == 1 or min(lengths) >= min_range


def test_plan_ranges_examples() -> None:
    assert plan_ranges(0, 4) == []
    assert plan_ranges(3 * MIB, 4) == [(0, 3 * MIB)]  # too small to split
    assert plan_ranges(10 * MIB, 4) == [(0, 5 * MIB), (5 * MIB, 10 * MIB)]
    assert plan_ranges(24 * MIB, 4) == [(i * 6 * MIB, (i + 1) * 6 * MIB) for i in range(4)]
    assert plan_ranges(300 * MIB, 1) == [(0, 300 * MIB)]
    large = plan_ranges(300_000_000, 4)
    assert len(large) == 20
    assert max(end - first for first, end in large) <= SEGMENT_BYTES


@pytest.mark.parametrize(("size", "parts"), [(-1, 4), (10, 0)], ids=["negative size", "no parts"])
def test_plan_ranges_refuses_nonsense(size: int, parts: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        plan_ranges(size, parts)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("bytes 0-99/100", (0, 99, 100)),
        (" bytes 5-9/* ", (5, 9, None)),
        ("bytes */100", None),
        ("bytes 5-/100", None),
        ("items 0-1/2", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_content_range(value: str | None, parsed: tuple[int, int, int | None] | None) -> None:
    assert parse_content_range(value) == parsed


def test_download_failed_names_its_step_and_reason() -> None:
    failed = DownloadFailed("download", "retries-exhausted", "stall")

    assert (failed.step, failed.reason, failed.detail) == ("download", "retries-exhausted", "stall")
    assert str(failed) == "download failed: retries-exhausted (last: stall)"
    assert str(DownloadFailed("verify", "sha256-mismatch")) == "verify failed: sha256-mismatch"
    assert isinstance(failed, SeedkeeperError)


def _download(url: str, target: Path, **overrides: object) -> None:
    arguments: dict[str, object] = {
        "size": 0,
        "sha256": EMPTY_SHA256,
        "deadline": time.monotonic() + 5,
    } | overrides
    download(url, target, **arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url",
    [
        "ftp://acct.example/x?X-Amz-Signature=deadbeef",
        "https:///x?X-Amz-Signature=deadbeef",
        "https://acct.example:port/x?X-Amz-Signature=deadbeef",
        "https://acct.example/x y?X-Amz-Signature=deadbeef",
    ],
    ids=["scheme", "no host", "bad port", "space"],
)
def test_a_bad_url_is_refused_without_quoting_it(url: str, tmp_path: Path) -> None:
    with pytest.raises(DownloadFailed) as caught:
        _download(url, tmp_path / "x.sqsh", size=10, sha256="0" * 64)

    assert (caught.value.step, caught.value.reason) == ("download", "bad-url")
    assert "deadbeef" not in str(caught.value)
    assert "acct" not in str(caught.value)
    assert not (tmp_path / "x.sqsh").exists()


@pytest.mark.parametrize(
    "overrides",
    [{"size": -1}, {"parts": 0}, {"stall_timeout": 0}, {"max_retries": -1}],
    ids=["size", "parts", "stall", "retries"],
)
def test_nonsense_arguments_are_refused(overrides: dict[str, object], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be"):
        _download(PRESIGNED_URL, tmp_path / "x.sqsh", **overrides)


def test_an_empty_archive_needs_no_request(tmp_path: Path) -> None:
    target = tmp_path / "empty.sqsh"
    target.write_bytes(b"stale debris")

    stats = download(
        PRESIGNED_URL, target, size=0, sha256=EMPTY_SHA256, deadline=time.monotonic() + 5
    )

    assert (stats.bytes, stats.retries) == (0, 0)
    assert target.read_bytes() == b""
    assert not [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


def test_an_empty_archive_with_the_wrong_hash_fails_verification(tmp_path: Path) -> None:
    with pytest.raises(DownloadFailed) as caught:
        _download(PRESIGNED_URL, tmp_path / "empty.sqsh", sha256="0" * 64)

    assert (caught.value.step, caught.value.reason) == ("verify", "sha256-mismatch")


def test_cancel_already_set_stops_before_anything(tmp_path: Path) -> None:
    cancel = threading.Event()
    cancel.set()

    with pytest.raises(DownloadFailed) as caught:
        _download(PRESIGNED_URL, tmp_path / "x.sqsh", size=10, cancel=cancel)

    assert (caught.value.step, caught.value.reason) == ("download", "cancelled")
    assert not (tmp_path / "x.sqsh").exists()


def test_a_deadline_already_past_stops_before_anything(tmp_path: Path) -> None:
    with pytest.raises(DownloadFailed) as caught:
        _download(PRESIGNED_URL, tmp_path / "x.sqsh", size=10, deadline=time.monotonic() - 1)

    assert (caught.value.step, caught.value.reason) == ("download", "deadline")
