"""MathInstruction: the instruction a warp issues in the main loop, validated against what CUTLASS 2.x offers."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import DescriptionError
from .types import DataType, MathOperation, OpClass

_T, _S = OpClass.TensorOp, OpClass.Simt
_F64, _F32, _TF32, _F16, _BF16, _S8, _S32 = (DataType.float64, DataType.float32, DataType.tfloat32,
                                             DataType.float16, DataType.bfloat16, DataType.int8, DataType.int32)
_MA = MathOperation.multiply_add
_FAST = (MathOperation.multiply_add_fast_f32, MathOperation.multiply_add_fast_f16,
         MathOperation.multiply_add_fast_bf16)

# (opclass, instruction shape, element a/b, accumulator) -> allowed math operations.
# The table of the users' API document.
VALID_MATH_INSTRUCTIONS: dict[tuple, tuple[MathOperation, ...]] = {
    (_T, (8, 8, 4), _F64, _F64): (_MA,),
    (_T, (16, 8, 8), _TF32, _F32): (_MA,),
    (_T, (16, 8, 8), _F32, _F32): (_MA, *_FAST),  # multiply_add rounds float32 operands to tf32
    (_T, (16, 8, 8), _F16, _F32): (_MA,),
    (_T, (16, 8, 8), _BF16, _F32): (_MA,),
    (_T, (16, 8, 16), _F16, _F16): (_MA,),
    (_T, (16, 8, 16), _F16, _F32): (_MA,),
    (_T, (16, 8, 16), _BF16, _F32): (_MA,),
    # int8: CUTLASS 4.2's Sm80 mma exists only as OpMultiplyAddSaturate; multiply_add (what PyCUTLASS 2.11 scripts
    # ask for) is built with it (see MathInstruction.cutlass_math_operation).
    (_T, (16, 8, 32), _S8, _S32): (MathOperation.multiply_add_saturate, _MA),
    (_S, (1, 1, 1), _F64, _F64): (_MA,),
    (_S, (1, 1, 1), _F32, _F32): (_MA,),
    # fp8 exists in the SM90 family only; the Sm80-style shape there means "the builder chooses".
    (_T, (16, 8, 32), DataType.float8_e4m3, _F32): (_MA,),
    (_T, (16, 8, 32), DataType.float8_e5m2, _F32): (_MA,),
}

# PyCUTLASS's spelling of two fast float32 instructions (see MathInstruction.__post_init__).
_FAST_SPELLINGS = ((_F16, _F16, MathOperation.multiply_add_fast_f16),
                   (_BF16, _BF16, MathOperation.multiply_add_fast_bf16))

# SM90 warpgroup MMA (wgmma): M is 64, N a multiple of 8 up to 256, K fixed by the operand width.
# (element, accumulator) -> instruction K.
WARPGROUP_MATH_INSTRUCTIONS: dict[tuple, int] = {
    (_F16, _F32): 16, (_F16, _F16): 16, (_BF16, _F32): 16, (_TF32, _F32): 8, (_F32, _F32): 8,
    (DataType.float8_e4m3, _F32): 32, (DataType.float8_e5m2, _F32): 32, (_S8, _S32): 32,
}


def _describe_valid() -> str:
    rows = []
    for (opclass, shape, element, acc), ops in VALID_MATH_INSTRUCTIONS.items():
        names = "/".join(op.name for op in ops)
        rows.append(f"  {opclass.name} {list(shape)} {element.label}->{acc.label}: {names}")
    return "\n".join(rows)


@dataclass(frozen=True)
class MathInstruction:
    instruction_shape: tuple[int, int, int]
    element_a: DataType
    element_b: DataType
    element_accumulator: DataType
    opcode_class: OpClass
    math_operation: MathOperation = MathOperation.multiply_add

    def __post_init__(self):
        try:
            shape = tuple(int(x) for x in self.instruction_shape)
        except (TypeError, ValueError):
            raise DescriptionError(
                f"MathInstruction.instruction_shape must be three integers such as [16, 8, 16] (at compute capability "
                f"90 also a warpgroup shape [64, n, k], or an Sm80 shape meaning 'the builder chooses'), got "
                f"{self.instruction_shape!r}", rule="instruction.shape") from None
        if len(shape) != 3:
            raise DescriptionError(f"MathInstruction.instruction_shape must be three integers, got {list(shape)}",
                                   rule="instruction.shape")
        object.__setattr__(self, "instruction_shape", shape)
        if shape == (16, 8, 8) and self.opcode_class is _T and \
                (self.element_a, self.element_b, self.math_operation) in _FAST_SPELLINGS:
            # PyCUTLASS 2.11 (test/unit/test_sm80.py) names the fast float32 instructions by the type the mma rounds
            # the float32 operands to: [16, 8, 8] float16 + multiply_add_fast_f16 is CUTLASS's float32 GEMM with
            # OpMultiplyAddFastF16 (float32 in memory). It is that instruction, so it is stored as such.
            object.__setattr__(self, "element_a", _F32)
            object.__setattr__(self, "element_b", _F32)
        for field, value, kind in (("element_a", self.element_a, DataType), ("element_b", self.element_b, DataType),
                                   ("element_accumulator", self.element_accumulator, DataType),
                                   ("opcode_class", self.opcode_class, OpClass),
                                   ("math_operation", self.math_operation, MathOperation)):
            if not isinstance(value, kind):
                raise DescriptionError(f"MathInstruction.{field} must be a {kind.__name__}, got {value!r}",
                                       rule="description.field_type")
        if self.element_a != self.element_b and not (self.element_a.is_fp8 and self.element_b.is_fp8):
            raise DescriptionError(f"MathInstruction: element_a ({self.element_a.label}) and element_b "
                                   f"({self.element_b.label}) must be the same type (or two fp8 types)",
                                   rule="instruction.mixed_operands")
        if len(shape) == 3 and shape[0] == 64 and self.opcode_class is _T:
            self._check_warpgroup(shape)
            return
        key = (self.opcode_class, shape, self.element_a, self.element_accumulator)
        allowed = VALID_MATH_INSTRUCTIONS.get(key)
        if allowed is None or self.math_operation not in allowed:
            raise DescriptionError(
                f"MathInstruction {self.opcode_class.name} {list(shape)} {self.element_a.label}->"
                f"{self.element_accumulator.label} with {self.math_operation.name} is not supported. "
                f"Valid combinations:\n{_describe_valid()}", rule="instruction.unsupported")

    def _check_warpgroup(self, shape) -> None:
        k = WARPGROUP_MATH_INSTRUCTIONS.get((self.element_a, self.element_accumulator))
        rows = "\n".join(f"  [64, n, {kk}] {e.label}->{a.label}" for (e, a), kk in WARPGROUP_MATH_INSTRUCTIONS.items())
        if k is None or shape[2] != k or shape[1] % 8 or not 8 <= shape[1] <= 256 \
                or self.math_operation is not _MA:
            raise DescriptionError(
                f"warpgroup MathInstruction {list(shape)} {self.element_a.label}->{self.element_accumulator.label} "
                f"with {self.math_operation.name} is not supported; SM90 wgmma shapes (n a multiple of 8 in 8..256, "
                f"multiply_add) are:\n{rows}", rule="instruction.warpgroup_unsupported")

    @property
    def is_warpgroup(self) -> bool:
        """An SM90 warpgroup (wgmma) shape such as [64, 128, 16]: usable by compute capability 90 only."""
        return self.instruction_shape[0] == 64

    @property
    def cutlass_math_operation(self) -> MathOperation:
        """The math operation the kernel is built with. CUTLASS 4.2's Sm80 int8 tensor-core mma exists only as
        OpMultiplyAddSaturate (mma.sync ... .satfinite), so int8 multiply_add (PyCUTLASS 2.11 ran it with CUTLASS
        2.11's non-saturating mma) is built saturating: the same products and sums, clamped instead of wrapped
        should an int32 sum overflow (beyond ~133,000 products of int8 extremes)."""
        if self.opcode_class is _T and self.element_a is _S8 and self.math_operation is _MA:
            return MathOperation.multiply_add_saturate
        return self.math_operation

    # PyCUTLASS spelled these positionally; keep aliases that read well in emitted code.
    @property
    def opclass(self) -> OpClass:
        return self.opcode_class
