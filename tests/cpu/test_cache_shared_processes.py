"""One artifact cache file shared by several processes that each open it many times (a Dask worker opens it once per
compile task, through a fresh session, while the caches of its earlier tasks are still open): no process may lose
its SQLite locks by opening the file again, so no other one may delete the -wal/-shm under it."""
from __future__ import annotations

import multiprocessing
import os
import time
import warnings
from pathlib import Path

from pycutlass.cache.store import ArtifactCache, identify_file
from pycutlass.tune.db import ResultsDB

STRESS_SECONDS = 3.0


def _store(path: str, key: str) -> None:
    """Another process: store ``key`` and close (its connection is then its process's last one)."""
    with ArtifactCache(path) as cache:
        cache.store([(key, f"kernel_{key}", None)], os.urandom(20_000), "cubin")
        assert cache.lookup(key) is not None


def _in_another_process(target, *args) -> None:
    process = multiprocessing.get_context("spawn").Process(target=target, args=args)
    process.start()
    process.join(timeout=60)
    assert process.exitcode == 0


def test_opening_a_cache_again_keeps_the_locks_of_its_open_connections(tmp_path: Path) -> None:
    path = str(tmp_path / "cache.db")
    first = ArtifactCache(path)
    first.store([("mine", "kernel_mine", None)], os.urandom(20_000), "cubin")
    # Opened again in this process (and inspected): the file must not be opened and closed outside SQLite, or this
    # process's POSIX locks go with the descriptor and the next process to close believes it is the last user.
    second = ArtifactCache(path)
    assert second.lookup("mine") is not None
    assert identify_file(path) in ("ours", "sqlite")  # its mark may still be in the WAL only
    _in_another_process(_store, path, "theirs")
    assert all(Path(f"{path}{suffix}").exists() for suffix in ("-wal", "-shm")), "deleted under open connections"
    _in_another_process(_store, path, "later")
    caches = (first, second, ArtifactCache(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a cache moved aside as corrupt would warn
        for cache in caches:
            assert all(cache.lookup(key) is not None for key in ("mine", "theirs", "later"))
    for cache in caches:
        cache.close()


def _results(path: str) -> None:
    with ResultsDB(path) as db:
        db.db.execute("SELECT COUNT(*) FROM sqlite_master")


def test_opening_a_results_db_again_keeps_the_locks_of_its_open_connections(tmp_path: Path) -> None:
    path = str(tmp_path / "r.db")
    with ResultsDB(path), ResultsDB(path, read_only=True):
        _in_another_process(_results, path)
        assert Path(f"{path}-shm").exists(), "deleted under open connections"


def _hammer(path: str, index: int, seconds: float, queue) -> None:
    """Fresh caches over and over (two open at a time, then both closed), each storing, claiming and looking up."""
    problems: list[str] = []
    rounds = 0
    deadline = time.monotonic() + seconds
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        while time.monotonic() < deadline and not problems:
            caches = [ArtifactCache(path) for _ in range(2)]
            try:
                for j, cache in enumerate(caches):
                    key = f"{index}-{rounds % 5}-{j}"
                    if cache.lookup(key) is None:
                        with cache.claim([key]):
                            cache.store([(key, f"kernel_{key}", None)], os.urandom(3000), "cubin")
                    cache.lookup(f"{(index + 1) % 3}-{rounds % 5}-{j}")
            except Exception as exc:  # noqa: BLE001 - reported to the test
                cause = exc.__cause__
                problems.append(f"{exc!r} ({getattr(cause, 'sqlite_errorname', cause)})")
            for cache in caches:
                cache.close()
            rounds += 1
    problems += [str(w.message) for w in caught]
    queue.put((index, rounds, problems))


def test_processes_opening_one_cache_again_and_again_never_fail(tmp_path: Path) -> None:
    path = str(tmp_path / "cache.db")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_hammer, args=(path, i, STRESS_SECONDS, queue)) for i in range(3)]
    for process in processes:
        process.start()
    reports = [queue.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert [problems for _, _, problems in sorted(reports)] == [[], [], []], sorted(reports)
    assert all(rounds > 10 for _, rounds, _ in reports), reports
    assert sorted(p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name) == []
