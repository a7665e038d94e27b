"""``epctx.ep.RecordCache`` and ``user_cache_dir``: what EPs keep between processes in the user's cache (IREE's
probe records): a record written atomically, read back; a corrupt, truncated or foreign record ignored and
written again; concurrent writers of one key never leave a half record; a folder that cannot be written never
fails the caller."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from epctx.ep import RecordCache, user_cache_dir

KEY = "ab" * 32


def test_a_record_is_read_back(tmp_path: Path) -> None:
    cache = RecordCache(tmp_path / "c")
    assert cache.get(KEY) is None
    assert cache.put(KEY, {"ok": False, "error": "IREE said no"})
    assert cache.get(KEY) == {"ok": False, "error": "IREE said no"}
    assert cache.path(KEY) == tmp_path / "c" / "ab" / f"{KEY}.json"
    assert not [p for p in cache.path(KEY).parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    "content",
    [b"", b'{"key": "', b"\xff\xfe not json", b"[1, 2]", b'{"key": "' + b"cd" * 32 + b'", "record": {}}'],
    ids=["empty", "truncated", "binary", "not-a-mapping", "another-key"],
)
def test_a_broken_record_reads_as_missing_and_is_written_again(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    cache = RecordCache(tmp_path)
    cache.path(KEY).parent.mkdir(parents=True)
    cache.path(KEY).write_bytes(content)
    caplog.set_level("INFO", logger="epctx")
    assert cache.get(KEY) is None
    assert content == b"" or "ignored (it is written again)" in caplog.text
    assert cache.put(KEY, {"n": 1}) and cache.get(KEY) == {"n": 1}


def test_keys_are_digests(tmp_path: Path) -> None:
    for bad in ("../../etc/passwd", "AB" * 32, "ab", ""):
        with pytest.raises(ValueError, match="hex digits"):
            RecordCache(tmp_path).path(bad)


def _writer(folder: str, worker: int, rounds: int) -> None:
    cache = RecordCache(folder)
    for k in range(rounds):
        assert cache.put(KEY, {"worker": worker, "round": k, "pad": "x" * 200_000})


def test_concurrent_writers_leave_one_whole_record(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 20)) for w in range(3)]
    for p in procs:
        p.start()
    cache = RecordCache(tmp_path)
    while any(p.is_alive() for p in procs):
        found = cache.get(KEY)  # a reader takes no lock, and never sees a half record
        assert found is None or len(found["pad"]) == 200_000
    for p in procs:
        p.join()
        assert p.exitcode == 0
    final = cache.get(KEY)
    assert final is not None and final["round"] == 19
    assert not [p for p in cache.path(KEY).parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only folder")
def test_an_unwritable_folder_fails_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tmp_path.chmod(0o500)
    try:
        cache = RecordCache(tmp_path / "sub")
        assert not cache.put(KEY, {"n": 1}) and not cache.put(KEY, {"n": 2})
        assert cache.get(KEY) is None
        assert caplog.text.count("cannot be written") == 1
    finally:
        tmp_path.chmod(0o700)


def test_a_file_where_the_folder_should_be_fails_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "blocked").write_text("a file, not a folder")
    cache = RecordCache(tmp_path / "blocked")
    assert not cache.put(KEY, {"n": 1}) and cache.get(KEY) is None
    assert "cannot be written" in caplog.text


def test_the_user_cache_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EPCTX_CACHE_DIR", str(tmp_path / "mine"))
    assert user_cache_dir("iree-probes") == tmp_path / "mine" / "iree-probes"
    monkeypatch.delenv("EPCTX_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir("trust") == tmp_path / "xdg" / "epctx" / "trust"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache_dir() == tmp_path / "home" / ".cache" / "epctx"
