"""add_module: compile the cache misses among some operations and record the results, per session.

Flow for each target: key every operation; take hits from this session's memory, then from the artifact cache
(verified on load); claim the misses so concurrent processes compile each key once; compile what is still missing
in one translation unit (or ``jobs`` units in parallel worker processes; more units where one would hold too many
operations, and fewer at once where memory is short: ``_units``, ``_parallel_units``); store; report.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from ..cache.current import CacheState
from ..description.target import Target
from ..emit.emitter import translation_unit
from ..errors import ArgumentError, CompilationError, DescriptionError
from ..session import Session, SessionState
from . import toolchain
from .backends import Backend, NvccBackend, NvrtcBackend, backend_by_name
from .jobs import run_units
from .target import detected_compute_capability

CACHE_KEY_SCHEMA = 2
log = logging.getLogger("pycutlass.compiler")


@dataclass(frozen=True)
class CompiledKernel:
    """One operation's entry in a compiled binary (a cubin shared by every operation of its unit)."""

    key: str
    binary: bytes = field(repr=False)
    sha256: str
    kernel_symbol: str
    builder_symbol: str
    backend: str
    target: str

    @property
    def arch(self) -> int:
        """The target's compute capability (e.g. 90 for sm_90 and sm_90a)."""
        return int(self.target.removeprefix("sm_").rstrip("a"))


@dataclass
class CompileReport:
    """What one ``add_module`` call did. Iterating it yields the CompiledKernels, in the order asked for."""

    kernels: list = field(default_factory=list)
    compiled: int = 0
    from_memory: int = 0
    from_disk: int = 0
    seconds: float = 0.0
    backend: str = ""
    substituted: dict = field(default_factory=dict)  # backend name -> why some operations used it instead
    # With add_module(..., errors="report"): (operations of a unit that failed, its CompilationError). Operations
    # compiled together fail together; a sweep recompiles such a unit one operation at a time to find the culprit.
    failures: list = field(default_factory=list)

    def __iter__(self):
        return iter(self.kernels)

    def __len__(self) -> int:
        return len(self.kernels)

    def __getitem__(self, index):
        return self.kernels[index]

    def __repr__(self) -> str:
        return (f"CompileReport({len(self.kernels)} kernels: {self.compiled} compiled, {self.from_memory} from memory, "
                f"{self.from_disk} from disk, {self.seconds:.2f} s, {self.backend})")


def _is_operation(value) -> bool:
    return all(hasattr(value, attr) for attr in ("emit_body", "headers", "name", "compute_capability"))


class Compiler(SessionState):
    """A session's compiler settings and its table of compiled operations."""

    def __init__(self, session: Session):
        super().__init__(session)
        self._backend: Backend | None = None
        self._fallbacks: dict[str, Backend] = {}
        self._memory: dict[str, CompiledKernel] = {}
        self._keys: dict[tuple, str] = {}
        self._detected: dict[int, int | None] = {}
        self._adopted: dict[tuple[str, str], CompiledKernel] = {}  # (operation name, target) -> bundle binary
        self._lock = threading.Lock()
        self.last_report = CompileReport()

    def option_changed(self, name: str) -> None:
        if name == "backend":
            self._backend = None
            self._fallbacks = {}

    # --- settings -------------------------------------------------------------------------------------------
    def use(self, backend: Backend) -> Backend:
        if not isinstance(backend, Backend):
            raise ArgumentError(f"backend must be a pycutlass compiler backend (compiler.nvcc(), compiler.nvrtc()), "
                                f"got {backend!r}")
        self._backend = backend
        return backend

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            chosen = self.session.options.get("backend")
            if isinstance(chosen, Backend):
                self._backend = chosen
            elif chosen is not None:
                if chosen not in ("nvcc", "nvrtc"):
                    raise ArgumentError(f"Session backend must be 'nvcc' or 'nvrtc', got {chosen!r}")
                self._backend = backend_by_name(chosen)
            else:
                try:  # nvcc is the documented default; without a toolkit, NVRTC from pip still works
                    toolchain.nvcc_path()
                    self._backend = NvccBackend()
                except Exception:
                    self._backend = NvrtcBackend()
        return self._backend

    def backend_for(self, operation) -> Backend:
        """The session's backend, unless the operation can only be built by another (SM90 kernels' Params builders
        run CUTLASS's host-side setup on the device, which only NVRTC's -default-device compiles)."""
        backend = self.backend
        required = operation.required_backend
        if required is None or required == backend.name:
            return backend
        found = self._fallbacks.get(required)
        if found is None:
            found = self._fallbacks[required] = backend_by_name(required, backend.extra_flags
                                                                if required == backend.name else ())
        return found

    @property
    def explicit_target(self) -> Target | None:
        value = self.session.options.get("target")
        return None if value is None else Target.parse(value)

    def target_for(self, operation) -> Target:
        """The explicit target, else the GPU's (SASS does not run across major architectures), else the op's own."""
        target = self.explicit_target
        if target is None:
            ordinal = self.session.options.get("device") or 0
            if ordinal not in self._detected:
                self._detected[ordinal] = detected_compute_capability(ordinal)
            detected = self._detected[ordinal]
            target = Target(detected if detected is not None else operation.compute_capability)
        return self.checked_target(operation, target)

    @staticmethod
    def checked_target(operation, target: Target) -> Target:
        """``target`` as the operation's family compiles for it, or a DescriptionError (before anything compiles)
        when that target cannot run the family (e.g. SM90 kernels for sm_80)."""
        target = target.for_family(operation.family)
        target.check_runs(operation.family, operation.name)
        return target

    # --- keys -----------------------------------------------------------------------------------------------
    def cache_key(self, operation, target: Target, backend: Backend | None = None) -> str:
        """sha256 of everything that changes the binary: source, backend, flags, target, toolchain, schema."""
        backend = backend or self.backend_for(operation)
        arch = target.arch
        memo = (operation.name, target, backend.name, tuple(backend.flags(arch)), backend.version(),
                toolchain.cutlass_version())
        key = self._keys.get(memo)
        if key is None:  # hashing the source is cheap once; launches look keys up often
            material = {
                "schema": CACHE_KEY_SCHEMA,
                "source": operation.emit(),
                "backend": backend.name,
                "flags": backend.flags(arch),
                "target": target.name,
                "compiler": backend.version(),
                "toolchain": toolchain.fingerprint(backend.name),
            }
            key = self._keys[memo] = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
        return key

    def key_and_target(self, operation, target: Target | None = None) -> tuple[str, Target]:
        """The cache key an operation compiles under (for ``target``, else the session's), and that target."""
        target = self.checked_target(operation, target) if target is not None else self.target_for(operation)
        return self.cache_key(operation, target), target

    # --- compile --------------------------------------------------------------------------------------------
    def lookup(self, operation, target: Target | None = None) -> CompiledKernel | None:
        target = target if target is not None else self.target_for(operation)
        return self._memory.get(self.cache_key(operation, target))

    def compiled_for(self, operation, target: Target) -> CompiledKernel:
        """The operation compiled for ``target`` (a device's), compiling on first use."""
        target = self.checked_target(operation, target)
        found = self._adopted.get((operation.name, target.name))
        if found is not None:
            return found
        found = self._memory.get(self.cache_key(operation, target))
        if found is None:
            found = self._add([operation], jobs=None, cache=None, target=target).kernels[0]
        return found

    def adopt(self, operation, target, binary: bytes, backend: str, kernel_symbol: str, builder_symbol: str) -> None:
        """Run ``operation`` on ``target`` from a binary compiled elsewhere (a bundle), without a toolchain here.

        The caller vouches that the binary was compiled from this operation's source (bundles check its hash).
        Adopted binaries live in this session only; they never enter the artifact cache, whose keys name the
        toolchain that built each entry."""
        target = Target.parse(target) if not isinstance(target, Target) else target
        sha = hashlib.sha256(binary).hexdigest()
        kernel = CompiledKernel(f"adopted:{sha}", binary, sha, kernel_symbol, builder_symbol, backend, target.name)
        with self._lock:
            self._adopted[(operation.name, target.name)] = kernel

    def add_module(self, operations, *, jobs: int | None = None, cache=None, target=None,
                   errors: str = "raise") -> CompileReport:
        """Compile the cache misses among ``operations``. ``target`` overrides the session's (compile for another
        GPU); ``errors="report"`` lists failed units in ``report.failures`` instead of raising."""
        operations = _check_operations(operations)
        jobs = _check_jobs(jobs)
        if errors not in ("raise", "report"):
            raise ArgumentError(f"errors must be 'raise' or 'report', got {errors!r}")
        target = parse_target(target) if target is not None else None
        return self._add(operations, jobs=jobs, cache=cache, target=target, errors=errors)

    def _add(self, operations, *, jobs, cache, target: Target | None, errors: str = "raise") -> CompileReport:
        start = time.perf_counter()
        backend = self.backend
        report = CompileReport(backend=backend.name)
        operations = list(dict.fromkeys(operations))  # equal descriptions compile once
        cache = cache if cache is not None else CacheState.of(self.session).cache
        keyed = [(op, self.checked_target(op, target) if target is not None else self.target_for(op))
                 for op in operations]
        backends = {op: self.backend_for(op) for op, _ in keyed}
        keys = {(op, t): self.cache_key(op, t, backends[op]) for op, t in keyed}
        for op in operations:
            if backends[op] is not backend and backends[op].name not in report.substituted:
                report.substituted[backends[op].name] = (
                    f"{type(op).__name__} compiles with {backends[op].name}, not {backend.name}: its device-side "
                    f"Params builder runs CUTLASS's host-side setup, which only NVRTC (-default-device) compiles")
                log.info("add_module: %s", report.substituted[backends[op].name])
        results: dict[str, CompiledKernel] = {}

        misses = []
        for op, t in keyed:
            key = keys[(op, t)]
            if key in self._memory:
                results[key] = self._memory[key]
                report.from_memory += 1
                continue
            artifact = cache.lookup(key)
            if artifact is not None:
                results[key] = self._remember(key, artifact.binary, artifact.sha256, op, backends[op], t)
                report.from_disk += 1
            else:
                misses.append((op, t))

        try:
            for name in dict.fromkeys(backends[op].name for op, _ in misses):
                chosen = [m for m in misses if backends[m[0]].name == name]
                self._compile_misses(chosen, keys, backends[chosen[0][0]], jobs, cache, report, results, errors)
        finally:
            report.seconds = time.perf_counter() - start
            report.kernels = [results[keys[pair]] for pair in keyed if keys[pair] in results]
            self.last_report = report
        log.info("add_module: %d compiled, %d from memory, %d from disk in %.2f s (%s)", report.compiled,
                 report.from_memory, report.from_disk, report.seconds, backend.name)
        return report

    def _compile_misses(self, misses, keys, backend, jobs, cache, report, results, errors="raise") -> None:
        with cache.claim([keys[m] for m in misses]):
            still_missing = []
            for op, t in misses:  # another process may have compiled them while we waited
                artifact = cache.lookup(keys[(op, t)])
                if artifact is not None:
                    results[keys[(op, t)]] = self._remember(keys[(op, t)], artifact.binary, artifact.sha256, op,
                                                            backend, t)
                    report.from_disk += 1
                else:
                    still_missing.append((op, t))
            failures = []
            progress = self.session.options.get("progress")
            units = _units(still_missing, jobs)
            for unit_ops, t, result in run_units(units, backend, _parallel_units(units, jobs), progress):
                if isinstance(result, CompilationError):
                    failures.append((unit_ops, result))
                    continue
                entries = [(keys[(op, t)], op.name, {"kernel": op.kernel_symbol, "builder": op.builder_symbol,
                                                     "backend": backend.name, "target": t.name,
                                                     "description": op.describe()}) for op in unit_ops]
                sha = cache.store(entries, result, "cubin")
                for op in unit_ops:
                    results[keys[(op, t)]] = self._remember(keys[(op, t)], result, sha, op, backend, t)
                report.compiled += len(unit_ops)
        if failures and errors == "report":
            report.failures.extend((tuple(ops), error) for ops, error in failures)
        elif failures:  # the units that compiled are cached; name the ones that did not
            failed = [op.name for ops, _ in failures for op in ops]
            first = failures[0][1]
            summary = str(first).split("\n--- compiler log ---")[0]
            raise CompilationError(f"{len(failed)} operation(s) failed to compile with {backend.name}: "
                                   f"{', '.join(failed)}. First error: {summary}",
                                   log=getattr(first, "log", ""), source=getattr(first, "source", ""))

    def _remember(self, key, binary, sha, op, backend, target) -> CompiledKernel:
        kernel = CompiledKernel(key, binary, sha, op.kernel_symbol, op.builder_symbol, backend.name, target.name)
        with self._lock:
            self._memory[key] = kernel
        return kernel


# A unit's compile memory grows with its operations. A CUTLASS 3.x (SM90) operation adds ~0.7 GB to NVRTC's ~3 GB
# (measured: one operation 2.9 GB; a unit of 15 reached 12 GB, and two such units at once met the out-of-memory
# killer on a 24 GB machine). So SM90 operations go at most HEAVY_UNIT_OPERATIONS to a unit, and no more units run
# at once than the memory available holds. CUTLASS 2.x operations are light; their cap only bounds a huge batch.
HEAVY_UNIT_OPERATIONS = 8
LIGHT_UNIT_OPERATIONS = 32
_HEAVY_BASE_GB, _HEAVY_OPERATION_GB = 3.0, 0.7


def _is_heavy(op) -> bool:
    return op.family == "sm90"


def _units(missing, jobs: int | None):
    """Split the misses into translation units: per target, SM90 and CUTLASS 2.x operations apart, operations whose
    units must define different macros (``unit_macros``: they change every header) apart, ``jobs`` units each (one
    when jobs is None), more where a unit would exceed its cap of operations."""
    by_class: dict[tuple, list] = {}
    for op, t in missing:
        by_class.setdefault((t, _is_heavy(op), tuple(op.unit_macros)), []).append(op)
    units = []
    for (t, heavy, _), group in by_class.items():
        cap = HEAVY_UNIT_OPERATIONS if heavy else LIGHT_UNIT_OPERATIONS
        n = max(1, min(jobs or 1, len(group)), -(-len(group) // cap))
        for i in range(n):
            unit_ops = group[i::n]
            name = f"pycutlass_unit_{os.getpid()}_" + \
                hashlib.sha256("".join(o.name for o in unit_ops).encode()).hexdigest()[:8]
            units.append((unit_ops, t, translation_unit(unit_ops), name))
    return units


def _available_gb() -> float | None:
    """MemAvailable of /proc/meminfo in GB (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return None
    return None


def _parallel_units(units, jobs: int | None) -> int:
    """Units compiled at once: ``jobs`` (1 when None), fewer where the SM90 units' estimated memory exceeds what
    is available now."""
    workers = max(1, min(jobs or 1, len(units)))
    heavy = [len(ops) for ops, *_ in units if any(_is_heavy(op) for op in ops)]
    available = _available_gb() if heavy and workers > 1 else None
    if available is not None:
        per_unit = _HEAVY_BASE_GB + _HEAVY_OPERATION_GB * max(heavy)
        fits = max(1, int(available // per_unit))
        if fits < workers:
            log.info("compiling %d units at once instead of %d: ~%.1f GB each, %.1f GB available", fits, workers,
                     per_unit, available)
            workers = fits
    return workers


def _check_operations(operations) -> list:
    if _is_operation(operations):
        raise ArgumentError("add_module takes a list of operations, e.g. add_module([operation]); got a single "
                            f"{type(operations).__name__}")
    if isinstance(operations, (str, bytes)) or not hasattr(operations, "__iter__"):
        raise ArgumentError(f"add_module takes a list of operations, got {type(operations).__name__}")
    operations = list(operations)
    for index, op in enumerate(operations):
        if not _is_operation(op):
            raise ArgumentError(f"add_module: item {index} is {op!r}, not an operation (GemmOperationUniversal, "
                                f"GemmOperationGrouped, Conv2dOperation or ReductionOperation)")
    return operations


def _check_jobs(jobs) -> int | None:
    if jobs is None:
        return None
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ArgumentError(f"jobs must be a positive integer (parallel compile units) or None, got {jobs!r}")
    return jobs


def parse_target(value) -> Target | None:
    """For ``set_target_arch``: None restores detection; anything else must name a supported target."""
    if value is None:
        return None
    try:
        return Target.parse(value)
    except DescriptionError as error:
        raise ArgumentError(str(error)) from None
