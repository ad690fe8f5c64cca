"""CPU tests of Conv2dOperation and pycutlass.conv.Conv2dProblemSize: construction, rejections, problem checks,
emission and real compiles.

The compiles (one nvcc unit holding fprop/dgrad/wgrad/int8-interleaved, then the fprop through NVRTC with nvcc
hidden) target sm_90 explicitly, so no GPU is needed.
"""
from __future__ import annotations

import ctypes
import pickle
import re
import shutil
import time

import pytest

import pycutlass as pc
from pycutlass.kinds.conv2d.abi import Conv2dArgs
from pycutlass import compiler
from pycutlass.cache.store import ArtifactCache
from pycutlass.compiler import toolchain
from pycutlass.conv import (Conv2dProblemSize, ConvKind, IteratorAlgorithm, Mode, Operator, SplitKMode,
                            StrideSupport)
from pycutlass.description.coords import MatrixCoord, Tensor4DCoord
from pycutlass.emit import abi
from pycutlass.emit.emitter import translation_unit
from pycutlass.errors import ArgumentError, DescriptionError, ToolchainError
from pycutlass.kinds.conv2d.operation import Conv2dOperation


F16, F32, TF32, BF16, F64, S8, S32 = (pc.float16, pc.float32, pc.tfloat32, pc.bfloat16, pc.float64, pc.int8,
                                      pc.int32)
NHWC, NC32HW32, C32RSK32 = pc.TensorNHWC, pc.TensorNC32HW32, pc.TensorC32RSK32
TC, SIMT = pc.OpClass.TensorOp, pc.OpClass.Simt


# --- builders ---------------------------------------------------------------------------------------------------
def make_op(kind=Operator.fprop, algorithm=IteratorAlgorithm.optimized, stride_support=StrideSupport.Strided,
            swizzle=pc.IdentitySwizzle1, element=F16, acc=F32, out=F16, align=8, align_b=None, align_c=8,
            tile=(128, 128, 64), stages=3, warps=(2, 2, 1), inst=(16, 8, 16), opclass=TC,
            math=pc.MathOperation.multiply_add, layouts=(NHWC, NHWC, NHWC), epilogue=None, arch=80):
    mi = pc.MathInstruction(inst, element, element, acc, opclass, math)
    td = pc.TileDescription(list(tile), stages, list(warps), mi)
    memory = F32 if element is TF32 else element
    A = pc.TensorDescription(memory, layouts[0], align)
    B = pc.TensorDescription(memory, layouts[1], align if align_b is None else align_b)
    C = pc.TensorDescription(out, layouts[2], align_c)
    epilogue = epilogue or pc.LinearCombination(out, align_c, acc, F32 if acc is not F64 else F64)
    return Conv2dOperation(kind, algorithm, arch, td, A, B, C, stride_support, epilogue, swizzle)


def f16_fprop_optimized():
    return make_op()


def f16_dgrad_strided():
    return make_op(kind=Operator.dgrad, algorithm=IteratorAlgorithm.analytic, tile=(128, 128, 32), out=F32,
                   align_c=4, swizzle=pc.StridedDgradIdentitySwizzle1,
                   epilogue=pc.LinearCombinationGeneric(pc.relu(F32), F32, 4, F32, F32))


def f16_dgrad_unity():
    return make_op(kind=Operator.dgrad, stride_support=StrideSupport.Unity, tile=(128, 128, 32))


def tf32_wgrad():
    return make_op(kind=Operator.wgrad, element=TF32, out=F32, align=4, align_c=4, tile=(128, 128, 16),
                   inst=(16, 8, 8))


def s8_interleaved_fprop():
    return make_op(element=S8, acc=S32, out=S8, align=16, align_c=8, inst=(16, 8, 32),
                   math=pc.MathOperation.multiply_add_saturate, layouts=(NC32HW32, C32RSK32, NC32HW32),
                   epilogue=pc.LinearCombinationClamp(S8, 8, S32, F32))


def simt_f32(kind=Operator.fprop, algorithm=IteratorAlgorithm.analytic, **kw):
    kw.setdefault("swizzle", pc.StridedDgradIdentitySwizzle1 if kind is Operator.dgrad and
                  kw.get("stride_support", StrideSupport.Strided) is StrideSupport.Strided else pc.IdentitySwizzle1)
    return make_op(kind=kind, algorithm=algorithm, element=F32, acc=F32, out=F32, align=1, align_c=1,
                   tile=(128, 128, 8), stages=4, warps=(4, 2, 1), inst=(1, 1, 1), opclass=SIMT, **kw)


def problem(n=1, h=14, w=14, c=64, k=128, r=3, s=3, pad=(1, 1, 1, 1), stride=(1, 1), dilation=(1, 1),
            mode=Mode.cross_correlation, split_k=1):
    return Conv2dProblemSize(Tensor4DCoord(n, h, w, c), Tensor4DCoord(k, r, s, c), Tensor4DCoord(*pad),
                             MatrixCoord(*stride), MatrixCoord(*dilation), mode, split_k, 1)


# --- Conv2dProblemSize ------------------------------------------------------------------------------------------
def _torch_out(size, pad_lo, pad_hi, kernel, stride, dilation):
    """torch.nn.Conv2d's output size formula, written out."""
    return (size + pad_lo + pad_hi - dilation * (kernel - 1) - 1) // stride + 1


@pytest.mark.parametrize("n,h,w,c,k,r,s,pad,stride,dilation", [
    (1, 14, 14, 64, 128, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),
    (2, 27, 27, 256, 512, 3, 3, (1, 1, 1, 1), (2, 1), (1, 1)),
    (4, 224, 224, 8, 64, 7, 7, (3, 3, 3, 3), (2, 2), (1, 1)),
    (1, 17, 11, 16, 32, 3, 5, (0, 0, 2, 2), (3, 2), (2, 3)),
    (3, 9, 9, 4, 8, 1, 1, (0, 0, 0, 0), (2, 2), (1, 1)),
    (1, 8, 10, 2, 2, 2, 3, (0, 1, 2, 0), (1, 2), (3, 1)),  # asymmetric padding: upper pads only change P, Q
])
def test_problem_size_derivations_match_the_direct_formula(n, h, w, c, k, r, s, pad, stride, dilation):
    ps = problem(n, h, w, c, k, r, s, pad, stride, dilation)
    p = _torch_out(h, pad[0], pad[1], r, stride[0], dilation[0])
    q = _torch_out(w, pad[2], pad[3], s, stride[1], dilation[1])
    assert (ps.P, ps.Q) == (p, q)
    assert (ps.N, ps.H, ps.W, ps.C, ps.K, ps.R, ps.S) == (n, h, w, c, k, r, s)
    assert (ps.pad_h, ps.pad_w, ps.stride_h, ps.stride_w, ps.dilation_h, ps.dilation_w) == \
        (pad[0], pad[2], *stride, *dilation)
    assert tuple(ps.padding()) == pad
    assert tuple(ps.output_extent()) == (n, p, q, k)
    assert tuple(ps.activation_extent()) == (n, h, w, c)
    assert tuple(ps.filter_extent()) == (k, r, s, c)
    assert (ps.activation_size(), ps.filter_size(), ps.output_size()) == (n * h * w * c, k * r * s * c, n * p * q * k)
    # Implicit GEMM M x N x K and operand extents per kind (pycutlass.conv's table).
    assert tuple(ps.implicit_gemm_size(Operator.fprop)) == (n * p * q, k, r * s * c)
    assert tuple(ps.implicit_gemm_size(Operator.dgrad)) == (n * h * w, c, r * s * k)
    assert tuple(ps.implicit_gemm_size(Operator.wgrad)) == (k, r * s * c, n * p * q)
    npqk, nhwc, krsc = (n, p, q, k), (n, h, w, c), (k, r, s, c)
    expected = {Operator.fprop: (nhwc, krsc, npqk), Operator.dgrad: (npqk, krsc, nhwc),
                Operator.wgrad: (npqk, nhwc, krsc)}
    for kind, (a, b, cc) in expected.items():
        assert (tuple(ps.tensor_a_extent(kind)), tuple(ps.tensor_b_extent(kind)), tuple(ps.tensor_c_extent(kind))) \
            == (a, b, cc)
        assert pc.conv.implicit_gemm_tensor_c_size(kind, ps) == ps.tensor_c_size(kind) == \
            cc[0] * cc[1] * cc[2] * cc[3]
        assert pc.conv.implicit_gemm_problem_size(kind, ps) == ps.implicit_gemm_size(kind)
        gemm = ps.implicit_gemm_size(kind)
        assert gemm.m() * gemm.n() == ps.tensor_c_size(kind)  # C is the implicit GEMM's M x N output


def test_problem_size_accepts_plain_sequences_and_the_string_kind():
    ps = Conv2dProblemSize((1, 8, 8, 16), (32, 3, 3, 16), (1, 1, 1, 1), (1, 1), (1, 1))
    assert ps == problem(1, 8, 8, 16, 32)
    assert ps.mode is Mode.cross_correlation and ps.split_k_slices == 1 and ps.groups == 1
    assert ps.implicit_gemm_size("wgrad") == ps.implicit_gemm_size(Operator.wgrad)
    assert ConvKind is Operator


def test_problem_size_is_immutable_hashable_and_picklable():
    ps = problem(split_k=2)
    with pytest.raises(AttributeError, match="immutable"):
        ps.C = 8
    with pytest.raises(AttributeError):
        del ps.K
    assert ps == problem(split_k=2) and hash(ps) == hash(problem(split_k=2))
    assert ps != problem(split_k=1)
    assert ps.reset_split_k_slices(1) == problem(split_k=1)
    assert ps.reset_mode(Mode.convolution).mode is Mode.convolution
    assert pickle.loads(pickle.dumps(ps)) == ps
    assert "NPQK=(1, 14, 14, 128)" in repr(ps)


@pytest.mark.parametrize("kwargs,message", [
    (dict(input_size=(1, 8, 8, 16), filter_size=(32, 3, 3, 8)), "filter has C=8 channels but the input has C=16"),
    (dict(groups=2), "groups must be 1"),
    (dict(input_size=(0, 8, 8, 16)), r"input_size.n must be >= 1, got 0"),
    (dict(filter_size=(32, 0, 3, 16)), r"filter_size.r must be >= 1"),
    (dict(stride=(0, 1)), r"stride.row must be >= 1"),
    (dict(dilation=(1, 0)), r"dilation.column must be >= 1"),
    (dict(padding=(-1, 0, 0, 0)), r"padding\[0\] must be >= 0"),
    (dict(padding=(0, 0, 0)), "padding must have 4 entries"),
    (dict(stride=(1, 1, 1)), "stride must have 2 entries"),
    (dict(filter_size=(32, 9, 3, 16), padding=(0, 0, 0, 0)), r"output would be 0 x 6"),
    (dict(dilation=(4, 1), padding=(0, 0, 0, 0)), r"output would be 0 x 6"),
    (dict(mode=5), "mode must be"),
    (dict(split_k_slices=0), "split_k_slices must be >= 1"),
    (dict(input_size=(1, 8, 8, 16.0)), "must be an integer"),
    (dict(input_size=(1 << 16, 256, 256, 1), filter_size=(1, 1, 1, 1)), "activation tensor has 4294967296"),
])
def test_problem_size_rejections(kwargs, message):
    args = dict(input_size=(1, 8, 8, 16), filter_size=(32, 3, 3, 16), padding=(1, 1, 1, 1), stride=(1, 1),
                dilation=(1, 1))
    args.update(kwargs)
    with pytest.raises(ArgumentError, match=message):
        Conv2dProblemSize(**args)


def test_interleaved_filter_reorder_matches_cutlass_reorder_column():
    import numpy as np

    for k in (32, 96):
        gather = pc.conv.interleaved_filter_gather(k)
        assert sorted(gather) == list(range(k))
        for n in range(k):  # cutlass::reorder_column<32>: dest column of source column n
            dest = (n // 32) * 32 + ((n % 8) // 2) * 8 + ((n % 32) // 8) * 2 + (n % 2)
            assert gather[dest] == n
    assert pc.conv.interleaved_filter_gather(32)[:8] == [0, 1, 8, 9, 16, 17, 24, 25]
    filt = np.arange(2 * 3 * 3 * 64 * 32).reshape(2, 3, 3, 64, 32)
    reordered = pc.conv.reorder_interleaved_filter(filt)
    assert reordered.shape == filt.shape and (reordered[:, :, :, 2] == filt[:, :, :, 8]).all()
    with pytest.raises(ArgumentError, match="multiple of 32"):
        pc.conv.interleaved_filter_gather(48)
    with pytest.raises(ArgumentError, match=r"5-D \(C/32, R, S, K, 32\)"):
        pc.conv.reorder_interleaved_filter(np.zeros((64, 3, 3, 32)))


def test_check_operation_needs_a_convolution():
    with pytest.raises(ArgumentError, match="not a convolution operation"):
        problem().check_operation(object())
    with pytest.raises(ArgumentError, match="convolution kind"):
        problem().implicit_gemm_size("conv")


# --- Conv2dOperation: constructions -----------------------------------------------------------------------------
def test_valid_constructions_and_identity():
    ops = [f16_fprop_optimized(), f16_dgrad_strided(), f16_dgrad_unity(), tf32_wgrad(), s8_interleaved_fprop(),
           simt_f32(), simt_f32(Operator.dgrad, IteratorAlgorithm.optimized),
           simt_f32(Operator.wgrad, IteratorAlgorithm.optimized),
           make_op(algorithm=IteratorAlgorithm.fixed_channels, align=4),
           make_op(algorithm=IteratorAlgorithm.few_channels, align=2),
           make_op(stride_support=StrideSupport.Unity),  # fprop Unity: PyCUTLASS accepted it (packed epilogue)
           make_op(element=BF16, out=BF16, kind=Operator.dgrad, stride_support=StrideSupport.Unity,
                   swizzle=pc.IdentitySwizzle4, tile=(128, 128, 32)),
           make_op(element=F64, acc=F64, out=F64, align=1, align_c=1, inst=(8, 8, 4), tile=(64, 64, 16),
                   kind=Operator.wgrad),
           make_op(element=S8, acc=S32, out=S32, align=16, align_c=4, inst=(16, 8, 32),
                   math=pc.MathOperation.multiply_add_saturate)]
    names = [op.name for op in ops]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"pycutlass_conv2d_\w+_[0-9a-f]{10}", n) for n in names)
    assert f16_fprop_optimized() == f16_fprop_optimized()
    assert f16_fprop_optimized().name == f16_fprop_optimized().name
    assert hash(f16_fprop_optimized()) == hash(f16_fprop_optimized())
    assert f16_fprop_optimized() != make_op(stride_support=StrideSupport.Unity)
    op = f16_fprop_optimized()
    assert op.kind == "conv2d" and op.conv_kind is Operator.fprop and op.element_accumulator is F32
    assert op.abi_struct_type is Conv2dArgs
    assert "Conv2d fprop optimized" in op.describe() and "float16/TensorNHWC/8" in op.describe()
    assert op.builder_symbol == op.name + "_build" and op.kernel_symbol == op.name
    assert pc.Conv2dOperation is Conv2dOperation


@pytest.mark.parametrize("build,message", [
    (lambda: make_op(kind=Operator.dgrad, algorithm=IteratorAlgorithm.fixed_channels, align=4),
     "fixed_channels iterator algorithm exists for fprop only"),
    (lambda: make_op(kind=Operator.wgrad, algorithm=IteratorAlgorithm.few_channels, align=2),
     "few_channels iterator algorithm exists for fprop only"),
    (lambda: simt_f32(algorithm=IteratorAlgorithm.few_channels), "OpClass.TensorOp only"),
    (lambda: make_op(algorithm=IteratorAlgorithm.fixed_channels, align=4, align_b=8),
     "A and B need the same alignment"),
    (lambda: make_op(kind=Operator.dgrad, element=S8, acc=S32, out=S32, align=16, align_c=4, inst=(16, 8, 32),
                     math=pc.MathOperation.multiply_add_saturate, stride_support=StrideSupport.Unity),
     "int8 convolutions are fprop only"),
    (lambda: make_op(layouts=(NHWC, NHWC, pc.RowMajor)), "must all be TensorNHWC"),
    (lambda: make_op(element=F64, acc=F64, out=F64, align=2, align_c=1, inst=(8, 8, 4), tile=(64, 64, 16)),
     "float64"),  # TensorDescription or the operation: CUTLASS's f64 thread maps load one element at a time
    (lambda: make_op(element=S8, acc=S32, out=S8, align=16, align_c=8, inst=(16, 8, 32),
                     math=pc.MathOperation.multiply_add_saturate, layouts=(NC32HW32, NHWC, NC32HW32),
                     epilogue=pc.LinearCombinationClamp(S8, 8, S32, F32)),
     "interleaved convolutions take A TensorNC32HW32, B TensorC32RSK32 and C TensorNC32HW32"),
    (lambda: make_op(element=S8, acc=S32, out=S32, align=16, align_c=4, inst=(16, 8, 32),
                     math=pc.MathOperation.multiply_add_saturate, layouts=(NC32HW32, C32RSK32, NC32HW32)),
     "writes int8 output"),
    (lambda: make_op(element=S8, acc=S32, out=S8, align=8, align_c=8, inst=(16, 8, 32),
                     math=pc.MathOperation.multiply_add_saturate, layouts=(NC32HW32, C32RSK32, NC32HW32),
                     epilogue=pc.LinearCombinationClamp(S8, 8, S32, F32)),
     "alignment must be 16"),
    (lambda: make_op(element=S8, acc=S32, out=S8, align=16, align_c=8, inst=(16, 8, 32),
                     math=pc.MathOperation.multiply_add_saturate, layouts=(NC32HW32, C32RSK32, NC32HW32),
                     algorithm=IteratorAlgorithm.few_channels, epilogue=pc.LinearCombinationClamp(S8, 8, S32, F32)),
     "analytic and optimized iterator algorithms only"),
    (lambda: make_op(layouts=(NC32HW32, C32RSK32, NC32HW32)), "interleaved"),
    (lambda: make_op(kind=Operator.dgrad, tile=(128, 128, 32)), "needs StridedDgradIdentitySwizzle1"),
    (lambda: make_op(swizzle=pc.StridedDgradIdentitySwizzle4), "for dgrad with StrideSupport.Strided only"),
    (lambda: make_op(kind=Operator.dgrad, stride_support=StrideSupport.Unity, tile=(128, 128, 32),
                     swizzle=pc.StridedDgradIdentitySwizzle1), "for dgrad with StrideSupport.Strided only"),
    (lambda: make_op(swizzle=pc.HorizontalSwizzle), "does not build with CUTLASS's convolution kernels"),
    (lambda: make_op(kind=Operator.dgrad, tile=(128, 128, 32), swizzle=pc.StridedDgradHorizontalSwizzle),
     "does not build"),
    (lambda: make_op(swizzle=pc.BatchedIdentitySwizzle), "swizzling_functor must be one of"),
    (lambda: make_op(tile=(256, 256, 64), stages=6, warps=(4, 4, 1)), "KiB of shared memory"),
    (lambda: make_op(align=1), "below the 32-bit minimum of multistage"),
    (lambda: make_op(align_c=4, epilogue=pc.LinearCombination(F16, 8, F32, F32)),
     "epilogue alignment 8 must equal C's alignment 4"),
    (lambda: make_op(arch=70), "compute capability 70 is not supported"),
    (lambda: Conv2dOperation("fprop", IteratorAlgorithm.optimized, 80, f16_fprop_optimized().tile_description,
                             *[f16_fprop_optimized().A] * 3, StrideSupport.Strided,
                             f16_fprop_optimized().epilogue_functor), "conv_kind must be pycutlass.conv.Operator"),
    (lambda: Conv2dOperation(Operator.fprop, "optimized", 80, f16_fprop_optimized().tile_description,
                             *[f16_fprop_optimized().A] * 3, StrideSupport.Strided,
                             f16_fprop_optimized().epilogue_functor), "iterator_algorithm must be"),
    (lambda: Conv2dOperation(Operator.fprop, IteratorAlgorithm.optimized, 80,
                             f16_fprop_optimized().tile_description, *[f16_fprop_optimized().A] * 3, "strided",
                             f16_fprop_optimized().epilogue_functor), "stride_support must be"),
])
def test_construction_rejections(build, message):
    with pytest.raises(DescriptionError, match=message):
        build()


# --- problem checks (what Conv2dArguments will call) ------------------------------------------------------------
def test_check_problem_size_accepts_fitting_problems():
    f16_fprop_optimized().check_problem_size(problem())
    problem(c=8, k=16).check_operation(f16_fprop_optimized())
    make_op(algorithm=IteratorAlgorithm.fixed_channels, align=4).check_problem_size(problem(c=4, k=64))
    make_op(algorithm=IteratorAlgorithm.few_channels, align=2).check_problem_size(problem(c=6, k=64))
    f16_dgrad_strided().check_problem_size(problem(stride=(2, 2)))
    f16_dgrad_strided().check_problem_size(problem(split_k=2))  # split-K is fine at stride 1
    # and at stride > 1 (serial; CUTLASS's can_implement refuses it, the kernel computes it: see check_problem_size)
    f16_dgrad_strided().check_problem_size(problem(stride=(2, 1), split_k=2))
    f16_dgrad_strided().check_problem_size(problem(stride=(3, 3), split_k=3))
    f16_dgrad_unity().check_problem_size(problem(split_k=3))
    tf32_wgrad().check_problem_size(problem(c=4, k=4, stride=(2, 2), dilation=(2, 2), pad=(2, 2, 2, 2)))
    s8_interleaved_fprop().check_problem_size(problem(c=32, k=64))
    simt_f32().check_problem_size(problem(c=3, k=5, r=40, s=40, h=50, w=50))  # analytic: any filter size


@pytest.mark.parametrize("op,ps,message", [
    (lambda: make_op(algorithm=IteratorAlgorithm.fixed_channels, align=4), problem(c=8),
     "fixed_channels needs C == the alignment of A and B"),
    (lambda: make_op(algorithm=IteratorAlgorithm.few_channels, align=4), problem(c=6),
     "few_channels needs C divisible by the alignment"),
    (f16_fprop_optimized, problem(c=12), r"channel alignment: A \(activation\) .* C must be divisible by 8"),
    (f16_fprop_optimized, problem(k=100), r"C/D \(output\) .* K must be divisible by 8"),
    (f16_dgrad_unity, problem(k=20), r"A \(output gradient\) .* K must be divisible by 8"),
    (f16_dgrad_strided, problem(c=18), r"B \(filter\) .* C must be divisible by 8"),
    (tf32_wgrad, problem(c=6, k=8), r"B \(activation\) .* C must be divisible by 4"),
    (f16_fprop_optimized, problem(r=33, h=40, pad=(0, 0, 0, 0)), r"R, S <= 32"),
    (f16_dgrad_unity, problem(s=33, w=40, pad=(0, 0, 0, 0)), r"R, S <= 32"),
    (f16_dgrad_unity, problem(stride=(2, 1)), r"Unity dgrad needs stride \(1, 1\)"),
    (f16_dgrad_strided, problem(dilation=(2, 1), pad=(2, 2, 2, 2)), "strided dgrad does not support dilation"),
    (s8_interleaved_fprop, problem(c=48, k=64), "divisible by 32"),
    (s8_interleaved_fprop, problem(c=64, k=48), "divisible by 32"),
    (f16_fprop_optimized, problem(split_k=70000), "exceeds 65535"),
    (lambda: simt_f32(), problem(n=64, h=2048, w=2048, c=3, k=4, r=1, s=1, pad=(0, 0, 0, 0)),
     "address at most 2 GiB"),
])
def test_check_problem_size_rejections(op, ps, message):
    with pytest.raises(ArgumentError, match=message):
        op().check_problem_size(ps)
    with pytest.raises(ArgumentError, match=message):
        ps.check_operation(op())


def test_check_problem_size_needs_a_problem_size():
    with pytest.raises(ArgumentError, match="must be a pycutlass.conv.Conv2dProblemSize"):
        f16_fprop_optimized().check_problem_size((1, 2, 3))


def test_launch_shape_semaphores_and_workspace():
    op = f16_fprop_optimized()  # 128x128 tiles, IdentitySwizzle1
    ps = problem(n=2, h=27, w=27, c=256, k=512, stride=(2, 1), split_k=3)  # GEMM 2*14*27=756 x 512 x 2304
    assert op.tiled_shape(ps) == (6, 4, 3)
    assert op.grid_shape(ps) == (6, 4, 3)
    assert op.semaphore_count(ps, SplitKMode.Serial) == 24
    assert op.semaphore_count(ps, SplitKMode.Parallel) == 0
    assert op.semaphore_count(ps.reset_split_k_slices(1)) == 0
    assert op.workspace_elements(ps, SplitKMode.Parallel) == 3 * 756 * 512
    assert op.workspace_elements(ps, SplitKMode.Serial) == 0
    # GemmIdentityThreadblockSwizzle<4>: log_tile 2 once there are >= 3 N tiles.
    assert make_op(swizzle=pc.IdentitySwizzle4).grid_shape(ps) == (24, 1, 3)
    assert make_op(swizzle=pc.IdentitySwizzle8).grid_shape(ps) == (24, 1, 3)  # 4 N tiles < 6: log_tile 2
    # Strided dgrad tiles M per starting filter position: N*ceil(H/sh)*ceil(W/sw) rows, times sh*sw positions.
    dgrad = f16_dgrad_strided()
    ps2 = problem(n=1, h=28, w=28, c=64, k=64, stride=(2, 2))
    assert dgrad.tiled_shape(ps2) == (2 * 2 * 2, 1, 1)  # 196 rows / 128 -> 2 tiles, x 4 filter phases
    # Serial split-K: one semaphore per (m, n) tile, filter phases included.
    assert dgrad.semaphore_count(ps2.reset_split_k_slices(3), SplitKMode.Serial) == 8


def test_make_abi_arguments():
    op = f16_fprop_optimized()
    ps = problem(n=2, h=9, w=7, c=16, k=24, pad=(1, 1, 2, 2), stride=(2, 1), dilation=(1, 2), split_k=2)
    args = op.make_abi_arguments(ps, 0x1000, 0x2000, 0x3000, 0x4000, op.epilogue_type(2.0, 0.5),
                                 SplitKMode.Parallel, semaphore=0x5000)
    assert isinstance(args, Conv2dArgs)
    assert (args.n, args.h, args.w, args.c, args.k, args.r, args.s, args.p, args.q) == \
        (2, 9, 7, 16, 24, 3, 3, ps.P, ps.Q)
    assert (args.pad_h, args.pad_w, args.stride_h, args.stride_w, args.dilation_h, args.dilation_w) == \
        (1, 2, 2, 1, 1, 2)
    assert (args.mode, args.split_k_slices, args.groups, args.split_k_mode) == (0, 2, 1, 2)
    assert (args.ptr_A, args.ptr_B, args.ptr_C, args.ptr_D, args.semaphore) == (0x1000, 0x2000, 0x3000, 0x4000,
                                                                                0x5000)
    assert (args.stride_c_w, args.stride_c_h, args.stride_c_n) == (24, ps.Q * 24, ps.P * ps.Q * 24)
    assert (args.alpha, args.beta) == (2.0, 0.5)
    bias = op.make_abi_arguments(ps, 1, 2, 3, 4, op.epilogue_type(), c_strides=(0, 0, 0))
    assert (bias.stride_c_w, bias.stride_c_h, bias.stride_c_n, bias.split_k_mode) == (0, 0, 0, 1)
    wgrad = tf32_wgrad().make_abi_arguments(ps, 1, 2, 3, 4, op.epilogue_type())
    assert (wgrad.stride_c_w, wgrad.stride_c_h, wgrad.stride_c_n) == (16, 3 * 16, 3 * 3 * 16)  # KRSC packed
    Conv2dArgs.check_no_padding()
    assert ctypes.sizeof(Conv2dArgs) % 8 == 0


# --- emission ---------------------------------------------------------------------------------------------------
def test_emission_uses_the_right_cutlass_kernels():
    fprop = f16_fprop_optimized().emit_body()
    assert "cutlass::conv::kernel::DefaultConv2dFprop<" in fprop
    assert "cutlass::conv::IteratorAlgorithm::kOptimized" in fprop and "StrideSupport::kStrided" in fprop
    assert "cutlass::arch::Sm80" in fprop and "GemmShape<64, 64, 64>" in fprop
    assert "make_Coord(a.stride_c_w, a.stride_c_h, a.stride_c_n)" in fprop  # C strides (bias broadcast)
    dgrad = f16_dgrad_strided().emit_body()
    assert "DefaultConv2dDgrad<" in dgrad and "StridedDgradIdentityThreadblockSwizzle<1>" in dgrad
    assert "epilogue.leaky_alpha" not in dgrad and "LinearCombinationGeneric<cutlass::epilogue::thread::ReLu" in dgrad
    wgrad = tf32_wgrad().emit_body()
    assert "DefaultConv2dWgrad<" in wgrad and "cutlass::tfloat32_t, cutlass::layout::TensorNHWC" in wgrad
    s8 = s8_interleaved_fprop().emit_body()
    assert "cutlass::layout::TensorNCxHWx<32>" in s8 and "cutlass::layout::TensorCxRSKx<32>" in s8
    assert "a.stride_c_w" not in s8  # interleaved C is packed
    leaky = make_op(epilogue=pc.LinearCombinationGeneric(pc.leaky_relu(F32), F16, 8, F32, F32)).emit_body()
    assert "epilogue.leaky_alpha = Compute(a.activation_args[0]);" in leaky
    assert "cutlass/conv/kernel/default_conv2d_dgrad.h" in f16_dgrad_strided().headers()


def test_emitted_symbols_are_prefixed_and_two_ops_share_one_unit():
    ops = [f16_fprop_optimized(), f16_dgrad_strided(), tf32_wgrad()]
    for op in ops:
        body = op.emit_body()
        defined = set(re.findall(r"^namespace (\w+) \{", body, re.M)
                      + re.findall(r"extern \"C\" __global__ void (?!__launch_bounds__)(\w+)\(", body)
                      + re.findall(r"^(\w+)\(typename", body, re.M))
        assert defined == {op.name + "_ns", op.kernel_symbol, op.builder_symbol}
        # Nothing at file scope besides the namespace and the two extern "C" kernels.
        outside = re.sub(r"namespace \w+ \{.*?\}  // namespace \w+", "", body, flags=re.S)
        assert not re.search(r"^(using|static_assert|template|struct|constexpr)", outside, re.M)
    unit = translation_unit(ops)
    for op in ops:
        assert unit.count(f"void {op.builder_symbol}(") == 1
        assert unit.count(f"\n{op.kernel_symbol}(typename") == 1
    assert unit.count("struct Conv2dArgs {") == 1
    assert unit.count('#include "cutlass/conv/kernel/default_conv2d_fprop.h"') == 1


# --- real compiles (one nvcc unit, one NVRTC; slow) -------------------------------------------------------------
def _assert_symbols(binary: bytes, ops) -> None:
    for op in ops:
        for symbol in (op.kernel_symbol, op.builder_symbol):
            assert symbol.encode() + b"\x00" in binary, symbol


@pytest.mark.slow
def test_compile_with_nvcc(compiler_state):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    compiler.nvcc()
    ops = [f16_fprop_optimized(), f16_dgrad_strided(), tf32_wgrad(), s8_interleaved_fprop()]
    start = time.perf_counter()
    kernels = compiler.add_module(ops, cache=ArtifactCache(":memory:"))
    seconds = time.perf_counter() - start
    assert compiler.last_report().compiled == 4
    assert len({k.sha256 for k in kernels}) == 1  # one translation unit, one cubin
    assert all(k.backend == "nvcc" and k.target == "sm_90" for k in kernels)
    _assert_symbols(kernels[0].binary, ops)
    print(f"nvcc: 4 conv2d ops in one unit in {seconds:.1f} s")


@pytest.mark.slow
def test_compile_with_nvrtc_and_pip_headers_only(compiler_state, toolkit_hidden):
    pytest.importorskip("cuda.bindings.nvrtc")
    with pytest.raises(ToolchainError):
        toolchain.nvcc_path()
    assert all("site-packages" in str(d) or "dist-packages" in str(d) for d in toolchain.cuda_include_dirs())
    compiler.nvrtc()
    ops = [f16_fprop_optimized()]
    start = time.perf_counter()
    kernels = compiler.add_module(ops, cache=ArtifactCache(":memory:"))
    seconds = time.perf_counter() - start
    assert compiler.last_report().compiled == 1
    assert kernels[0].backend == "nvrtc" and kernels[0].target == "sm_90"
    _assert_symbols(kernels[0].binary, ops)
    print(f"nvrtc: 1 conv2d fprop in {seconds:.1f} s")
