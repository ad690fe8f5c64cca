"""Benchmark a sweep in worker processes, one per GPU, that a faulting or hanging kernel cannot take down.

A kernel that raises a CUDA error poisons its context (and a hang never returns): each GPU's work runs in a child
process that the parent kills and restarts when a task fails that way or passes its timeout. The parent writes each
finished row at once, skips rows already in the DB (resume), and stops within a moment on Ctrl-C.
"""
from __future__ import annotations

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

log = logging.getLogger("pycutlass.tune")
_POLL_SECONDS = 0.5  # how often a waiting parent looks for Ctrl-C


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


def _worker_main(conn, ordinal: int, session_options: dict, config_json: str, prepare_session=None) -> None:
    """Serve tasks until told to stop: ``("facts",)``, ``("adopt", op, target, binary, ...)``,
    ``("kernel", op, problem_dict)``, ``("baseline", problem_dict, a_label, c_label)``. ``prepare_session``
    (picklable, called with the worker's session before the first task) readies it, e.g. adopts a bundle's
    binaries (:func:`pycutlass.tune.bundle.run_bundle`)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops us cleanly
    import torch

    from ..session import Session
    from .bench import GemmBench, measure_gemm, measure_torch
    from .problems import problem_from_dict

    # The parent pinned this process to its GPU with CUDA_VISIBLE_DEVICES: it is device 0 here.
    torch.cuda.set_device(0)
    session = Session(**{**session_options, "device": 0})
    if prepare_session is not None:
        prepare_session(session)
    bench = GemmBench(BenchConfig.from_json(config_json), 0)
    while True:
        message = conn.recv()
        if message is None:
            return
        try:
            if message[0] == "facts":
                reply = _device_facts(0)
            elif message[0] == "adopt":  # a binary compiled elsewhere (a Dask compile worker)
                from ..compiler.manager import Compiler

                _, operation, target, binary, backend, kernel_symbol, builder_symbol = message
                Compiler.of(session).adopt(operation, target, binary, backend, kernel_symbol, builder_symbol)
                reply = {"adopted": operation.name}
            elif message[0] == "kernel":
                _, operation, problem = message
                measurement, resources = measure_gemm(bench, operation, problem_from_dict(problem), session)
                reply = {"measurement": measurement.__dict__, "resources": resources}
            else:
                _, problem, a_label, c_label = message
                measurement = measure_torch(bench, problem_from_dict(problem), a_label, c_label=c_label)
                reply = {"measurement": measurement.__dict__}
        except Exception as exc:  # the row says what failed
            reply = {"error": f"{type(exc).__name__}: {exc}"}
            if not _context_usable(torch):  # a fault is sticky: every later launch would fail too
                conn.send({**reply, "fatal": True})
                os._exit(70)  # the parent starts a fresh process for the next task
        conn.send(reply)


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

    def _start(self) -> None:
        # A fresh interpreter (not fork: it would inherit a CUDA context; not multiprocessing's spawn: it re-runs
        # the user's script when that has no __main__ guard, and daemonic Dask workers may not use it), talking
        # over a socket pair. Pinned to its GPU: it sees one device (ordinal 0) and can touch no other.
        parent, child = socket.socketpair()
        environment = {**os.environ, "CUDA_VISIBLE_DEVICES": physical_gpu(self.ordinal,
                                                                         os.environ.get("CUDA_VISIBLE_DEVICES")),
                       "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", "from pycutlass.tune.runner import child_entry; child_entry()",
                 str(child.fileno())], pass_fds=[child.fileno()], env=environment, stdin=subprocess.DEVNULL)
        finally:
            child.close()
        self._conn = Connection(parent.detach())
        self._conn.send((self._main, self._args))  # the worker function and its arguments, pickled by reference

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


def run_sweep(sweep, *, config: BenchConfig | None = None, devices=None, timeout: float = 120.0,
              progress: bool | None = None, baseline: bool = True, prepare_session=None,
              operations=None, worker_main=None) -> BenchSummary:
    """Time ``sweep``'s compiled operations on its problems; one worker per device, rows written as they finish.
    ``prepare_session``: a picklable ``f(session)`` each worker calls on its session first (see ``_worker_main``)."""
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
    device_ids = {}
    harness = config.fingerprint
    try:
        models = {}
        for worker in workers:  # facts first: a device row is part of every run's key
            facts = worker.request(("facts",), timeout, stop)
            device_ids[worker.ordinal] = sweep.db.add_device(facts)
            models.setdefault(facts.get("name", ""), []).append(worker.ordinal)
        tasks = _tasks(sweep, operations, baseline)
        # One queue per GPU model: GPUs of one model share the pairs (each measured once, idle ones take the next);
        # each model measures every pair, so rankings of different GPUs never mix. Resume: a pair measured before
        # on any GPU of that model (same sweep and harness) is not measured again.
        queues, distinct = {}, []
        for ordinals in models.values():
            ids = sorted({device_ids[o] for o in ordinals})
            done = {(r["kernel"], r["problem"]) for r in sweep.db.query(
                f"select kernel, problem from runs where sweep = ? and harness = ? and device in "
                f"({','.join('?' * len(ids))})", [sweep.name, harness, *ids])}
            pending = queue.Queue()
            for task in tasks:
                if (task[0], task[1].key) in done:
                    summary.skipped += 1
                else:
                    pending.put(task)
            distinct.append(pending)
            for ordinal in ordinals:
                queues[ordinal] = pending
        bar = _progress(sum(q.qsize() for q in distinct), "benchmark", progress)
        lock = threading.Lock()

        def serve(worker: Worker) -> None:
            device = device_ids[worker.ordinal]
            pending = queues[worker.ordinal]
            while not stop.is_set():
                try:
                    kernel, problem, message = pending.get_nowait()
                except queue.Empty:
                    return
                try:
                    reply = worker.request(message, timeout, stop)
                except WorkerLost as lost:
                    if stop.is_set():  # stopped by Ctrl-C, not by the kernel: record nothing
                        return
                    status = "timeout" if "timed out" in str(lost) else "failed"
                    reply = {"measurement": {"status": status, "message": str(lost)}}
                except KeyboardInterrupt:
                    return
                if "error" in reply:
                    reply = {"measurement": {"status": "failed", "message": reply["error"]}}
                m = reply["measurement"]
                sweep.db.record_run(sweep=sweep.name, device=device, kernel=kernel, problem=problem.key,
                                    harness=harness, status=m["status"], seconds=m.get("seconds"),
                                    seconds_min=m.get("seconds_min"), seconds_iqr=m.get("seconds_iqr"),
                                    repetitions=m.get("repetitions", 0), flops=problem.flops,
                                    rel_error=m.get("rel_error"), message=m.get("message", ""),
                                    worker=f"{platform.node()}/gpu{worker.ordinal}")
                if reply.get("resources"):
                    sweep.db.record_resources(kernel, device, reply["resources"])
                with lock:
                    summary.done += 1
                    summary.statuses[m["status"]] = summary.statuses.get(m["status"], 0) + 1
                bar.update(1)

        threads = [threading.Thread(target=serve, args=(w,), daemon=True) for w in workers]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(_POLL_SECONDS)
        except KeyboardInterrupt:
            stop.set()
            for thread in threads:
                thread.join(5.0)
            raise
        finally:
            bar.close()
    finally:
        for worker in workers:
            worker.stop()
            summary.restarts += worker.restarts
        summary.seconds = time.perf_counter() - start
    log.info("sweep %s benchmark: %s", sweep.name, summary)
    return summary


def _times_as_gemm(operation) -> bool:
    """GEMM operations (Sm80 and SM90 families); grouped GEMM and conv have their own benchmarks."""
    from ..kinds import GemmOperationUniversal

    return isinstance(operation, GemmOperationUniversal)


def _tasks(sweep, operations, baseline: bool) -> list:
    """Problem-major order (inputs are reused across kernels), each problem's baseline first."""
    tasks = []
    operations = [op for op in operations if _times_as_gemm(op)]
    for problem in sweep.problems:
        if problem.kind != "gemm":
            continue  # the harness times GEMM problems; other kinds are recorded by their own benchmarks
        labels = []
        for op in operations:
            math_inst = op.tile_description.math_instruction
            pair = (element_label(math_inst.element_a), element_label(op.C.element))
            if pair not in labels:
                labels.append(pair)
        if baseline:
            for a_label, c_label in labels:
                name = sweep.db.add_baseline(baseline_name(a_label, c_label),
                                             f"torch (cuBLAS) {a_label} -> {c_label}, A row-major, B column-major")
                tasks.append((name, problem, ("baseline", problem.to_dict(), a_label, c_label)))
        for op in operations:
            tasks.append((op.name, problem, ("kernel", op, problem.to_dict())))
    return tasks
