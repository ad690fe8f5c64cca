"""CPU tests of code emission: complete translation units, unique symbols, determinism, the transposed (column-major
output) problem, and the padding-free ABI structs shared by Python and the emitted C++. No compiler is run here.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import pycutlass as cutlass
from pycutlass.kinds.conv2d.abi import Conv2dArgs
from pycutlass.kinds.gemm_grouped.abi import GemmGroupedArgs
from pycutlass.kinds.gemm.abi import GemmUniversalArgs
from pycutlass.kinds.reduction.abi import ReductionArgs
from pycutlass.emit import abi, emitter, names
from pycutlass.emit.emitter import translation_unit

REPO_ROOT = Path(__file__).resolve().parents[2]

# A kernel or builder definition: `extern "C" __global__ void [__launch_bounds__(...)] NAME(`.
_DEFINITION = re.compile(r'extern "C" __global__ void\s+(?:__launch_bounds__\((?:[^()]|\([^()]*\))*\)\s*)?(\w+)\(')


def defined_kernels(source: str) -> list[str]:
    return _DEFINITION.findall(source)


def td(element, layout, alignment):
    return cutlass.TensorDescription(element, layout, alignment)


def f16_tile(shape=(128, 128, 32), stages=3):
    math = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                   cutlass.OpClass.TensorOp)
    return cutlass.TileDescription(list(shape), stages, [2, 2, 1], math)


def gemm(layout_a=cutlass.RowMajor, layout_b=cutlass.ColumnMajor, layout_c=cutlass.RowMajor, alignment_a=8,
         alignment_b=8, alignment_c=8, epilogue=None, tile=None):
    C = td(cutlass.float16, layout_c, alignment_c)
    epilogue = epilogue or cutlass.LinearCombination(cutlass.float16, alignment_c, cutlass.float32, cutlass.float32)
    return cutlass.GemmOperationUniversal(80, tile or f16_tile(), td(cutlass.float16, layout_a, alignment_a),
                                          td(cutlass.float16, layout_b, alignment_b), C, epilogue)


def leaky_gemm():
    epilogue = cutlass.LinearCombinationGeneric(cutlass.leaky_relu(cutlass.float32), cutlass.float16, 8,
                                                cutlass.float32, cutlass.float32)
    return gemm(tile=f16_tile((64, 128, 32), 4), epilogue=epilogue)


def template_arguments(body: str, name: str) -> list[str]:
    """The DefaultGemmUniversal<...> arguments of operation ``name``, one string per argument line."""
    namespace = body[body.index(f"namespace {name}_ns {{"):body.index(f"}}  // namespace {name}_ns")]
    block = namespace[namespace.index("DefaultGemmUniversal<") + len("DefaultGemmUniversal<"):
                      namespace.index(">::GemmKernel;")]
    return [line.strip().rstrip(",") for line in block.strip().splitlines()]


# --- one operation -------------------------------------------------------------------------------------------------
def test_emit_is_a_complete_translation_unit():
    op = gemm()
    source = op.emit()
    # Headers first: CUTLASS, then what the operation needs.
    includes = re.findall(r'^#include "([^"]+)"$', source, re.M)
    assert includes[0] == "cutlass/cutlass.h"
    assert set(op.headers()) <= set(includes) and len(includes) == len(set(includes))
    assert source.index("#include") < source.index("namespace pycutlass_abi {") < source.index(op.name)
    # The ABI structs this kind uses, with their layout checks, inside pycutlass_abi; no other kind's struct, so a
    # new kind's struct re-keys no cached GEMM.
    assert op.abi_structs() == (abi.LaunchInfo, GemmUniversalArgs)
    for struct in (Conv2dArgs, GemmGroupedArgs, ReductionArgs):
        assert f"struct {struct.__name__} {{" not in source
    for struct in op.abi_structs():
        assert struct.cpp_definition() in source
        assert f"static_assert(sizeof({struct.__name__}) == {ctypes.sizeof(struct)}," in source
        for field, _ in struct._fields_:
            assert f"static_assert(__builtin_offsetof({struct.__name__}, {field}) == " \
                   f"{getattr(struct, field).offset}," in source
    assert source.count("#ifndef __CUDACC_RTC__") == len(op.abi_structs())  # NVRTC has no constant offsetof
    # The kernel and its device-side Params builder, named after the operation.
    assert defined_kernels(source) == [op.kernel_symbol, op.builder_symbol]
    assert op.builder_symbol == op.name + "_build"
    assert f"{op.name}(typename {op.name}_ns::Kernel::Params params)" in source
    assert f"{op.builder_symbol}(pycutlass_abi::GemmUniversalArgs a, pycutlass_abi::LaunchInfo *info," in source
    assert f"__launch_bounds__({op.name}_ns::Kernel::kThreadCount)" in source
    assert source.count(f"namespace {op.name}_ns {{") == 1
    # Balanced braces and parentheses: a truncated template would not be.
    assert source.count("{") == source.count("}") and source.count("(") == source.count(")")
    assert source.endswith("}\n")
    assert not re.search(r"\{\{|\}\}|\{%|%\}", source), "unrendered jinja syntax"


def test_emitted_types_follow_the_description():
    op = leaky_gemm()
    body = op.emit_body()
    args = template_arguments(body, op.name)
    assert args[0] == "cutlass::half_t, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, 8"
    assert args[1] == "cutlass::half_t, cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, 8"
    assert args[2] == "cutlass::half_t, cutlass::layout::RowMajor"
    assert args[3] == "float"
    assert args[4] == "cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80"
    assert args[5:8] == ["cutlass::gemm::GemmShape<64, 128, 32>", "cutlass::gemm::GemmShape<32, 64, 32>",
                         "cutlass::gemm::GemmShape<16, 8, 16>"]
    assert args[-3:] == ["cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<1>", "4",
                         "cutlass::arch::OpMultiplyAdd"]
    assert ("using EpilogueOp = cutlass::epilogue::thread::LinearCombinationGeneric<"
            "cutlass::epilogue::thread::LeakyReLU, cutlass::half_t, 8, float, float>;") in body
    assert "epilogue.leaky_alpha = Compute(a.activation_args[0]);" in body  # the activation's runtime argument
    assert "cutlass/epilogue/thread/linear_combination_generic.h" in op.headers()


def test_column_major_output_emits_the_transposed_problem():
    # A row-major with alignment 8, B row-major with alignment 4: distinguishable after the swap.
    plain = gemm(cutlass.RowMajor, cutlass.RowMajor, cutlass.RowMajor, 8, 4, 8)
    transposed = gemm(cutlass.RowMajor, cutlass.RowMajor, cutlass.ColumnMajor, 8, 4, 8)
    assert not plain.transposed and transposed.transposed
    plain_body, transposed_body = plain.emit_body(), transposed.emit_body()
    assert "constexpr bool kTransposed = false;" in plain_body
    assert "constexpr bool kTransposed = true;" in transposed_body
    p, t = template_arguments(plain_body, plain.name), template_arguments(transposed_body, transposed.name)
    assert p[:3] == ["cutlass::half_t, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, 8",
                     "cutlass::half_t, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, 4",
                     "cutlass::half_t, cutlass::layout::RowMajor"]
    # D^T = B^T A^T: the kernel's A is B^T (column-major, B's alignment), its B is A^T, its C is row-major.
    assert t[:3] == ["cutlass::half_t, cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, 4",
                     "cutlass::half_t, cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, 8",
                     "cutlass::half_t, cutlass::layout::RowMajor"]
    assert p[3:] == t[3:]
    # The builder swaps M/N, the A/B pointers, leading dimensions and batch strides when transposed.
    for swap in ("swap_values(m, n)", "swap_values(ptr_A, ptr_B)", "swap_values(lda, ldb)",
                 "swap_values(batch_stride_A, batch_stride_B)"):
        assert swap in transposed_body
    # The name still describes the user's problem (layouts t, t, n), not the kernel's.
    assert "_ttn_" in transposed.name and "_ttt_" in plain.name and "_a848_" in transposed.name


def test_int8_column_major_output_stays_k_contiguous():
    math = cutlass.MathInstruction([16, 8, 32], cutlass.int8, cutlass.int8, cutlass.int32, cutlass.OpClass.TensorOp,
                                   cutlass.MathOperation.multiply_add_saturate)
    tile = cutlass.TileDescription([128, 128, 64], 3, [2, 2, 1], math)
    op = cutlass.GemmOperationUniversal(
        80, tile, td(cutlass.int8, cutlass.RowMajor, 16), td(cutlass.int8, cutlass.ColumnMajor, 8),
        td(cutlass.int8, cutlass.ColumnMajor, 8),
        cutlass.LinearCombinationClamp(cutlass.int8, 8, cutlass.int32, cutlass.float32))
    args = template_arguments(op.emit_body(), op.name)
    assert args[0] == "int8_t, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, 8"
    assert args[1] == "int8_t, cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, 16"
    assert args[2] == "int8_t, cutlass::layout::RowMajor"
    assert args[-1] == "cutlass::arch::OpMultiplyAddSaturate"


# --- several operations in one unit ----------------------------------------------------------------------------------
def test_two_operations_share_one_prelude():
    op1, op2 = gemm(), leaky_gemm()
    assert op1.name != op2.name
    source = translation_unit([op1, op2])
    assert source.count("namespace pycutlass_abi {") == 1 and source.count("namespace pycutlass_detail {") == 1
    assert source.count("// Generated by pycutlass.") == 1
    for struct in op1.abi_structs():
        assert source.count(f"struct {struct.__name__} {{") == 1
    includes = re.findall(r'^#include "([^"]+)"$', source, re.M)
    assert len(includes) == len(set(includes))
    assert set(op1.headers()) | set(op2.headers()) <= set(includes)
    kernels = defined_kernels(source)
    assert kernels == [op1.kernel_symbol, op1.builder_symbol, op2.kernel_symbol, op2.builder_symbol]
    duplicates = [name for name, count in Counter(kernels).items() if count > 1]
    assert not duplicates
    for op in (op1, op2):
        assert source.count(f"namespace {op.name}_ns {{") == 1
    # The unit is the shared prelude followed by each operation's own body, in order.
    assert source == emitter.prelude([*op1.headers(), *op2.headers()], [*op1.abi_structs(), *op2.abi_structs()]) + \
        op1.emit_body() + op2.emit_body()
    # All prelude text appears exactly once even though both operations include linear_combination headers.
    prelude = emitter.prelude(op1.headers(), op1.abi_structs())
    assert op1.emit() == prelude + op1.emit_body()


def test_gemm_and_reduction_in_one_unit():
    op = gemm()
    reduction = cutlass.ReductionOperation(cutlass.MatrixCoord(4, 32 * 8), td(cutlass.float16, cutlass.RowMajor, 8),
                                           cutlass.float32, count=8)
    source = translation_unit([op, reduction])
    kernels = defined_kernels(source)
    assert kernels == [op.kernel_symbol, op.builder_symbol, reduction.kernel_symbol, reduction.builder_symbol]
    assert len(set(kernels)) == 4
    assert f"{reduction.builder_symbol}(pycutlass_abi::ReductionArgs a," in source
    assert source.count("namespace pycutlass_abi {") == 1


def test_unequal_operations_never_define_a_symbol_twice():
    """Regression: relu(float32) and relu(float16) epilogues once gave two unequal operations one name."""
    def relu_gemm(element):
        return gemm(epilogue=cutlass.LinearCombinationGeneric(cutlass.relu(element), cutlass.float16, 8))

    ops = list(dict.fromkeys([relu_gemm(cutlass.float32), relu_gemm(cutlass.float16)]))  # add_module's dedup
    kernels = defined_kernels(translation_unit(ops))
    assert len(kernels) == len(set(kernels)), Counter(kernels).most_common(2)


# --- determinism ----------------------------------------------------------------------------------------------------
def test_emission_is_deterministic_in_process():
    first = [gemm(), leaky_gemm()]
    again = [gemm(), leaky_gemm()]  # fresh description objects
    assert [op.emit() for op in first] == [op.emit() for op in again] == [op.emit() for op in first]
    assert translation_unit(first) == translation_unit(again)
    assert translation_unit(first) != translation_unit(reversed(first))  # order is the caller's, not random


_OPS = """
import pycutlass as cutlass

def make_ops():
    math = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                   cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math)
    A = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
    B = cutlass.TensorDescription(cutlass.float16, cutlass.ColumnMajor, 8)
    ops = []
    for layout, epilogue in ((cutlass.RowMajor, cutlass.LinearCombination(cutlass.float16, 8)),
                             (cutlass.ColumnMajor, cutlass.LinearCombinationGeneric(
                                 cutlass.leaky_relu(cutlass.float32), cutlass.float16, 8)),
                             (cutlass.RowMajor, cutlass.LinearCombinationGeneric(cutlass.gelu(), cutlass.float16, 8))):
        C = cutlass.TensorDescription(cutlass.float16, layout, 8)
        ops.append(cutlass.GemmOperationUniversal(80, tile, A, B, C, epilogue, cutlass.IdentitySwizzle4))
    return ops
"""

_FINGERPRINT = """
import hashlib
from pycutlass.emit.emitter import translation_unit
ops = make_ops()
print(" ".join(op.name for op in ops))
print(hashlib.sha256(translation_unit(ops).encode()).hexdigest())
"""


def test_emission_is_deterministic_across_processes():
    """Names and code must not depend on hash randomization: cache keys are shared between processes."""
    namespace = {}
    exec(_OPS, namespace)
    ops = namespace["make_ops"]()
    expected = [" ".join(op.name for op in ops), hashlib.sha256(translation_unit(ops).encode()).hexdigest()]
    for seed in ("1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(REPO_ROOT))
        out = subprocess.run([sys.executable, "-c", _OPS + _FINGERPRINT], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[:2] == expected


# --- the ABI structs ------------------------------------------------------------------------------------------------
ALL_STRUCTS = (abi.LaunchInfo, GemmUniversalArgs, Conv2dArgs, GemmGroupedArgs, ReductionArgs)


@pytest.mark.parametrize("struct", ALL_STRUCTS, ids=lambda s: s.__name__)
def test_abi_structs_have_no_padding(struct):
    struct.check_no_padding()
    offset = 0
    for name, ctype in struct._fields_:
        assert getattr(struct, name).offset == offset, name
        offset += ctypes.sizeof(ctype)
    assert ctypes.sizeof(struct) == offset


def test_abi_epilogue_fields_and_fill():
    for struct in (GemmUniversalArgs, Conv2dArgs, GemmGroupedArgs, ReductionArgs):
        assert [name for name, _ in struct._fields_[-3:]] == ["alpha", "beta", "activation_args"]
    args = GemmUniversalArgs()
    abi.fill_epilogue(args, cutlass.epilogue.EpilogueArguments(2.0, 0.5, (0.125,)))
    assert (args.alpha, args.beta, list(args.activation_args)) == (2.0, 0.5, [0.125, 0.0, 0.0, 0.0])
    assert len(args.activation_args) == abi.MAX_ACTIVATION_ARGS


def test_padded_structs_are_rejected():
    class Padded(abi.AbiStruct):
        _fields_ = [("count", ctypes.c_int32), ("pointer", ctypes.c_uint64)]  # 4 bytes of padding before pointer

    class TailPadded(abi.AbiStruct):
        _fields_ = [("pointer", ctypes.c_uint64), ("count", ctypes.c_int32)]  # 4 bytes of padding at the end

    class Explicit(abi.AbiStruct):
        _fields_ = [("count", ctypes.c_int32), ("reserved", ctypes.c_int32), ("pointer", ctypes.c_uint64)]

    with pytest.raises(TypeError, match=r"Padded.pointer is padded \(offset 8, expected 4\)"):
        Padded.check_no_padding()
    with pytest.raises(TypeError, match="Padded.pointer is padded"):
        Padded.cpp_definition()  # never emitted
    with pytest.raises(TypeError, match="TailPadded has tail padding"):
        TailPadded.check_no_padding()
    Explicit.check_no_padding()
    definition = Explicit.cpp_definition()
    assert "struct Explicit {\n  int32_t count;\n  int32_t reserved;\n  uint64_t pointer;\n};" in definition
    assert 'static_assert(sizeof(Explicit) == 16, "Explicit: size differs from pycutlass.emit.abi");' in definition


def test_abi_cpp_types_match_ctypes():
    source = abi.cpp_definitions(ALL_STRUCTS)
    struct = GemmUniversalArgs.cpp_definition()
    assert "  int32_t mode;" in struct and "  uint64_t ptr_A;" in struct and "  int64_t lda;" in struct
    assert "  double alpha;" in struct and f"  double activation_args[{abi.MAX_ACTIVATION_ARGS}];" in struct
    assert all(s.cpp_definition() in source for s in ALL_STRUCTS)
    assert names.ELEMENT[cutlass.float16] == "cutlass::half_t"


def test_int32_fields_refuse_what_they_cannot_hold():
    """ctypes would store 2**31 as -2**31: a kernel would compute another problem, so setting it raises."""
    args = GemmUniversalArgs()
    args.m, args.n = 2**31 - 1, -(2**31)
    assert (args.m, args.n) == (2**31 - 1, -(2**31))
    for value in (2**31, 3_000_000_000, -(2**31) - 1):
        with pytest.raises(cutlass.ArgumentError, match=rf"GemmUniversalArgs.k: {value} does not fit the kernel's "
                                                        r"int32_t"):
            args.k = value
    assert args.k == 0
    args.lda = 2**40  # int64 fields hold any stride a tensor can have
    assert GemmUniversalArgs.from_buffer_copy(args).m == 2**31 - 1
    with pytest.raises(cutlass.ArgumentError, match="GemmCoord.m must be at most 2147483647"):
        cutlass.GemmCoord(2**31, 1, 1)
    with pytest.raises(cutlass.ArgumentError, match="MatrixCoord.row must be at most 2147483647"):
        cutlass.MatrixCoord(2**31, 1)
    # the structs the builder kernels write are read with ctypes' own fields
    assert type(vars(abi.LaunchInfo)["grid_x"]).__name__ == "CField"
