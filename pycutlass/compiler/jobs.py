"""Runs translation units in compile worker processes: in parallel, with progress, and interruptible.

An interrupt (KeyboardInterrupt, as Jupyter's SIGINT to the Python process alone raises it) kills every worker's
process group at once and returns within a second, instead of waiting for running compilers to finish.
"""
from __future__ import annotations

import concurrent.futures as futures
import json
import logging
import os
import signal
import subprocess
import sys
import threading

from ..errors import CompilationError

log = logging.getLogger("pycutlass.compiler")


class _Children:
    """The worker processes alive now, so an interrupt can kill them all."""

    def __init__(self):
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self.stopping = False

    def start(self, argv) -> subprocess.Popen:
        with self._lock:
            if self.stopping:
                raise CompilationError("compile interrupted")
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
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


def _compile_in_worker(children: _Children, backend, source: str, target, unit_name: str) -> bytes:
    arch = target.arch
    header = json.dumps({"backend": backend.name, "extra_flags": list(backend.extra_flags), "arch": arch,
                         "unit_name": unit_name})
    proc = children.start([sys.executable, "-m", "pycutlass.compiler.worker"])
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
    children = _Children()
    pool = futures.ThreadPoolExecutor(max_workers=max(1, min(jobs, len(units))),
                                      thread_name_prefix="pycutlass-compile")
    bar = _progress_bar(len(units), sum(len(ops) for ops, *_ in units), backend.name, progress)
    try:
        pending = {}
        for ops, target, source, unit_name in units:
            log.info("compiling %d operation(s) with %s for %s: %s", len(ops), backend.name, target.name,
                     ", ".join(op.name for op in ops))
            pending[pool.submit(_compile_in_worker, children, backend, source, target, unit_name)] = (ops, target)
        for done in futures.as_completed(pending):
            ops, arch = pending[done]
            try:
                result = done.result()
            except CompilationError as error:
                log.warning("%s failed for %s", backend.name, ", ".join(op.name for op in ops))
                result = error
            if bar is not None:
                bar.update(len(ops))
            yield ops, arch, result
    except BaseException:  # KeyboardInterrupt above all: stop every compiler now, leave nothing running
        children.kill_all()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        if bar is not None:
            bar.close()
        pool.shutdown(wait=False, cancel_futures=True)


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
