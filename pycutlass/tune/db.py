"""The results database: one SQLite file (through sqlite-utils) per sweep, or shared by many.

Tables (documented in docs/tuning.md; query them with ``sqlite-utils`` or Datasette):

- ``devices``         one row per GPU + driver + toolkit + library versions a run was measured on
- ``kernels``         one row per operation (``name`` = the operation's unique name), its operation class
                      (``op_class``, see ``operation_class``), its space parameters as columns and as JSON, and its
                      description; baselines (torch) are kernels of kind "baseline"
- ``problems``        one row per problem (``key``), its fields as columns and as JSON
- ``compile_status``  the compile memo, keyed by the cache key (source + flags + target + toolchain): ok or failed,
                      with the error class and the compiler log
- ``runs``            one row per (sweep, device, kernel, problem, harness): status (ok, wrong, failed, timeout),
                      median / min / spread of seconds, repetitions, relative error
- ``resources``       registers, spills, shared memory, occupancy per (kernel, device)
- ``tuning``          the autotuner's cache: key (device, arch, driver, toolkit, kind, types, layouts, epilogue,
                      shape bucket) -> kernel
- ``sweeps``          a sweep's definition (space and problem set as JSON)

Every row has a deterministic primary key, so re-running skips what is done and merging DBs is idempotent.
Each row is committed as it is written: an interrupted sweep keeps everything it finished.
"""
from __future__ import annotations

import contextlib
import csv
import os
import hashlib
import json
import re
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..cache.store import sqlite_application_id
from ..errors import ArgumentError, ResultsDatabaseError

SCHEMA_VERSION = 1

# Table -> (primary key, column types). Columns not listed (kernel parameters, problem fields) are added as
# they appear (sqlite-utils alter=True), so a new search-space dimension needs no migration.
TABLES: dict[str, tuple[str | tuple[str, ...], dict[str, type]]] = {
    "devices": ("id", {"id": str, "name": str, "uuid": str, "compute_capability": int, "sm_count": int,
                       "sm_clock_mhz": int, "memory_clock_mhz": int, "l2_bytes": int, "driver": str,
                       "cuda_runtime": str, "cutlass": str, "pycutlass": str, "torch": str, "host": str}),
    "kernels": ("name", {"name": str, "kind": str, "family": str, "op_class": str, "description": str,
                         "params": str}),
    "problems": ("key", {"key": str, "kind": str, "flops": float, "spec": str}),
    "compile_status": ("cache_key", {"cache_key": str, "kernel": str, "target": str, "backend": str, "status": str,
                                     "error_class": str, "log": str, "seconds": float, "time": float}),
    "runs": ("id", {"id": str, "sweep": str, "device": str, "kernel": str, "problem": str, "harness": str,
                    "status": str, "seconds": float, "seconds_min": float, "seconds_iqr": float,
                    "repetitions": int, "tflops": float, "rel_error": float, "message": str, "worker": str,
                    "time": float}),
    "resources": (("kernel", "device"), {"kernel": str, "device": str, "registers": int, "local_bytes": int,
                                         "static_smem": int, "dynamic_smem": int, "threads": int,
                                         "max_active_blocks": int, "occupancy": float}),
    "tuning": ("key", {"key": str, "kernel": str, "params": str, "seconds": float, "policy": str,
                       "candidates": int, "time": float}),
    "sweeps": ("name", {"name": str, "space": str, "problems": str, "fingerprint": str, "time": float}),
}

RUN_STATUSES = ("ok", "wrong", "failed", "timeout")
BASELINE_KIND = "baseline"
UNKNOWN_CLASS = "unknown"  # a kernel row whose class cannot be derived (no description objects, no params)

_SHORT_TYPES = {"float64": "f64", "float32": "f32", "tfloat32": "tf32", "float16": "f16", "bfloat16": "bf16",
                "int8": "s8", "int32": "s32", "float8_e4m3": "e4m3", "float8_e5m2": "e5m2"}
_SHORT_LAYOUTS = {"RowMajor": "row", "ColumnMajor": "col"}


def _type(element) -> str:
    label = getattr(element, "label", str(element))
    return _SHORT_TYPES.get(label, label)


def _tensor(element, layout, alignment) -> str:
    name = getattr(layout, "value", str(layout))
    return f"{_type(element)}/{_SHORT_LAYOUTS.get(name, name)}/{alignment}"


def operation_class(operation) -> str:
    """The operation class: what a call computes and accepts, not how. Kernels compete only within a class.

    ``"gemm A=f16/row/8 B=f16/col/8 C=f16/row/8 D=f16/row/8 acc=f32 epilogue=LinearCombination/f32"``: the kind
    (the Sm80 and SM90 families of one kind are one class: they answer the same call), A, B, C and D as element
    type / layout / alignment, the accumulator, the epilogue and its compute type; then the math operation when it
    is not a plain multiply-add, the convolution kind and a bias when present. Stable: built from the
    descriptions' own labels, never from a name or a hash."""
    tile = operation.tile_description
    math_inst = tile.math_instruction
    epilogue = operation.epilogue_functor
    kind = re.sub(r"_sm\d+$", "", str(operation.kind))
    conv_kind = operation.conv_kind
    if conv_kind is not None:
        kind += f"/{getattr(conv_kind, 'name', conv_kind)}"
    A, B, C = operation.A, operation.B, operation.C
    d_alignment = getattr(epilogue, "alignment", C.alignment)
    parts = [kind, f"A={_tensor(math_inst.element_a, A.layout, A.alignment)}",
             f"B={_tensor(math_inst.element_b, B.layout, B.alignment)}",
             f"C={_tensor(C.element, C.layout, C.alignment)}",
             f"D={_tensor(getattr(epilogue, 'element_output', C.element), C.layout, d_alignment)}",
             f"acc={_type(math_inst.element_accumulator)}",
             f"epilogue={epilogue.describe()}/{_type(getattr(epilogue, 'element_epilogue', ''))}"]
    math_operation = getattr(math_inst, "math_operation", None)
    if math_operation is not None and getattr(math_operation, "value", math_operation) != "multiply_add":
        parts.append(f"math={getattr(math_operation, 'value', math_operation)}")
    if operation.bias:
        parts.append(f"bias={operation.bias}")
    return " ".join(parts)


def class_slug(op_class: str) -> str:
    """An operation class as a file-name part: letters, digits, '.', '-' and '_' only."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", op_class.replace(" ", "_").replace("=", "-")).strip("-") or "class"


class Result(tuple):
    """One ``(kernel, problem, seconds)`` triple of ``ResultsDB.results`` that carries its kernel's operation class
    as ``op_class``: it unpacks and compares as the plain triple; selection and plots group rows by the class."""

    def __new__(cls, kernel, problem, seconds, op_class: str):
        self = super().__new__(cls, (kernel, problem, seconds))
        self.op_class = op_class
        return self

    def __reduce__(self):
        return (Result, (*self, self.op_class))

    def __repr__(self) -> str:
        return f"Result({', '.join(map(repr, self))}, op_class={self.op_class!r})"


def pycutlass_version() -> str:
    """The installed pycutlass version, recorded with devices and bundles."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pycutlass")
    except PackageNotFoundError:  # run from a source tree (a GPU host with the project on PYTHONPATH)
        return "source"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def run_id(sweep: str, device: str, kernel: str, problem: str, harness: str) -> str:
    """The runs table's key: one measurement per sweep, device, kernel, problem and harness setting."""
    return hashlib.sha256(canonical_json([sweep, device, kernel, problem, harness]).encode()).hexdigest()[:32]


def device_id(facts: dict) -> str:
    """A device row's key: the GPU (UUID, else name) with the driver and library versions that shape timings."""
    parts = [facts.get(k) for k in ("uuid", "name", "driver", "cuda_runtime", "cutlass", "pycutlass")]
    return hashlib.sha256(canonical_json(parts).encode()).hexdigest()[:16]


class ResultsDB:
    """A results database file. Thread-safe (one connection, serialized); processes share it through SQLite's
    locking (WAL journal, busy timeout), each write its own transaction.

    ``read_only=True`` inspects an existing file and writes nothing, not even SQLite's ``-wal``/``-shm`` files, so
    a database in a read-only folder (or a read-only file) can be read. A path that cannot be used (a directory, a
    file that is not a results database, a file or folder that is not writable when writing) raises
    :class:`~pycutlass.errors.ResultsDatabaseError` before anything is created.
    """

    def __init__(self, path: str | Path, *, read_only: bool = False):
        import sqlite_utils  # ~100 ms: only when a DB is opened

        self.path = Path(path)
        self.read_only = read_only
        self._lock = threading.RLock()
        self._immutable = False  # a read-only connection without locking: no -wal/-shm to share or to create
        self._opened_signature: tuple | None = None
        _check_file(self.path, read_only)
        conn = self._connect()
        try:
            self.db = sqlite_utils.Database(conn)
            if not read_only:
                self._ensure_schema()
            elif self._version() != SCHEMA_VERSION:
                raise ResultsDatabaseError(f"{self.path} is not a pycutlass results database of schema "
                                           f"{SCHEMA_VERSION} (found {self._version()!r})")
        except sqlite3.Error as exc:
            conn.close()
            raise self._open_error(exc) from exc
        except BaseException:
            conn.close()
            raise

    def _connect(self) -> sqlite3.Connection:
        try:
            if self.read_only:
                # WAL readers create -wal/-shm beside the file (and leave them): where no writer has the file open
                # (no -shm, nothing in -wal), read the file alone with immutable=1, which creates nothing.
                wal, shm = Path(f"{self.path}-wal"), Path(f"{self.path}-shm")
                self._immutable = not shm.exists() and _size(wal) == 0
                self._opened_signature = _file_signature(self.path)
                uri = f"file:{urllib.parse.quote(str(self.path.resolve()))}?mode=ro"
                conn = sqlite3.connect(uri + ("&immutable=1" if self._immutable else ""), uri=True, timeout=60,
                                       check_same_thread=False)
                pragma = "PRAGMA query_only=ON"
            else:
                conn = sqlite3.connect(str(self.path), timeout=60, check_same_thread=False, isolation_level=None)
                pragma = "PRAGMA journal_mode=WAL"
        except sqlite3.Error as exc:
            raise self._open_error(exc) from exc
        try:
            conn.execute(pragma)
        except sqlite3.Error as exc:
            conn.close()
            raise self._open_error(exc) from exc
        return conn

    def _open_error(self, exc: sqlite3.Error) -> ResultsDatabaseError:
        """An SQLite failure while opening, as what is wrong with the file and what to do."""
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            return ResultsDatabaseError(f"{self.path} is damaged or not a database ({exc}); it was left as it is. "
                                        "Pass another --db path")
        if code not in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM):
            return ResultsDatabaseError(f"cannot open results database {self.path}: {exc}")
        if self.read_only:
            return ResultsDatabaseError(
                f"cannot read results database {self.path} ({exc}): its {self.path.name}-wal journal holds changes "
                "that SQLite can only read with write access to the folder. Run a writing command on it where the "
                "folder is writable, or copy the .db with its -wal and -shm files to a writable folder")
        return ResultsDatabaseError(
            f"cannot write results database {self.path} ({exc}): the file and its folder must be writable (SQLite "
            f"creates {self.path.name}-wal and {self.path.name}-shm beside it). Make them writable or pass another "
            "--db path; commands that only read (select, heatmap, db info, db export) work on read-only files")

    # --- schema ---------------------------------------------------------------------------------------------
    def _version(self):
        if "meta" not in self.db.table_names():
            return None
        rows = list(self.db.query("select value from meta where key = 'schema'"))
        return int(rows[0]["value"]) if rows else None

    def _ensure_schema(self) -> None:
        with self.transaction():
            found = self._version()
            if found is None:
                names = set(self.db.table_names())
                if names - {"meta"} - set(TABLES):
                    raise ResultsDatabaseError(f"{self.path} holds tables {sorted(names)}: not a pycutlass results "
                                               "database; it was left as it is. Pass another --db path")
                self.db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
                self.db["meta"].insert({"key": "schema", "value": str(SCHEMA_VERSION)}, replace=True)
            elif found != SCHEMA_VERSION:
                raise ResultsDatabaseError(f"{self.path} has results schema {found}; this pycutlass reads "
                                           f"{SCHEMA_VERSION}")
            for name, (pk, columns) in TABLES.items():
                self.db[name].create(columns, pk=pk, if_not_exists=True)
            self.db["runs"].create_index(["kernel", "problem"], if_not_exists=True)
            self.db["compile_status"].create_index(["kernel"], if_not_exists=True)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """A write: BEGIN IMMEDIATE takes the write lock first, so concurrent writers queue (busy timeout) instead
        of failing mid-way. sqlite-utils commits its own statements, so the transaction may already be closed."""
        with self._lock:
            conn = self.db.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            if conn.in_transaction:
                conn.execute("COMMIT")

    def close(self) -> None:
        self.db.conn.close()

    def _reopen(self) -> None:
        """A fresh immutable connection: a writer changed the file since this one was opened."""
        import sqlite_utils

        self.db.conn.close()
        self.db = sqlite_utils.Database(self._connect())

    def __enter__(self) -> ResultsDB:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ResultsDB {self.path}>"

    # --- writes ---------------------------------------------------------------------------------------------
    def _upsert(self, table: str, rows: Iterable[dict], *, replace: bool = True) -> None:
        if self.read_only:
            raise ArgumentError(f"{self.path} was opened read-only")
        rows = list(rows)
        if not rows:
            return
        with self.transaction():
            self.db[table].insert_all(rows, pk=TABLES[table][0], alter=True, replace=replace,
                                      ignore=not replace)

    def add_device(self, facts: dict) -> str:
        row = {k: v for k, v in facts.items() if v is not None}
        row["id"] = device_id(facts)
        self._upsert("devices", [row])
        return row["id"]

    def add_kernel(self, operation, params: dict | None = None, *, op_class: str | None = None) -> str:
        """Record an operation (its parameters flattened to columns, so SQL can group by tile or stages) and its
        operation class (``operation_class``; ``op_class`` gives it for objects that are not descriptions)."""
        params = dict(params or {})
        if op_class is None:
            op_class = _class_of(operation, params)
        row = {"name": operation.name, "kind": params.get("kind", type(operation).__name__),
               "family": operation.family, "op_class": op_class, "description": operation.describe(),
               "params": canonical_json(params), **_flatten(params)}
        self._upsert("kernels", [row])
        return operation.name

    def add_baseline(self, name: str, description: str) -> str:
        self._upsert("kernels", [{"name": name, "kind": BASELINE_KIND, "family": "", "description": description,
                                  "params": "{}"}])
        return name

    def add_problem(self, problem) -> str:
        spec = problem.to_dict()
        row = {"key": problem.key, "kind": problem.kind, "flops": float(problem.flops), "spec": canonical_json(spec),
               **{k: v for k, v in _flatten(spec).items() if k != "kind"}}
        self._upsert("problems", [row])
        return problem.key

    def add_sweep(self, name: str, space: dict, problems: dict, fingerprint: str) -> None:
        self._upsert("sweeps", [{"name": name, "space": canonical_json(space), "problems": canonical_json(problems),
                                 "fingerprint": fingerprint, "time": time.time()}])

    def record_compile(self, cache_key: str, kernel: str, target: str, backend: str, status: str,
                       error_class: str = "", log: str = "", seconds: float = 0.0) -> None:
        if status not in ("ok", "failed"):
            raise ArgumentError(f"compile status must be 'ok' or 'failed', got {status!r}")
        self._upsert("compile_status", [{"cache_key": cache_key, "kernel": kernel, "target": target,
                                         "backend": backend, "status": status, "error_class": error_class,
                                         "log": log[-20000:], "seconds": seconds, "time": time.time()}])

    def record_runs(self, runs: Iterable[dict]) -> list[str]:
        """Many ``record_run`` rows in one transaction (a distributed task's results: one commit, not hundreds)."""
        rows = [self._run_row(**run) for run in runs]
        self._upsert("runs", rows)
        return [row["id"] for row in rows]

    def record_run(self, **run) -> str:
        row = self._run_row(**run)
        self._upsert("runs", [row])
        return row["id"]

    @staticmethod
    def _run_row(*, sweep: str, device: str, kernel: str, problem: str, harness: str, status: str,
                 seconds: float | None = None, seconds_min: float | None = None, seconds_iqr: float | None = None,
                 repetitions: int = 0, flops: float | None = None, rel_error: float | None = None,
                 message: str = "", worker: str = "") -> dict:
        if status not in RUN_STATUSES:
            raise ArgumentError(f"run status must be one of {RUN_STATUSES}, got {status!r}")
        rid = run_id(sweep, device, kernel, problem, harness)
        tflops = flops / seconds / 1e12 if (flops and seconds) else None
        return {"id": rid, "sweep": sweep, "device": device, "kernel": kernel, "problem": problem,
                "harness": harness, "status": status, "seconds": seconds, "seconds_min": seconds_min,
                "seconds_iqr": seconds_iqr, "repetitions": repetitions, "tflops": tflops, "rel_error": rel_error,
                "message": message[-4000:], "worker": worker, "time": time.time()}

    def record_resources(self, kernel: str, device: str, resources: dict) -> None:
        self._upsert("resources", [{"kernel": kernel, "device": device, **resources}])

    def put_tuning(self, key: str, kernel: str, params: dict, seconds: float, policy: str, candidates: int) -> None:
        self._upsert("tuning", [{"key": key, "kernel": kernel, "params": canonical_json(params), "seconds": seconds,
                                 "policy": policy, "candidates": candidates, "time": time.time()}])

    # --- reads ----------------------------------------------------------------------------------------------
    def query(self, sql: str, params: Iterable | dict = ()) -> list[dict]:
        with self._lock:
            if not self._immutable:
                return list(self.db.query(sql, params))
            # Without locking a writer may change the file under us: read again until it held still.
            for attempt in range(3):
                if _file_signature(self.path) != self._opened_signature:
                    self._reopen()
                try:
                    rows, failure = list(self.db.query(sql, params)), None
                except sqlite3.DatabaseError as exc:
                    rows, failure = [], exc
                if _file_signature(self.path) == self._opened_signature or attempt == 2:
                    break
            if failure is not None:
                raise failure
            return rows

    def compile_status(self, cache_key: str) -> dict | None:
        rows = self.query("select * from compile_status where cache_key = ?", [cache_key])
        return rows[0] if rows else None

    def tuning(self, key: str) -> dict | None:
        rows = self.query("select * from tuning where key = ?", [key])
        return rows[0] if rows else None

    def tuning_keys(self) -> list[dict]:
        return self.query("select key, kernel, params, seconds from tuning")

    def kernel_classes(self) -> dict[str, str]:
        """``{kernel name: operation class}`` of every kernel row. Rows written before the ``op_class`` column
        existed get theirs from their space parameters (or ``UNKNOWN_CLASS`` without any); nothing is written."""
        has_column = "op_class" in self.db["kernels"].columns_dict
        rows = self.query(f"select name, params{', op_class' if has_column else ''} from kernels")
        classes = {}
        for row in rows:
            found = row.get("op_class")
            if not found:
                try:
                    params = json.loads(row["params"] or "{}")
                except ValueError:
                    params = {}
                found = _class_from_params(params)
            classes[row["name"]] = found
        return classes

    def results(self, *, sweep: str | None = None, device: str | None = None,
                include_baselines: bool = False) -> list[Result]:
        """``(kernel, problem, seconds)`` of every successful run: the input of select_kernels and heatmaps. Each
        is a ``Result`` whose ``op_class`` names its kernel's operation class (see ``split_classes`` in
        ``pycutlass.tune.select``: kernels compete only within a class)."""
        sql = ("select r.kernel, r.problem, min(r.seconds) as seconds from runs r join kernels k on k.name = r.kernel "
               "where r.status = 'ok'")
        args: list = []
        if not include_baselines:
            sql += " and k.kind != ?"
            args.append(BASELINE_KIND)
        if sweep is not None:
            sql += " and r.sweep = ?"
            args.append(sweep)
        if device is not None:
            sql += " and r.device = ?"
            args.append(device)
        sql += " group by r.kernel, r.problem order by r.problem, r.kernel"
        rows = self.query(sql, args)
        classes = self.kernel_classes() if rows else {}
        return [Result(row["kernel"], row["problem"], row["seconds"], classes.get(row["kernel"], UNKNOWN_CLASS))
                for row in rows]

    def counts(self) -> dict[str, int]:
        return {name: self.query(f"select count(*) as n from [{name}]")[0]["n"] for name in TABLES}

    # --- merge and export -----------------------------------------------------------------------------------
    def merge(self, other: str | Path | ResultsDB) -> dict[str, int]:
        """Copy every row of another results DB that this one lacks (by primary key). Idempotent: merging twice
        adds nothing. Returns the rows added per table."""
        source = other if isinstance(other, ResultsDB) else ResultsDB(other, read_only=True)
        added = {}
        try:
            for table in TABLES:
                before = self.db[table].count
                rows = source.query(f"select * from [{table}]")
                self._upsert(table, rows, replace=False)  # same key, same facts: keep ours
                added[table] = self.db[table].count - before
        finally:
            if source is not other:
                source.close()
        return added

    def export(self, table: str, path: str | Path) -> Path:
        """Write one table as CSV or JSON (by the path's suffix)."""
        if table not in TABLES:
            raise ArgumentError(f"unknown table {table!r}; tables: {sorted(TABLES)}")
        path = Path(path)
        if path.suffix not in (".csv", ".json"):
            raise ArgumentError(f"export writes .csv or .json, got {path.name!r}")
        rows = self.query(f"select * from [{table}]")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ArgumentError(f"cannot create the folder of {path}: {exc.strerror or exc}") from None
        if path.suffix == ".json":
            path.write_text(json.dumps(rows, indent=1))
        elif path.suffix == ".csv":
            columns = list(dict.fromkeys(c for row in rows for c in row)) or [
                c.name for c in self.db[table].columns]
            with path.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows(rows)
        return path


_SQLITE_MAGIC = b"SQLite format 3\x00"


def _check_file(path: Path, read_only: bool) -> None:
    """Refuse, before SQLite touches anything, a path that cannot be this kind of results database."""
    if path.is_dir():
        raise ResultsDatabaseError(f"{path} is a directory, not a results database file; pass a file path such as "
                                   f"{path / 'results.db'}")
    try:
        if path.stat().st_size and sqlite_application_id(path) is not None:
            head = _SQLITE_MAGIC  # not open(): its close would drop the SQLite locks this process holds on the file
        else:
            with open(path, "rb") as handle:
                head = handle.read(len(_SQLITE_MAGIC))
    except FileNotFoundError:
        head = None
    except OSError as exc:
        raise ResultsDatabaseError(f"cannot read results database {path}: {exc.strerror or exc}") from None
    if head is None and read_only:
        raise ResultsDatabaseError(f"no results database at {path} (the file does not exist)")
    if head and not head.startswith(_SQLITE_MAGIC):
        raise ResultsDatabaseError(f"{path} is not a database: it is {_describe_file(path)}; it was left as it is. "
                                   "A results database is an SQLite file pycutlass creates: pass a new path or "
                                   "one written by `pycutlass sweep` or `tune`")
    if read_only:
        if not head:
            raise ResultsDatabaseError(f"{path} is an empty file, not a results database")
        return
    if head is not None:
        if not os.access(path, os.W_OK):
            raise ResultsDatabaseError(
                f"results database {path} is not writable (a read-only file); commands that only read it (select, "
                "heatmap, db info, db export) work as it is. To write results, make it writable or pass another "
                "--db path")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # the folder that would hold the missing ones
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ResultsDatabaseError(
            f"cannot write results database {path}: the folder {folder} is not writable (SQLite creates "
            f"{path.name}-wal and {path.name}-shm beside the database). Make it writable or pass a --db path in a "
            "writable folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ResultsDatabaseError(f"cannot create the folder of results database {path}: "
                                   f"{exc.strerror or exc}") from None


def _describe_file(path: Path) -> str:
    with open(path, "rb") as handle:
        head = handle.read(512)
    size = path.stat().st_size
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "\x00" not in text:
        first = text.strip().splitlines()[0][:60] if text.strip() else ""
        return f"a text file of {size} bytes" + (f" starting {first!r}" if first else "")
    return f"a binary file of {size} bytes"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _file_signature(path: Path) -> tuple:
    """Identity, size and modification time of the database and of its WAL: changes when a writer touches either."""
    signature: tuple = ()
    for name in (str(path), f"{path}-wal"):
        try:
            info = os.stat(name)
            signature += (info.st_ino, info.st_size, info.st_mtime_ns)
        except FileNotFoundError:
            signature += (None,)
    return signature


def _class_from_params(params: dict) -> str:
    """A kernel's class rebuilt from its space parameters (descriptions only: nothing compiles)."""
    if not params.get("element_a") and not params.get("dtypes"):
        return UNKNOWN_CLASS
    try:
        from .space import build_operation

        return operation_class(build_operation(params))
    except Exception:  # parameters of another pycutlass version, or of a stand-in: the class stays unknown
        return UNKNOWN_CLASS


def _class_of(operation, params: dict) -> str:
    try:
        return operation_class(operation)
    except (AttributeError, TypeError):  # not a description object (a stand-in with a name): from its parameters
        return _class_from_params(params)


def _flatten(params: dict, prefix: str = "") -> dict:
    """Parameters as SQL columns: lists become "128x128x32"-style strings, nested dicts get prefixed names."""
    flat = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}_"))
        elif isinstance(value, (list, tuple)):
            flat[name] = "x".join(str(v) for v in value)
        elif value is None or isinstance(value, (str, int, float)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return {k: v for k, v in flat.items() if k not in ("name", "key", "spec", "params", "description")}
