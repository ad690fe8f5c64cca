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
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from ..errors import ArgumentError
from .breakdown import Breakdown, WorkerTimes
from .gpu_slots import GPU_RESOURCE, GpuSlots

log = logging.getLogger("pycutlass.tune")

COMPILE_RESOURCE = "MEMORY_GB"  # declared by workers that accept compiles; an SM90 unit peaks near 3 GB
COMPILE_MEMORY_GB = 3
TASKS_PER_GPU = 8  # benchmark tasks per GPU by default: the tail (the last task) is short beside the whole


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
    slots = _worker_slots()
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
            if slots is not None:  # this worker's benchmark tasks use it without a transfer
                slots.hold(key, {"name": op.name, "operation": op, "target": resolved.name, "binary": compiled.binary,
                                  "backend": row["backend"], "kernel_symbol": compiled.kernel_symbol,
                                  "builder_symbol": compiled.builder_symbol})
        results.append(row)
    return results


def _worker_slots() -> GpuSlots | None:
    try:
        from .dask_gpus import worker_slots
    except ImportError:  # no Dask here
        return None
    return worker_slots()


@contextlib.contextmanager
def _task_slots():
    """This Dask worker's GPU slots, or (outside a worker with them) slots of this task's own on the first visible
    GPU, closed when the task ends."""
    slots = _worker_slots()
    if slots is not None:
        yield slots
        return
    slots = GpuSlots("local", 1)
    try:
        yield slots
    finally:
        slots.close()


@contextlib.contextmanager
def _gpu_runner(slots: GpuSlots, config_json: str, worker_main, session_options: dict | None, timeout: float, stop,
                times: dict):
    """One of ``slots``' GPUs and its benchmark process (kept between tasks; a process that died since the last task
    is replaced now, not mid-request), with the GPU's facts asked once per process. Yields (runner, ordinal);
    ``times`` collects request seconds and the worker's phases."""
    import time as clock

    from .bench import BenchConfig
    from .runner import Worker

    config = BenchConfig.from_json(config_json)
    options = dict(session_options or {})
    signature = (config_json, worker_main, tuple(sorted(options.items())))
    with slots.gpu() as ordinal:
        runner = slots.runner(ordinal, signature, lambda: Worker(ordinal, options, config, None, worker_main))
        runner.worker.start()
        if runner.fresh_process() or runner.facts is None:
            began = clock.perf_counter()
            facts = runner.worker.request(("facts",), timeout, stop)
            times["requests"] += clock.perf_counter() - began
            _add_phases(times, facts.pop("phases", None))
            runner.facts = facts
        yield runner, ordinal


def _add_phases(times: dict, phases: dict | None) -> None:
    for name, seconds in (phases or {}).items():
        times["phases"][name] = times["phases"].get(name, 0.0) + seconds


def _measured(runner, request, times: dict) -> dict:
    """``request(runner)`` (the worker's reply) as a row's measurement fields: a lost or failing worker process
    becomes a failed (or timed-out) measurement, and a replacement process starts for the next request."""
    import time as clock

    from .runner import WorkerLost

    began = clock.perf_counter()
    try:
        runner.worker.start()
        runner.fresh_process()  # a new process (after a fault) has adopted nothing yet
        reply = request(runner)
        _add_phases(times, reply.get("phases"))
    except WorkerLost as lost:
        _add_phases(times, {"lost": clock.perf_counter() - began})
        status = "timeout" if "timed out" in str(lost) else "failed"
        reply = {"measurement": {"status": status, "message": str(lost)}}
    times["requests"] += clock.perf_counter() - began
    times["tasks"] += 1
    if "error" in reply:
        reply = {"measurement": {"status": "failed", "message": reply["error"]}}
    return reply


def benchmark_task(kernels: list[dict], problems: list[dict], config_json: str, timeout: float,
                   worker_main=None, session_options: dict | None = None) -> dict:
    """Time kernels on problems on one of this Dask worker's GPUs, in that GPU's benchmark process (kept between
    tasks: a faulting kernel takes down only it, and it is restarted). ``kernels``: dicts with the operation, its cache
    key and, where the client sent it, its binary; the others must be held here (compiled or received before).

    Returns ``{"missing": [names]}`` when some binary is neither sent nor held (the client sends the task again with
    them), else ``{"rows", "worker", "gpu", "times", "held"}``: one row per pair, kernel by kernel."""
    stop = threading.Event()
    rows = []
    times = {"requests": 0.0, "phases": {}, "tasks": 0, "kernels": len(kernels)}
    with _task_slots() as slots:
        for kernel in kernels:
            if kernel.get("binary") is not None:
                slots.hold(kernel["key"], kernel)
        missing = [k["name"] for k in kernels if slots.held(k["key"]) is None]
        if missing:
            return {"missing": missing, "worker": slots.address}
        with _gpu_runner(slots, config_json, worker_main, session_options, timeout, stop, times) as (runner, ordinal):
            for kernel in kernels:
                held = slots.held(kernel["key"])
                for problem in problems:
                    def request(runner, held=held, problem=problem, name=kernel["name"]):
                        if name not in runner.adopted:
                            reply = runner.worker.request(("adopt", held["operation"], held["target"],
                                                           held["binary"], held["backend"], held["kernel_symbol"],
                                                           held["builder_symbol"]), timeout, stop)
                            _add_phases(times, reply.get("phases"))
                            runner.adopted.add(name)
                        return runner.worker.request(("kernel", held["operation"], problem), timeout, stop)

                    reply = _measured(runner, request, times)
                    rows.append({"kernel": kernel["name"], "problem": problem, "facts": runner.facts,
                                 "measurement": reply["measurement"], "resources": reply.get("resources")})
        return {"rows": rows, "worker": slots.address, "gpu": ordinal, "times": times,
                "held": [k["name"] for k in kernels]}


def baseline_task(baselines: list[dict], config_json: str, timeout: float, worker_main=None,
                  session_options: dict | None = None) -> dict:
    """Time torch's own computation of problems (the baseline rows: cuBLAS, ``torch._grouped_mm``, cuDNN) on one of
    this Dask worker's GPUs, in the same benchmark process and harness as the kernels. ``baselines``: dicts with the
    baseline's row name, the problem and the request's labels (A type, C type, and a convolution's kind). Returns
    what ``benchmark_task`` returns, with nothing held."""
    stop = threading.Event()
    rows = []
    times = {"requests": 0.0, "phases": {}, "tasks": 0, "kernels": 0}
    with _task_slots() as slots, \
            _gpu_runner(slots, config_json, worker_main, session_options, timeout, stop, times) as (runner, ordinal):
        for baseline in baselines:
            def request(runner, baseline=baseline):
                return runner.worker.request(("baseline", baseline["problem"], *baseline["labels"]), timeout, stop)

            reply = _measured(runner, request, times)
            rows.append({"kernel": baseline["name"], "problem": baseline["problem"], "facts": runner.facts,
                         "measurement": reply["measurement"], "resources": None})
        return {"rows": rows, "worker": slots.address, "gpu": ordinal, "times": times, "held": []}


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
    # benchmark placement: tasks that ran where their kernels were held (nothing sent), binaries sent with tasks,
    # and tasks sent again with their binaries because they ran on a worker that did not hold them
    tasks: int = 0
    placed: int = 0
    binaries_sent: int = 0
    resent: int = 0
    breakdown: Breakdown = field(default_factory=Breakdown)  # per (worker, GPU) and phase (benchmark only)

    def __str__(self) -> str:
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(self.statuses.items()))
        placement = (f"; {self.tasks} tasks, {self.placed} on the worker holding their kernels, {self.binaries_sent} "
                     f"binaries sent, {self.resent} tasks sent again" if self.tasks else "")
        return (f"{self.done}/{self.submitted} done ({statuses or 'none'}), {self.skipped} skipped (already done), "
                f"{len(self.workers)} workers, {self.seconds:.1f} s"
                + (f", {self.foreign_toolchain} built by another toolchain" if self.foreign_toolchain else "")
                + placement)


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


def local_cluster(compile_workers: int, gpus: int):
    """A cluster of this host's processes: ``compile_workers`` single-threaded compile workers and, where the host has
    GPUs, one benchmark worker declaring them all (a task per GPU at a time; its GPU slots give each task its own)."""
    from distributed import Nanny, Scheduler, SpecCluster

    workers = {f"compile-{i}": {"cls": Nanny, "options": {"nthreads": 1, "resources":
                                                          {COMPILE_RESOURCE: COMPILE_MEMORY_GB}}}
               for i in range(compile_workers)}
    if gpus:
        workers["gpus"] = {"cls": Nanny, "options": {"nthreads": gpus, "resources": {GPU_RESOURCE: gpus}}}
    return SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}},
                       silence_logs=logging.WARNING)


def _client_for(scheduler):
    """A Client from "local:N" (``local_cluster``: N compile workers, and a benchmark worker for this host's GPUs),
    an address, or a Client."""
    kind, value = parse_scheduler(scheduler)
    if kind == "client":
        return value, None
    from distributed import Client

    if kind == "local":
        from .runner import visible_gpus

        cluster = local_cluster(value, len(visible_gpus()))
        return Client(cluster), cluster
    return Client(value), None


class DaskExecutor:
    """Runs a sweep's compile and benchmark tasks on a Dask cluster; the client writes every result."""

    def __init__(self, scheduler="local:2", *, worker_cache_path: str | None = None, retries: int = 2):
        from .dask_gpus import GpuWorkers

        self.client, self._cluster = _client_for(scheduler)
        self.worker_cache_path = worker_cache_path
        self.retries = retries
        self.holders: dict[str, str] = {}  # kernel name -> the worker that compiled or received its binary
        # every worker (and any that joins later) keeps its GPU processes and the binaries it holds between tasks
        self.client.register_plugin(GpuWorkers())

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
        if row["status"] == "ok":
            self.holders[row["name"]] = row["worker"]

    # --- benchmark ----------------------------------------------------------------------------------------------
    def benchmark(self, sweep, *, config=None, timeout: float = 120.0, problems_per_task: int | None = None,
                  kernels_per_task: int = 1, baseline: bool = False, worker_main=None,
                  progress: bool | None = None) -> DistributedSummary:
        """Time every ready operation on every problem on the cluster's GPU workers (``GPU`` resource).

        Work is partitioned into (kernel block x problem block) tasks, ``kernels_per_task`` x ``problems_per_task``
        (default: one kernel on as many problems as leaves at least ``TASKS_PER_GPU`` tasks per GPU), so no pair is
        measured twice, a kernel's module loads on few GPUs, idle GPUs steal the remaining tasks and the last tasks
        are short. A task goes to the worker that compiled (or was sent) its kernels, with
        no binary; where no worker holds them it carries them, and a task that ran elsewhere (stolen, or its worker
        was lost) is sent again with them. Rows already in the DB are not submitted again. Pairs are measured once
        per sweep on whichever GPU takes them: give GPUs of different models their own sweeps (or resources) to rank
        them separately. ``DistributedSummary.breakdown`` says where the time went per (worker, GPU)."""
        from ..cache.current import CacheState
        from ..compiler.manager import Compiler
        from .bench import BenchConfig
        from .progress import progress_bar as _progress
        from .runner import baseline_labels, baseline_request, operations_by_kind, problem_kinds

        for name, value in (("kernels_per_task", kernels_per_task), ("problems_per_task", problems_per_task)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ArgumentError(f"{name} must be a positive integer, got {value!r}")
        config = config or BenchConfig()
        resources = self._resources(GPU_RESOURCE, 1)
        if resources is None:
            raise ArgumentError(f"no Dask worker declares a {GPU_RESOURCE} resource (start GPU workers with "
                                f"`dask worker --resources GPU=1` or `dask cuda worker`)")
        start = time.perf_counter()
        compiler = Compiler.of(sweep.session)
        cache = CacheState.of(sweep.session).cache
        kernels = []
        operations = sweep.ready_operations()
        for op in operations:
            kinds = problem_kinds(op)
            if not kinds:
                continue
            key, resolved = compiler.key_and_target(op, sweep._target())
            if cache.lookup(key) is None:
                continue
            kernels.append({"name": op.name, "key": key, "operation": op, "target": resolved.name,
                            "backend": compiler.backend_for(op).name, "kernel_symbol": op.kernel_symbol,
                            "builder_symbol": op.builder_symbol, "kinds": kinds})
        harness = config.fingerprint
        done = {(r["kernel"], r["problem"]) for r in sweep.db.query(
            "select kernel, problem from runs where sweep = ? and harness = ?", [sweep.name, harness])}
        summary = DistributedSummary()
        breakdown = summary.breakdown
        workers = self.client.scheduler_info().get("workers", {})
        gpu_workers = {address for address, info in workers.items() if GPU_RESOURCE in (info.get("resources") or {})}
        every_worker_has_a_gpu = gpu_workers == set(workers)
        gpus = sum(int((info.get("resources") or {}).get(GPU_RESOURCE, 0)) for info in workers.values())
        by_key = {p.key: p for p in sweep.problems}
        futures: dict = {}  # future -> (kernel block, problem part, place, carried, the rows it owes)

        # Kernels no worker holds (compiled before, e.g. by a local sweep) go round robin over the GPUs: the first
        # task of such a block carries the binaries to the chosen worker; its other tasks are submitted when that one
        # is done, to the worker that then holds them, without binaries.
        turns = [address for address in sorted(gpu_workers)
                 for _ in range(max(1, int(workers[address]["resources"][GPU_RESOURCE])))]
        turn = iter(range(1 << 62))
        deferred: dict[tuple, list] = {}  # kernel names of a carried block -> its other problem blocks

        def holder_of(block: list[dict]) -> str | None:
            holders = {self.holders.get(k["name"]) for k in block}
            place = holders.pop() if len(holders) == 1 else None
            return place if place in gpu_workers else None

        def submit(block: list[dict], part: list, carry: bool, place: str | None = None):
            """Submit a task for ``block`` x ``part``: on the worker holding the block's kernels, without their
            binaries, or (``carry``) with them, on ``place`` (a worker that has asked for them, else the next turn)."""
            if not carry:
                place = holder_of(block)
                carry = place is None
            if carry and place is None and turns:
                place = turns[next(turn) % len(turns)]
            if carry:
                summary.binaries_sent += len(block)
            payload = [_with_binary(k, cache) if carry else k for k in block]
            if every_worker_has_a_gpu:  # the holder first; any other may steal it
                where = dict(workers=[place] if place else None, allow_other_workers=place is not None)
            else:
                # Dask lets a loosely placed task be stolen by any worker, resources aside (a compile worker then
                # fails on the GPU resource it lacks), so here any GPU worker may take it, with no preference: one
                # that lacks the binaries says so and gets them
                where = dict(workers=sorted(gpu_workers))
            future = self.client.submit(benchmark_task, payload, [p.to_dict() for p in part], harness, timeout,
                                        worker_main, resources=resources, retries=self.retries, pure=False, **where)
            futures[future] = (block, part, place, carry, [(k["name"], p.to_dict()) for k in block for p in part])
            return future

        # The torch baselines first (they need no binary; any GPU takes them), a problem block per task.
        if baseline:
            owed = []
            by_kind = operations_by_kind(operations)
            for problem in sweep.problems:
                for labels in baseline_labels(problem, by_kind.get(problem.kind, [])):
                    name, request = baseline_request(sweep, problem, *labels)
                    if (name, problem.key) in done:
                        summary.skipped += 1
                        continue
                    owed.append({"name": name, "problem": request[1], "labels": list(request[2:])})
            per_task = max(1, math.ceil(len(owed) / max(1, TASKS_PER_GPU * max(1, gpus))))
            for first in range(0, len(owed), per_task):
                chunk = owed[first:first + per_task]
                future = self.client.submit(baseline_task, chunk, harness, timeout, worker_main,
                                            resources=resources, retries=self.retries, pure=False)
                futures[future] = ([], [], None, False, [(b["name"], b["problem"]) for b in chunk])
                summary.submitted += len(chunk)
                summary.tasks += 1

        # Each operation is timed on the problems of its kinds (GEMM, grouped, masked, Conv2d): kernels that pair
        # with the same kinds share the problem blocks.
        groups: dict[tuple, list] = {}
        for kernel in kernels:
            groups.setdefault(kernel["kinds"], []).append(kernel)
        for kinds, group in groups.items():
            problems = [p for p in sweep.problems if p.kind in kinds]
            step = problems_per_task
            if step is None:  # enough tasks that the last ones are short: at least TASKS_PER_GPU per GPU
                kernel_blocks = max(1, math.ceil(len(kernels) / kernels_per_task))
                blocks = min(len(problems), max(1, math.ceil(TASKS_PER_GPU * max(1, gpus) / kernel_blocks)))
                step = max(1, math.ceil(len(problems) / max(1, blocks)))
            for first in range(0, len(group), kernels_per_task):
                block = group[first:first + kernels_per_task]
                for begin in range(0, len(problems), step):
                    part = problems[begin:begin + step]
                    todo = [k for k in block if any((k["name"], p.key) not in done for p in part)]
                    summary.skipped += sum((k["name"], p.key) in done for k in block for p in part)
                    if not todo:
                        continue
                    summary.submitted += len(todo) * len(part)
                    summary.tasks += 1
                    names = tuple(k["name"] for k in todo)
                    if holder_of(todo) is None and names in deferred:
                        deferred[names].append((todo, part))  # after the task that brings the binaries
                        continue
                    if holder_of(todo) is None:
                        deferred[names] = []
                    submit(todo, part, carry=False)
        breakdown.setup = time.perf_counter() - start
        bar = _progress(summary.submitted, "benchmark (dask)", progress)
        devices: dict[str, str] = {}
        lines: dict[str, WorkerTimes] = {}
        last_seen: dict[str, float] = {}
        with _collecting(self.client, futures, bar, summary, start) as finished:
            for future in finished:
                block, part, place, carried, owed = futures.pop(future)
                try:
                    result = future.result()
                except Exception as exc:  # e.g. KilledWorker: the task took down workers repeatedly
                    result = {"worker": "?", "rows": [
                        {"kernel": name, "problem": problem, "facts": {"host": "?", "uuid": ""},
                         "measurement": {"status": "failed", "message": f"{type(exc).__name__}: {exc}"}}
                        for name, problem in owed]}
                if "missing" in result:  # it ran where the binaries are not (stolen, or its worker was lost):
                    summary.resent += 1  # send it again with them, to the worker that asked
                    finished.add(submit(block, part, carry=True, place=result["worker"]))
                    continue
                if result["worker"] == place and not carried:
                    summary.placed += 1
                for name in result.get("held", ()):
                    self.holders[name] = result["worker"]
                for later, later_part in deferred.pop(tuple(k["name"] for k in block), ()):
                    finished.add(submit(later, later_part, carry=False))  # where the binaries now are
                if "times" in result:
                    label = f"{result['worker']}/gpu{result['gpu']}"
                    line = lines.setdefault(label, WorkerTimes(label))
                    line.requests += result["times"]["requests"]
                    line.tasks += result["times"]["tasks"]
                    line.kernels += result["times"]["kernels"]
                    line.add_phases(result["times"]["phases"])
                    last_seen[label] = time.perf_counter()
                runs = []
                for row in result["rows"]:
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
                began = time.perf_counter()
                sweep.db.record_runs(runs)  # one commit per task: the single writer keeps up at scale
                breakdown.write += time.perf_counter() - began
                breakdown.rows_written += len(runs)
                breakdown.commits += 1
                summary.done += len(runs)
                bar.update(len(runs))
        end = time.perf_counter()
        breakdown.wall = end - start
        for label, line in sorted(lines.items()):  # the client's view: a GPU not running a task of ours waited
            line.wall = breakdown.wall
            line.idle = max(0.0, line.wall - line.requests)
            line.tail = end - last_seen[label]
            breakdown.workers.append(line)
        return summary


def _with_binary(kernel: dict, cache) -> dict:
    """The kernel with its binary from the client's artifact cache (sent where no worker holds it)."""
    return {**kernel, "binary": cache.lookup(kernel["key"]).binary}


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
