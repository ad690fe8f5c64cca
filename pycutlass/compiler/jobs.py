"""Runs translation units in compile worker processes: in parallel, with progress, and interruptible.

An interrupt (KeyboardInterrupt, as Jupyter's SIGINT to the Python process alone raises it) kills every worker's
process group at once and returns within a second, instead of waiting for running compilers to finish.

Workers are killed with SIGKILL, so they cannot clean up after themselves: every unit compiles in a folder of a
temporary directory this process owns (the workers' TMPDIR, so nvcc's own tmpxft files land there too), removed
whatever ends the compile: success, a failure, an exception, an interrupt, or SIGTERM (turned into SystemExit
while units compile, where SIGTERM would otherwise kill this process without any cleanup).
"""
from __future__ import annotations

import concurrent.futures as futures
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from ..errors import CompilationError

log = logging.getLogger("pycutlass.compiler")
# One line per finished unit where no progress bar shows; the command line prints this logger on a piped stderr.
progress_log = logging.getLogger("pycutlass.progress")


class _Children:
    """The worker processes alive now, so an interrupt can kill them all."""

    def __init__(self, workdir: str):
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self.stopping = False
        self.workdir = workdir

    def start(self, argv, unit_name: str) -> subprocess.Popen:
        with self._lock:
            if self.stopping:
                raise CompilationError("compile interrupted")
            unit_dir = os.path.join(self.workdir, unit_name)
            os.makedirs(unit_dir, exist_ok=True)
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, env={**os.environ, "TMPDIR": unit_dir})
            self._procs.add(proc)
            return proc

    def done(self, proc) -> None:
        with self._lock:
            self._procs.discard(proc)

    def kill_all(self) -> None:
        with self._lock:
            self.stopping = True
            procs = list(self._procs)
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in procs:  # reaped, so that nothing of theirs still writes into the folder being removed
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)


def _remove_tree(path: str) -> None:
    """Remove ``path``; a killed compiler's last file can appear just after a first pass, hence a few passes."""
    for _ in range(20):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        time.sleep(0.05)
    log.warning("could not remove the compile folder %s", path)


@contextlib.contextmanager
def _sigterm_raises_system_exit():
    """While units compile, SIGTERM raises SystemExit(143) in the main thread (so cleanup runs) where it would
    kill the process outright; a handler someone else installed is left alone."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminate(signum, frame):
        raise SystemExit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # a generator closed from another thread cannot restore it
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _compile_in_worker(children: _Children, backend, source: str, target, unit_name: str) -> bytes:
    arch = target.arch
    header = json.dumps({"backend": backend.name, "extra_flags": list(backend.extra_flags), "arch": arch,
                         "unit_name": unit_name})
    proc = children.start([sys.executable, "-m", "pycutlass.compiler.worker"], unit_name)
    try:
        out, err = proc.communicate(header.encode() + b"\n" + source.encode())
    finally:
        children.done(proc)
    if proc.returncode == 0 and out:
        return out
    if children.stopping:
        raise CompilationError(f"compile of {unit_name} interrupted")
    if proc.returncode == 3:
        detail = json.loads(err.decode(errors="replace") or "{}")
        raise CompilationError(detail.get("message", f"{backend.name} failed compiling {unit_name}"),
                               log=detail.get("log", ""), source=source)
    killed = (" (SIGKILL: usually the kernel's out-of-memory killer; compile with fewer jobs or free memory, "
              "an SM90 operation takes up to ~3 GB)" if proc.returncode == -9 else "")
    raise CompilationError(f"the compile worker for {unit_name} ({backend.name}, sm_{arch}) exited with "
                           f"{proc.returncode}{killed}", log=err.decode(errors="replace")[-20000:], source=source)


def run_units(units, backend, jobs: int, progress: bool | None):
    """``units``: (operations, target, source, unit_name). Yields (operations, target, cubin or CompilationError)."""
    if not units:
        return
    children = _Children(tempfile.mkdtemp(prefix="pycutlass-compile-"))
    pool = futures.ThreadPoolExecutor(max_workers=max(1, min(jobs, len(units))),
                                      thread_name_prefix="pycutlass-compile")
    total = sum(len(ops) for ops, *_ in units)
    bar = _progress_bar(len(units), total, backend.name, progress)
    finished = 0
    try:
        with _sigterm_raises_system_exit():
            pending = {}
            for ops, target, source, unit_name in units:
                log.info("compiling %d operation(s) with %s for %s: %s", len(ops), backend.name, target.name,
                         ", ".join(op.name for op in ops))
                pending[pool.submit(_timed, children, backend, source, target, unit_name)] = (ops, target)
            for done in futures.as_completed(pending):
                ops, arch = pending[done]
                try:
                    result, seconds = done.result()
                except CompilationError as error:
                    log.warning("%s failed for %s", backend.name, ", ".join(op.name for op in ops))
                    result, seconds = error, getattr(error, "seconds", 0.0)
                finished += len(ops)
                if bar is not None and not bar.disable:
                    bar.update(len(ops))
                else:  # no bar on this stream (a pipe, a log file): one line per unit instead
                    _report_unit(ops, finished, total, seconds, result)
                yield ops, arch, result
    except BaseException:  # KeyboardInterrupt above all: stop every compiler now, leave nothing running
        children.kill_all()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        if bar is not None:
            bar.close()
        pool.shutdown(wait=False, cancel_futures=True)
        children.kill_all()  # none is left after a normal end; the folder must outlive no compiler
        _remove_tree(children.workdir)


def _timed(children, backend, source, target, unit_name) -> tuple[bytes, float]:
    start = time.perf_counter()
    try:
        return _compile_in_worker(children, backend, source, target, unit_name), time.perf_counter() - start
    except CompilationError as error:
        error.seconds = time.perf_counter() - start
        raise


def _report_unit(ops, finished: int, total: int, seconds: float, result) -> None:
    names = ops[0].name + (f" and {len(ops) - 1} more" if len(ops) > 1 else "")
    verb = "failed" if isinstance(result, CompilationError) else "compiled"
    progress_log.info("%s %d/%d: %s (%.1f s)", verb, finished, total, names, seconds)


def _progress_bar(units: int, operations: int, backend: str, progress: bool | None):
    """A tqdm bar over operations; shown on a terminal (or when asked), hidden for a single unit by default."""
    if progress is False or (progress is None and units < 2):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=operations, desc=f"pycutlass: compiling ({backend})", unit="op",
                disable=None if progress is None else not progress, leave=False)
