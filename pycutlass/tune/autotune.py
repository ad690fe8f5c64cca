"""Autotuning with a persistent tuning cache, and ``Tuned``: a GEMM that dispatches by shape.

    best = autotune(SearchSpace.preset("sm80-f16"), GemmProblem(4096, 4096, 4096), db="tune.db")
    gemm = Tuned(SearchSpace.preset("sm80-f16"), db="tune.db", policy="pow2")
    gemm(a, b, d)          # tunes on the first call in each bucket, then one dict lookup per call

The cache key names the device (GPU, compute capability, driver, toolkit), the operation class (kind, types,
layouts, epilogue) and the shape under a key policy: ``"exact"``, ``"pow2"`` (M, N, K rounded up to powers of two)
or a function of the problem.

Tuning a problem compiles and times only the ``top_k`` candidates that :func:`pycutlass.tune.rank.rank` ranks best
for it (default :data:`DEFAULT_TOP_K`), plus every candidate already in the kernel cache (checked by cache key,
without compiling); ``top_k=None`` compiles them all.
"""
from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ArgumentError
from ..kinds import GemmArguments
from ..kinds.gemm.modes import Mode
from ..session import Session, current
from .db import ResultsDB, canonical_json
from .space import SearchSpace

# An SM90 operation costs 20-40 s of CPU to compile and a 16-core host compiles about 8 at once, so 8 candidates
# compile in one round (under a minute on such a host); benchmarks/tune_trust.py checks that the ranking's best 8
# hold the exhaustive best within 2%. Sweeps default to every candidate instead.
DEFAULT_TOP_K = 8


# --- key policies -----------------------------------------------------------------------------------------------
def next_pow2(value: int) -> int:
    return 1 if value <= 1 else 1 << (int(value) - 1).bit_length()


def bucket_of(problem, policy) -> tuple:
    """The shape part of a tuning key under ``policy``."""
    if callable(policy):
        bucket = policy(problem)
        try:
            json.dumps(bucket)
        except TypeError:
            raise ArgumentError(f"a key policy function must return JSON-able values, got {bucket!r}") from None
        return tuple(bucket) if isinstance(bucket, list) else bucket if isinstance(bucket, tuple) else (bucket,)
    if policy not in ("exact", "pow2"):
        raise ArgumentError(f"key policy must be 'exact', 'pow2' or a function of the problem, got {policy!r}")
    kind = getattr(problem, "kind", "gemm")
    if kind != "gemm":  # a grouped set or a convolution: its own key (a grouped set's is a digest of its shapes)
        if policy == "pow2":
            raise ArgumentError(f"key policy 'pow2' rounds a GEMM's M, N and K; a {kind} problem is keyed "
                                f"'exact' or by a function of the problem")
        return (problem.key,)
    shape = (problem.m, problem.n, problem.k, problem.batch)
    if policy == "exact":
        return shape
    return tuple(next_pow2(v) for v in shape)


def policy_name(policy) -> str:
    return policy if isinstance(policy, str) else f"function:{getattr(policy, '__qualname__', repr(policy))}"


def operation_signature(operation) -> dict:
    """What a tuning result is about besides the shape: kind, types, layouts and epilogue (not the tile)."""
    math_inst = operation.tile_description.math_instruction
    return {"kind": type(operation).__name__.replace("Sm90", ""),
            "a": [math_inst.element_a.label, operation.A.layout.value],
            "b": [math_inst.element_b.label, operation.B.layout.value],
            "c": [operation.C.element.label, operation.C.layout.value],
            "accumulator": math_inst.element_accumulator.label, "epilogue": operation.epilogue_functor.describe(),
            "bias": operation.bias}


def local_device_facts(ordinal: int = 0) -> dict:
    """The part of the current GPU that goes into tuning keys: name, compute capability, driver, toolkit."""
    from cuda.bindings import driver as cu

    from ..errors import NoGpuError

    try:
        (err,) = cu.cuInit(0)
    except Exception as exc:
        raise NoGpuError(f"autotuning needs a GPU ({exc})") from None
    if err != cu.CUresult.CUDA_SUCCESS:
        raise NoGpuError(f"autotuning needs a GPU (cuInit: {err!r})")
    _, dev = cu.cuDeviceGet(ordinal)
    _, name = cu.cuDeviceGetName(256, dev)
    attr = cu.CUdevice_attribute
    _, major = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    _, minor = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    _, driver = cu.cuDriverGetVersion()
    from ..compiler import toolchain

    try:
        toolkit = toolchain.nvrtc_version()
    except Exception:
        toolkit = None
    return {"device": name.split(b"\0")[0].decode(), "cc": int(major) * 10 + int(minor), "driver": int(driver),
            "toolkit": toolkit}


def local_sm_count(ordinal: int = 0) -> int | None:
    """The current GPU's SM count (for ranking; not part of tuning keys), or None without a GPU."""
    try:
        from cuda.bindings import driver as cu

        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return None
        _, dev = cu.cuDeviceGet(ordinal)
        err, count = cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
        return int(count) if err == cu.CUresult.CUDA_SUCCESS else None
    except Exception:  # noqa: BLE001 - no driver: the device model's usual count
        return None


def tuning_key(device_facts: dict, signature: dict, bucket: tuple, policy) -> str:
    return canonical_json({"device": device_facts, "op": signature, "bucket": list(bucket),
                           "policy": policy_name(policy)})


# --- candidates and measurement ---------------------------------------------------------------------------------
def candidates(space_or_operations) -> tuple[list, dict]:
    """Operations and their parameters (parameters let the cache rebuild the winner in another process)."""
    if isinstance(space_or_operations, str):  # a preset name, as SearchSpace.preset takes it
        space_or_operations = SearchSpace.preset(space_or_operations)
    if hasattr(space_or_operations, "build"):
        built = space_or_operations.build()
        operations = list(built.operations)
        params = {op.name: built.params_of(op) for op in operations}
    else:
        operations = list(dict.fromkeys(space_or_operations))
        params = {op.name: {} for op in operations}
    if not operations:
        raise ArgumentError("autotune needs at least one valid candidate operation")
    by_signature: dict[str, list] = {}
    for op in operations:
        by_signature.setdefault(canonical_json(operation_signature(op)), []).append(op)
    if len(by_signature) > 1:
        from .db import operation_class
        from .select import MixedClassesError

        classes = list(dict.fromkeys(operation_class(ops[0]) for ops in by_signature.values()))
        raise MixedClassesError(f"autotune's candidates must share types, layouts and epilogue (they answer one "
                                f"call), and they hold {len(by_signature)} operation classes: {'; '.join(classes)}. "
                                f"Tune each class with its own candidates", classes)
    return operations, params


def check_problem_kind(operations, problem) -> None:
    """The candidates must compute the problem's kind: GEMM operations GEMMs, grouped ones grouped sets (SM90
    grouped ones also the masked layout), Conv2d operations convolutions."""
    from .db import operation_class
    from .runner import problem_kinds

    kind = getattr(problem, "kind", None)
    takes = problem_kinds(operations[0])
    if kind not in takes:
        raise ArgumentError(f"autotune: the candidates ({operation_class(operations[0])}) are timed on "
                            f"{' or '.join(takes) or 'no'} problems, got a {kind} problem ({problem!r})")


def gpu_measure(config=None, session: Session | None = None, device: int | None = None):
    """The default measurement: the sweep harness in this process (GEMM, grouped GEMM or Conv2d, by the problem's
    kind); returns seconds or None (wrong/failed)."""
    from .bench import BenchConfig, GemmBench, measure_kernel

    # 50 repetitions: on an H100, 20 picked kernels up to 10% off the best at 4096^3; 50 kept all 10 shapes within 1%
    bench = GemmBench(config or BenchConfig(), device)

    def measure(operation, problem):
        try:
            measurement, _ = measure_kernel(bench, operation, problem, session)
        except ArgumentError:  # this candidate cannot run this problem (e.g. its alignment): not a choice
            return None
        return measurement.seconds if measurement.status == "ok" else None

    return measure


@dataclass
class TuneResult:
    operation: object
    seconds: float | None
    key: str
    from_cache: bool
    candidates: int
    timings: dict  # operation name -> seconds (None: failed or wrong); empty when from the cache
    op_class: str = ""  # the candidates' operation class


def autotune(space_or_operations, problem, *, db: ResultsDB | str, policy="exact", config=None,
             session: Session | None = None, jobs: int | None = None, measure: Callable | None = None,
             device_facts: dict | None = None, retune: bool = False,
             top_k: int | None = DEFAULT_TOP_K) -> TuneResult:
    """The fastest candidate for ``problem`` on this GPU, from the tuning cache or by compiling and timing the
    ``top_k`` best-ranked candidates and those already compiled (``top_k=None``: every candidate).

    ``measure(operation, problem) -> seconds | None`` replaces the GPU harness (tests, custom timing).
    """
    tuner = _Tuner(space_or_operations, db, policy, config, session, jobs, measure, device_facts, top_k,
                   facts_first=True)
    return tuner.tune(problem, retune=retune)


def _check_top_k(top_k):
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise ArgumentError(f"top_k must be a positive integer or None (every candidate), got {top_k!r}")
    return top_k


class _Tuner:
    def __init__(self, space_or_operations, db, policy, config, session, jobs, measure, device_facts,
                 top_k=DEFAULT_TOP_K, facts_first=False):
        bucket_of(_Probe(), policy)  # validates the policy early
        self.top_k = _check_top_k(top_k)
        self.operations, self.params = candidates(space_or_operations)
        self.by_name = {op.name: op for op in self.operations}
        self.policy = policy
        self.config = config
        self.session = session or current()
        self.jobs = jobs
        self._measure = measure
        self.device_facts = device_facts
        if facts_first:  # tuning now: without a GPU, fail before the database file is created
            self.facts()
        self.db = db if isinstance(db, ResultsDB) else ResultsDB(db)
        self.signature = operation_signature(self.operations[0])
        from .db import operation_class

        self.op_class = operation_class(self.operations[0])
        self._compiled: dict[str, bool] = {}  # operation name -> compiled (True) or failed (False), as tuned
        self._cached_names = None  # candidates found in the kernel cache, checked once

    def facts(self) -> dict:
        if self.device_facts is None:
            self.device_facts = local_device_facts(self.session.options.get("device") or 0)
        return self.device_facts

    def key(self, problem) -> str:
        return tuning_key(self.facts(), self.signature, bucket_of(problem, self.policy), self.policy)

    def cached(self, key: str):
        row = self.db.tuning(key)
        if row is None:
            return None
        op = self.by_name.get(row["kernel"])
        if op is None:  # tuned with another candidate list: rebuild from parameters when possible
            params = json.loads(row["params"])
            if not params:
                return None
            from .space import build_operation

            op = build_operation(params)
        return op, row

    def tune(self, problem, *, retune: bool = False) -> TuneResult:
        check_problem_kind(self.operations, problem)
        key = self.key(problem)
        if not retune:
            hit = self.cached(key)
            if hit is not None:
                return TuneResult(hit[0], hit[1]["seconds"], key, True, hit[1]["candidates"], {}, self.op_class)
        ready = self._compile(self.candidates_for(problem))
        measure = self._measure or gpu_measure(self.config, self.session)
        timings = {op.name: measure(op, problem) for op in ready}
        good = {name: t for name, t in timings.items() if t is not None and math.isfinite(t) and t > 0}
        if not good:
            raise ArgumentError(f"no candidate ran correctly on {problem.key} ({len(ready)} tried)")
        best = min(good, key=good.get)
        self.db.put_tuning(key, best, self.params.get(best, {}), good[best], policy_name(self.policy), len(ready))
        return TuneResult(self.by_name[best], good[best], key, False, len(ready), timings, self.op_class)

    def candidates_for(self, problem) -> list:
        """What tuning ``problem`` compiles and times: the ``top_k`` best-ranked candidates, then those already in
        the kernel cache (cheap: no compile), in candidate order; every candidate when top_k is None or larger."""
        if self.top_k is None or len(self.operations) <= self.top_k:
            return list(self.operations)
        from .rank import top_k

        device, sm_count = self._rank_device()
        chosen = {op.name for op in top_k(self.operations, problem, self.top_k, device, history=self.db,
                                          sm_count=sm_count)}
        chosen |= self.cached_names() | {name for name, ok in self._compiled.items() if ok}
        return [op for op in self.operations if op.name in chosen]

    def _rank_device(self):
        from .rank import device_model

        facts = self.device_facts or {}
        sm_count = None if self._measure is not None else local_sm_count(self.session.options.get("device") or 0)
        if facts.get("device"):
            try:
                return device_model(facts["device"]), sm_count
            except ArgumentError:  # a GPU the model does not know: its compute capability's usual one
                pass
        cc = facts.get("cc") or self.operations[0].compute_capability
        return device_model(None, compute_capability=cc), sm_count

    def cached_names(self) -> set[str]:
        """Candidates whose binary is in the tuner's Session's kernel cache (memory or disk), by cache key."""
        if self._cached_names is None:
            from .sweep import cached_operation_names

            self._cached_names = cached_operation_names(self.operations, self.session)
        return self._cached_names

    def _compile(self, operations) -> list:
        todo = [op for op in operations if op.name not in self._compiled]
        if todo:
            if self._measure is not None:  # a custom measure compiles (or simulates) what it needs
                self._compiled.update((op.name, True) for op in todo)
            else:
                from .sweep import Sweep

                sweep = Sweep(todo, db=self.db, name="autotune", session=self.session)
                sweep.compile(jobs=self.jobs)
                ready = {op.name for op in sweep.ready_operations()}
                self._compiled.update((op.name, op.name in ready) for op in todo)
        return [op for op in operations if self._compiled.get(op.name)]


class _Probe:
    m = n = k = batch = 1
    key = "probe"


class Tuned:
    """A GEMM callable over a candidate set: ``tuned(A, B, D, C=None, alpha=1, beta=0)``.

    Dispatch is one dict lookup by the key policy's bucket (thread-safe without a lock: misses take one). On a
    miss it tunes (``tune=True``: the ``top_k`` best-ranked candidates for the shape, plus those already compiled)
    or uses the nearest known bucket by log-distance of M, N, K (``tune=False``).
    """

    def __init__(self, space_or_operations, *, db: ResultsDB | str, policy="pow2", tune: bool = True, config=None,
                 session: Session | None = None, jobs: int | None = None, measure: Callable | None = None,
                 device_facts: dict | None = None, top_k: int | None = DEFAULT_TOP_K):
        self._tuner = _Tuner(space_or_operations, db, policy, config, session, jobs, measure, device_facts, top_k)
        self.tune_on_miss = tune
        self._chosen: dict[tuple, object] = {}
        self._lock = threading.Lock()

    @property
    def policy(self):
        return self._tuner.policy

    @property
    def op_class(self) -> str:
        """The operation class every candidate shares (``pycutlass.tune.db.operation_class``)."""
        return self._tuner.op_class

    def dispatched(self) -> dict:
        """``{(m, n, k, batch): operation}`` for every shape this callable has served so far."""
        return dict(self._chosen)

    def select(self, m: int, n: int, k: int, batch: int = 1):
        """The operation for this shape (tuning or falling back on a miss)."""
        found = self._chosen.get((m, n, k, batch))
        if found is not None:
            return found
        from .problems import GemmProblem

        problem = GemmProblem(m, n, k, batch)
        with self._lock:
            found = self._chosen.get((m, n, k, batch))
            if found is None:
                found = self._resolve(problem)
                self._chosen[(m, n, k, batch)] = found
        return found

    def _resolve(self, problem):
        key = self._tuner.key(problem)
        hit = self._tuner.cached(key)
        if hit is not None:
            return hit[0]
        if self.tune_on_miss:
            return self._tuner.tune(problem).operation
        nearest = self._nearest(problem)
        if nearest is None:
            raise ArgumentError(f"no tuning result for {problem.key} or any shape of this operation class on this "
                                f"device, and tuning is off (Tuned(..., tune=True) tunes on a miss)")
        return nearest

    def _nearest(self, problem):
        facts, policy = self._tuner.facts(), self._tuner.policy
        wanted = bucket_of(problem, policy)
        best, best_distance = None, math.inf
        for row in self._tuner.db.tuning_keys():
            key = json.loads(row["key"])
            if (key.get("device") != facts or key.get("op") != self._tuner.signature
                    or key.get("policy") != policy_name(policy)):
                continue
            bucket = key["bucket"]
            if len(bucket) != len(wanted) or not all(isinstance(v, (int, float)) and v > 0 for v in bucket + list(wanted)):
                continue
            distance = sum(abs(math.log2(a) - math.log2(b)) for a, b in zip(bucket, wanted))
            if distance < best_distance:
                hit = self._tuner.cached(row["key"])
                if hit is not None:
                    best, best_distance = hit[0], distance
        return best

    def __call__(self, A, B, D, C=None, alpha: float = 1.0, beta: float = 0.0, *, stream=None):
        batch = A.shape[0] if len(A.shape) == 3 else 1
        m, k = A.shape[-2], A.shape[-1]
        n = B.shape[-1]
        if B.shape[-2] != k or tuple(D.shape[-2:]) != (m, n):
            raise ArgumentError(f"Tuned GEMM: A {tuple(A.shape)}, B {tuple(B.shape)}, D {tuple(D.shape)} do not "
                                f"form (M x K) @ (K x N) -> (M x N)")
        operation = self.select(m, n, k, batch)
        mode = Mode.Batched if batch > 1 else Mode.Gemm
        arguments = GemmArguments(operation, (m, n, k), A, B, C, D,
                                          output_op=operation.epilogue_type(alpha, beta if C is not None else 0.0),
                                          gemm_mode=mode, batch=batch, stream=stream, session=self._tuner.session)
        operation.run(arguments)
        return arguments
