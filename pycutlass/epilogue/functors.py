"""Epilogue functors: D = f(alpha * accumulator + beta * C), and the runtime values they take."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..description.types import DataType
from ..errors import ArgumentError, DescriptionError
from .activations import Activation


@dataclass(frozen=True)
class EpilogueArguments:
    """The ``output_op`` value of an operation: alpha, beta and the activation's own arguments."""

    alpha: float
    beta: float
    activation_args: tuple[float, ...] = ()


# The types an epilogue computes in (tfloat32 and fp8 are operand formats for tensor cores).
COMPUTE_TYPES = (DataType.float16, DataType.bfloat16, DataType.float32, DataType.float64)


@dataclass(frozen=True)
class EpilogueFunctor:
    element_output: DataType
    alignment: int
    element_accumulator: DataType = DataType.float32
    element_epilogue: DataType | None = None  # None: float64 for a float64 epilogue, else float32
    kind: str = field(default="LinearCombination", init=False)
    activation: Activation | None = field(default=None, init=False)

    def __post_init__(self):
        self._resolve_element_epilogue()
        for name in ("element_output", "element_accumulator", "element_epilogue"):
            if not isinstance(getattr(self, name), DataType):
                raise DescriptionError(f"{type(self).__name__}.{name} must be a DataType, got {getattr(self, name)!r}",
                                       rule="description.field_type")
        if self.element_epilogue.is_integer:
            self._check_integer_epilogue()
        elif self.element_epilogue not in COMPUTE_TYPES:
            why = ("the tensor cores' operand format (float32 rounded to a 10-bit mantissa), not an arithmetic type"
                   if self.element_epilogue is DataType.tfloat32 else
                   "a storage format of 2-3 significant bits that CUTLASS's activations do not build in")
            raise DescriptionError(
                f"{type(self).__name__}: element_epilogue {self.element_epilogue.label} is {why}; alpha * accumulator "
                f"+ beta * C computes in one of {', '.join(t.label for t in COMPUTE_TYPES)} (float32 for a "
                f"tfloat32 GEMM)", rule="epilogue.compute_type")
        # Up to 256 bits: tensor-op GEMM epilogues store C/D 32 bytes at a time (the operations check the rest).
        max_alignment = 256 // self.element_output.bits
        if not isinstance(self.alignment, int) or self.alignment < 1 or self.alignment > max_alignment \
                or self.alignment & (self.alignment - 1):
            raise DescriptionError(f"{type(self).__name__}.alignment {self.alignment!r} must be a power of two "
                                   f"<= {max_alignment} for {self.element_output.label}", rule="epilogue.alignment")

    def _check_integer_epilogue(self) -> None:
        """int32 compute, as PyCUTLASS 2.11's s8 -> s32 GEMM tests ask for: CUTLASS's LinearCombination(Clamp)
        computes alpha * accumulator + beta * C in int32 (alpha and beta are then integers). Kept to int32
        accumulators, and to the outputs whose conversion from int32 is exact or clamped: int32, or int8 after
        LinearCombinationClamp (a plain int8 conversion would wrap)."""
        outputs = (DataType.int32, DataType.int8) if self.kind == "LinearCombinationClamp" else (DataType.int32,)
        if self.element_epilogue is not DataType.int32 or self.element_accumulator is not DataType.int32 or \
                self.kind not in ("LinearCombination", "LinearCombinationClamp") or \
                self.element_output not in outputs:
            raise DescriptionError(
                f"{type(self).__name__}: an integer epilogue computes in int32, for LinearCombination with int32 "
                f"accumulators and int32 output or LinearCombinationClamp with int32 accumulators and int8/int32 "
                f"output; got element_epilogue {self.element_epilogue.label}, accumulator "
                f"{self.element_accumulator.label}, output {self.element_output.label}. Otherwise the epilogue "
                f"computes in a floating-point type (float32)", rule="epilogue.compute_type")

    def _wide_types(self) -> list[str]:
        """What makes this a float64 epilogue: a float64 output, accumulator or activation."""
        wide = [f"{name} {getattr(self, name).label}" for name in ("element_output", "element_accumulator")
                if getattr(self, name) is DataType.float64]
        if self.activation is not None and self.activation.element is DataType.float64:
            wide.append(f"activation {self.activation.name}(float64)")
        return wide

    def _resolve_element_epilogue(self) -> None:
        """A float64 epilogue computes in float64. CUTLASS computes alpha, beta and the activation in ElementCompute
        (= element_epilogue), so float32 there rounds every float64 result to about 3e-8: omitted,
        element_epilogue becomes float64; given narrower, the description is rejected. (A float64 reference must be
        float64 too: torch's CUDA F.hardswish is 2^-25 high on float64 tensors, see pycutlass.torch.reference.)"""
        if not isinstance(self.element_output, DataType) or not isinstance(self.element_accumulator, DataType):
            return  # reported by the type checks below
        wide = self._wide_types()
        if self.element_epilogue is None:
            object.__setattr__(self, "element_epilogue", DataType.float64 if wide else DataType.float32)
        elif wide and self.element_epilogue is not DataType.float64:
            raise DescriptionError(
                f"{type(self).__name__}: a float64 epilogue ({', '.join(wide)}) must compute in float64: CUTLASS "
                f"computes alpha, beta and the activation in element_epilogue, and "
                f"{getattr(self.element_epilogue, 'label', self.element_epilogue)} would round the float64 results; "
                f"pass element_epilogue=float64 or leave it out", rule="epilogue.compute_type")

    @property
    def num_activation_args(self) -> int:
        return self.activation.num_arguments if self.activation else 0

    def make_arguments(self, alpha=1.0, beta=0.0, *activation_args) -> EpilogueArguments:
        if len(activation_args) != self.num_activation_args:
            names = self.activation.argument_names if self.activation else ()
            raise ArgumentError(f"{self.describe()} takes alpha, beta and {self.num_activation_args} activation "
                                f"argument(s) {list(names)}; got {len(activation_args)} activation argument(s)")
        try:
            values = (float(alpha), float(beta), *(float(a) for a in activation_args))
        except (TypeError, ValueError):
            raise ArgumentError(f"epilogue arguments must be numbers, got alpha={alpha!r}, beta={beta!r}, "
                                f"activation args={activation_args!r}") from None
        if self.element_epilogue.is_integer and not all(v.is_integer() and abs(v) < 2 ** 31 for v in values[:2]):
            raise ArgumentError(f"{self.describe()} computes in {self.element_epilogue.label}: alpha and beta must be "
                                f"integers, got alpha={alpha!r}, beta={beta!r}")
        return EpilogueArguments(values[0], values[1], tuple(values[2:]))

    def describe(self) -> str:
        act = f"<{self.activation.name}>" if self.activation else ""
        return f"{self.kind}{act}"


@dataclass(frozen=True)
class LinearCombination(EpilogueFunctor):
    pass


# Outputs cutlass::epilogue::thread::LinearCombinationClamp compiles for (linear_combination_clamp.h): the generic
# template clamps to platform::numeric_limits<ElementOutput>::max() and ::lowest(), which CUTLASS defines for the
# integer types, half_t and bfloat16_t but not for float (no lowest()) nor double (no numeric_limits at all); the
# specialization for int32 accumulators computed in float static_asserts an integer output.
CLAMP_OUTPUTS = (DataType.int8, DataType.int32, DataType.float16, DataType.bfloat16)


@dataclass(frozen=True)
class LinearCombinationClamp(EpilogueFunctor):
    kind: str = field(default="LinearCombinationClamp", init=False)

    def __post_init__(self):
        super().__post_init__()
        out = self.element_output
        if out not in CLAMP_OUTPUTS:
            raise DescriptionError(
                f"LinearCombinationClamp clamps to the output type's range with CUTLASS's platform::numeric_limits, "
                f"which has max() and lowest() only for {', '.join(e.label for e in CLAMP_OUTPUTS)} outputs; got "
                f"{out.label} (float32 has no lowest(), float64 no numeric_limits). Use LinearCombination",
                rule="epilogue.clamp_output")
        if self.element_accumulator is DataType.int32 and self.element_epilogue is DataType.float32 \
                and out.is_float:
            raise DescriptionError(
                f"LinearCombinationClamp with int32 accumulators computed in float32 is CUTLASS's integer-output "
                f"specialization (static_assert: integer output); got {out.label}. Use int8 or int32 output",
                rule="epilogue.integer_output")


@dataclass(frozen=True)
class FastLinearCombinationClamp(EpilogueFunctor):
    """int8 output from int32 accumulators computed in float; CUTLASS's fast path, valid for K <= 256.

    ``FastLinearCombinationClamp(element_output, alignment)``; PyCUTLASS's 4-argument form
    ``(element_output, alignment, element_accumulator, element_epilogue)``, which scripts use to build every
    functor alike, is accepted too: CUTLASS's functor has no such template parameters (it always reads int32 and
    computes in float32), so those two must be int32 and float32 (or None) and change nothing.
    """

    element_accumulator: DataType = field(default=DataType.int32, init=False)
    element_epilogue: DataType = field(default=DataType.float32, init=False)
    kind: str = field(default="FastLinearCombinationClamp", init=False)

    def __init__(self, element_output: DataType, alignment: int, element_accumulator: DataType | None = None,
                 element_epilogue: DataType | None = None):
        for name, given, fixed in (("element_accumulator", element_accumulator, DataType.int32),
                                   ("element_epilogue", element_epilogue, DataType.float32)):
            if given is not None and given is not fixed:
                raise DescriptionError(
                    f"FastLinearCombinationClamp always has {name} {fixed.label} (CUTLASS's functor takes only the "
                    f"output type and alignment); got {getattr(given, 'label', given)!r}. Leave it out, or use "
                    f"LinearCombinationClamp", rule="epilogue.fast_clamp")
        object.__setattr__(self, "element_output", element_output)
        object.__setattr__(self, "alignment", alignment)
        object.__setattr__(self, "element_accumulator", DataType.int32)
        object.__setattr__(self, "element_epilogue", DataType.float32)
        object.__setattr__(self, "kind", "FastLinearCombinationClamp")
        object.__setattr__(self, "activation", None)
        self.__post_init__()

    def __post_init__(self):
        if self.element_output is not DataType.int8:
            raise DescriptionError(f"FastLinearCombinationClamp writes int8 output, got "
                                   f"{getattr(self.element_output, 'label', self.element_output)}",
                                   rule="epilogue.fast_clamp")
        super().__post_init__()


# Activations whose CUTLASS functor has no bfloat16_t form (Tanh, Sigmoid, SiLu return fast_tanh / fast_exp's float
# result as T; bfloat16_t converts from float only explicitly). The others compile and compute in bfloat16.
BFLOAT16_UNCOMPILABLE = ("tanh", "sigmoid", "silu")


class LinearCombinationGeneric(EpilogueFunctor):
    """D = activation(alpha * accumulator + beta * C). First argument: an activation such as ``relu(float32)``."""

    def __init__(self, activation: Activation, element_output: DataType, alignment: int,
                 element_accumulator: DataType = DataType.float32, element_epilogue: DataType | None = None):
        if not isinstance(activation, Activation):
            raise DescriptionError(f"LinearCombinationGeneric needs an activation such as relu(pycutlass.float32) "
                                   f"as its first argument, got {activation!r}", rule="description.field_type")
        object.__setattr__(self, "activation", activation)
        object.__setattr__(self, "kind", "LinearCombinationGeneric")
        object.__setattr__(self, "element_output", element_output)
        object.__setattr__(self, "alignment", alignment)
        object.__setattr__(self, "element_accumulator", element_accumulator)
        object.__setattr__(self, "element_epilogue", element_epilogue)
        self.__post_init__()
        if self.element_epilogue is DataType.bfloat16 and activation.name in BFLOAT16_UNCOMPILABLE:
            raise DescriptionError(
                f"LinearCombinationGeneric: {activation.name} cannot compute in bfloat16: CUTLASS's "
                f"{activation.cpp_template.rsplit('::', 1)[-1]}<bfloat16_t> returns the float of its fast "
                f"{'tanh' if activation.name == 'tanh' else 'exp'} where a bfloat16_t is due, which does not "
                f"compile; pass element_epilogue=float32 (or float16)", rule="epilogue.activation_type")

    def __repr__(self) -> str:
        # The activation's full repr (with its compute type) keeps operation names unique.
        return (f"LinearCombinationGeneric({self.activation!r}, {self.element_output!r}, {self.alignment}, "
                f"{self.element_accumulator!r}, {self.element_epilogue!r})")
