"""CPU tests of ``pycutlass cache``: inspecting changes nothing, foreign files are refused, debris is cleared."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from pycutlass.cache.store import ArtifactCache, CacheCorruptError
from pycutlass.cli import main as cli_main
from pycutlass.errors import CacheError

BINARY = b"\x7fELF" + bytes(range(256)) * 8


def _snapshot(directory: Path) -> dict[str, tuple[int, int, bytes]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(directory.iterdir())}


def _invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(cli_main, ["cache", *args], input=input)


def _filled(path: Path) -> Path:
    with ArtifactCache(path) as cache:
        cache.store([("aaaa1111", "gemm_a", {}), ("bbbb2222", "gemm_b", {}), ("cccc3333", "gemm_c", {}),
                     ("dddd4444", "gemm_d", {})], BINARY, "cubin")
        cache.store([("eeee5555", "conv", {})], b"x" * 1000, "cubin")
    return path


@pytest.mark.parametrize("command", ["list", "size", "path", "clear"])
def test_a_text_file_is_refused_and_left_alone(tmp_path, command):
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping: milk, eggs\n")
    before = _snapshot(tmp_path)
    result = _invoke(command, "--path", str(notes), *(["--yes"] if command == "clear" else []))
    assert _snapshot(tmp_path) == before  # not renamed, not replaced, nothing created next to it
    if command == "path":
        assert result.exit_code == 0 and result.stdout.strip() == str(notes)
    else:
        assert result.exit_code == 1
        assert "not a pycutlass cache: it is a text file of 21 bytes starting 'shopping: milk, eggs'" in result.output


def test_compiling_into_a_text_file_is_refused(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping\n")
    with pytest.raises(CacheError, match="not a pycutlass cache: it is a text file"):
        ArtifactCache(notes).store([("k", "kernel", {})], BINARY, "cubin")
    with pytest.raises(CacheError, match="not a pycutlass cache: it is a binary file of 4096 bytes"):
        (tmp_path / "random.bin").write_bytes(os.urandom(4096))
        ArtifactCache(tmp_path / "random.bin").lookup("k")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "random.bin"]
    assert notes.read_text() == "shopping\n"


@pytest.mark.parametrize("command", ["list", "size"])
def test_inspecting_creates_moves_and_writes_nothing(tmp_path, command):
    db = _filled(tmp_path / "compiled_cache.db")
    before = _snapshot(tmp_path)
    result = _invoke(command, "--path", str(db))
    assert result.exit_code == 0, result.output
    assert _snapshot(tmp_path) == before  # no -wal/-shm, no last_used update, no schema write


def test_inspecting_a_damaged_cache_says_so_and_moves_nothing(tmp_path):
    db = _filled(tmp_path / "compiled_cache.db")
    data = db.read_bytes()
    db.write_bytes(data[:100] + bytes(len(data) - 100))
    before = _snapshot(tmp_path)
    for command in ("list", "size"):
        result = _invoke(command, "--path", str(db))
        assert result.exit_code == 1 and "is corrupt" in result.output and "left as it is" in result.output
    with pytest.raises(CacheCorruptError):
        ArtifactCache(db, read_only=True).entries()
    assert _snapshot(tmp_path) == before


def test_inspecting_while_a_writer_is_active(tmp_path):
    db = _filled(tmp_path / "compiled_cache.db")
    writer = ArtifactCache(db)
    writer.store([("ffff6666", "late", {})], b"late", "cubin")  # still in the open writer's WAL
    before = _snapshot(tmp_path)
    assert {e["key"] for e in ArtifactCache(db, read_only=True).entries()} >= {"ffff6666", "aaaa1111"}
    assert set(_snapshot(tmp_path)) == set(before)
    writer.close()


def test_read_only_cache_refuses_writes(tmp_path):
    db = _filled(tmp_path / "compiled_cache.db")
    cache = ArtifactCache(db, read_only=True)
    assert cache.lookup("aaaa1111").binary == BINARY
    for call in (lambda: cache.store([("k", "n", {})], b"b", "cubin"), cache.clear, lambda: cache.remove("k")):
        with pytest.raises(CacheError, match="read-only"):
            call()


def test_inspecting_a_missing_path_says_so_and_creates_nothing(tmp_path):
    missing = tmp_path / "sub" / "none.db"
    for command in ("list", "size", "clear"):
        result = _invoke(command, "--path", str(missing), "--yes") if command == "clear" else \
            _invoke(command, "--path", str(missing))
        assert result.exit_code == 0 and "does not exist" in result.output
    shown = _invoke("path", "--path", str(missing))
    assert shown.stdout.strip() == str(missing) and "no file there yet" in shown.stderr
    assert list(tmp_path.iterdir()) == []


def test_list_sizes_each_kernel_by_its_share_of_the_binary(tmp_path):
    db = _filled(tmp_path / "compiled_cache.db")
    shares = {e["key"]: (e["share"], e["sharing"]) for e in ArtifactCache(db, read_only=True).entries()}
    assert shares["aaaa1111"] == (len(BINARY) / 4, 4) and shares["eeee5555"] == (1000, 1)
    listed = _invoke("list", "--path", str(db)).output
    line = next(line for line in listed.splitlines() if line.startswith("gemm_a"))
    assert f"{len(BINARY) // 4} B (1/4)" in line and "2.0 KiB" not in listed
    assert "1000 B" in next(line for line in listed.splitlines() if line.startswith("conv"))


def test_clear_and_size_include_the_files_moved_aside(tmp_path):
    db = _filled(tmp_path / "compiled_cache.db")
    data = db.read_bytes()
    db.write_bytes(data[:100] + bytes(len(data) - 100))
    with pytest.warns(Warning, match="is corrupt"):
        ArtifactCache(db).store([("k", "kernel", {})], BINARY, "cubin")  # compiling moves it aside
    (aside,) = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    stranger = tmp_path / "compiled_cache.db.corrupt-20240101-000000"  # such a name, but not a database
    stranger.write_text("not mine\n")
    unrelated = tmp_path / "other.db.corrupt-20240101-000000"
    unrelated.write_bytes(data)

    sized = _invoke("size", "--path", str(db))
    assert sized.exit_code == 0 and "in 2 damaged files moved aside" in sized.output

    cleared = _invoke("clear", "--yes", "--path", str(db))
    assert cleared.exit_code == 0, cleared.output
    assert "Removed 1 cached kernels" in cleared.output and "Removed 1 damaged files" in cleared.output
    assert not aside.exists() and stranger.read_text() == "not mine\n" and unrelated.exists()
    assert "Left 1 files that are not databases" in cleared.output
    assert ArtifactCache(db, read_only=True).entries() == []


def test_clear_of_a_damaged_cache(tmp_path):
    db = _filled(tmp_path / "compiled_cache.db")
    data = db.read_bytes()
    db.write_bytes(data[:100] + bytes(len(data) - 100))
    declined = _invoke("clear", "--path", str(db), input="n\n")
    assert declined.exit_code != 0 and db.read_bytes()[:100] == data[:100]  # untouched
    with pytest.warns(Warning, match="is corrupt"):
        cleared = _invoke("clear", "--yes", "--path", str(db))
    assert cleared.exit_code == 0, cleared.output
    assert sorted(p.name for p in tmp_path.iterdir() if "corrupt" in p.name) == []
    assert ArtifactCache(db, read_only=True).entries() == []


def test_version_is_the_installed_one():
    from importlib.metadata import PackageNotFoundError, version

    try:
        expected = version("pycutlass")
    except PackageNotFoundError:
        expected = "source"
    result = CliRunner().invoke(cli_main, ["--version"])
    assert result.exit_code == 0 and result.output == f"pycutlass {expected}\n"
