"""Argument rules several kinds share: PyCUTLASS's positional call forms (``UNSET``, ``compat_positional``), the
problem size and ``output_op`` checks, the operands' alignment against the problem, and the Sm80 family's split-K
output rules."""
from __future__ import annotations

import functools
import inspect

import numpy as np

from ...description.coords import GemmCoord
from ...description.types import LayoutType
from ...epilogue.functors import EpilogueArguments
from ...errors import ArgumentError, UnknownKeywordError
from ...runtime.launch import GRID_LIMITS
from .modes import Mode

@functools.cache
def accepted_keywords(cls: type) -> frozenset:
    """The keyword names ``cls(...)`` takes: the named parameters of every ``__init__`` along its MRO that forwards
    ``**keywords`` to the next (a subclass adds its knobs, the base class keeps PyCUTLASS's)."""
    names = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters.values()
        names |= {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return frozenset(names - {"self"})


def check_keywords(cls: type, operation, keywords: dict) -> None:
    """Refuse keywords ``cls`` does not take with the operation's name and what it does take (a keyword of another
    kind, such as an SM90 knob given for an Sm80-family operation, would otherwise end in a TypeError)."""
    unknown = sorted(set(keywords) - accepted_keywords(cls))
    if unknown:
        from ..base import Operation

        name = operation.name if isinstance(operation, Operation) else type(operation).__name__
        raise UnknownKeywordError(f"{cls.__name__} for {name} takes no {', '.join(map(repr, unknown))} (keywords of "
                            f"another kind of operation, e.g. SM90's knobs and scales); it takes "
                            f"{sorted(accepted_keywords(cls) - {'operation'})}")


def coerce_problem_size(problem_size) -> GemmCoord:
    if isinstance(problem_size, GemmCoord):
        return problem_size
    try:
        m, n, k = problem_size
    except (TypeError, ValueError):
        raise ArgumentError(f"problem_size must be a pycutlass.gemm.GemmCoord(M, N, K), got {problem_size!r}") \
            from None
    return GemmCoord(m, n, k)


def coerce_output_op(operation, output_op) -> EpilogueArguments:
    if output_op is None:
        return operation.epilogue_type(1.0, 0.0)
    if isinstance(output_op, EpilogueArguments):
        if len(output_op.activation_args) != operation.epilogue_functor.num_activation_args:
            return operation.epilogue_type(output_op.alpha, output_op.beta, *output_op.activation_args)
        return output_op
    if isinstance(output_op, (list, tuple)):
        return operation.epilogue_type(*output_op)
    raise ArgumentError(f"output_op must come from operation.epilogue_type(alpha, beta, ...), got {output_op!r}")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ArgumentError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def problem_alignment_checks(operation) -> tuple:
    """(operand, elements per access, dimension name, index into (M, N, K)) of each operand's contiguous dimension:
    what ``check_problem_alignment`` tests, worked out once per operation layout (grouped Arguments test every
    problem)."""
    checks = []
    for label, desc, contiguous in (("A", operation.A, {LayoutType.RowMajor: ("K", 2), LayoutType.ColumnMajor: ("M", 0)}),
                                    ("B", operation.B, {LayoutType.RowMajor: ("N", 1), LayoutType.ColumnMajor: ("K", 2)}),
                                    ("C", operation.C, {LayoutType.RowMajor: ("N", 1), LayoutType.ColumnMajor: ("M", 0)})):
        if desc.layout in contiguous:
            dim, index = contiguous[desc.layout]
            checks.append((label, desc.alignment, dim, index))
        else:  # interleaved-32
            dim, index = ("N", 1) if label == "C" else ("K", 2)
            checks.append((label, 32, dim, index))
    return tuple(checks)


def check_problem_alignment(operation, m: int, n: int, k: int, checks: tuple | None = None) -> None:
    """CUTLASS's can_implement: vector accesses along the contiguous dimension must not straddle rows.
    ``checks``: ``problem_alignment_checks(operation)``, when the caller tests many problems."""
    extents = (m, n, k)
    for label, alignment, dim, index in checks or problem_alignment_checks(operation):
        if extents[index] % alignment:
            raise ArgumentError(f"{operation.name}: {label} is accessed {alignment} elements at a time along {dim}, "
                                f"so {dim} must be a multiple of {alignment}; got {dim}={extents[index]}. Use an "
                                f"operation with a smaller {label} alignment")


UNSET = object()  # a keyword not passed (PyCUTLASS's positional mode needs to tell "not passed" from a default)


def compat_positional(what: str, positional: tuple, names: tuple, keywords: dict, mode_name: str, mode_type) -> dict:
    """Binds the Arguments' positional parameters after D, in pycutlass's order (``names``), with PyCUTLASS's form
    too: PyCUTLASS took the mode right after D (``GemmArguments(op, size, A, B, C, D, gemm_mode, **kwargs)``,
    ``Conv2dArguments(..., D, split_k_mode, **kwargs)``), where pycutlass takes ``output_op``; a mode found there is
    the mode, and ``output_op`` comes by keyword as PyCUTLASS required. Returns the values by name (UNSET: not given).
    """
    values = dict(keywords)
    if positional and isinstance(positional[0], mode_type):
        if len(positional) > 1:
            raise ArgumentError(f"{what}: after {mode_name} (PyCUTLASS's positional order) pass the rest by keyword")
        order = (mode_name,)
    else:
        order = names
    if len(positional) > len(order):
        raise TypeError(f"{what}() takes at most {6 + len(order)} positional arguments after self, got "
                        f"{6 + len(positional)}")
    for name, value in zip(order, positional):
        if values.get(name, UNSET) is not UNSET:
            raise ArgumentError(f"{what}: {name} was passed both by position ({value!r}) and by keyword "
                                f"({values[name]!r}); pass it once")
        values[name] = value
    return values


SM80_MAX_BATCH = GRID_LIMITS[2]  # one grid z layer per batch


def check_sm80_batch(batch: int) -> None:
    """An Sm80-family GEMM runs each batch in one layer of the grid's z; CUTLASS's batched swizzle even keeps only
    batch % 65536 of them (65536 batches would write nothing)."""
    if batch > SM80_MAX_BATCH:
        raise ArgumentError(f"batch {batch} exceeds {SM80_MAX_BATCH}: an Sm80-family GEMM runs each batch in its own "
                            f"layer of the launch grid's z, which CUDA caps at {SM80_MAX_BATCH}; split the batch "
                            f"across calls")


def check_split_k_output(operation, mode, split_k_slices, output_op) -> None:
    """Split-K keeps partial results in D's type where that rounds them: reject what would come out wrong.

    Serial split-K (``Mode.Gemm``, ``split_k_slices`` > 1, on kernels whose slices add up in D: the Sm80 family)
    stores each K slice's ``alpha * partial (+ beta * C)`` in D and the next slice adds its own to that. An integer
    D rounds (and an int8 one clamps) every partial, which a float D does not need to; with an int32 D and an
    integral alpha the partials stay whole numbers and the sum is exact. ``GemmSplitKParallel`` writes the raw
    partial sums in D's type: an integer type narrower than 32 bits clamps them.
    """
    element = operation.C.element
    if not element.is_integer or split_k_slices == 1 and mode is not Mode.GemmSplitKParallel:
        return
    if mode is Mode.GemmSplitKParallel and element.bits < 32:
        raise ArgumentError(f"parallel split-K writes its partial sums in the operation's {element.label} output "
                            f"type, which would clamp them; build the operation with an int32 output for the "
                            f"partials and reduce them into {element.label} with a ReductionOperation")
    if mode is not Mode.Gemm or not operation.serial_split_k_through_output:
        return
    if element.bits < 32:
        raise ArgumentError(f"serial split-K (split_k_slices={split_k_slices}) stores each K slice's partial result "
                            f"in D, and a {element.label} D rounds and clamps every one of them: use "
                            f"split_k_slices=1, an int32 output, or GemmSplitKParallel with int32 partials")
    if not float(output_op.alpha).is_integer():
        raise ArgumentError(f"serial split-K (split_k_slices={split_k_slices}) rounds alpha * partial to an integer "
                            f"for every K slice of an integer D; with alpha={output_op.alpha} the slices' roundings "
                            f"add up: use split_k_slices=1 or an integral alpha")


def zero_unwritten_partials(arguments, launch, slices: int, slice_bytes: int) -> None:
    """Parallel split-K: zero the workspace slices no thread block writes, so a reduction over all ``slices`` adds
    zeros there. CUTLASS 2.x cuts K into chunks of whole 128-bit accesses, so a short K is split fewer ways than
    asked (K=2 in 5 float32 slices: one chunk of 4, one slice written). The kernel's grid has one z layer per K
    chunk in every 2.x swizzle; the device builder reports that grid (``launch``: the PreparedLaunch)."""
    written = int(launch.grid[2])
    if written < slices:
        from ...runtime import driver

        driver.memset_d8(arguments.workspace + written * slice_bytes, 0, (slices - written) * slice_bytes,
                         arguments.stream)


def split_k_slices_alias(split_k_slices, split_k_splices):
    """``split_k_splices=``: PyCUTLASS 2.11's README and its frontend test spell the keyword so, and its
    GemmArguments swallowed unknown keywords; here it is read as ``split_k_slices`` (a warning names the spelling)."""
    import warnings

    if split_k_slices is not UNSET and split_k_slices != split_k_splices:
        raise ArgumentError(f"split_k_slices={split_k_slices!r} and split_k_splices={split_k_splices!r} disagree; "
                            f"pass split_k_slices only")
    warnings.warn("GemmArguments(split_k_splices=...) is PyCUTLASS 2.11's misspelling of split_k_slices; it is read "
                  "as split_k_slices", UserWarning, stacklevel=3)
    return split_k_splices
