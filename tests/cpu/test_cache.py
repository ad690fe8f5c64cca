"""CPU tests of the artifact cache (pycutlass.cache) and its CLI: real SQLite files, real processes."""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path

import platformdirs
import pytest
from click.testing import CliRunner

from pycutlass.cache import location, store
from pycutlass.cache.store import SCHEMA_VERSION, Artifact, ArtifactCache
from pycutlass.cli import main as cli_main
from pycutlass.errors import CacheError, CacheIntegrityWarning

REPO_ROOT = Path(__file__).resolve().parents[2]
BINARY = b"\x7fELF" + bytes(range(256)) * 8


@pytest.fixture
def cache_file(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "compiled_cache.db"


@pytest.fixture
def no_integrity_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheIntegrityWarning)
        yield


def _moved_aside(db_file: Path, reason: str) -> list[Path]:
    """The database files moved aside for ``reason`` (not their -wal/-shm companions)."""
    prefix = f"{db_file.name}.{reason}-"
    moved = (p for p in db_file.parent.iterdir() if p.name.startswith(prefix))
    return sorted(p for p in moved if not p.name.endswith(("-wal", "-shm")))


@contextlib.contextmanager
def _raw(db_file: Path) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection that commits and closes, for tests that play another party."""
    with contextlib.closing(sqlite3.connect(db_file)) as conn, conn:
        yield conn


def _fill(cache: ArtifactCache, count: int = 3, size: int = 50_000) -> dict[str, bytes]:
    binaries = {f"key{i}": os.urandom(size) for i in range(count)}
    for key, binary in binaries.items():
        cache.store([(key, f"kernel_{key}", {"index": key})], binary, "cubin")
    return binaries


# ---- store / lookup ---------------------------------------------------------------------------


def test_roundtrip(cache_file: Path, no_integrity_warnings) -> None:
    cache = ArtifactCache(cache_file)
    assert not cache_file.parent.exists(), "constructing a cache must create nothing"
    assert cache.lookup("missing") is None
    sha = cache.store([("k", "gemm_kernel", {"arch": 80, "tile": [128, 128, 32]})], BINARY, "cubin")

    found = cache.lookup("k")
    assert found == Artifact(
        key="k", name="gemm_kernel", binary=BINARY, sha256=sha, kind="cubin", meta={"arch": 80, "tile": [128, 128, 32]}
    )
    cache.close()
    assert ArtifactCache(cache_file).lookup("k") == found  # persisted, and the connection reopens


def test_keys_share_one_binary(cache_file: Path, no_integrity_warnings) -> None:
    cache = ArtifactCache(cache_file)
    sha = cache.store([("a", "kernel_a", {}), ("b", "kernel_b", {}), ("c", "kernel_c", None)], BINARY, "cubin")
    cache.store([("d", "kernel_d", {})], BINARY, "cubin")  # same bytes again: still one copy

    with _raw(cache_file) as raw:
        assert raw.execute("SELECT COUNT(*) FROM binaries").fetchone() == (1,)
        assert raw.execute("SELECT COUNT(*) FROM kernels WHERE binary_sha256 = ?", [sha]).fetchone() == (4,)
    assert cache.size_bytes() == len(BINARY)
    assert {a.name for a in map(cache.lookup, "abcd")} == {"kernel_a", "kernel_b", "kernel_c", "kernel_d"}

    # A shared binary lives until its last key goes; a replaced key's old binary is dropped.
    assert cache.remove("a") and not cache.remove("a")
    assert cache.size_bytes() == len(BINARY)
    for key in "bcd":
        cache.store([(key, f"kernel_{key}", {})], b"new", "ptx")
    assert cache.size_bytes() == 3
    assert cache.lookup("b").kind == "ptx"


def test_memory_cache(no_integrity_warnings) -> None:
    cache = ArtifactCache(":memory:")
    assert cache.path == ":memory:"
    cache.store([("k", "kernel", {"x": 1})], BINARY, "cubin")
    with cache.claim(["k", "other"]):
        assert cache.lookup("k").binary == BINARY
    assert [e["key"] for e in cache.entries()] == ["k"]
    assert cache.clear() == 2  # one kernel row + one binary row
    assert cache.lookup("k") is None


def test_entries_and_last_used(cache_file: Path) -> None:
    cache = ArtifactCache(cache_file)
    cache.store([("old", "kernel_old", {"m": 1})], b"one", "cubin")
    cache.store([("new", "kernel_new", {})], b"two", "ptx")
    time.sleep(0.01)
    cache.lookup("old")
    entries = cache.entries()
    assert [e["key"] for e in entries] == ["old", "new"]  # most recently used first
    assert set(entries[0]) == {"key", "name", "sha256", "size", "sharing", "share", "kind", "created", "last_used",
                               "meta"}
    assert entries[0]["meta"] == {"m": 1} and entries[0]["size"] == 3
    assert entries[0]["last_used"] > entries[0]["created"]


# ---- integrity --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tamper",
    [
        "UPDATE binaries SET data = :junk WHERE sha256 = :sha",  # same size, other bytes
        "UPDATE binaries SET data = substr(data, 1, 100) WHERE sha256 = :sha",  # truncated
        "UPDATE binaries SET data = NULL WHERE sha256 = :sha",  # missing
        "UPDATE binaries SET data = CAST(data AS TEXT) WHERE sha256 = :sha",  # wrong type
        "DELETE FROM binaries WHERE sha256 = :sha",  # dangling kernel row
    ],
)
def test_tampered_binary_is_discarded(cache_file: Path, tamper: str) -> None:
    cache = ArtifactCache(cache_file)
    sha = cache.store([("victim", "kernel_v", {}), ("sibling", "kernel_s", {})], BINARY, "cubin")
    cache.store([("bystander", "kernel_b", {})], b"other", "cubin")
    with _raw(cache_file) as raw:
        raw.execute(tamper, {"sha": sha, "junk": bytes(len(BINARY))})

    with pytest.warns(CacheIntegrityWarning, match="'victim'"):
        assert cache.lookup("victim") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheIntegrityWarning)
        assert cache.lookup("sibling") is None  # same bad binary: removed along with it
        assert cache.lookup("bystander").binary == b"other"
    assert [e["key"] for e in cache.entries()] == ["bystander"]


def _damaged_cache(cache_file: Path) -> bytes:
    """A pycutlass cache whose pages after the header are garbage; returns its bytes."""
    with ArtifactCache(cache_file) as cache:
        _fill(cache, count=1)
    data = cache_file.read_bytes()
    garbage = data[:100] + os.urandom(len(data) - 100)
    cache_file.write_bytes(garbage)
    return garbage


def test_corrupt_file_is_moved_aside(cache_file: Path) -> None:
    garbage = _damaged_cache(cache_file)

    cache = ArtifactCache(cache_file)
    with pytest.warns(CacheIntegrityWarning, match="is corrupt.*moved to.*starting empty"):
        assert cache.lookup("k") is None
    (moved,) = _moved_aside(cache_file, "corrupt")
    assert moved.read_bytes() == garbage
    cache.store([("k", "kernel", {})], BINARY, "cubin")
    assert cache.lookup("k").binary == BINARY


def test_truncated_file_is_moved_aside(cache_file: Path) -> None:
    with ArtifactCache(cache_file) as cache:
        _fill(cache, count=6)
    data = cache_file.read_bytes()
    assert not Path(f"{cache_file}-wal").exists()  # closed cleanly: everything is in the main file
    cache_file.write_bytes(data[: len(data) // 2])

    cache = ArtifactCache(cache_file)
    with pytest.warns(CacheIntegrityWarning, match="is corrupt"):
        assert cache.entries() == []
    assert len(_moved_aside(cache_file, "corrupt")) == 1
    cache.store([("k", "kernel", {})], BINARY, "cubin")
    assert cache.lookup("k").binary == BINARY


def test_corruption_found_after_open_is_recovered(cache_file: Path) -> None:
    with ArtifactCache(cache_file) as cache:
        binaries = _fill(cache, count=6)
    with open(cache_file, "r+b") as handle:  # zero pages in the middle: header and size stay valid
        size = handle.seek(0, os.SEEK_END)
        handle.seek(size // 2)
        handle.write(bytes(size // 4))

    cache = ArtifactCache(cache_file)
    with pytest.warns(CacheIntegrityWarning):
        results = {key: cache.lookup(key) for key in binaries}
    assert all(found is None or found.binary == binaries[key] for key, found in results.items())  # no bad data
    cache.store([("k", "kernel", {})], BINARY, "cubin")
    assert cache.lookup("k").binary == BINARY


def test_schema_mismatch_recreates(cache_file: Path) -> None:
    with ArtifactCache(cache_file) as cache:
        _fill(cache, count=1)
    with _raw(cache_file) as raw:
        raw.execute("UPDATE meta SET value = '999' WHERE name = 'schema_version'")

    cache = ArtifactCache(cache_file)
    with pytest.warns(CacheIntegrityWarning, match=f"schema version 999.*uses {SCHEMA_VERSION}"):
        assert cache.lookup("key0") is None
    assert len(_moved_aside(cache_file, "schema-v999")) == 1
    assert cache.entries() == []
    with _raw(cache_file) as raw:
        assert raw.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)


def test_foreign_database_is_not_used(cache_file: Path, no_integrity_warnings) -> None:
    cache_file.parent.mkdir(parents=True)
    with _raw(cache_file) as raw:
        raw.execute("CREATE TABLE something_else (x)")
    before = cache_file.read_bytes()
    for read_only in (False, True):
        cache = ArtifactCache(cache_file, read_only=read_only)
        with pytest.raises(CacheError, match="not a pycutlass cache: it is an SQLite database of another "
                                             r"application \(tables: something_else\)"):
            cache.entries()
        with pytest.raises(CacheError, match="not a pycutlass cache"):
            ArtifactCache(cache_file).store([("k", "kernel", {})], BINARY, "cubin")
    assert sorted(p.name for p in cache_file.parent.iterdir()) == [cache_file.name]
    assert cache_file.read_bytes() == before  # not even its journal mode changed


def test_pragmas(cache_file: Path) -> None:
    db = ArtifactCache(cache_file)._database()
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert db.execute("PRAGMA busy_timeout").fetchone() == (60000,)
    assert db.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL


# ---- claims -----------------------------------------------------------------------------------


def _compile_worker(db_file: str, log_file: str, error_dir: str, keys: list[str], start) -> None:
    """One process of the concurrency test: the compiler's lookup / claim / lookup / compile / store."""
    try:
        cache = ArtifactCache(db_file)
        start.wait()
        misses = [k for k in keys if cache.lookup(k) is None]
        if misses:
            with cache.claim(misses):
                still = [k for k in misses if cache.lookup(k) is None]
                if still:
                    time.sleep(0.3)  # "compile" them as one translation unit
                    with open(log_file, "a") as log:
                        log.write("".join(f"{k} {os.getpid()}\n" for k in still))
                    binary = ("|".join(still)).encode()
                    cache.store([(k, f"kernel_{k}", {"pid": os.getpid()}) for k in still], binary, "cubin")
        for key in keys:
            assert cache.lookup(key) is not None, key
    except BaseException:
        Path(error_dir, f"{os.getpid()}.txt").write_text(traceback.format_exc())
        raise


def test_a_lock_reported_busy_at_once_is_tried_again_then_named(cache_file: Path, monkeypatch) -> None:
    """SQLite answers some lock conflicts with SQLITE_BUSY without waiting on busy_timeout (where waiting could
    deadlock, or during another process's WAL recovery): the operation, one transaction, runs again after a short
    backoff; a lock that stays busy is a CacheError naming the cache."""
    cache = ArtifactCache(cache_file)
    cache.store([("k", "kernel_k", {})], b"binary", "cubin")
    monkeypatch.setattr(store.time, "sleep", lambda seconds: None)
    calls = []

    def flaky(db):
        calls.append(1)
        if len(calls) < 3:
            raise sqlite3.OperationalError("database is locked")
        return cache._lookup(db, "k")

    assert cache._with_recovery(flaky).name == "kernel_k" and len(calls) == 3

    def always_busy(db):
        raise sqlite3.OperationalError("database is locked")

    with pytest.raises(CacheError, match=r"artifact cache .*: database is locked"):
        cache._with_recovery(always_busy)

    def other_failure(db):
        calls.append(1)
        raise sqlite3.OperationalError("no such table: nothing")

    calls.clear()
    with pytest.raises(CacheError, match="no such table"):
        cache._with_recovery(other_failure)
    assert len(calls) == 1  # only a busy lock is tried again


def test_concurrent_processes_compile_each_key_once(tmp_path: Path) -> None:
    db_file, log_file, error_dir = tmp_path / "shared.db", tmp_path / "compiles.log", tmp_path / "errors"
    error_dir.mkdir()
    log_file.touch()
    keys = ["k0", "k1", "k2", "k3"]
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    workers = [
        ctx.Process(
            target=_compile_worker,
            args=(str(db_file), str(log_file), str(error_dir), keys[i % 4 :] + keys[: i % 4], start),
        )
        for i in range(6)
    ]
    for worker in workers:
        worker.start()
    time.sleep(0.5)  # let them all import and open the (fresh) file, then race
    start.set()
    for worker in workers:
        worker.join(timeout=60)

    errors = [p.read_text() for p in error_dir.iterdir()]
    assert not errors, "\n".join(errors)
    assert [w.exitcode for w in workers] == [0] * 6
    compiled = [line.split()[0] for line in log_file.read_text().splitlines()]
    assert sorted(compiled) == keys, f"each key must be compiled exactly once: {compiled}"
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheIntegrityWarning)
        cache = ArtifactCache(db_file)
        assert all(cache.lookup(k).name == f"kernel_{k}" for k in keys)
        assert {e["key"] for e in cache.entries()} == set(keys)
    with _raw(db_file) as raw:
        assert raw.execute("SELECT COUNT(*) FROM claims").fetchone() == (0,)  # all released


def _insert_claim(db_file: Path, key: str, pid: int, acquired: float, host: str = socket.gethostname()) -> None:
    with _raw(db_file) as raw:
        raw.execute(
            "INSERT INTO claims (key, owner, pid, host, acquired) VALUES (?, 'someone', ?, ?, ?)",
            [key, pid, host, acquired],
        )


def test_claim_of_dead_process_is_taken_over(cache_file: Path) -> None:
    cache = ArtifactCache(cache_file)
    cache.entries()  # create the file
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _insert_claim(cache_file, "k", dead.pid, time.time())

    began = time.monotonic()
    with cache.claim(["k", "other"]):
        assert time.monotonic() - began < 2
        with _raw(cache_file) as raw:
            assert raw.execute("SELECT DISTINCT pid FROM claims").fetchall() == [(os.getpid(),)]


def test_expired_claim_is_taken_over(cache_file: Path) -> None:
    cache = ArtifactCache(cache_file)
    cache.entries()
    _insert_claim(cache_file, "k", os.getpid(), time.time() - 100)  # holder alive, but too old
    began = time.monotonic()
    with cache.claim(["k"], timeout=50):
        assert time.monotonic() - began < 2


def test_live_claim_on_another_host_waits_for_release(cache_file: Path) -> None:
    cache = ArtifactCache(cache_file)
    cache.entries()
    _insert_claim(cache_file, "k", 1, time.time(), host="elsewhere")  # pid not checkable: only age counts

    def release_later() -> None:
        time.sleep(0.4)
        with _raw(cache_file) as raw:
            raw.execute("DELETE FROM claims WHERE owner = 'someone'")

    releaser = threading.Thread(target=release_later)
    releaser.start()
    began = time.monotonic()
    with cache.claim(["k"]):
        waited = time.monotonic() - began
    releaser.join()
    assert 0.35 < waited < 3


def test_threads_exclude_each_other(cache_file: Path) -> None:
    cache = ArtifactCache(cache_file)
    inside, overlaps = [], []

    def work() -> None:
        with cache.claim(["shared", "x"]):
            if inside:
                overlaps.append(True)
            inside.append(True)
            time.sleep(0.05)
            inside.pop()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not overlaps


def test_claim_released_on_exception(cache_file: Path) -> None:
    cache = ArtifactCache(cache_file)
    with pytest.raises(RuntimeError):
        with cache.claim(["k"]):
            raise RuntimeError("compile failed")
    with _raw(cache_file) as raw:
        assert raw.execute("SELECT COUNT(*) FROM claims").fetchone() == (0,)


# ---- location and the default cache ----------------------------------------------------------


def test_default_dir_env_override_and_platform_default(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(location.CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert location.default_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv(location.CACHE_DIR_ENV)
    assert location.default_cache_dir() == Path(platformdirs.user_cache_dir("pycutlass"))
    assert location.default_cache_dir() != Path.cwd()
    assert location.default_cache_path().name == location.DEFAULT_DB_NAME == "compiled_cache.db"


def test_ensure_cache_dir_is_private(tmp_path: Path) -> None:
    created = location.ensure_cache_dir(tmp_path / "a" / "b")
    assert stat.S_IMODE(created.stat().st_mode) == 0o700
    assert location.ensure_cache_dir(created) == created  # existing and safe: fine

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(CacheError, match="writable by group or others"):
        location.ensure_cache_dir(shared)
    (tmp_path / "file").write_text("")
    with pytest.raises(CacheError, match="not a directory"):
        location.ensure_cache_dir(tmp_path / "file")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_ensure_cache_dir_rejects_other_owner(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    os.chown(planted, 12345, -1)
    with pytest.raises(CacheError, match="owned by uid 12345"):
        location.ensure_cache_dir(planted)


def test_default_cache_created_on_first_use(tmp_path: Path, monkeypatch) -> None:
    import pycutlass
    from pycutlass.cache import get_cache, set_cache_path

    cache_dir = tmp_path / "env-cache"
    monkeypatch.setenv(location.CACHE_DIR_ENV, str(cache_dir))
    with pycutlass.Session().activate():  # a fresh session: its cache is the default location's
        cache = get_cache()
        assert get_cache() is cache
        assert cache.path == cache_dir / "compiled_cache.db"
        assert not cache_dir.exists(), "get_cache() alone must create nothing"
        cache.store([("k", "kernel", {})], BINARY, "cubin")
        assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700

        memory = set_cache_path(":memory:")
        assert get_cache() is memory and memory.lookup("k") is None
        set_cache_path(None)
        assert get_cache().lookup("k").binary == BINARY
        get_cache().close()


def test_importing_creates_nothing(tmp_path: Path) -> None:
    env = dict(os.environ, HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "xdg"), PYTHONPATH=str(REPO_ROOT))
    env[location.CACHE_DIR_ENV] = str(tmp_path / "cache")
    code = "import pycutlass.cache, pycutlass.cache.store, pycutlass.cli; pycutlass.cache.get_cache()"
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True)
    assert list(tmp_path.iterdir()) == []


# ---- CLI --------------------------------------------------------------------------------------


def test_cli_list_size_clear(cache_file: Path) -> None:
    with ArtifactCache(cache_file) as cache:
        cache.store([("aaaa1111", "gemm_f16_128x128", {}), ("bbbb2222", "gemm_f16_64x64", {})], BINARY, "cubin")
        cache.store([("cccc3333", "conv_fprop", {})], b"ptx text", "ptx")
    runner = CliRunner()
    path = ["--path", str(cache_file)]

    listed = runner.invoke(cli_main, ["cache", "list", *path])
    assert listed.exit_code == 0, listed.output
    assert "NAME" in listed.output and "LAST USED" in listed.output
    for text in ("gemm_f16_128x128", "gemm_f16_64x64", "conv_fprop", "aaaa1111", "ptx", "cubin"):
        assert text in listed.output

    sized = runner.invoke(cli_main, ["cache", "size", *path])
    assert sized.exit_code == 0, sized.output
    assert "3 kernels in 2 binaries" in sized.output

    declined = runner.invoke(cli_main, ["cache", "clear", *path], input="n\n")
    assert declined.exit_code != 0 and len(ArtifactCache(cache_file).entries()) == 3

    cleared = runner.invoke(cli_main, ["cache", "clear", "--yes", *path])
    assert cleared.exit_code == 0 and "Removed 3" in cleared.output
    assert ArtifactCache(cache_file).entries() == []
    assert "empty" in runner.invoke(cli_main, ["cache", "list", *path]).output


def test_cli_path_and_missing_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(location.CACHE_DIR_ENV, str(tmp_path / "c"))
    runner = CliRunner()
    shown = runner.invoke(cli_main, ["cache", "path"])
    assert shown.exit_code == 0 and shown.stdout.strip() == str(tmp_path / "c" / "compiled_cache.db")
    assert "no file there yet" in shown.stderr
    for command in ("list", "size", "clear"):
        result = runner.invoke(cli_main, ["cache", command, "--yes"] if command == "clear" else ["cache", command])
        assert result.exit_code == 0 and "No cache" in result.output
    assert not (tmp_path / "c").exists(), "inspecting must not create the cache"


def test_python_dash_m(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), **{location.CACHE_DIR_ENV: str(tmp_path)})
    out = subprocess.run(
        [sys.executable, "-m", "pycutlass", "cache", "path"], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(tmp_path / "compiled_cache.db")


def test_cli_refuses_unsafe_default_dir(tmp_path: Path, monkeypatch) -> None:
    unsafe = tmp_path / "unsafe"
    ArtifactCache(unsafe / "compiled_cache.db").store([("k", "kernel", {})], BINARY, "cubin")
    os.chmod(unsafe, 0o777)
    monkeypatch.setenv(location.CACHE_DIR_ENV, str(unsafe))
    result = CliRunner().invoke(cli_main, ["cache", "list"])
    assert result.exit_code == 1 and "writable by group or others" in result.output


# ---- read-only caches ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _read_only(*paths: Path) -> Iterator[None]:
    """Make ``paths`` unwritable in a way that holds for root too: the immutable attribute (chattr +i, which the
    kernel enforces for every user) when running as root, else the permission bits."""
    if os.geteuid() == 0:
        done = subprocess.run(["chattr", "+i", *map(str, paths)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot make files immutable here (chattr: {done.stderr.strip()})")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", *map(str, paths)], check=True)
        return
    modes = {path: stat.S_IMODE(path.stat().st_mode) for path in paths}
    for path in paths:
        path.chmod(modes[path] & ~0o222)
    try:
        yield
    finally:
        for path, mode in modes.items():
            path.chmod(mode)


def test_a_read_only_folder_without_a_cache_names_the_permission(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    with _read_only(folder):
        assert not os.access(folder, os.W_OK)  # holds for root too
        with pytest.raises(CacheError, match=f"cannot create artifact cache .*no write permission on its "
                                             f"directory {folder}"):
            ArtifactCache(folder / "c.db").lookup("k")
    assert list(folder.iterdir()) == []


def _gemm():
    import pycutlass as cutlass

    math = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                   cutlass.OpClass.TensorOp, cutlass.MathOperation.multiply_add)
    return [cutlass.GemmOperationUniversal(
        80, cutlass.TileDescription([128, 128, 32], stages, [2, 2, 1], math),
        cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8),
        cutlass.TensorDescription(cutlass.float16, cutlass.ColumnMajor, 8),
        cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8),
        cutlass.LinearCombination(cutlass.float16, 8, cutlass.float32, cutlass.float32)) for stages in (3, 4)]


def test_a_read_only_cache_serves_its_kernels_and_refuses_new_ones(tmp_path: Path) -> None:
    """A shared read-only cache: its kernels load (no last-used update), a compile into it is a CacheError."""
    import pycutlass as cutlass
    from pycutlass.compiler.manager import Compiler

    folder = tmp_path / "shared"
    db_file = folder / "c.db"
    cached, new = _gemm()
    options = {"backend": "nvrtc", "target": 80, "cache_path": str(db_file), "progress": False}
    writer = cutlass.Session(**options)
    key, _ = Compiler.of(writer).key_and_target(cached)
    binary = b"\x7fELF a stand-in cubin"
    with ArtifactCache(db_file) as cache:
        cache.store([(key, cached.name, {"kernel": cached.kernel_symbol})], binary, "cubin")
        used_before = cache.entries()[0]["last_used"]
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    with _read_only(db_file, folder):
        compiler = Compiler.of(cutlass.Session(**options))
        report = compiler.add_module([cached])
        assert report.from_disk == 1 and report.compiled == 0 and report.kernels[0].binary == binary
        with pytest.raises(CacheError, match=r"is read-only here \(no write permission on the file .*\): cannot "
                                             r"claim\. The kernels it holds load"):
            compiler.add_module([new])
        assert compiler.last_report.compiled == 0
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before  # nothing written, no -wal
    with ArtifactCache(db_file, read_only=True) as cache:
        assert cache.entries()[0]["last_used"] == used_before


def test_a_cache_dir_that_is_a_file_is_an_error_at_once(tmp_path: Path, monkeypatch) -> None:
    import pycutlass as cutlass
    from pycutlass.cache.current import get_cache

    not_a_dir = tmp_path / "cache-file"
    not_a_dir.write_text("notes")
    for value in (not_a_dir, not_a_dir / "below"):
        monkeypatch.setenv(location.CACHE_DIR_ENV, str(value))
        for command in (["cache", "path"], ["cache", "list"], ["cache", "size"], ["cache", "clear", "--yes"]):
            out = CliRunner().invoke(cli_main, command)
            assert out.exit_code == 1 and f"{value} is not a directory" in out.output, out.output
            assert "no file there yet" not in out.output and "Traceback" not in out.output
        with pytest.raises(CacheError, match=f"PYCUTLASS_CACHE_DIR={value}: {value} is not a directory"):
            get_cache(cutlass.Session()).lookup("k")
    assert not_a_dir.read_text() == "notes"
