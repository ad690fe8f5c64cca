"""Benchmark a sweep in worker processes, one per GPU, that a faulting or hanging kernel cannot take down.

A kernel that raises a CUDA error poisons its context (and a hang never returns): each GPU's work runs in a child
process that the parent kills and restarts when a task fails that way or passes its timeout. The workers start at
once; each takes whole kernels (its modules load on one GPU) and, at the end, single pairs of the others' kernels
(``PairPlan``). The parent commits finished rows from a writer thread of its own, skips rows already in the DB
(resume), stops within a moment on Ctrl-C, and records where the time went (``BenchSummary.breakdown``).
"""
from __future__ import annotations

import collections
import logging
import os
import platform
import queue
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from dataclasses import dataclass, field

from ..errors import ArgumentError, NoGpuError
from .bench import BenchConfig, element_label
from .breakdown import Breakdown, Timeline, WorkerTimes

log = logging.getLogger("pycutlass.tune")
_POLL_SECONDS = 0.5  # how often a waiting parent looks for Ctrl-C
SPAWNED_AT = "PYCUTLASS_WORKER_SPAWNED_AT"  # the parent's time.monotonic() when it started a worker process


# --- the worker process ---------------------------------------------------------------------------------------
def _device_facts(ordinal: int) -> dict:
    import torch

    from ..compiler import toolchain
    from .db import pycutlass_version

    props = torch.cuda.get_device_properties(ordinal)
    facts = {"name": props.name, "uuid": str(getattr(props, "uuid", "")), "compute_capability":
             props.major * 10 + props.minor, "sm_count": props.multi_processor_count,
             "l2_bytes": getattr(props, "L2_cache_size", None), "cuda_runtime": torch.version.cuda,
             "pycutlass": pycutlass_version(), "torch": torch.__version__, "host": platform.node()}
    try:
        facts["cutlass"] = toolchain.cutlass_version()
    except Exception:
        facts["cutlass"] = None
    try:
        from cuda.bindings import driver as cu

        cu.cuInit(0)
        _, version = cu.cuDriverGetVersion()
        facts["driver_api"] = int(version)
        _, dev = cu.cuDeviceGet(ordinal)
        attr = cu.CUdevice_attribute
        _, clock = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev)
        _, mem_clock = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, dev)
        facts["sm_clock_mhz"], facts["memory_clock_mhz"] = int(clock) // 1000, int(mem_clock) // 1000
    except Exception:
        pass
    try:  # the driver's own version string, as nvidia-smi shows it
        import ctypes

        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        nvml.nvmlInit_v2()
        buffer = ctypes.create_string_buffer(96)
        if nvml.nvmlSystemGetDriverVersion(buffer, 96) == 0:
            facts["driver"] = buffer.value.decode()
    except Exception:
        facts.setdefault("driver", str(facts.get("driver_api", "")))
    return facts


def spawn_seconds() -> float:
    """Seconds since the parent started this worker process (interpreter start and imports), from the time it
    passed in the environment (CLOCK_MONOTONIC, shared by the processes of a host); 0 when unknown."""
    try:
        return max(0.0, time.monotonic() - float(os.environ[SPAWNED_AT]))
    except (KeyError, ValueError):
        return 0.0


def _worker_main(conn, ordinal: int, session_options: dict, config_json: str, prepare_session=None) -> None:
    """Serve tasks until told to stop: ``("facts",)``, ``("adopt", op, target, binary, ...)``,
    ``("kernel", op, problem_dict)``, ``("baseline", problem_dict, a_label, c_label)``. ``prepare_session``
    (picklable, called with the worker's session before the first task) readies it, e.g. adopts a bundle's
    binaries (:func:`pycutlass.tune.bundle.run_bundle`). Every reply carries ``phases``: the seconds spent per phase
    since the previous reply (:mod:`pycutlass.tune.breakdown`)."""
    import signal

    from .breakdown import PhaseClock

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops us cleanly
    clock = PhaseClock()
    clock.add("startup", spawn_seconds())
    with clock.phase("startup"):
        import torch

        from ..session import Session
        from .bench import GemmBench, worker_cache_bytes

        # The parent pinned this process to its GPU with CUDA_VISIBLE_DEVICES: it is device 0 here.
        torch.cuda.set_device(0)
        session = Session(**{**session_options, "device": 0})
        if prepare_session is not None:
            prepare_session(session)
        bench = GemmBench(BenchConfig.from_json(config_json), 0, clock=clock, cache_bytes=worker_cache_bytes(0))
    while True:
        message = conn.recv()
        if message is None:
            return
        with clock.phase("other"):
            reply = _serve_one(message, session, bench, torch)
        reply["phases"] = clock.take()
        if reply.get("fatal"):
            conn.send(reply)
            os._exit(70)  # the parent starts a fresh process for the next task
        conn.send(reply)


def _serve_one(message, session, bench, torch) -> dict:
    from .bench import measure_baseline, measure_kernel
    from .problems import problem_from_dict

    try:
        if message[0] == "facts":
            return _device_facts(0)
        if message[0] == "adopt":  # a binary compiled elsewhere (a Dask compile worker)
            from ..compiler.manager import Compiler

            _, operation, target, binary, backend, kernel_symbol, builder_symbol = message
            Compiler.of(session).adopt(operation, target, binary, backend, kernel_symbol, builder_symbol)
            return {"adopted": operation.name}
        if message[0] == "kernel":
            _, operation, problem = message
            measurement, resources = measure_kernel(bench, operation, problem_from_dict(problem), session)
            return {"measurement": measurement.__dict__, "resources": resources}
        _, problem, a_label, c_label, *conv_kind = message
        measurement = measure_baseline(bench, problem_from_dict(problem), a_label, c_label, *conv_kind)
        return {"measurement": measurement.__dict__}
    except Exception as exc:  # the row says what failed
        reply = {"error": f"{type(exc).__name__}: {exc}"}
        if not _context_usable(torch):  # a fault is sticky: every later launch would fail too
            reply["fatal"] = True
        return reply


def _context_usable(torch) -> bool:
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return True
    except Exception:
        return False


def child_entry() -> None:
    """The worker process's entry: receive the worker function and its arguments, then serve."""
    fd = int(sys.argv[1])
    conn = Connection(fd)
    try:
        main, args = conn.recv()
    except EOFError:
        return
    try:
        main(conn, *args)
    except EOFError:  # the parent went away
        pass


# --- the parent's side ----------------------------------------------------------------------------------------
def physical_gpu(ordinal: int, visible: str | None) -> str:
    """The CUDA_VISIBLE_DEVICES entry for this process's GPU ``ordinal`` (respecting the parent's own list)."""
    if not visible:
        return str(ordinal)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if ordinal >= len(entries):
        raise ArgumentError(f"GPU {ordinal} is not visible (CUDA_VISIBLE_DEVICES={visible!r})")
    return entries[ordinal]


class WorkerLost(Exception):
    """The worker died or passed its timeout; it has been stopped and will be restarted."""


class Worker:
    """One GPU's worker process, restarted on demand."""

    def __init__(self, ordinal: int, session_options: dict, config: BenchConfig, prepare_session=None,
                 main=None):
        self.ordinal = ordinal
        self._main = main or _worker_main  # tests substitute a stand-in that needs no GPU
        self._args = (ordinal, session_options, config.fingerprint, prepare_session)
        self._process = None
        self._conn = None
        self.restarts = 0
        self.generation = 0  # processes started so far: a new one has been told nothing

    def _start(self) -> None:
        # A fresh interpreter (not fork: it would inherit a CUDA context; not multiprocessing's spawn: it re-runs
        # the user's script when that has no __main__ guard, and daemonic Dask workers may not use it), talking
        # over a socket pair. Pinned to its GPU: it sees one device (ordinal 0) and can touch no other.
        self.generation += 1
        parent, child = socket.socketpair()
        environment = {**os.environ, "CUDA_VISIBLE_DEVICES": physical_gpu(self.ordinal,
                                                                         os.environ.get("CUDA_VISIBLE_DEVICES")),
                       "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), SPAWNED_AT: repr(time.monotonic())}
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", "from pycutlass.tune.runner import child_entry; child_entry()",
                 str(child.fileno())], pass_fds=[child.fileno()], env=environment, stdin=subprocess.DEVNULL)
        finally:
            child.close()
        self._conn = Connection(parent.detach())
        self._conn.send((self._main, self._args))  # the worker function and its arguments, pickled by reference

    def start(self) -> None:
        """Start the process now (it readies itself while the parent starts the others); requests start it too."""
        if self._process is None or self._process.poll() is not None:
            self._start()

    def request(self, message, timeout: float, stop: threading.Event):
        if self._process is None or self._process.poll() is not None:
            self._start()
        try:
            self._conn.send(message)
        except OSError:  # it died between tasks: the message never arrived, so send it to a fresh process
            self._lost()
            self._start()
            self._conn.send(message)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._conn.poll(_POLL_SECONDS):
                    reply = self._conn.recv()
                    if reply.get("fatal"):  # the worker's context is poisoned and it is exiting: replace it
                        self._lost()
                    return reply
            except (EOFError, OSError):
                self._lost()
                raise WorkerLost("the worker process died (a kernel fault or a crash)") from None
            if stop.is_set():
                self.stop()
                raise KeyboardInterrupt
            if self._process.poll() is not None:
                code = self._process.returncode
                self._lost()
                raise WorkerLost(f"the worker process died (exit code {code})")
            if time.monotonic() > deadline:
                self._lost()
                raise WorkerLost(f"timed out after {timeout:.0f} s (killed)")

    def _lost(self) -> None:
        """Kill the worker after a fault or a timeout; the next request starts a fresh one."""
        self.restarts += 1
        self.stop()

    def stop(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                try:
                    self._conn.send(None)
                except OSError:
                    pass
                try:
                    self._process.wait(1.0)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait(5.0)
            self._conn.close()
        self._process = None


@dataclass
class BenchSummary:
    done: int = 0
    skipped: int = 0  # already in the DB
    statuses: dict = field(default_factory=dict)
    restarts: int = 0
    seconds: float = 0.0
    breakdown: Breakdown = field(default_factory=Breakdown)  # where the time went, per worker and phase

    def __str__(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.statuses.items()))
        return (f"{self.done} measured ({counts or 'none'}), {self.skipped} already in the DB, {self.restarts} worker "
                f"restarts, {self.seconds:.1f} s")


def visible_gpus() -> list[int]:
    from ..compiler.target import detected_compute_capability

    found, ordinal = [], 0
    while detected_compute_capability(ordinal) is not None:
        found.append(ordinal)
        ordinal += 1
    return found


def baseline_name(a_label: str, c_label: str) -> str:
    return f"torch.matmul[{a_label}->{c_label}]"


def grouped_baseline_name(a_label: str, c_label: str) -> str:
    return f"torch.grouped[{a_label}->{c_label}]"


def conv_baseline_name(conv_kind: str, a_label: str, c_label: str) -> str:
    return f"torch.conv2d.{conv_kind}[{a_label}->{c_label}]"


class PairPlan:
    """The pairs that the workers of one GPU model share, handed out one at a time, grouped by kernel.

    A worker takes a whole kernel (every problem) while untaken kernels remain, so each kernel's module is loaded on
    one GPU only and the workers' per-kernel costs do not add up. A worker with nothing left takes pairs from the far
    end of the kernel with the most pairs left (its owner works from the near end), so no worker waits while pairs
    remain: the tail is at most one pair per worker. Alternate kernels run the problems in reverse order, so a
    worker's operand cache still holds the problems it meets first when it cannot hold them all."""

    def __init__(self, tasks):
        groups: dict[str, list] = {}
        for task in tasks:
            groups.setdefault(task[0], []).append(task)
        self._groups = [collections.deque(g if i % 2 == 0 else reversed(g)) for i, g in enumerate(groups.values())]
        self._untaken = collections.deque(range(len(self._groups)))
        self._current: dict = {}  # worker -> (group index, from the far end)
        self._lock = threading.Lock()
        self.stolen: collections.Counter = collections.Counter()  # worker -> pairs taken from another's kernel
        self.kernels: dict = collections.defaultdict(set)  # worker -> kernels it was given

    def __len__(self) -> int:
        with self._lock:
            return sum(len(g) for g in self._groups)

    def next(self, worker):
        """The next (kernel, problem, message) for ``worker``, or None when every pair is handed out."""
        with self._lock:
            index, far = self._current.get(worker, (None, False))
            if index is None or not self._groups[index]:
                index, far = None, False
                while self._untaken:
                    candidate = self._untaken.popleft()
                    if self._groups[candidate]:
                        index = candidate
                        break
                if index is None:  # every kernel is taken: help the one with the most pairs left
                    index = max(range(len(self._groups)), key=lambda i: len(self._groups[i]), default=None)
                    if index is None or not self._groups[index]:
                        self._current.pop(worker, None)
                        return None
                    far = True
                self._current[worker] = (index, far)
            group = self._groups[index]
            task = group.pop() if far else group.popleft()
            if far:
                self.stolen[worker] += 1
            self.kernels[worker].add(task[0])
            return task


class _RowWriter:
    """The parent's one DB writer: serving threads queue rows, a thread of its own commits whatever has queued up in
    one transaction, so no GPU waits for SQLite (rows are committed within a commit of being measured)."""

    def __init__(self, db):
        self.db = db
        self.seconds = 0.0
        self.rows = 0
        self.commits = 0
        self.error: BaseException | None = None
        self._queue: queue.Queue = queue.Queue()
        self._resources_written: set = set()
        self._thread = threading.Thread(target=self._run, name="pycutlass-sweep-writer", daemon=True)
        self._thread.start()

    def put(self, run: dict, resources: dict | None) -> None:
        if self.error is not None:
            raise self.error
        self._queue.put((run, resources))

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, finished = [first], False
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    finished = True
                    break
                batch.append(item)
            if self.error is None:
                start = time.perf_counter()
                try:
                    self.db.record_runs([run for run, _ in batch])
                    for run, resources in batch:  # per kernel and device: once is enough
                        if resources and (run["kernel"], run["device"]) not in self._resources_written:
                            self.db.record_resources(run["kernel"], run["device"], resources)
                            self._resources_written.add((run["kernel"], run["device"]))
                    self.rows += len(batch)
                    self.commits += 1
                except BaseException as exc:  # noqa: BLE001 - raised in the serving threads and at close
                    self.error = exc
                self.seconds += time.perf_counter() - start
            if finished:
                return

    def close(self) -> None:
        """Commit what is queued and stop; raise what writing failed with."""
        self._queue.put(None)
        self._thread.join()
        if self.error is not None:
            raise self.error


def run_sweep(sweep, *, config: BenchConfig | None = None, devices=None, timeout: float = 120.0,
              progress: bool | None = None, baseline: bool = True, prepare_session=None,
              operations=None, worker_main=None) -> BenchSummary:
    """Time ``sweep``'s compiled operations on its problems; one worker per device, rows written as they finish.
    ``prepare_session``: a picklable ``f(session)`` each worker calls on its session first (see ``_worker_main``).
    ``BenchSummary.breakdown`` says where the time went, per worker and phase."""
    from .progress import progress_bar as _progress

    config = config or BenchConfig()
    if not isinstance(config, BenchConfig):
        raise ArgumentError(f"config must be a BenchConfig, got {type(config).__name__}")
    devices = visible_gpus() if devices is None else list(devices)
    if not devices:
        raise NoGpuError("benchmarking needs a GPU: none is visible (compile-only sweeps run anywhere)")
    if not sweep.problems:
        raise ArgumentError("the sweep has no problems to benchmark")
    operations = sweep.ready_operations() if operations is None else list(operations)
    start = time.perf_counter()
    options = {k: v for k, v in sweep.session.options.items() if k in ("backend", "target", "cache_path")}
    workers = [Worker(d, options, config, prepare_session, worker_main) for d in devices]
    stop = threading.Event()
    summary = BenchSummary()
    breakdown = summary.breakdown
    lines = {w.ordinal: Timeline(WorkerTimes(f"{platform.node()}/gpu{w.ordinal}"), start) for w in workers}
    device_ids = {}
    harness = config.fingerprint
    writer, plans = None, {}
    try:
        for worker in workers:  # all start at once: their imports and CUDA contexts overlap
            worker.start()
        facts = _gather_facts(workers, lines, timeout, stop)
        setup_start = time.perf_counter()
        models = {}
        for worker in workers:  # a device row is part of every run's key
            device_ids[worker.ordinal] = sweep.db.add_device(facts[worker.ordinal])
            models.setdefault(facts[worker.ordinal].get("name", ""), []).append(worker.ordinal)
        tasks = _tasks(sweep, operations, baseline)
        # One plan per GPU model: GPUs of one model share the pairs (each measured once, idle ones take the next);
        # each model measures every pair, so rankings of different GPUs never mix. Resume: a pair measured before
        # on any GPU of that model (same sweep and harness) is not measured again.
        distinct = []
        for ordinals in models.values():
            ids = sorted({device_ids[o] for o in ordinals})
            done = {(r["kernel"], r["problem"]) for r in sweep.db.query(
                f"select kernel, problem from runs where sweep = ? and harness = ? and device in "
                f"({','.join('?' * len(ids))})", [sweep.name, harness, *ids])}
            pending = [task for task in tasks if (task[0], task[1].key) not in done]
            summary.skipped += len(tasks) - len(pending)
            plan = PairPlan(pending)
            distinct.append(plan)
            for ordinal in ordinals:
                plans[ordinal] = plan
        breakdown.setup = time.perf_counter() - setup_start
        bar = _progress(sum(len(p) for p in distinct), "benchmark", progress)
        lock = threading.Lock()
        writer = _RowWriter(sweep.db)

        def serve(worker: Worker) -> None:
            device = device_ids[worker.ordinal]
            plan = plans[worker.ordinal]
            line = lines[worker.ordinal]
            line.mark("idle")  # waiting for the other workers to start and for the plan
            while not stop.is_set():
                task = plan.next(worker.ordinal)
                if task is None:
                    return
                kernel, problem, message = task
                line.mark("parent")
                try:
                    reply = worker.request(message, timeout, stop)
                except WorkerLost as lost:
                    line.times.add_phases({"lost": line.mark("requests")})
                    if stop.is_set():  # stopped by Ctrl-C, not by the kernel: record nothing
                        return
                    status = "timeout" if "timed out" in str(lost) else "failed"
                    reply = {"measurement": {"status": status, "message": str(lost)}}
                except KeyboardInterrupt:
                    return
                else:
                    line.mark("requests")
                    line.times.add_phases(reply.get("phases"))
                line.times.tasks += 1
                if "error" in reply:
                    reply = {"measurement": {"status": "failed", "message": reply["error"]}}
                m = reply["measurement"]
                writer.put(dict(sweep=sweep.name, device=device, kernel=kernel, problem=problem.key,
                                harness=harness, status=m["status"], seconds=m.get("seconds"),
                                seconds_min=m.get("seconds_min"), seconds_iqr=m.get("seconds_iqr"),
                                repetitions=m.get("repetitions", 0), flops=problem.flops,
                                rel_error=m.get("rel_error"), message=m.get("message", ""),
                                worker=f"{platform.node()}/gpu{worker.ordinal}"), reply.get("resources"))
                with lock:
                    summary.done += 1
                    summary.statuses[m["status"]] = summary.statuses.get(m["status"], 0) + 1
                bar.update(1)
                line.mark("parent")

        try:
            _run_threads([threading.Thread(target=serve, args=(w,), daemon=True) for w in workers], stop,
                         settle=5.0)
        finally:
            bar.close()
    finally:
        work_end = time.perf_counter()  # the workers' part ends here; then the last commit and stopping them
        if writer is not None:  # what was measured is committed, Ctrl-C or not
            writer.close()
            breakdown.write, breakdown.rows_written, breakdown.commits = writer.seconds, writer.rows, writer.commits
        for worker in workers:
            worker.stop()
            summary.restarts += worker.restarts
        end = time.perf_counter()
        summary.seconds = breakdown.wall = end - start
        breakdown.teardown = end - work_end
        for worker in workers:
            line = lines[worker.ordinal]
            line.finish(work_end)
            plan = plans.get(worker.ordinal)
            if plan is not None:
                line.times.kernels = len(plan.kernels.get(worker.ordinal, ()))
                line.times.stolen = plan.stolen.get(worker.ordinal, 0)
            breakdown.workers.append(line.times)
    log.info("sweep %s benchmark: %s", sweep.name, summary)
    return summary


def _gather_facts(workers, lines, timeout: float, stop: threading.Event) -> dict:
    """Every worker's device facts, asked in parallel (each reply waits for that worker's start-up)."""
    facts, errors = {}, []

    def ask(worker: Worker) -> None:
        try:
            reply = worker.request(("facts",), timeout, stop)
            lines[worker.ordinal].mark("requests")
            lines[worker.ordinal].times.add_phases(reply.pop("phases", None))
            facts[worker.ordinal] = reply
        except BaseException as exc:  # noqa: BLE001 - raised in the calling thread
            errors.append(exc)

    _run_threads([threading.Thread(target=ask, args=(w,), daemon=True) for w in workers], stop)
    if errors:
        raise errors[0]
    return facts


def _times_as_gemm(operation) -> bool:
    """GEMM operations (Sm80 and SM90 families); grouped GEMM and conv have their own benchmarks."""
    from ..kinds import GemmOperationUniversal

    return isinstance(operation, GemmOperationUniversal)


def _times_as_conv(operation) -> bool:
    from ..kinds import Conv2dOperation

    return isinstance(operation, Conv2dOperation)


def _times_as_grouped(operation) -> bool:
    from ..kinds import GemmOperationGrouped

    return isinstance(operation, GemmOperationGrouped)


def _times_as_masked(operation) -> bool:
    """The masked layout: SM90 grouped operations (device-side counts) with row-major A and C."""
    from ..description.types import LayoutType

    return _times_as_grouped(operation) and operation.family == "sm90" and \
        operation.A.layout is LayoutType.RowMajor and operation.C.layout is LayoutType.RowMajor


def _run_threads(threads, stop, settle: float = 0.0) -> None:
    """Start ``threads`` and wait for them in short joins, so Ctrl-C reaches this thread at once; on Ctrl-C set
    ``stop``, give each thread ``settle`` seconds to finish what it holds, and re-raise."""
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(_POLL_SECONDS)
    except KeyboardInterrupt:
        stop.set()
        for thread in threads:
            if settle:
                thread.join(settle)
        raise


def _baseline_row(kind: str, a_label: str, c_label: str, conv_kind: str | None) -> tuple[str, str]:
    """The baseline kernel's name and description for a problem kind."""
    if kind == "conv2d":
        return (conv_baseline_name(conv_kind, a_label, c_label),
                f"torch (cuDNN) {conv_kind} {a_label} -> {c_label}, channels-last")
    if kind in ("grouped_gemm", "masked_grouped_gemm"):
        return (grouped_baseline_name(a_label, c_label),
                f"torch grouped {a_label} -> {c_label}: torch._grouped_mm where it serves the problem, else a CUDA "
                f"graph of torch.matmul per group")
    return baseline_name(a_label, c_label), f"torch (cuBLAS) {a_label} -> {c_label}, A row-major, B column-major"


def problem_kinds(operation) -> tuple[str, ...]:
    """The kinds of problem an operation is timed on: GEMM operations GEMM problems, grouped operations grouped
    problems (and masked ones, the SM90 grouped operations that can take the layout), Conv2d operations Conv2d
    problems (each computing its own kind of convolution)."""
    if _times_as_gemm(operation):
        return ("gemm",)
    if _times_as_grouped(operation):
        return ("grouped_gemm", "masked_grouped_gemm") if _times_as_masked(operation) else ("grouped_gemm",)
    if _times_as_conv(operation):
        return ("conv2d",)
    return ()


def operations_by_kind(operations) -> dict[str, list]:
    """Problem kind -> the operations timed on it (``problem_kinds``), in the given order."""
    found: dict[str, list] = {}
    for op in operations:
        for kind in problem_kinds(op):
            found.setdefault(kind, []).append(op)
    return found


def baseline_labels(problem, operations) -> list[tuple[str, str, str | None]]:
    """(A type, C type, convolution kind or None) of the baselines a problem needs: one per such triple among
    ``operations``, those timed on it (``operations_by_kind``)."""
    labels = []
    for op in operations:
        math_inst = op.tile_description.math_instruction
        label = (element_label(math_inst.element_a), element_label(op.C.element),
                 op.conv_kind.name if problem.kind == "conv2d" else None)
        if label not in labels:
            labels.append(label)
    return labels


def baseline_request(sweep, problem, a_label: str, c_label: str, conv_kind: str | None) -> tuple[str, tuple]:
    """The baseline's row name (registered in the sweep's DB) and the worker's request for it."""
    name = sweep.db.add_baseline(*_baseline_row(problem.kind, a_label, c_label, conv_kind))
    extra = (conv_kind,) if conv_kind else ()
    return name, ("baseline", problem.to_dict(), a_label, c_label, *extra)


def _tasks(sweep, operations, baseline: bool) -> list:
    """Problem-major order (inputs are reused across kernels), each problem's baseline first (``problem_kinds``
    pairs operations with problems; each kind of convolution beside torch's own)."""
    tasks = []
    by_kind = operations_by_kind(operations)
    for problem in sweep.problems:
        kind_operations = by_kind.get(problem.kind, [])
        if baseline:
            for labels in baseline_labels(problem, kind_operations):
                name, request = baseline_request(sweep, problem, *labels)
                tasks.append((name, problem, request))
        for op in kind_operations:
            tasks.append((op.name, problem, ("kernel", op, problem.to_dict())))
    return tasks
