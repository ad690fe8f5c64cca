"""A sweep: compile a search space (remembering what failed), then benchmark every kernel on every problem.

    sweep = Sweep(SearchSpace.preset("sm80-f16"), model_problems("llama-3-8b"), db="sweep.db")
    sweep.compile(jobs=16)      # any machine; known-bad configurations are skipped, known-good come from the cache
    sweep.benchmark()           # GPU host: one worker process per GPU, restarted when a kernel faults or hangs

Both stages write to the results DB as they go, so an interrupted sweep resumes where it stopped.
``Sweep(..., top_k=K)`` keeps only the union over the problems of each one's K best-ranked operations
(:mod:`pycutlass.tune.rank`) plus those already in the kernel cache; the default (None) keeps every operation.
"""
from __future__ import annotations

import logging
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field

from ..compiler.manager import Compiler, parse_target
from ..errors import ArgumentError
from ..session import Session, current
from .db import ResultsDB
from .progress import progress_bar as _progress
from .space import SearchSpace

log = logging.getLogger("pycutlass.tune")


@dataclass
class CompileSummary:
    """What ``Sweep.compile`` did."""

    valid: int = 0
    pruned: Counter = field(default_factory=Counter)  # reason -> count
    known_bad: int = 0  # skipped: the memo says they failed with this very cache key
    from_cache: int = 0
    compiled: int = 0
    failed: Counter = field(default_factory=Counter)  # error class -> count
    seconds: float = 0.0

    @property
    def ready(self) -> int:
        return self.from_cache + self.compiled

    def __str__(self) -> str:
        pruned = sum(self.pruned.values())
        reasons = ", ".join(f"{n} {r}" for r, n in self.pruned.most_common(4))
        failed = ", ".join(f"{n} {r}" for r, n in self.failed.most_common(4))
        return (f"{self.valid} valid ({pruned} pruned{': ' + reasons if reasons else ''}); {self.ready} ready "
                f"({self.compiled} compiled, {self.from_cache} cached), {sum(self.failed.values())} failed"
                f"{' (' + failed + ')' if failed else ''}, {self.known_bad} known-bad skipped; {self.seconds:.1f} s")


def error_class(error: BaseException) -> str:
    """A short, stable class for a compile failure, so the memo and the report group like failures together."""
    text = f"{error}\n{getattr(error, 'log', '')}"
    found = re.search(r"(?:error|ptxas fatal)\s*:?\s*([^\n]{0,160})", text)
    detail = found.group(1) if found else str(error).splitlines()[0][:160] if str(error) else ""
    detail = re.sub(r"\"[^\"]*\"|'[^']*'|0x[0-9a-f]+|\d+", "#", detail).strip()
    return f"{type(error).__name__}: {detail}"[:200]


def cached_operation_names(operations, session: Session, target=None) -> set[str]:
    """Names of the operations whose binary is already in the session's kernel cache (memory or disk), looked up by
    cache key: nothing compiles. Empty when keys cannot be computed here (no toolchain)."""
    from ..cache.current import CacheState

    compiler, found = Compiler.of(session), set()
    target = None if target is None else parse_target(target)
    try:
        cache = CacheState.of(session).cache
        for op in operations:
            key, op_target = compiler.key_and_target(op, target)
            if compiler.lookup(op, op_target) is not None or cache.lookup(key) is not None:
                found.add(op.name)
    except Exception as error:  # noqa: BLE001 - no toolchain or unreadable cache: nothing counts as compiled
        log.info("kernel cache not consulted (%s)", error)
    return found


def ranked_union(operations, problems, top_k: int, *, device=None, history=None, sm_count=None) -> list:
    """The operations among the ``top_k`` best-ranked of their operation class for at least one problem they are
    timed on (GEMM, grouped GEMM or Conv2d: ``runner.problem_kinds``), in their original order."""
    from .db import operation_class
    from .rank import top_k as best
    from .runner import operations_by_kind

    classes_by_kind = {}
    for kind, serving in operations_by_kind(operations).items():
        by_class = {}
        for op in serving:
            by_class.setdefault(operation_class(op), []).append(op)
        classes_by_kind[kind] = list(by_class.values())
    chosen = set()
    for problem in problems:
        for candidates in classes_by_kind.get(problem.kind, ()):
            chosen |= {op.name for op in best(candidates, problem, top_k, device, history, sm_count=sm_count)}
    return [op for op in operations if op.name in chosen]


class Sweep:
    """A search space (a ``SearchSpace``, a preset name such as ``"sm80-f16"``, or a list of operations) x a problem
    set, recorded in a results DB (opened, or created, once the space and problems are known to be valid)."""

    def __init__(self, space, problems=None, *, db: ResultsDB | str | os.PathLike, name: str | None = None,
                 session: Session | None = None, target=None, top_k: int | None = None, rank_device=None):
        self.session = session or current()
        self.problems = list(problems or [])
        self.target = target
        if isinstance(space, str):  # a preset name, as SearchSpace.preset takes it
            space = SearchSpace.preset(space)
        if hasattr(space, "build"):
            self.space = space
            built = space.build()
            self.operations = list(built.operations)
            self._params = {op.name: built.params_of(op) for op in self.operations}
            self.pruned = Counter(built.pruned_by_reason)
            self.name = name or f"space-{space.fingerprint[:12]}"
            space_dict = space.to_dict()
        else:
            try:
                self.operations = list(dict.fromkeys(space))
            except TypeError:
                raise ArgumentError(f"Sweep takes a SearchSpace, a preset name {SearchSpace.presets()} or a list of "
                                    f"operations, got {type(space).__name__}") from None
            for op in self.operations:
                if not (hasattr(op, "name") and hasattr(op, "describe")):
                    raise ArgumentError(f"Sweep takes a SearchSpace, a preset name or a list of operations; the list "
                                        f"holds {op!r}, not an operation")
            self.space = None
            self._params = {op.name: {"kind": type(op).__name__} for op in self.operations}
            self.pruned = Counter()
            self.name = name or "operations"
            space_dict = {"operations": [op.name for op in self.operations]}
        if not self.operations:
            raise ArgumentError(f"the sweep has no valid operation ({sum(self.pruned.values())} pruned: "
                                f"{dict(self.pruned)})")
        for problem in self.problems:
            if not all(hasattr(problem, a) for a in ("key", "kind", "flops", "to_dict")):
                raise ArgumentError(f"problems must be pycutlass.tune.problems objects (GemmProblem, ...), got "
                                    f"{problem!r}")
        if top_k is not None:
            self._check_top_k(top_k)
        # Opened (and created) only once the sweep is known to be valid; ranking reads its history.
        self.db = db if isinstance(db, ResultsDB) else ResultsDB(db)
        if top_k is not None:
            self._keep_top_k(top_k, rank_device)
        self.db.add_sweep(self.name, space_dict, {"problems": [p.to_dict() for p in self.problems]},
                          getattr(space, "fingerprint", ""))
        for op in self.operations:
            self.db.add_kernel(op, self._params[op.name])
        for problem in self.problems:
            self.db.add_problem(problem)

    def params_of(self, operation) -> dict:
        return self._params[operation.name]

    def _check_top_k(self, top_k) -> None:
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise ArgumentError(f"top_k must be a positive integer or None (every operation), got {top_k!r}")
        if not self.problems:
            raise ArgumentError("top_k ranks the operations for the sweep's problems: give problems too")

    def _keep_top_k(self, top_k, rank_device) -> None:
        kept = ranked_union(self.operations, self.problems, top_k, device=rank_device, history=self.db)
        names = {op.name for op in kept} | cached_operation_names(self.operations, self.session, self.target)
        dropped = len(self.operations) - len(names)
        if dropped:
            self.pruned[f"ranked below the top {top_k} for every problem"] += dropped
        self.operations = [op for op in self.operations if op.name in names]

    # --- compile ----------------------------------------------------------------------------------------------
    def compile(self, *, jobs: int | None = None, chunk: int | None = None, progress: bool | None = None,
                retry_singly: bool = True) -> CompileSummary:
        """Compile every valid operation not known to fail, ``chunk`` at a time (memo written after each chunk).

        A unit that fails is compiled again one operation per unit, so only the culprit is recorded as failed.
        """
        start = time.perf_counter()
        if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
            raise ArgumentError(f"jobs must be a positive integer (parallel compile processes) or None, got {jobs!r}")
        jobs = jobs or default_jobs()
        chunk = chunk or max(jobs * 4, 8)
        compiler = Compiler.of(self.session)
        summary = CompileSummary(valid=len(self.operations), pruned=Counter(self.pruned))
        pending = []
        self.keys = {}
        for op in self.operations:
            key, target = compiler.key_and_target(op, self._target())
            self.keys[op.name] = (key, target)
            memo = self.db.compile_status(key)
            if memo is not None and memo["status"] == "failed":
                summary.known_bad += 1
                summary.failed[memo["error_class"]] += 1
            else:
                pending.append(op)
        bar = _progress(len(pending), "compile", progress)
        try:
            for begin in range(0, len(pending), chunk):
                self._compile_chunk(compiler, pending[begin:begin + chunk], jobs, summary, retry_singly)
                bar.update(min(chunk, len(pending) - begin))
        finally:
            bar.close()
            summary.seconds = time.perf_counter() - start
        log.info("sweep %s: %s", self.name, summary)
        return summary

    def _target(self):
        return None if self.target is None else parse_target(self.target)

    def _compile_chunk(self, compiler, ops, jobs, summary, retry_singly) -> None:
        report = compiler.add_module(ops, jobs=jobs, target=self._target(), errors="report")
        per_op = report.seconds / max(1, report.compiled) if report.compiled else 0.0
        summary.from_cache += report.from_disk + report.from_memory
        failed_units = report.failures
        if retry_singly:
            retry = [op for unit, _ in failed_units if len(unit) > 1 for op in unit]
            failed_units = [(unit, error) for unit, error in failed_units if len(unit) == 1]
            if retry:
                again = compiler.add_module(retry, jobs=len(retry), target=self._target(), errors="report")
                report.compiled += again.compiled
                failed_units += again.failures
        failed = {op.name: error for unit, error in failed_units for op in unit}
        summary.compiled += report.compiled
        for op in ops:
            key, target = self.keys[op.name]
            backend = compiler.backend_for(op).name
            error = failed.get(op.name)
            if error is None:
                self.db.record_compile(key, op.name, target.name, backend, "ok", seconds=per_op)
            else:
                cls = error_class(error)
                summary.failed[cls] += 1
                self.db.record_compile(key, op.name, target.name, backend, "failed", error_class=cls,
                                       log=f"{error}\n{getattr(error, 'log', '')}")

    def ready_operations(self) -> list:
        """The operations whose compile succeeded (per the memo), in space order."""
        compiler = Compiler.of(self.session)
        ready = []
        for op in self.operations:
            key, _ = compiler.key_and_target(op, self._target())
            memo = self.db.compile_status(key)
            if memo is not None and memo["status"] == "ok":
                ready.append(op)
        return ready

    # --- benchmark --------------------------------------------------------------------------------------------
    def benchmark(self, *, config=None, devices=None, timeout: float = 120.0, progress: bool | None = None,
                  baseline: bool = True):
        """Time every ready operation on every problem on the GPU(s); see :func:`pycutlass.tune.runner.run_sweep`."""
        from .runner import run_sweep

        return run_sweep(self, config=config, devices=devices, timeout=timeout, progress=progress, baseline=baseline)


def default_jobs() -> int:
    """Parallel compile processes: one per core, and no more than memory allows (an SM90 unit peaks near 3 GB)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        by_memory = max(1, int(available // (3 * 2**30)))
    except (ValueError, OSError, AttributeError):
        by_memory = cores
    return max(1, min(cores, by_memory))

