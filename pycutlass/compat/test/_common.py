"""What the GEMM and conv testbeds share: PyCUTLASS 2.11's inputs (small integers from a seed), float64 references
of the epilogue, and the verdict."""
from __future__ import annotations

import logging

import numpy as np

from ...description.types import DataType
from ...epilogue.activations import reference as activation_reference
from ...errors import ArgumentError, DescriptionError

log = logging.getLogger("pycutlass.test")

SEED = 2080  # PyCUTLASS 2.11's testbeds' default seed

_NUMPY = {DataType.float64: np.float64, DataType.float32: np.float32, DataType.tfloat32: np.float32,
          DataType.float16: np.float16, DataType.int8: np.int8, DataType.int32: np.int32}
_ML_DTYPES = {DataType.bfloat16: "bfloat16", DataType.float8_e4m3: "float8_e4m3fn",
              DataType.float8_e5m2: "float8_e5m2"}


def numpy_type(element: DataType):
    """The numpy type a testbed's host tensors use for ``element`` (bfloat16 and fp8 through ml_dtypes, as
    PyCUTLASS's through the ``bfloat16`` package)."""
    if element in _NUMPY:
        return _NUMPY[element]
    if element in _ML_DTYPES:
        try:
            import ml_dtypes
        except ImportError:
            raise ArgumentError(f"the testbeds keep {element.label} tensors in numpy, which needs ml_dtypes "
                                f"(pip install ml_dtypes)") from None
        return getattr(ml_dtypes, _ML_DTYPES[element])
    raise ArgumentError(f"the testbeds do not support {element.label} tensors")


def scope(element: DataType) -> tuple[int, int]:
    """PyCUTLASS's value range by the operand's width: small integers, exact in every type and every sum here."""
    if element.bits == 1:
        return 0, 1
    if element.bits <= 8:
        return -1, 1
    if element.bits == 16:
        return -4, 4
    return -8, 8


def uniform_integers(rng: np.random.Generator, size, element: DataType, bounds) -> np.ndarray:
    low, high = bounds
    return rng.integers(low, high + 1, size=size).astype(np.float64).astype(numpy_type(element))


def activation_arguments(functor, given) -> tuple:
    """The activation's runtime arguments, checked by the functor itself: PyCUTLASS's testbeds passed only alpha
    and beta, so an activation that takes more (leaky_relu) needs them from the caller."""
    given = tuple(given)
    try:
        functor.make_arguments(1.0, 0.0, *given)
    except ArgumentError as error:
        raise ArgumentError(f"{error}; pass them to the testbed as activation_args=(...)") from None
    return given


# The largest finite value of each float output a Clamp epilogue takes (float16, bfloat16: 0x7F7F) and clips to.
_FINITE_MAX = {DataType.float16: float(np.finfo(np.float16).max), DataType.bfloat16: 3.3895313892515355e38}


def epilogue_reference(functor, element_out: DataType, accumulator, source, alpha, beta, activation_args=()):
    """D = act(alpha * accumulator + beta * C) in float64, then what the output conversion does: integers round
    and saturate, the Clamp epilogues clamp to the output's range."""
    x = float(alpha) * accumulator + (float(beta) * source if source is not None else 0.0)
    if functor.activation is not None:
        x = activation_reference(functor.activation.name, x, *activation_args)
    if element_out.is_integer:
        info = np.iinfo(np.int8 if element_out is DataType.int8 else np.int32)
        return np.clip(np.rint(x), info.min, info.max)
    if "Clamp" in functor.kind:
        finite = _FINITE_MAX.get(element_out)
        if finite is not None:
            x = np.clip(x, -finite, finite)
    return x


_TOLERANCE = {DataType.float64: 1e-12, DataType.float32: 1e-5, DataType.float16: 2e-3, DataType.bfloat16: 1.5e-2,
              DataType.float8_e4m3: 8e-2, DataType.float8_e5m2: 1.5e-1}


def tolerance(functor, element_out: DataType, accumulator: DataType) -> float:
    """The relative (Frobenius) error a correct result stays under: the output's rounding, widened where the
    epilogue or the accumulator computes in 16 bits."""
    tol = _TOLERANCE.get(element_out, 1e-5)
    if functor.element_epilogue.bits <= 16 or accumulator.bits <= 16:
        tol = max(tol, 1e-2)
    return tol


def matches(got, reference, functor, element_out: DataType, accumulator: DataType,
            serial_slices: int = 1) -> tuple[bool, str]:
    """(passed, what was wrong). Integer outputs are exact (a float epilogue's rounding ties may differ by one).
    ``serial_slices``: serial split-K rounds each slice's partial result into D, so a 16-bit float D carries that
    many roundings of partial sums (the tolerance grows with them)."""
    got = np.asarray(got, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if not np.all(np.isfinite(got)):
        return False, f"{int(np.sum(~np.isfinite(got)))} non-finite output element(s)"
    if element_out.is_integer:
        limit = 0 if functor.kind == "LinearCombination" else 1
        worst = float(np.max(np.abs(got - reference), initial=0.0))
        return worst <= limit, f"largest difference {worst} (allowed {limit})"
    norm = float(np.linalg.norm(reference)) or 1.0
    error = float(np.linalg.norm(got - reference)) / norm
    tol = tolerance(functor, element_out, accumulator)
    if element_out.bits <= 16:
        tol *= max(1, int(serial_slices))
    return error <= tol, f"relative error {error:.3g} (tolerance {tol:.3g})"


def poisoned(size: int, element: DataType) -> np.ndarray:
    """An output buffer every element of which a run must overwrite (NaN, or -77 for integers)."""
    return np.full(size, -77 if element.is_integer else np.nan).astype(numpy_type(element))


def reduction_for(operation):
    """PyCUTLASS's ReductionOperation for an operation's parallel split-K: its epilogue, over partials in its output
    type (what pycutlass's split-K writes). Raises DescriptionError where no reduction takes that output."""
    from ...description.coords import MatrixCoord
    from ...kinds.reduction.operation import ReductionOperation

    functor = operation.epilogue_functor
    return ReductionOperation(
        shape=MatrixCoord(4, 32 * operation.C.alignment), C=operation.C,
        element_accumulator=operation.tile_description.math_instruction.element_accumulator,
        element_workspace=operation.C.element, element_compute=functor.element_epilogue, epilogue_functor=functor,
        count=operation.C.alignment)


def sweep_verdict(launcher, what: str, attempts: int, skipped_before: int, passed: bool) -> bool:
    """A sweep's result: False, with the reason printed, when the arguments refused every case (a sweep that ran
    nothing has shown nothing); the refused cases are logged either way."""
    refused = len(launcher.skipped) - skipped_before
    if refused:
        log.warning("%s(%s): %d of %d case(s) refused by the arguments and skipped, e.g. %s", what,
                    launcher.operation.name, refused, attempts, launcher.skipped[skipped_before])
    if attempts and refused == attempts:
        print(f"{what}: the arguments refused all {attempts} cases, so nothing ran; the first refusal: "
              f"{launcher.skipped[skipped_before]}")
        return False
    return passed


class Launcher:
    """What the GEMM, conv and grouped testbeds share: settings, the split-K reduction (``with_reduction``),
    compiling, and one checked (or profiled) run."""

    def __init__(self, operation, seed, verification, profiling, warmup_iterations, iterations, activation_args,
                 kwargs, with_reduction: bool = True) -> None:
        from ... import compiler
        from .profiler import GpuTimer

        self.operation = operation
        self.functor = operation.epilogue_functor
        self.activation_args = activation_arguments(self.functor, activation_args)
        self.accumulator = operation.tile_description.math_instruction.element_accumulator
        for description in (operation.A, operation.B, operation.C):
            numpy_type(description.element)  # bfloat16 / fp8 without ml_dtypes: say so now
        self.seed, self.verification, self.profiling = int(seed), bool(verification), bool(profiling)
        self.warmup_iterations, self.iterations = int(warmup_iterations), int(iterations)
        self.sleep_time = float(kwargs.get("sleep", 0))
        self.bounds = scope(operation.A.element)
        self.timer = GpuTimer()
        self.skipped: list[str] = []  # cases the arguments refused, with why
        self.reduction_operation, self._no_reduction = None, "this testbed runs no split-K reduction"
        if with_reduction:
            try:
                self.reduction_operation = reduction_for(operation)
            except DescriptionError as error:
                self._no_reduction = str(error)
        compiler.add_module([op for op in (operation, self.reduction_operation) if op is not None])

    def reduction_arguments(self, arguments, problem_size, partitions, destination, source, alpha, beta):
        from ...kinds.reduction.arguments import ReductionArguments

        if self.reduction_operation is None:
            raise ArgumentError(f"no ReductionOperation for this output: {self._no_reduction}")
        return ReductionArguments(self.reduction_operation, problem_size=problem_size, partitions=partitions,
                                  workspace=arguments, destination=destination, source=source,
                                  output_op=self.reduction_operation.epilogue_type(alpha, beta,
                                                                                   *self.activation_args))

    def execute(self, case: str, build, reference, output, serial_slices: int, report, compare=None):
        """Build the arguments (``build()`` -> (arguments, reduction arguments or None); an ArgumentError skips the
        case), run, then compare ``output()`` with ``reference()`` (or call ``compare()`` -> (passed, detail)
        where one output is not enough), ``report(detail)`` on a mismatch; or profile. True / False, or
        milliseconds per run when profiling."""
        from ...runtime.memory import get_allocated_size

        before = get_allocated_size()
        try:
            arguments, reduction = build()
        except ArgumentError as error:
            self.skipped.append(f"{case}: {error}")
            log.info("skipped %s: %s", case, error)
            return True
        self._once(arguments, reduction)
        passed = True
        if self.verification:
            (reduction or arguments).sync()
            passed, detail = compare() if compare is not None else matches(
                output(), reference(), self.functor, self.operation.C.element, self.accumulator, serial_slices)
            if not passed:
                report(detail)
        runtime = self._profile(arguments, reduction) if self.profiling else None
        del arguments, reduction
        after = get_allocated_size()
        assert after == before, f"{after - before} bytes of device memory were not released after {case}"
        return runtime if self.profiling else passed

    def _once(self, arguments, reduction) -> None:
        self.operation.run(arguments)
        if reduction is not None:
            self.reduction_operation.run(reduction)

    def _profile(self, arguments, reduction) -> float:
        import time

        time.sleep(self.sleep_time)
        for _ in range(self.warmup_iterations):
            self._once(arguments, reduction)
        self.timer.start(arguments.stream)
        for _ in range(self.iterations):
            self._once(arguments, reduction)
        self.timer.stop_and_wait(arguments.stream)
        return self.timer.duration(self.iterations)
