"""C++ spellings of description enums. The one place that knows CUTLASS's type names."""
from __future__ import annotations

from ..description.types import DataType, LayoutType, MathOperation, OpClass, SwizzlingFunctor

ELEMENT = {
    DataType.float64: "double",
    DataType.float32: "float",
    DataType.tfloat32: "cutlass::tfloat32_t",
    DataType.float16: "cutlass::half_t",
    DataType.bfloat16: "cutlass::bfloat16_t",
    DataType.int8: "int8_t",
    DataType.int32: "int32_t",
    DataType.float8_e4m3: "cutlass::float_e4m3_t",
    DataType.float8_e5m2: "cutlass::float_e5m2_t",
}

SHORT = {DataType.float64: "f64", DataType.float32: "f32", DataType.tfloat32: "tf32", DataType.float16: "f16",
         DataType.bfloat16: "bf16", DataType.int8: "s8", DataType.int32: "s32",
         DataType.float8_e4m3: "e4m3", DataType.float8_e5m2: "e5m2"}

LAYOUT = {
    LayoutType.RowMajor: "cutlass::layout::RowMajor",
    LayoutType.ColumnMajor: "cutlass::layout::ColumnMajor",
    LayoutType.RowMajorInterleaved32: "cutlass::layout::RowMajorInterleaved<32>",
    LayoutType.ColumnMajorInterleaved32: "cutlass::layout::ColumnMajorInterleaved<32>",
    LayoutType.TensorNHWC: "cutlass::layout::TensorNHWC",
    LayoutType.TensorNC32HW32: "cutlass::layout::TensorNCxHWx<32>",
    LayoutType.TensorC32RSK32: "cutlass::layout::TensorCxRSKx<32>",
}

LAYOUT_SHORT = {LayoutType.RowMajor: "t", LayoutType.ColumnMajor: "n", LayoutType.RowMajorInterleaved32: "t32",
                LayoutType.ColumnMajorInterleaved32: "n32", LayoutType.TensorNHWC: "nhwc",
                LayoutType.TensorNC32HW32: "nc32hw32", LayoutType.TensorC32RSK32: "c32rsk32"}

# Transposing a matrix swaps these layouts; used to canonicalize column-major outputs to row-major.
TRANSPOSED = {LayoutType.RowMajor: LayoutType.ColumnMajor, LayoutType.ColumnMajor: LayoutType.RowMajor}

OPCLASS = {OpClass.TensorOp: "cutlass::arch::OpClassTensorOp", OpClass.Simt: "cutlass::arch::OpClassSimt"}

MATH_OPERATION = {
    MathOperation.multiply_add: "cutlass::arch::OpMultiplyAdd",
    MathOperation.multiply_add_fast_f32: "cutlass::arch::OpMultiplyAddFastF32",
    MathOperation.multiply_add_fast_f16: "cutlass::arch::OpMultiplyAddFastF16",
    MathOperation.multiply_add_fast_bf16: "cutlass::arch::OpMultiplyAddFastBF16",
    MathOperation.multiply_add_saturate: "cutlass::arch::OpMultiplyAddSaturate",
}


def arch_tag(family: str) -> str:
    """CUTLASS's architecture tag of a template family (Hopper runs the Sm80 family with the Sm80 tag)."""
    return {"sm80": "cutlass::arch::Sm80"}[family]


def gemm_swizzle(swizzle: SwizzlingFunctor) -> str:
    if swizzle.kind == "gemm":
        return f"cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<{swizzle.log_tile}>"
    if swizzle.kind == "horizontal":
        return "cutlass::gemm::threadblock::GemmHorizontalThreadblockSwizzle"
    if swizzle.kind == "batched":
        return "cutlass::gemm::threadblock::GemmBatchedIdentityThreadblockSwizzle"
    if swizzle.kind == "strided_dgrad":
        return f"cutlass::conv::threadblock::StridedDgradIdentityThreadblockSwizzle<{swizzle.log_tile}>"
    if swizzle.kind == "strided_dgrad_horizontal":
        return "cutlass::conv::threadblock::StridedDgradHorizontalThreadblockSwizzle"
    raise KeyError(swizzle)


def epilogue_functor(functor) -> str:
    """The C++ type of an epilogue functor description."""
    out = ELEMENT[functor.element_output]
    acc = ELEMENT[functor.element_accumulator]
    comp = ELEMENT[functor.element_epilogue]
    if functor.kind == "LinearCombination":
        return f"cutlass::epilogue::thread::LinearCombination<{out}, {functor.alignment}, {acc}, {comp}>"
    if functor.kind == "LinearCombinationClamp":
        return f"cutlass::epilogue::thread::LinearCombinationClamp<{out}, {functor.alignment}, {acc}, {comp}>"
    if functor.kind == "FastLinearCombinationClamp":
        return f"cutlass::epilogue::thread::FastLinearCombinationClamp<{out}, {functor.alignment}>"
    if functor.kind == "LinearCombinationGeneric":
        return (f"cutlass::epilogue::thread::LinearCombinationGeneric<{functor.activation.cpp_template}, {out}, "
                f"{functor.alignment}, {acc}, {comp}>")
    raise KeyError(functor.kind)


def epilogue_headers(functor) -> list[str]:
    headers = {
        "LinearCombination": "cutlass/epilogue/thread/linear_combination.h",
        "LinearCombinationClamp": "cutlass/epilogue/thread/linear_combination_clamp.h",
        "FastLinearCombinationClamp": "cutlass/epilogue/thread/linear_combination_clamp.h",
        "LinearCombinationGeneric": "cutlass/epilogue/thread/linear_combination_generic.h",
    }
    if functor.activation is not None:
        # linear_combination_generic.h does not include the activation functors (LeakyReLU, SiLu, HardSwish,
        # Sigmoid, ... live in activation.h); a GEMM or conv unit pulls it in through its epilogue headers, a
        # ReductionOperation alone in a unit does not.
        return [headers[functor.kind], "cutlass/epilogue/thread/activation.h"]
    return [headers[functor.kind]]
