"""add_module: compile the cache misses among some operations in one translation unit and record the results.

Flow for each target architecture: key every operation; take hits from this process's memory, then from the
SQLite cache (verified on load); claim the misses so concurrent processes compile each key once; compile what is
still missing in one translation unit (or ``jobs`` units in parallel); store; attach.
"""
from __future__ import annotations

import concurrent.futures as futures
import hashlib
import json
import multiprocessing
import os
import threading
import time
from dataclasses import dataclass

from ..emit.emitter import translation_unit
from ..errors import CompilationError
from . import toolchain
from .backends import Backend, NvccBackend, NvrtcBackend, compile_in_subprocess
from .target import resolve_target

CACHE_KEY_SCHEMA = 1


@dataclass(frozen=True)
class CompiledKernel:
    """One operation's entry in a compiled binary (a cubin shared by every operation of its unit)."""

    key: str
    binary: bytes
    sha256: str
    kernel_symbol: str
    builder_symbol: str
    backend: str
    arch: int


@dataclass
class CompileReport:
    compiled: int = 0
    from_memory: int = 0
    from_disk: int = 0
    seconds: float = 0.0


class Compiler:
    """Process-wide compiler settings and the in-memory table of compiled operations."""

    def __init__(self):
        self.backend: Backend | None = None
        self.target_arch: int | None = None
        self._memory: dict[str, CompiledKernel] = {}
        self._keys: dict[tuple, str] = {}
        self._lock = threading.Lock()
        self.last_report = CompileReport()

    # --- settings -------------------------------------------------------------------------------------------
    def use(self, backend: Backend) -> Backend:
        self.backend = backend
        return backend

    def current_backend(self) -> Backend:
        if self.backend is None:
            try:  # nvcc is the documented default; without a toolkit, NVRTC from pip still works
                toolchain.nvcc_path()
                self.backend = NvccBackend()
            except Exception:
                self.backend = NvrtcBackend()
        return self.backend

    # --- keys -----------------------------------------------------------------------------------------------
    def cache_key(self, operation, arch: int, backend: Backend | None = None) -> str:
        backend = backend or self.current_backend()
        memo = (operation.name, arch, backend.name, tuple(backend.flags(arch)), backend.version(),
                toolchain.cutlass_version())
        key = self._keys.get(memo)
        if key is None:  # hashing the source is cheap once; launches look keys up often
            key = self._keys[memo] = self._compute_key(operation, arch, backend)
        return key

    def _compute_key(self, operation, arch: int, backend: Backend) -> str:
        material = {
            "schema": CACHE_KEY_SCHEMA,
            "source": operation.emit(),
            "backend": backend.name,
            "flags": backend.flags(arch),
            "arch": arch,
            "compiler": backend.version(),
            "cutlass": toolchain.cutlass_version(),
        }
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()

    def target_for(self, operation) -> int:
        return resolve_target(self.target_arch, operation.compute_capability)

    # --- compile --------------------------------------------------------------------------------------------
    def lookup(self, operation, arch: int | None = None) -> CompiledKernel | None:
        arch = arch if arch is not None else self.target_for(operation)
        return self._memory.get(self.cache_key(operation, arch))

    def add_module(self, operations, *, jobs: int | None = None, cache=None) -> list[CompiledKernel]:
        from ..cache import get_cache

        start = time.perf_counter()
        report = CompileReport()
        operations = list(dict.fromkeys(operations))  # equal descriptions compile once
        backend = self.current_backend()
        cache = cache if cache is not None else get_cache()
        keyed = [(op, self.target_for(op)) for op in operations]
        keys = {(op, arch): self.cache_key(op, arch, backend) for op, arch in keyed}
        results: dict[str, CompiledKernel] = {}

        misses = []
        for op, arch in keyed:
            key = keys[(op, arch)]
            if key in self._memory:
                results[key] = self._memory[key]
                report.from_memory += 1
                continue
            artifact = cache.lookup(key)
            if artifact is not None:
                results[key] = self._remember(key, artifact.binary, artifact.sha256, op, backend, arch)
                report.from_disk += 1
            else:
                misses.append((op, arch))

        if misses:
            with cache.claim([keys[m] for m in misses]):
                still_missing = []
                for op, arch in misses:  # another process may have compiled them while we waited
                    artifact = cache.lookup(keys[(op, arch)])
                    if artifact is not None:
                        results[keys[(op, arch)]] = self._remember(keys[(op, arch)], artifact.binary,
                                                                   artifact.sha256, op, backend, arch)
                        report.from_disk += 1
                    else:
                        still_missing.append((op, arch))
                failures = []
                for unit_ops, arch, binary in self._compile_units(still_missing, backend, jobs, failures):
                    entries = [(keys[(op, arch)], op.name, {"kernel": op.kernel_symbol, "builder": op.builder_symbol,
                                                             "backend": backend.name, "arch": arch,
                                                             "description": op.describe()}) for op in unit_ops]
                    sha = cache.store(entries, binary, "cubin")
                    for op in unit_ops:
                        results[keys[(op, arch)]] = self._remember(keys[(op, arch)], binary, sha, op, backend, arch)
                    report.compiled += len(unit_ops)
                if failures:  # the units that compiled are cached; name the ones that did not
                    report.seconds = time.perf_counter() - start
                    self.last_report = report
                    failed = [op.name for ops, _, _ in failures for op in ops]
                    first = failures[0][2]
                    summary = str(first).split("\n--- compiler log ---")[0]
                    raise CompilationError(f"{len(failed)} operation(s) failed to compile with {backend.name}: "
                                           f"{', '.join(failed)}. First error: {summary}",
                                           log=getattr(first, "log", ""), source=getattr(first, "source", ""))
        report.seconds = time.perf_counter() - start
        self.last_report = report
        return [results[keys[(op, arch)]] for op, arch in keyed]

    def _remember(self, key, binary, sha, op, backend, arch) -> CompiledKernel:
        kernel = CompiledKernel(key, binary, sha, op.kernel_symbol, op.builder_symbol, backend.name, arch)
        with self._lock:
            self._memory[key] = kernel
        return kernel

    def _compile_units(self, missing, backend: Backend, jobs: int | None, failures: list):
        """Yields (operations, arch, cubin) per translation unit; appends (operations, arch, error) on failure."""
        by_arch: dict[int, list] = {}
        for op, arch in missing:
            by_arch.setdefault(arch, []).append(op)
        units = []
        for arch, ops in by_arch.items():
            n = max(1, min(jobs or 1, len(ops)))
            units.extend((ops[i::n], arch) for i in range(n))
        if not units:  # another process compiled everything while we waited for the claim
            return
        if len(units) == 1:
            ops, arch = units[0]
            try:
                binary = backend.compile(translation_unit(ops), arch, _unit_name(ops))
            except CompilationError as error:
                failures.append((ops, arch, error))
                return
            yield ops, arch, binary
            return
        if backend.name == "nvrtc":  # NVRTC serializes threads of one process: use processes
            pool = futures.ProcessPoolExecutor(max_workers=len(units), mp_context=multiprocessing.get_context("spawn"))
        else:
            pool = futures.ThreadPoolExecutor(max_workers=len(units))
        with pool:
            pending = {pool.submit(compile_in_subprocess, backend.name, backend.extra_flags, translation_unit(ops),
                                   arch, _unit_name(ops)): (ops, arch) for ops, arch in units}
            for done in futures.as_completed(pending):
                ops, arch = pending[done]
                try:
                    binary = done.result()
                except CompilationError as error:
                    failures.append((ops, arch, error))
                    continue
                yield ops, arch, binary


def _unit_name(ops) -> str:
    return f"pycutlass_unit_{os.getpid()}_{hashlib.sha256(''.join(o.name for o in ops).encode()).hexdigest()[:8]}"


COMPILER = Compiler()
