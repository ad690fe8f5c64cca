"""SQLite-backed store of compiled kernel binaries, shared safely by every process of a user.

Layout: each binary is stored once (``binaries``, keyed by the sha256 of its bytes); each cache key,
i.e. one operation, is a row of ``kernels`` pointing at the binary it was compiled into, so the
operations of one translation unit share one binary. ``claims`` rows let one process at a time
compile a key while the others wait for its result instead of compiling it again.

Everything read back is verified (sha256, size) before it is returned, because what is returned is
loaded and run as native code. A corrupt cache file, or one of another schema version, is moved aside
and replaced by an empty cache, with a :class:`CacheIntegrityWarning`: the cost is a recompile. A file that is
not a pycutlass cache (not SQLite, or another application's database) is never used, moved or changed: it
raises :class:`CacheError` saying what it is. ``read_only=True`` opens for inspection (SQLite ``mode=ro``):
nothing is created, moved or written then. A cache this process may not write (a shared, read-only deployment)
is opened that way by itself: its kernels load, and compiling into it is a :class:`CacheError` naming the
missing permission.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import socket
import sqlite3
import stat
import threading
import time
import urllib.parse
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar


from pycutlass.cache.location import CACHE_DIR_ENV, check_cache_dir, ensure_cache_dir
from pycutlass.errors import CacheError, CacheIntegrityWarning

if TYPE_CHECKING:  # sqlite_utils costs ~130 ms to import: only when a cache is opened
    from sqlite_utils import Database

SCHEMA_VERSION = 1
MEMORY = ":memory:"
# SQLite header field "application id" (bytes 68-71): marks a file as a pycutlass cache ("pCUT").
APPLICATION_ID = 0x70435554
_SQLITE_MAGIC = b"SQLite format 3\x00"
# What _move_aside names its files: <db name>.corrupt-<stamp>[-n] or .schema-v<N>-<stamp>[-n], plus -wal/-shm.
_MOVED_ASIDE = r"\.(?:corrupt|schema-v[^/]+?)-\d{8}-\d{6}(?:-\d+)?"

_CONNECT_TIMEOUT_S = 60
# busy_timeout first, so that switching to WAL also waits for other processes instead of failing.
_PRAGMAS = ("PRAGMA busy_timeout=60000", "PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL")
_CLAIM_POLL_MIN_S = 0.02
_BUSY_RETRIES = 5  # a lock reported busy at once (not after busy_timeout): tried again, backing off 1.5-3.1 s in all
_BUSY_BACKOFF_S = 0.05
_CLAIM_POLL_MAX_S = 0.2
# Primary SQLite result codes meaning "the file is damaged or is not a database at all".
_CORRUPTION_CODES = {getattr(sqlite3, "SQLITE_CORRUPT", 11), getattr(sqlite3, "SQLITE_NOTADB", 26)}
_HOST = socket.gethostname()

_T = TypeVar("_T")


@dataclass(frozen=True)
class Artifact:
    """A verified cached kernel: ``binary`` hashes to ``sha256``; ``name`` is the kernel symbol."""

    key: str
    name: str
    binary: bytes = field(repr=False)
    sha256: str
    kind: str
    meta: dict = field(default_factory=dict, hash=False)


class CacheCorruptError(CacheError):
    """A pycutlass cache file is damaged (raised when inspecting read-only; compiling moves it aside)."""


class _SchemaMismatch(Exception):
    def __init__(self, found: object):
        super().__init__(found)
        self.found = found


class _NotOurs(Exception):
    """An SQLite database holding tables, but not pycutlass's."""

    def __init__(self, tables: list[str]):
        super().__init__(tables)
        self.tables = tables


class ArtifactCache:
    """A cache of compiled kernels in one SQLite file, or in memory for ``path=":memory:"``.

    Nothing is opened or created until the first call that needs the database. Safe to share
    between threads (calls are serialized) and between processes (SQLite WAL + claims).
    ``private_dir=True`` creates and checks the parent directory with :func:`ensure_cache_dir`;
    an explicit path is otherwise trusted as given (its parent is created if missing).
    ``read_only=True`` inspects an existing file without creating, moving or writing anything
    (``lookup``/``entries``/``size_bytes`` only; a damaged file raises :class:`CacheCorruptError`).
    """

    def __init__(self, path: str | os.PathLike, *, private_dir: bool = False, read_only: bool = False):
        self._memory = os.fspath(path) == MEMORY
        self._path = None if self._memory else Path(path).expanduser()
        self._private_dir = private_dir
        self._read_only = read_only and not self._memory
        self._immutable = False  # read-only connection that bypasses locking (no -wal/-shm to share)
        self._read_only_because: str | None = None  # why a cache opened for writing turned out read-only
        self._lock = threading.RLock()
        self._db: Database | None = None
        self._db_pid: int | None = None
        self._file_identity: tuple[int, int] | None = None

    @property
    def path(self) -> Path | str:
        """The database file, or ``":memory:"``."""
        return MEMORY if self._path is None else self._path

    def __repr__(self) -> str:
        return f"ArtifactCache({os.fspath(self.path)!r})"

    def __enter__(self) -> ArtifactCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- public API -------------------------------------------------------------------------

    def lookup(self, key: str) -> Artifact | None:
        """The verified artifact stored under ``key``, or None (missing, or failed verification)."""
        return self._with_recovery(lambda db: self._lookup(db, key))

    def store(self, entries: Iterable[tuple[str, str, Mapping[str, Any] | None]], binary: bytes, kind: str) -> str:
        """Store ``binary`` once and point every ``(key, name, meta)`` entry at it; returns its sha256.

        All entries are written in one transaction: other processes see all of them or none.
        """
        self._check_writable("store")
        binary = bytes(binary)
        sha256 = hashlib.sha256(binary).hexdigest()
        now = time.time()
        kernel_rows = [
            {
                "key": key,
                "binary_sha256": sha256,
                "name": name,
                "meta": json.dumps(dict(meta or {}), sort_keys=True),
                "created": now,
                "last_used": now,
            }
            for key, name, meta in entries
        ]
        if not kernel_rows:
            raise ValueError("store() needs at least one (key, name, meta) entry for the binary")
        binary_row = {"sha256": sha256, "data": binary, "size": len(binary), "kind": kind, "created": now}

        def write(db: Database) -> None:
            with _immediate(db):
                replaced = _binaries_of(db, [row["key"] for row in kernel_rows])
                db["binaries"].insert(binary_row, ignore=True)
                db["kernels"].insert_all(kernel_rows, replace=True)
                _drop_orphan_binaries(db, replaced - {sha256})

        self._with_recovery(write)
        return sha256

    @contextlib.contextmanager
    def claim(self, keys: Iterable[str], timeout: float = 600.0) -> Iterator[None]:
        """Hold the right to compile ``keys``: across processes, one holder per key at a time.

        All keys are taken atomically (so two callers wanting overlapping sets cannot deadlock),
        waiting with short sleeps while another live holder has any of them. A claim whose process
        died on this host, or that is older than ``timeout`` seconds, is taken over. Inside the
        block, look the keys up again: the previous holder has probably stored them.
        """
        self._check_writable("claim")
        wanted = sorted(set(keys))
        if not wanted:
            yield
            return
        owner = uuid.uuid4().hex  # per claim, so threads of one process also exclude each other
        delay = _CLAIM_POLL_MIN_S
        while not self._with_recovery(lambda db: _try_claim(db, wanted, owner, timeout)):
            time.sleep(random.uniform(_CLAIM_POLL_MIN_S, delay))  # jitter keeps waiters out of step
            delay = min(delay * 1.5, _CLAIM_POLL_MAX_S)
        try:
            yield
        finally:
            self._with_recovery(lambda db: _release_claim(db, owner))

    def entries(self) -> list[dict[str, Any]]:
        """One dict per key: key, name, sha256, size, sharing, share, kind, created, last_used, meta.

        ``size`` is the whole binary's, ``sharing`` the number of keys stored in that binary and ``share``
        this key's part of it (``size / sharing``). Newest use first.
        """
        rows = self._with_recovery(
            lambda db: list(
                db.query(
                    "SELECT k.key, k.name, k.binary_sha256 AS sha256, b.size, "
                    "(SELECT COUNT(*) FROM kernels s WHERE s.binary_sha256 = k.binary_sha256) AS sharing, "
                    "b.kind, k.created, k.last_used, k.meta "
                    "FROM kernels k LEFT JOIN binaries b ON b.sha256 = k.binary_sha256 "
                    "ORDER BY k.last_used DESC, k.key"
                )
            )
        )
        for row in rows:
            row["meta"] = _parse_meta(row["meta"])
            row["share"] = None if row["size"] is None else row["size"] / max(row["sharing"], 1)
        return rows

    def size_bytes(self) -> int:
        """Total size of the stored binaries (each counted once), in bytes."""
        return self._with_recovery(
            lambda db: next(db.query("SELECT COALESCE(SUM(size), 0) AS total FROM binaries"))["total"]
        )

    def remove(self, key: str) -> bool:
        """Forget ``key`` (and its binary once no other key uses it). True if it was present."""
        self._check_writable("remove")

        def delete(db: Database) -> bool:
            with _immediate(db):
                shas = _binaries_of(db, [key])
                if not shas:
                    return False
                db.execute("DELETE FROM kernels WHERE key = ?", [key])
                _drop_orphan_binaries(db, shas)
                return True

        return self._with_recovery(delete)

    def clear(self) -> int:
        """Remove every kernel and binary; returns the number of rows removed (kernels + binaries).

        The damaged files moved aside next to it are not touched: :func:`remove_moved_aside_files` does that.
        """
        self._check_writable("clear")

        def delete_all(db: Database) -> int:
            with _immediate(db):
                removed = db.execute("DELETE FROM kernels").rowcount
                removed += db.execute("DELETE FROM binaries").rowcount
            if not self._memory:
                # Give the space back to the file system; if another process is busy it is merely reused later.
                with contextlib.suppress(sqlite3.OperationalError):
                    db.execute("VACUUM")
                    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return removed

        return self._with_recovery(delete_all)

    def close(self) -> None:
        """Close the connection; the next call reopens it."""
        with self._lock:
            db, self._db = self._db, None
            if db is not None and self._db_pid == os.getpid():
                db.close()

    # ---- connection, recovery ---------------------------------------------------------------

    def _check_writable(self, what: str) -> None:
        if not self._read_only and not self._memory:
            self._with_recovery(lambda db: None)  # opening finds out whether this process may write the file
        if self._read_only_because is not None:
            raise CacheError(
                f"artifact cache {os.fspath(self.path)} is read-only here ({self._read_only_because}): cannot "
                f"{what}. The kernels it holds load; to compile new ones, point cache_path or "
                f"{CACHE_DIR_ENV} at a directory you can write"
            )
        if self._read_only:
            raise CacheError(f"artifact cache {os.fspath(self.path)} was opened read-only: cannot {what}")

    def _with_recovery(self, operation: Callable[[Database], _T]) -> _T:
        """Run ``operation`` on the connection; if the file turns out corrupt, start over on a fresh one. A lock
        SQLite reports busy without waiting (it does so where waiting could deadlock, or while another process
        recovers the WAL) is tried again a few times: every operation is one transaction, rolled back on failure."""
        with self._lock:
            if self._read_only:
                return self._read(operation)
            for attempt in range(_BUSY_RETRIES + 1):
                try:
                    try:
                        return operation(self._database())
                    except sqlite3.DatabaseError as exc:
                        if self._memory or not _is_corruption(exc):
                            raise
                        self._discard_corrupt_file(exc)
                        return operation(self._database())
                except sqlite3.Error as exc:
                    if _is_busy(exc) and attempt < _BUSY_RETRIES:
                        time.sleep(_BUSY_BACKOFF_S * 2**attempt * (1 + random.random()))
                        continue
                    raise CacheError(f"artifact cache {os.fspath(self.path)}: {exc}") from exc
            raise AssertionError("unreachable")

    def _read(self, operation: Callable[[Database], _T]) -> _T:
        """Read-only: run ``operation``; with an immutable connection, again if a writer changed the file."""
        assert self._path is not None
        for attempt in range(3):
            before = _file_signature(self._path)
            try:
                result = operation(self._database())
                failure = None
            except sqlite3.Error as exc:
                failure = exc
            if not self._immutable or _file_signature(self._path) == before or attempt == 2:
                break
            self.close()  # a writer was busy: read again (through its WAL if it has one now)
        if failure is None:
            return result
        if isinstance(failure, sqlite3.DatabaseError) and _is_corruption(failure):
            raise CacheCorruptError(
                f"artifact cache {self._path} is corrupt ({failure}); left as it is. The next compile or "
                "`pycutlass cache clear` moves it aside and starts an empty cache"
            ) from failure
        raise CacheError(f"artifact cache {self._path}: {failure}") from failure

    def _database(self) -> Database:
        if self._db is not None and self._db_pid == os.getpid():
            return self._db
        # A connection inherited through fork() must be neither used nor closed (SQLite forbids both).
        self._db = None
        if self._memory:
            self._db = _connect(MEMORY)
        elif self._read_only:
            self._db = self._open_read_only()
        else:
            self._db = self._open_file()
        self._db_pid = os.getpid()
        return self._db

    def _open_read_only(self) -> Database:
        """Open for inspection: SQLite ``mode=ro``; creates, moves and writes nothing (not even -wal/-shm)."""
        assert self._path is not None
        if self._private_dir:
            check_cache_dir(self._path.parent)
        kind = identify_file(self._path)
        if kind == "missing":
            raise CacheError(f"no cache at {self._path} (the file does not exist)")
        # A WAL database opened read-only creates its -wal/-shm when they are missing (and leaves them behind):
        # then read the file alone (immutable=1, no locking), and _read() checks that no writer changed it.
        shared = all(Path(f"{self._path}{suffix}").exists() for suffix in ("-wal", "-shm"))
        self._immutable = not shared
        uri = f"file:{urllib.parse.quote(os.fspath(self._path.resolve()))}?mode=ro" + (
            "" if shared else "&immutable=1")
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=_CONNECT_TIMEOUT_S, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise CacheError(f"cannot open artifact cache {self._path} read-only: {exc}") from exc
        conn.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
        try:
            from sqlite_utils import Database

            db = Database(conn, recursive_triggers=False, execute_plugins=False)
            db.execute("PRAGMA busy_timeout=60000")
            db.execute("PRAGMA query_only=ON")
            try:
                found = _schema_version(db)
            except _NotOurs as exc:
                raise CacheError(_not_ours_message(self._path, exc.tables)) from exc
            if found is not None and found != SCHEMA_VERSION:
                raise CacheError(
                    f"artifact cache {self._path} has schema version {found}, this pycutlass uses {SCHEMA_VERSION}; "
                    "the next compile moves it aside and starts an empty cache"
                )
            return db
        except BaseException:
            conn.close()
            raise

    def _open_file(self) -> Database:
        assert self._path is not None
        parent = self._path.parent
        if self._private_dir:
            ensure_cache_dir(parent)
        else:
            try:
                parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise CacheError(f"cannot create the directory of artifact cache {self._path}: {exc}") from exc
        missing_permission = _write_permission_problem(self._path)
        if missing_permission is not None:
            return self._open_without_write_permission(missing_permission)
        for attempt in (1, 2):
            identity = _file_identity(self._path)
            kind = identify_file(self._path)  # raises CacheError for a file that is not a database
            try:
                db = _connect(self._path)
            except sqlite3.OperationalError as exc:
                if not _is_permission_failure(exc):
                    raise
                # os.access() can say yes where the file system still refuses (e.g. some network file systems)
                return self._open_without_write_permission(f"SQLite cannot write there: {exc}")
            except _NotOurs as exc:
                raise CacheError(_not_ours_message(self._path, exc.tables)) from exc
            except _SchemaMismatch as exc:
                if attempt == 2:
                    raise CacheError(
                        f"artifact cache {self._path} was just recreated with schema {exc.found}"
                    ) from exc
                self._move_aside(
                    f"schema-v{exc.found}", identity,
                    f"has schema version {exc.found}, this pycutlass uses {SCHEMA_VERSION}",
                )
                continue
            except sqlite3.DatabaseError as exc:
                if attempt == 2 or not _is_corruption(exc):
                    raise
                if kind != "ours":
                    raise CacheError(
                        f"{self._path} is a damaged SQLite database that is not marked as a pycutlass cache "
                        f"({exc}); it was left as it is. Remove it, or choose another cache path"
                    ) from exc
                self._move_aside("corrupt", identity, f"is corrupt ({exc})")
                continue
            self._file_identity = _file_identity(self._path)
            return db
        raise AssertionError("unreachable")

    def _open_without_write_permission(self, problem: str) -> Database:
        """A cache this process may not write: read it as it is (lookups work, bookkeeping is skipped)."""
        assert self._path is not None
        if identify_file(self._path) in ("missing", "empty"):
            raise CacheError(f"cannot create artifact cache {self._path}: {problem}. Point cache_path or "
                             f"{CACHE_DIR_ENV} at a directory you can write")
        self._read_only = True
        self._read_only_because = problem
        return self._open_read_only()

    def _discard_corrupt_file(self, exc: sqlite3.DatabaseError) -> None:
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()
        self._move_aside("corrupt", self._file_identity, f"is corrupt ({exc})")

    def _move_aside(self, reason: str, identity: tuple[int, int] | None, problem: str) -> None:
        """Rename the database (with its -wal/-shm) to ``<path>.<reason>-<timestamp>`` and warn.

        Only if it is still the file we opened: another process may have replaced it already.
        """
        assert self._path is not None
        if identity is None or _file_identity(self._path) != identity:
            return
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = Path(f"{self._path}.{reason}-{stamp}")
        counter = 1
        while target.exists():
            counter += 1
            target = Path(f"{self._path}.{reason}-{stamp}-{counter}")
        try:
            os.replace(self._path, target)
            # A leftover WAL would be replayed into the new, empty database: it must go too.
            for suffix in ("-wal", "-shm"):
                side = Path(f"{self._path}{suffix}")
                if side.exists():
                    os.replace(side, Path(f"{target}{suffix}"))
        except OSError as exc:
            raise CacheError(f"cache file {self._path} {problem}, and it could not be moved aside: {exc}") from exc
        warnings.warn(
            f"cache file {self._path} {problem}; moved to {target}; starting empty",
            CacheIntegrityWarning,
            stacklevel=2,
        )

    def _lookup(self, db: Database, key: str) -> Artifact | None:
        rows = list(
            db.query(
                "SELECT k.name, k.meta, k.binary_sha256, b.data, b.size, b.kind "
                "FROM kernels k LEFT JOIN binaries b ON b.sha256 = k.binary_sha256 WHERE k.key = ?",
                [key],
            )
        )
        if not rows:
            return None
        row = rows[0]
        meta = _parse_meta(row["meta"])
        problem = _verification_problem(row["data"], row["size"], row["binary_sha256"])
        if problem is None and meta is None:
            problem = "its metadata is not a JSON object"
        if problem is not None:
            if self._read_only:
                warnings.warn(f"cached kernel {key!r} failed verification ({problem})", CacheIntegrityWarning,
                              stacklevel=5)
                return None
            warnings.warn(
                f"cached kernel {key!r} failed verification ({problem}); discarded, it will be rebuilt",
                CacheIntegrityWarning,
                stacklevel=5,  # the caller of lookup()
            )
            # Every key pointing at the bad binary is bad too.
            with _immediate(db):
                db.execute("DELETE FROM kernels WHERE key = ? OR binary_sha256 = ?", [key, row["binary_sha256"]])
                db.execute("DELETE FROM binaries WHERE sha256 = ?", [row["binary_sha256"]])
            return None
        # Bookkeeping only: a read-only or very busy cache must still serve its hits.
        if not self._read_only:
            with contextlib.suppress(sqlite3.OperationalError):
                db.execute("UPDATE kernels SET last_used = ? WHERE key = ?", [time.time(), key])
        return Artifact(
            key=key, name=row["name"], binary=row["data"], sha256=row["binary_sha256"], kind=row["kind"], meta=meta
        )


# ---- helpers on a connection ----------------------------------------------------------------


def _connect(target: str | Path) -> Database:
    """Open, configure, and check or create the schema. Raises _SchemaMismatch or sqlite3 errors."""
    conn = sqlite3.connect(
        os.fspath(target), timeout=_CONNECT_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    # Text that is not UTF-8 (a damaged or tampered file) must read back as a mismatch, not raise.
    conn.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
    try:
        # No plugins: they would run arbitrary code on every connection.
        from sqlite_utils import Database

        db = Database(conn, recursive_triggers=False, execute_plugins=False)
        db.execute(_PRAGMAS[0])
        _schema_version(db)  # another application's database: raise before changing anything (journal mode)
        for pragma in _PRAGMAS[1:]:
            db.execute(pragma)
        _ensure_schema(db)
        return db
    except BaseException:
        conn.close()
        raise


def _schema_version(db: Database) -> object:
    """The schema version of a pycutlass cache, None for a database without tables (a new one).

    Raises _NotOurs for a database with tables but no pycutlass ``meta``, unless its header carries
    pycutlass's application id (then it is ours, damaged: a schema mismatch).
    """
    tables = db.table_names()
    if not tables:
        return None
    if "meta" in tables:
        rows = list(db.query("SELECT value FROM meta WHERE name = 'schema_version'"))
        if rows:
            return _as_int(rows[0]["value"])
    if next(iter(db.execute("PRAGMA application_id").fetchone()), 0) != APPLICATION_ID:
        raise _NotOurs(sorted(tables))
    return "unknown"


def _ensure_schema(db: Database) -> None:
    with _immediate(db):  # two processes creating a fresh file at once must not both do it
        found = _schema_version(db)
        if found is None:
            found = SCHEMA_VERSION  # a new, empty database
        if found != SCHEMA_VERSION:
            raise _SchemaMismatch(found)
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        db["meta"].create({"name": str, "value": str}, pk="name", if_not_exists=True)
        db["meta"].insert({"name": "schema_version", "value": str(SCHEMA_VERSION)}, replace=True)
        db["binaries"].create(
            {"sha256": str, "data": bytes, "size": int, "kind": str, "created": float},
            pk="sha256", if_not_exists=True,
        )
        db["kernels"].create(
            {"key": str, "binary_sha256": str, "name": str, "meta": str, "created": float, "last_used": float},
            pk="key", if_not_exists=True,
        )
        db["kernels"].create_index(["binary_sha256"], if_not_exists=True)
        db["claims"].create(
            {"key": str, "owner": str, "pid": int, "host": str, "acquired": float},
            pk="key", if_not_exists=True,
        )


@contextlib.contextmanager
def _immediate(db: Database) -> Iterator[Database]:
    """A write transaction that takes the write lock up front.

    A deferred transaction that reads and then writes fails at once with SQLITE_BUSY in WAL mode
    when another process wrote in between; taking the lock first makes it wait on busy_timeout.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.conn.execute("COMMIT")
    except BaseException:
        if db.conn.in_transaction:
            db.conn.execute("ROLLBACK")
        raise


def _try_claim(db: Database, keys: list[str], owner: str, timeout: float) -> bool:
    now = time.time()
    with _immediate(db):
        held = list(
            db.query(
                "SELECT key, pid, host, acquired FROM claims WHERE key IN (SELECT value FROM json_each(?))",
                [json.dumps(keys)],
            )
        )
        if any(not _claim_is_stale(row, now, timeout) for row in held):
            return False
        db["claims"].insert_all(
            [{"key": key, "owner": owner, "pid": os.getpid(), "host": _HOST, "acquired": now} for key in keys],
            replace=True,  # takes over stale claims
        )
    return True


def _release_claim(db: Database, owner: str) -> None:
    # By owner: a claim taken over from us (we were too slow) stays with its new holder.
    with _immediate(db):
        db.execute("DELETE FROM claims WHERE owner = ?", [owner])


def _claim_is_stale(claim: Mapping[str, Any], now: float, timeout: float) -> bool:
    if now - claim["acquired"] > timeout:
        return True
    return claim["host"] == _HOST and not _pid_alive(claim["pid"])


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":
        return True  # os.kill(pid, 0) is not a probe on Windows; rely on the timeout there
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # e.g. PermissionError: it exists, as another user
    return True


def _binaries_of(db: Database, keys: list[str]) -> set[str]:
    rows = db.query(
        "SELECT binary_sha256 FROM kernels WHERE key IN (SELECT value FROM json_each(?))", [json.dumps(keys)]
    )
    return {row["binary_sha256"] for row in rows}


def _drop_orphan_binaries(db: Database, shas: Iterable[str]) -> None:
    for sha in shas:
        db.execute(
            "DELETE FROM binaries WHERE sha256 = ? "
            "AND NOT EXISTS (SELECT 1 FROM kernels WHERE binary_sha256 = binaries.sha256)",
            [sha],
        )


def _verification_problem(data: object, size: object, sha256: str) -> str | None:
    if data is None:
        return "its binary is missing"
    if not isinstance(data, bytes):
        return f"its binary is stored as {type(data).__name__}, not bytes"
    if len(data) != size:
        return f"its binary is {len(data)} bytes, {size} were stored"
    if hashlib.sha256(data).hexdigest() != sha256:
        return "its binary does not match its sha256"
    return None


def _parse_meta(text: object) -> dict | None:
    try:
        meta = json.loads(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _as_int(value: object) -> object:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return value


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


def _is_corruption(exc: sqlite3.DatabaseError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _CORRUPTION_CODES
    return type(exc) is sqlite3.DatabaseError  # older Pythons: no code; subclasses are other failures


def _file_signature(path: Path) -> tuple[int, ...] | None:
    """Identity, size and mtime of the database and of its WAL: changes when a writer touches either."""
    signature: tuple[int, ...] = ()
    for suffix in ("", "-wal"):
        try:
            info = os.stat(f"{path}{suffix}")
        except FileNotFoundError:
            signature += (-1,)
            continue
        signature += (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    return signature


def _not_ours_message(path: Path, tables: list[str]) -> str:
    shown = ", ".join(tables[:8]) + (", ..." if len(tables) > 8 else "")
    return (f"{path} is not a pycutlass cache: it is an SQLite database of another application (tables: {shown}); "
            "it was left as it is. Choose another cache path")


def identify_file(path: str | os.PathLike) -> str:
    """What ``path`` is, read from its header: by SQLite (read-only, immutable: nothing locked, created or changed)
    where it reads a database there, else from the file's first bytes.

    ``"missing"``, ``"empty"`` (0 bytes: a database about to be created), ``"ours"`` (an SQLite file marked
    with pycutlass's application id) or ``"sqlite"`` (unmarked SQLite: a cache made before the mark, or
    another application's database, told apart by its tables). Anything else raises :class:`CacheError`
    saying what the file is: pycutlass never uses, moves or changes it.
    """
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        raise CacheError(f"cannot read {path}: {exc}") from exc
    if stat.S_ISDIR(info.st_mode):
        raise CacheError(f"{path} is not a pycutlass cache: it is a directory")
    if info.st_size == 0:
        return "empty"
    application_id = sqlite_application_id(path)
    if application_id is not None:
        return "ours" if application_id == APPLICATION_ID else "sqlite"
    # Not a database to SQLite (a damaged header, or no SQLite file at all): its bytes say which.
    try:
        with open(path, "rb") as handle:
            head = handle.read(512)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        raise CacheError(f"cannot read {path}: {exc}") from exc
    if not head:
        return "empty"
    if head.startswith(_SQLITE_MAGIC):
        if len(head) >= 72 and int.from_bytes(head[68:72], "big") == APPLICATION_ID:
            return "ours"
        return "sqlite"
    raise CacheError(f"{path} is not a pycutlass cache: it is {_describe_contents(head, path)}; "
                     "it was left as it is. Choose another cache path")


def sqlite_application_id(path: str | os.PathLike) -> int | None:
    """The application id in the header of the SQLite database ``path``, or None where SQLite reads no database there.

    Read through SQLite, never with open(): closing any descriptor of a file drops every POSIX lock this process holds
    on it, those of its open SQLite connections included. Another process that closes its connection then takes
    itself for the file's last user: it checkpoints and deletes the -wal and -shm under those connections, which read
    a WAL index that is gone (SQLITE_IOERR_SHORT_READ, "database disk image is malformed"). SQLite keeps its own
    descriptor open while the process holds locks on the file; immutable=1 takes no lock and creates no -wal/-shm.
    """
    uri = f"file:{urllib.parse.quote(os.fspath(Path(path).resolve()))}?mode=ro&immutable=1"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            return conn.execute("PRAGMA application_id").fetchone()[0]
    except sqlite3.Error:  # not a database, a damaged header, or unreadable: the caller looks at the bytes
        return None


def _describe_contents(head: bytes, path: Path) -> str:
    try:
        size = path.stat().st_size
    except OSError:
        size = len(head)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = None
        with contextlib.suppress(UnicodeDecodeError):  # cut inside a multi-byte character
            text = head[:-3].decode("utf-8") if len(head) == 512 else None
    if text is not None and "\x00" not in text:
        first = text.strip().splitlines()[0][:60] if text.strip() else ""
        return f"a text file of {size} bytes" + (f" starting {first!r}" if first else "")
    return f"a binary file of {size} bytes, not an SQLite database (it starts with {head[:16].hex(' ')})"


def moved_aside_files(db_path: str | os.PathLike) -> list[Path]:
    """The files pycutlass moved aside next to ``db_path`` (``<name>.corrupt-*``, ``<name>.schema-v*``),
    with their -wal/-shm, whether or not ``db_path`` itself exists."""
    db_path = Path(db_path)
    pattern = re.compile(re.escape(db_path.name) + _MOVED_ASIDE + r"(?:-wal|-shm)?")
    try:
        names = os.listdir(db_path.parent)
    except OSError:
        return []
    return sorted(db_path.parent / name for name in names
                  if pattern.fullmatch(name) and (db_path.parent / name).is_file())


def remove_moved_aside_files(db_path: str | os.PathLike) -> tuple[list[Path], list[Path]]:
    """Delete the files :func:`moved_aside_files` finds that are SQLite databases (what pycutlass moves
    aside), with their -wal/-shm; returns (removed, kept). Any other file with such a name is kept."""
    removed: list[Path] = []
    kept: list[Path] = []
    files = moved_aside_files(db_path)
    mains = [p for p in files if not p.name.endswith(("-wal", "-shm"))]
    for main in mains:
        try:
            with open(main, "rb") as handle:
                is_db = handle.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
        except OSError:
            is_db = False
        group = [main, *(Path(f"{main}{s}") for s in ("-wal", "-shm") if Path(f"{main}{s}") in files)]
        if not is_db:
            kept.extend(group)
            continue
        for path in group:
            try:
                path.unlink()
                removed.append(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise CacheError(f"cannot remove {path}: {exc}") from exc
    return removed, kept


def _write_permission_problem(path: Path) -> str | None:
    """What keeps this process from writing the cache at ``path`` (its file, or its directory, where SQLite creates
    the file and its -wal/-shm companions), or None. Read-only file systems and immutable files count, for root too."""
    if path.exists() and not os.access(path, os.W_OK):
        return f"no write permission on the file {path}"
    if not os.access(path.parent, os.W_OK | os.X_OK):
        companions = [Path(f"{path}{suffix}") for suffix in ("-wal", "-shm")]
        if not (path.exists() and all(c.exists() and os.access(c, os.W_OK) for c in companions)):
            return f"no write permission on its directory {path.parent}"
    return None


def _is_permission_failure(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (getattr(sqlite3, "SQLITE_READONLY", 8), getattr(sqlite3, "SQLITE_CANTOPEN", 14),
                               getattr(sqlite3, "SQLITE_PERM", 3))
    return "readonly" in str(exc) or "unable to open" in str(exc)


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return info.st_dev, info.st_ino


# ---- the process-wide default cache ---------------------------------------------------------
