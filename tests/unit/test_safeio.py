"""ckptbench.safeio: the rules for opening what ckptbench does not own, one by one."""

from __future__ import annotations

import errno
import os
import tomllib
from pathlib import Path

import pytest

from ckptbench import native, safeio
from ckptbench.errors import UnsafeFileError


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("keep\n")
    return path


def test_a_symlink_is_refused_for_reading_and_writing(tmp_path: Path, victim: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(victim)
    for flags in (os.O_RDONLY, os.O_WRONLY | os.O_CREAT, os.O_RDWR | os.O_CREAT | os.O_TRUNC):
        with pytest.raises(UnsafeFileError, match="symbolic link"):
            safeio.open_regular(link, flags)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "would-be-created")
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        safeio.open_regular(dangling, os.O_WRONLY | os.O_CREAT)
    assert victim.read_text() == "keep\n" and not (tmp_path / "would-be-created").exists()


def test_a_hard_link_is_refused_for_writing_and_read_as_it_is(tmp_path: Path, victim: Path) -> None:
    link = tmp_path / "link"
    os.link(victim, link)
    for flags in (os.O_WRONLY, os.O_WRONLY | os.O_CREAT, os.O_RDWR | os.O_CREAT):
        with pytest.raises(UnsafeFileError, match="hard link"):
            safeio.open_regular(link, flags)
    os.close(safeio.open_regular(link, os.O_RDONLY))  # reading it leaks nothing its reader could not read
    assert victim.read_text() == "keep\n"


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: os.mkfifo(p), "FIFO"),
    (lambda p: p.mkdir(), "directory"),
])
def test_special_files_are_refused_without_blocking(tmp_path: Path, make, says: str) -> None:
    path = tmp_path / "special"
    make(path)
    for flags in (os.O_RDONLY, os.O_WRONLY):  # a FIFO opened blocking would wait for a peer forever
        with pytest.raises(UnsafeFileError, match=says):
            safeio.open_regular(path, flags)


def test_a_device_is_refused() -> None:
    with pytest.raises(UnsafeFileError, match="character device"):
        safeio.open_regular("/dev/zero")


def test_reads_stop_at_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "doc"
    path.write_bytes(b"x" * 100)
    assert safeio.read_capped(path, 100) == b"x" * 100
    with pytest.raises(UnsafeFileError, match="more than a manifest can be"):
        safeio.read_capped(path, 99, what="manifest")


def test_a_file_that_grows_past_its_size_is_cut_at_the_cap() -> None:
    """/proc files report size 0: the cap holds while reading, not only on the size."""
    assert len(safeio.read_capped("/proc/self/status", 1 << 20)) > 0
    with pytest.raises(UnsafeFileError):
        safeio.read_capped("/proc/self/status", 10)


@pytest.mark.parametrize("text", ["x = " + "[" * 40 + "]" * 40, "x = " + "{a = " * 40 + "1" + "}" * 40,
                                  "x = " + "[" * 5000 + "]" * 5000])
def test_toml_nested_too_deep_is_invalid_toml_not_a_recursion_error(text: str) -> None:
    with pytest.raises(tomllib.TOMLDecodeError, match="nested"):
        safeio.loads_toml(text)


def test_toml_brackets_in_strings_and_comments_do_not_count() -> None:
    text = 'a = "' + "[" * 100 + '"\nb = \'\'\'' + "{" * 100 + "'''\n# " + "[" * 100 + "\n[t]\nc = [[1], [2]]\n"
    assert safeio.loads_toml(text)["t"] == {"c": [[1], [2]]}


def test_write_output_replaces_a_planted_link_and_never_writes_through_it(tmp_path: Path, victim: Path) -> None:
    out = tmp_path / "report.html"
    out.symlink_to(victim)
    safeio.write_output(out, b"<html>")
    assert not out.is_symlink() and out.read_bytes() == b"<html>"
    assert victim.read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "victim.txt"]  # no temp file left


def test_write_output_leaves_nothing_when_the_writer_fails(tmp_path: Path) -> None:
    def fails(out) -> None:
        out.write(b"half")
        raise RuntimeError("the plot failed")

    with pytest.raises(RuntimeError):
        safeio.write_output(tmp_path / "plot.png", fails)
    assert list(tmp_path.iterdir()) == []


def test_a_directory_held_open_is_reached_after_its_name_was_swapped(tmp_path: Path) -> None:
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    with safeio.Directory.open(tmp_path) as parent, parent.subdir("work") as directory:
        work.rename(tmp_path / "moved")
        work.symlink_to(elsewhere)
        Path(directory.path_of("file")).write_text("data")
        directory.write_atomic("atomic", lambda out: out.write(b"x"))
        assert not directory.same_as("work", parent)
    assert sorted(p.name for p in (tmp_path / "moved").iterdir()) == ["atomic", "file"]
    assert list(elsewhere.iterdir()) == []


def test_a_symlink_where_a_subdirectory_belongs_is_refused(tmp_path: Path) -> None:
    (tmp_path / "sub").symlink_to(tmp_path)
    with safeio.Directory.open(tmp_path) as directory, pytest.raises(UnsafeFileError, match="symbolic link"):
        directory.subdir("sub")


def test_the_engine_writes_through_no_symlink_at_a_files_name(tmp_path: Path, victim: Path) -> None:
    link = tmp_path / "shard.bin"
    link.symlink_to(victim)
    buf = native.AlignedBuffer(4096)
    with pytest.raises(OSError) as caught:
        native.write([(memoryview(buf), str(link), 0)], threads=1, block_size=4096, direct=False)
    assert caught.value.errno == errno.ELOOP
    assert victim.read_text() == "keep\n"
