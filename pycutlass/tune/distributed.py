"""Sweeps over many processes and hosts through Dask (``dask.distributed``).

    with DaskExecutor("local:4") as executor:            # or "tcp://scheduler:8786", or an existing Client
        executor.compile(sweep)                            # compile tasks on workers with free CPU and memory
        executor.benchmark(sweep)                          # benchmark tasks on workers that declare a GPU

Why Dask: its scheduler already does what a sweep needs (work stealing across heterogeneous workers, abstract
resources such as ``GPU=1`` or ``MEMORY_GB=48``, retrying tasks of lost workers, a dashboard); dask-cuda's
``dask cuda worker`` starts one worker per GPU. See docs/distributed.md.

The client is the only writer of the results DB and of its artifact cache. Compiled kernels travel back as cache
entries: the binary, its sha256 (checked on arrival) and the cache key the worker computed (its toolchain).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from ..errors import ArgumentError

log = logging.getLogger("pycutlass.tune")

COMPILE_RESOURCE = "MEMORY_GB"  # declared by workers that accept compiles; an SM90 unit peaks near 3 GB
COMPILE_MEMORY_GB = 3
GPU_RESOURCE = "GPU"


# --- tasks (run on Dask workers) --------------------------------------------------------------------------------
def compile_task(operations: list, target: str, backend: str, cache_path: str | None) -> list[dict]:
    """Compile ``operations`` in this worker's process; failures come back as data (retries are for lost workers)."""
    from ..compiler.manager import Compiler
    from ..description.target import Target
    from ..session import Session
    from .sweep import error_class

    try:
        from distributed import get_worker

        worker = get_worker().address
    except Exception:  # run outside a worker (tests, a thread pool)
        worker = "local"
    options = {"target": target, "backend": backend}
    if cache_path is not None:
        options["cache_path"] = cache_path
    session = Session(**options)
    compiler = Compiler.of(session)
    start = time.perf_counter()
    report = compiler.add_module(operations, target=target, errors="report")
    failed = {op.name: error for unit, error in report.failures for op in unit}
    seconds = (time.perf_counter() - start) / max(1, len(operations))
    results = []
    for op in operations:
        key, resolved = compiler.key_and_target(op, Target.parse(target))
        row = {"name": op.name, "key": key, "target": resolved.name, "backend": compiler.backend_for(op).name,
               "worker": worker, "seconds": seconds}
        error = failed.get(op.name)
        if error is not None:
            row.update(status="failed", error_class=error_class(error), log=f"{error}\n{getattr(error, 'log', '')}")
        else:
            compiled = compiler.compiled_for(op, resolved)
            row.update(status="ok", binary=compiled.binary, sha256=compiled.sha256,
                       kernel_symbol=compiled.kernel_symbol, builder_symbol=compiled.builder_symbol)
        results.append(row)
    return results


def benchmark_task(kernels: list[dict], problems: list[dict], config_json: str, timeout: float,
                   worker_main=None) -> list[dict]:
    """Time kernels on problems on this Dask worker's GPU, in a pinned subprocess that a faulting kernel cannot
    take down. ``kernels``: dicts with the operation and its binary (adopted, so nothing compiles here)."""
    import threading

    from .bench import BenchConfig
    from .runner import Worker, WorkerLost

    config = BenchConfig.from_json(config_json)
    worker = Worker(0, {}, config, None, worker_main)
    stop = threading.Event()
    rows = []
    try:
        facts = worker.request(("facts",), timeout, stop)
        adopted = set()
        for problem in problems:
            for kernel in kernels:
                try:
                    if kernel["name"] not in adopted and kernel.get("binary") is not None:
                        worker.request(("adopt", kernel["operation"], kernel["target"], kernel["binary"],
                                        kernel["backend"], kernel["kernel_symbol"], kernel["builder_symbol"]),
                                       timeout, stop)
                        adopted.add(kernel["name"])
                    reply = worker.request(("kernel", kernel["operation"], problem), timeout, stop)
                except WorkerLost as lost:
                    adopted.clear()  # a fresh process has adopted nothing
                    status = "timeout" if "timed out" in str(lost) else "failed"
                    reply = {"measurement": {"status": status, "message": str(lost)}}
                if "error" in reply:
                    reply = {"measurement": {"status": "failed", "message": reply["error"]}}
                rows.append({"kernel": kernel["name"], "problem": problem, "facts": facts, **reply})
    finally:
        worker.stop()
    return rows


# --- the client -------------------------------------------------------------------------------------------------
@dataclass
class DistributedSummary:
    submitted: int = 0
    done: int = 0
    skipped: int = 0
    statuses: Counter = field(default_factory=Counter)
    workers: Counter = field(default_factory=Counter)  # worker address -> tasks finished
    foreign_toolchain: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(self.statuses.items()))
        return (f"{self.done}/{self.submitted} done ({statuses or 'none'}), {self.skipped} skipped (already done), "
                f"{len(self.workers)} workers, {self.seconds:.1f} s"
                + (f", {self.foreign_toolchain} built by another toolchain" if self.foreign_toolchain else ""))


_SCHEDULER_PROTOCOLS = ("tcp", "tls", "ucx", "ws", "wss", "inproc")


def parse_scheduler(scheduler) -> tuple[str, object]:
    """Check a scheduler before Dask is touched: ``("local", N)`` for "local" or "local:N" (N >= 1 workers),
    ``("address", text)`` for a scheduler address (``tcp://host:8786``, ``host:8786``), ``("client", it)`` for a
    dask Client."""
    if not isinstance(scheduler, str):
        try:
            from distributed import Client  # only a Client is not a string: Dask is in use already
        except ImportError:
            Client = None
        if Client is not None and isinstance(scheduler, Client):
            return "client", scheduler
        raise ArgumentError(f"scheduler must be 'local:N', a scheduler address or a dask Client, got {scheduler!r}")
    allowed = ("allowed: 'local' or 'local:N' (a local cluster of N >= 1 workers), or a scheduler address such as "
               "'tcp://host:8786' or 'host:8786'")
    if scheduler == "local":
        return "local", 2
    if scheduler.startswith("local:"):
        count = scheduler.removeprefix("local:")
        if not count.isdigit() or int(count) < 1:
            raise ArgumentError(f"scheduler {scheduler!r}: a local cluster needs a positive number of workers; "
                                f"{allowed}")
        return "local", int(count)
    protocol, separator, rest = scheduler.rpartition("://")
    host, colon, port = rest.rpartition(":")
    if separator and protocol not in _SCHEDULER_PROTOCOLS:
        raise ArgumentError(f"scheduler {scheduler!r}: unknown protocol {protocol!r} (known: "
                            f"{', '.join(_SCHEDULER_PROTOCOLS)}); {allowed}")
    if protocol == "inproc" or (host and colon and port.isdigit()) or (separator and rest and not colon):
        return "address", scheduler
    raise ArgumentError(f"scheduler {scheduler!r} is neither a local cluster nor a scheduler address; {allowed}")


def _client_for(scheduler):
    """A Client from "local:N" (a LocalCluster of N single-threaded worker processes), an address, or a Client."""
    kind, value = parse_scheduler(scheduler)
    if kind == "client":
        return value, None
    from distributed import Client, LocalCluster

    if kind == "local":
        cluster = LocalCluster(n_workers=value, threads_per_worker=1, processes=True, dashboard_address=None,
                               resources={COMPILE_RESOURCE: COMPILE_MEMORY_GB})
        return Client(cluster), cluster
    return Client(value), None


class DaskExecutor:
    """Runs a sweep's compile and benchmark tasks on a Dask cluster; the client writes every result."""

    def __init__(self, scheduler="local:2", *, worker_cache_path: str | None = None, retries: int = 2):
        self.client, self._cluster = _client_for(scheduler)
        self.worker_cache_path = worker_cache_path
        self.retries = retries

    def close(self) -> None:
        if self._cluster is not None:  # a cluster we started; a user's client stays open
            self.client.close()
            self._cluster.close()

    def __enter__(self) -> DaskExecutor:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _resources(self, name: str, amount: int) -> dict | None:
        """Ask for a resource only when some worker declares it (otherwise Dask would wait forever)."""
        workers = self.client.scheduler_info().get("workers", {}).values()
        return {name: amount} if any(name in (w.get("resources") or {}) for w in workers) else None

    # --- compile ------------------------------------------------------------------------------------------------
    def compile(self, sweep, *, chunk: int = 1, progress: bool | None = None) -> DistributedSummary:
        """Compile the sweep's operations that the memo does not already settle, ``chunk`` per task."""
        from ..cache.current import CacheState
        from ..compiler.manager import Compiler
        from .progress import progress_bar as _progress

        start = time.perf_counter()
        compiler = Compiler.of(sweep.session)
        cache = CacheState.of(sweep.session).cache
        target = sweep._target()
        summary = DistributedSummary()
        pending = []
        for op in sweep.operations:
            key, resolved = compiler.key_and_target(op, target)
            memo = sweep.db.compile_status(key)
            if memo is not None and (memo["status"] == "failed" or cache.lookup(key) is not None):
                summary.skipped += 1
                summary.statuses[f"known {memo['status']}"] += 1
            else:
                pending.append((op, key, resolved))
        resources = self._resources(COMPILE_RESOURCE, COMPILE_MEMORY_GB)
        futures = {}
        for begin in range(0, len(pending), chunk):
            part = pending[begin:begin + chunk]
            future = self.client.submit(compile_task, [op for op, _, _ in part], part[0][2].name,
                                        compiler.backend_for(part[0][0]).name, self.worker_cache_path,
                                        resources=resources, retries=self.retries, pure=False)
            futures[future] = part
        summary.submitted = len(pending)
        bar = _progress(len(pending), "compile (dask)", progress)
        with _collecting(self.client, futures, bar, summary, start) as finished:
            for future in finished:
                part = futures[future]
                try:
                    rows = future.result()
                except Exception as exc:  # e.g. KilledWorker: the task took down workers repeatedly
                    rows = [{"name": op.name, "key": key, "target": t.name, "backend": compiler.backend_for(op).name,
                             "status": "failed", "error_class": f"{type(exc).__name__}: lost worker",
                             "log": str(exc), "worker": "?", "seconds": 0.0} for op, key, t in part]
                for row, (op, key, _) in zip(rows, part):
                    self._record_compile(sweep, cache, row, key, summary)
                bar.update(len(part))
        log.info("dask compile %s: %s", sweep.name, summary)
        return summary

    def _record_compile(self, sweep, cache, row: dict, client_key: str, summary: DistributedSummary) -> None:
        key = row["key"]
        if key != client_key:  # built by a worker whose toolchain differs from ours: keyed as what it is
            summary.foreign_toolchain += 1
        if row["status"] == "ok":
            if hashlib.sha256(row["binary"]).hexdigest() != row["sha256"]:
                row = {**row, "status": "failed", "error_class": "TransferError: binary hash mismatch",
                       "log": f"{row['name']}: the binary from {row['worker']} failed its sha256 check"}
            else:
                cache.store([(key, row["name"], {"kernel": row["kernel_symbol"], "builder": row["builder_symbol"],
                                                 "backend": row["backend"], "target": row["target"],
                                                 "worker": row["worker"]})], row["binary"], "cubin")
        sweep.db.record_compile(key, row["name"], row["target"], row["backend"], row["status"],
                                error_class=row.get("error_class", ""), log=row.get("log", ""),
                                seconds=row.get("seconds", 0.0))
        summary.done += 1
        summary.statuses[row["status"]] += 1
        summary.workers[row["worker"]] += 1

    # --- benchmark ----------------------------------------------------------------------------------------------
    def benchmark(self, sweep, *, config=None, timeout: float = 120.0, problems_per_task: int = 1,
                  kernels_per_task: int | None = None, baseline: bool = False, worker_main=None,
                  progress: bool | None = None) -> DistributedSummary:
        """Time every ready operation on every problem on the cluster's GPU workers (``GPU`` resource).

        Work is partitioned into (problem block x kernel block) tasks, ``problems_per_task`` x ``kernels_per_task``
        (default: all kernels), so no pair is measured twice and idle GPUs steal the remaining tasks; kernel blocks
        bound the binaries each task carries (docs/distributed.md). Rows already in the DB are not submitted again.
        Pairs are measured once per sweep on whichever GPU takes them: give GPUs of different models their own
        sweeps (or resources) to rank them separately."""
        from ..cache.current import CacheState
        from ..compiler.manager import Compiler
        from .bench import BenchConfig
        from .runner import _times_as_gemm
        from .progress import progress_bar as _progress

        if baseline:
            raise ArgumentError("distributed sweeps record no torch baseline yet; run one with Sweep.benchmark")
        config = config or BenchConfig()
        resources = self._resources(GPU_RESOURCE, 1)
        if resources is None:
            raise ArgumentError(f"no Dask worker declares a {GPU_RESOURCE} resource (start GPU workers with "
                                f"`dask worker --resources GPU=1` or `dask cuda worker`)")
        start = time.perf_counter()
        compiler = Compiler.of(sweep.session)
        cache = CacheState.of(sweep.session).cache
        kernels = []
        for op in sweep.ready_operations():
            if not _times_as_gemm(op):
                continue
            key, resolved = compiler.key_and_target(op, sweep._target())
            artifact = cache.lookup(key)
            if artifact is None:
                continue
            kernels.append({"name": op.name, "operation": op, "target": resolved.name, "binary": artifact.binary,
                            "backend": compiler.backend_for(op).name, "kernel_symbol": op.kernel_symbol,
                            "builder_symbol": op.builder_symbol})
        harness = config.fingerprint
        done = {(r["kernel"], r["problem"]) for r in sweep.db.query(
            "select kernel, problem from runs where sweep = ? and harness = ?", [sweep.name, harness])}
        summary = DistributedSummary()
        futures = {}
        problems = [p for p in sweep.problems if p.kind == "gemm"]
        by_key = {p.key: p for p in problems}
        block = kernels_per_task or max(1, len(kernels))
        for begin in range(0, len(problems), problems_per_task):
            part = problems[begin:begin + problems_per_task]
            for first in range(0, len(kernels), block):
                chunk = kernels[first:first + block]
                todo = [k for k in chunk if any((k["name"], p.key) not in done for p in part)]
                summary.skipped += sum((k["name"], p.key) in done for k in chunk for p in part)
                if not todo:
                    continue
                future = self.client.submit(benchmark_task, todo, [p.to_dict() for p in part], harness, timeout,
                                            worker_main, resources=resources, retries=self.retries, pure=False)
                futures[future] = part
                summary.submitted += len(todo) * len(part)
        bar = _progress(summary.submitted, "benchmark (dask)", progress)
        devices: dict[str, str] = {}
        with _collecting(self.client, futures, bar, summary, start) as finished:
            for future in finished:
                runs = []
                for row in future.result():
                    problem = by_key[_problem_key(row["problem"])]
                    if (row["kernel"], problem.key) in done:
                        continue  # a retried task re-measured a pair: the first row stays
                    facts = row["facts"]
                    uuid = facts.get("uuid", "")
                    if uuid not in devices:
                        devices[uuid] = sweep.db.add_device(facts)
                    m = row["measurement"]
                    runs.append(dict(sweep=sweep.name, device=devices[uuid], kernel=row["kernel"],
                                     problem=problem.key, harness=harness, status=m["status"],
                                     seconds=m.get("seconds"), seconds_min=m.get("seconds_min"),
                                     seconds_iqr=m.get("seconds_iqr"), repetitions=m.get("repetitions", 0),
                                     flops=problem.flops, rel_error=m.get("rel_error"),
                                     message=m.get("message", ""), worker=f"{facts.get('host', '?')}/{uuid}"))
                    if row.get("resources"):
                        sweep.db.record_resources(row["kernel"], devices[uuid], row["resources"])
                    done.add((row["kernel"], problem.key))
                    summary.statuses[m["status"]] += 1
                    summary.workers[uuid] += 1
                sweep.db.record_runs(runs)  # one commit per task: the single writer keeps up at scale
                summary.done += len(runs)
                bar.update(len(runs))
        return summary


@contextlib.contextmanager
def _collecting(client, futures, bar, summary: DistributedSummary, start: float):
    """Futures as they finish; Ctrl-C cancels the rest (everything recorded so far stays)."""
    from distributed import as_completed

    try:
        yield as_completed(list(futures))
    except KeyboardInterrupt:
        client.cancel(list(futures))
        raise
    finally:
        bar.close()
        summary.seconds = time.perf_counter() - start


def _problem_key(spec: dict) -> str:
    from .problems import problem_from_dict

    return problem_from_dict(spec).key
