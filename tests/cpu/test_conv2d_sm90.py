"""SM90 implicit-GEMM convolution under NVRTC: the compile probe (pycutlass/kinds/conv2d_sm90, not yet a kind).

CUTLASS 4.2's SM90 conv headers do not compile under NVRTC as shipped; ``nvrtc_overlay.cuh`` makes them compile
without editing them (docs/sm90.md, "SM90 convolution"). The slow test compiles one fprop kernel and its device-side
Params builder for real.
"""
from __future__ import annotations

import ctypes
import re

import pytest

from pycutlass.compiler import toolchain
from pycutlass.compiler.backends import NvrtcBackend
from pycutlass.kinds.conv2d_sm90 import probe


def test_overlay_comes_first_and_avoids_the_sm100_headers():
    source = probe.probe_source()
    includes = re.findall(r'#include [<"]([^>"]+)[>"]', source)
    assert includes[0] == "cuda/std/type_traits"
    # conv_universal.hpp drags in the SM100 kernel (explicit __host__ members NVRTC rejects); the overlay declares
    # the primary template and includes the SM90 specialization alone.
    assert "cutlass/conv/kernel/conv_universal.hpp" not in includes
    assert "cutlass/conv/kernel/sm90_implicit_gemm_tma_warpspecialized.hpp" in includes
    # The im2col traits are compiled with CUTE_HOST as host-device, and the macro is restored right after.
    at = source.index('#include "cute/atom/copy_traits_sm90_im2col.hpp"')
    assert "#define CUTE_HOST CUTE_HOST_DEVICE" in source[:at]
    assert "#define CUTE_HOST __forceinline__ __host__" in source[at:at + 200]


def test_probe_source_is_parameterized():
    source = probe.probe_source("probe_x", element="bf16", tile=(64, 128, 64), cluster=(2, 1, 1))
    assert "cutlass::bfloat16_t" in source and "Shape<_64, _128, Shape<_64>>" in source
    assert "__cluster_dims__(2, 1, 1)" in source and "probe_x_build" in source
    with pytest.raises(KeyError):
        probe.probe_source(element="f32")


def test_cutlass_util_include_dir_holds_packed_stride():
    assert (toolchain.cutlass_util_include_dir() / "cutlass" / "util" / "packed_stride.hpp").is_file()


@pytest.mark.slow
def test_nvrtc_compiles_an_sm90_fprop_kernel_and_its_builder():
    """A real NVRTC compile (about 80-110 s on two cores): the kernel and the builder that runs CUTLASS's
    ``ConvUniversal::to_underlying_arguments`` (im2col TMA descriptor included) on the device."""
    name = "pycutlass_conv2d_sm90_probe"
    backend = NvrtcBackend((f"-I{toolchain.cutlass_util_include_dir()}",))
    cubin = backend.compile(probe.probe_source(name), "90a", name)
    assert name.encode() in cubin and f"{name}_build".encode() in cubin
    assert len(cubin) > 100_000  # a real kernel, not an empty stub


@pytest.mark.slow
def test_nvrtc_compiles_sm90_dgrad_and_wgrad_kernels():
    """The same overlay carries the backward kernels (about 100 s on two cores for both; no builders yet)."""
    name = "pycutlass_conv2d_sm90_probe"
    backend = NvrtcBackend((f"-I{toolchain.cutlass_util_include_dir()}",))
    cubin = backend.compile(probe.backward_probe_source(name), "90a", name)
    assert f"{name}_dgrad".encode() in cubin and f"{name}_wgrad".encode() in cubin


def test_im2col_capture_decodes_the_overlays_layout():
    """The Python twin of pycutlass_rtc::Im2colCapture (natural C alignment: no padding before the last byte)."""
    assert probe.Im2colCapture.LAYOUT.size == 111  # 112 in C (8-byte alignment), within the 128-byte descriptor
    raw = probe.Im2colCapture.LAYOUT.pack(0x7F0000001000, 64, 9, 9, 2, 1, 128, 1152, 10368, 0, -1, -1, 0, -1, -1, 0,
                                          64, 128, 1, 2, 1, 1, 1, 4, 1, 3, 2, 0, 0xC7) + bytes(17)
    capture = probe.Im2colCapture(raw)
    assert capture.address == 0x7F0000001000 and capture.dims[:4] == (64, 9, 9, 2) and capture.rank == 4
    assert capture.strides[:3] == (128, 1152, 10368) and capture.lower[:2] == (-1, -1) and capture.upper[:2] == (-1, -1)
    assert (capture.range_c, capture.range_whdn, capture.elem_strides[:4]) == (64, 128, (1, 2, 1, 1))
    assert (capture.data_type, capture.swizzle, capture.l2_promotion) == (1, 3, 2)
    with pytest.raises(ValueError, match="not an im2col capture"):
        probe.Im2colCapture(bytes(128))  # a tiled descriptor NVRTC left empty


# --- the conv2d_sm90 kind ------------------------------------------------------------------------------------------
import pycutlass as cutlass  # noqa: E402
from pycutlass import DescriptionError, ArgumentError  # noqa: E402
from pycutlass import conv as pconv  # noqa: E402
from pycutlass.kinds.conv2d_sm90 import Conv2dArgumentsSm90, Conv2dOperationSm90  # noqa: E402

_D = cutlass.DataType
_NHWC = cutlass.LayoutType.TensorNHWC


def sm90_conv(element=_D.float16, tile=(128, 128, 64), cluster=(1, 1, 1), stages=0, warps=None, kind=None,
              out=None, align=8, algorithm=None, functor=None, swizzle=None, acc=_D.float32, bias=False,
              stride_support=None, c_align=None, **tile_kw):
    math = cutlass.MathInstruction([64, tile[1], 16], element, element, acc, cutlass.OpClass.TensorOp)
    tile_d = cutlass.TileDescription(list(tile), stages, warps, math, cluster_shape=list(cluster), **tile_kw)
    out = out or element
    A = cutlass.TensorDescription(element, _NHWC, align)
    B = cutlass.TensorDescription(element, _NHWC, align)
    C = cutlass.TensorDescription(out, _NHWC, c_align or align)
    functor = functor or cutlass.LinearCombination(out, C.alignment, acc, _D.float32)
    kind = kind or pconv.Operator.fprop
    if stride_support is None:  # SM90 dgrad runs stride 1 only
        stride_support = pconv.StrideSupport.Unity if kind is pconv.Operator.dgrad else pconv.StrideSupport.Strided
    return cutlass.Conv2dOperation(kind, algorithm or pconv.IteratorAlgorithm.optimized, 90, tile_d, A, B, C,
                                   stride_support, functor, swizzle or cutlass.IdentitySwizzle1, bias=bias)


def test_conv2d_at_90_with_an_sm90_tile_builds_the_sm90_kind():
    op = sm90_conv()
    assert isinstance(op, Conv2dOperationSm90) and op.kind == "conv2d_sm90" and op.required_backend == "nvrtc"
    assert op.name.startswith("pycutlass_conv2d_sm90_fprop_") and op.family == "sm90"
    assert isinstance(sm90_conv(_D.bfloat16, tile=(64, 128, 64), cluster=(2, 1, 1)), Conv2dOperationSm90)


def test_conv2d_at_90_with_an_sm80_tile_keeps_the_sm80_kernel():
    math = cutlass.MathInstruction([16, 8, 16], _D.float16, _D.float16, _D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 64], 3, [2, 2, 1], math)
    desc = [cutlass.TensorDescription(_D.float16, _NHWC, 8) for _ in range(3)]
    op = cutlass.Conv2dOperation(pconv.Operator.fprop, pconv.IteratorAlgorithm.optimized, 90, tile, *desc,
                                 pconv.StrideSupport.Strided, cutlass.LinearCombination(_D.float16, 8))
    assert type(op) is cutlass.Conv2dOperation and op.kind == "conv2d"


@pytest.mark.parametrize("kw, match", [
    (dict(kind=pconv.Operator.wgrad, bias=True), "bias=True is for fprop and dgrad"),
    (dict(kind=pconv.Operator.dgrad, stride_support=pconv.StrideSupport.Strided),
     "SM90 dgrad is built for stride \\(1, 1\\) only: pass StrideSupport.Unity"),
    (dict(kind=pconv.Operator.wgrad, epilogue_schedule=cutlass.EpilogueScheduleType.TmaWarpSpecialized),
     "NoSmemWarpSpecialized"),
    (dict(bias="column"), "bias must be True"),
    (dict(kernel_schedule=cutlass.KernelScheduleType.TmaWarpSpecializedPingpong), "ping-pong schedule is not built"),
    (dict(kernel_schedule=cutlass.KernelScheduleType.TmaWarpSpecializedCooperativeFP8FastAccum), "TmaWarpSpecialized"),
    (dict(epilogue_schedule=cutlass.EpilogueScheduleType.NoSmemWarpSpecialized), "epilogue_schedule"),
    (dict(tile_scheduler=cutlass.TileSchedulerType.StreamK), "stream-K"),
    (dict(element=_D.float32, acc=_D.float32), "float32"),
    (dict(acc=_D.float16), "accumulate in float32"),
    (dict(out=_D.float32), "must hold float16"),
    (dict(align=4), "alignment must be 8"),
    (dict(tile=(256, 128, 64), kernel_schedule=cutlass.KernelScheduleType.TmaWarpSpecialized),
     "tile M must be 64 or 128"),
    (dict(tile=(128, 32, 64)), "tile N must be"),
    (dict(tile=(128, 128, 32)), "tile K must be 64"),
    (dict(cluster=(2, 2, 1)), "cluster_shape"),
    (dict(stages=7), "7 stages of a 128x128x64 tile .* \\(2 to 6 stages\\)"),
    (dict(tile=(128, 256, 64), stages=5), "fewer stages \\(2 to 4 stages\\)"),
    (dict(algorithm=pconv.IteratorAlgorithm.few_channels), "few_channels"),
    (dict(swizzle=cutlass.IdentitySwizzle4), "IdentitySwizzle1"),
])
def test_what_is_not_built_is_rejected_at_construction(kw, match):
    with pytest.raises(DescriptionError, match=match):
        sm90_conv(**kw)


def _relu_functor(element=_D.float16):
    return cutlass.LinearCombinationGeneric(cutlass.relu(_D.float32), element, 8, _D.float32, _D.float32)


def test_activations_and_bias_for_fprop_and_dgrad_but_not_wgrad():
    for kind in (pconv.Operator.fprop, pconv.Operator.dgrad):
        op = sm90_conv(kind=kind, functor=_relu_functor(), bias=True)
        assert op.bias and op.name.endswith(op.name[-10:]) and "_bias_relu_" in op.name
        assert op.epilogue_schedule is cutlass.EpilogueScheduleType.TmaWarpSpecialized
    with pytest.raises(DescriptionError, match="only LinearCombination"):
        sm90_conv(kind=pconv.Operator.wgrad, functor=_relu_functor())
    clamp = cutlass.LinearCombinationClamp(_D.float16, 8, _D.float32, _D.float32)
    with pytest.raises(DescriptionError, match="LinearCombinationClamp epilogue is not built"):
        sm90_conv(functor=clamp)


def test_dgrad_and_wgrad_build_the_sm90_kind():
    dgrad = sm90_conv(kind=pconv.Operator.dgrad)
    wgrad = sm90_conv(_D.bfloat16, kind=pconv.Operator.wgrad, tile=(64, 128, 64), cluster=(1, 2, 1))
    assert isinstance(dgrad, Conv2dOperationSm90) and dgrad.name.startswith("pycutlass_conv2d_sm90_dgrad_")
    assert isinstance(wgrad, Conv2dOperationSm90) and wgrad.name.startswith("pycutlass_conv2d_sm90_wgrad_")
    assert wgrad.epilogue_schedule is cutlass.EpilogueScheduleType.NoSmemWarpSpecialized
    assert len({dgrad.name, wgrad.name, sm90_conv().name}) == 3


def _problem(n=1, h=9, w=9, c=64, k=128, r=3, s=3, pad=(1, 1), stride=(1, 1), dilation=(1, 1), split=1, groups=1):
    p = (h + 2 * pad[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (w + 2 * pad[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
    return cutlass.conv.Conv2dProblemSize(
        cutlass.Tensor4DCoord(n, h, w, c), cutlass.Tensor4DCoord(k, r, s, c),
        cutlass.Tensor4DCoord(pad[0], pad[0], pad[1], pad[1]), cutlass.MatrixCoord(*stride),
        cutlass.MatrixCoord(*dilation), cutlass.conv.Mode.cross_correlation, split, groups)


def test_problem_checks():
    op = sm90_conv()
    op.check_problem_size(_problem())
    op.check_problem_size(_problem(c=8, k=8, stride=(2, 2), dilation=(2, 2), pad=(0, 2)))
    for problem, match in ((_problem(c=12), "C \\(input channels\\) must be a multiple of 8"),
                           (_problem(k=20), "K \\(output channels\\)"),
                           (_problem(split=2), "no split-K"),
                           (_problem(r=3, dilation=(200, 1), h=900), "dilation must be at most 254"),
                           (_problem(pad=(200, 1), h=9), "corners")):
        with pytest.raises(ArgumentError, match=match):
            op.check_problem_size(problem)
    op.check_problem_size(_problem(r=2, dilation=(254, 1), h=300, pad=(127, 1)))  # CUTLASS takes offsets below 255
    with pytest.raises(ArgumentError, match="at most 254"):
        op.check_problem_size(_problem(r=2, dilation=(255, 1), h=300, pad=(127, 1)))


def test_dgrad_problem_checks():
    op = sm90_conv(kind=pconv.Operator.dgrad)
    op.check_problem_size(_problem())
    op.check_problem_size(_problem(c=8, k=16, r=5, s=5, pad=(2, 0)))
    with pytest.raises(ArgumentError, match="stride \\(1, 1\\) only"):
        op.check_problem_size(_problem(stride=(2, 2)))
    # dgrad's corners: lower = pad - (R-1)*dilation, upper = lower + H - P
    with pytest.raises(ArgumentError, match="corners"):
        op.check_problem_size(_problem(r=3, dilation=(70, 1), h=300, pad=(0, 1)))
    wgrad = sm90_conv(kind=pconv.Operator.wgrad)
    wgrad.check_problem_size(_problem(stride=(2, 2), dilation=(2, 1)))
    with pytest.raises(ArgumentError, match="K \\(output channels\\)"):
        wgrad.check_problem_size(_problem(k=12))


def test_corners_follow_cutlass():
    from pycutlass.kinds.conv2d_sm90.operation import _corners

    assert _corners(pconv.Operator.fprop, 1, 2, 3, 1, 9, 10) == (-1, 0)
    assert _corners(pconv.Operator.wgrad, 0, 0, 5, 2, 9, 1) == (0, -8)
    # dgrad, stride 1, H = 9, R = 3, pad 1/1: P = 9, lower = 1 - 2 = -1, upper = -1 (= -upper_pad)
    assert _corners(pconv.Operator.dgrad, 1, 1, 3, 1, 9, 9) == (-1, -1)


def test_abi_struct_passes_d_for_a_missing_c():
    op = sm90_conv()
    args = op.make_abi_arguments(_problem(), 0x1000, 0x2000, 0, 0x4000, op.epilogue_type(1.0, 0.0))
    assert (args.ptr_A, args.ptr_B, args.ptr_C, args.ptr_D) == (0x1000, 0x2000, 0x4000, 0x4000)
    assert (args.n, args.h, args.w, args.c, args.k, args.r, args.s, args.p, args.q) == (1, 9, 9, 64, 128, 3, 3, 9, 9)


def test_emission_holds_the_kernel_builder_and_records():
    from pycutlass.emit import emitter

    op = sm90_conv(_D.bfloat16, tile=(64, 128, 64), cluster=(2, 1, 1))
    unit = emitter.translation_unit([op])
    includes = re.findall(r'#include [<"]([^>"]+)[>"]', unit)
    assert includes[0] == "cuda/std/type_traits"
    assert "cutlass/conv/kernel/conv_universal.hpp" not in includes
    for text in ("struct Sm90Conv2dArgs", "struct TmaRecord", "__cluster_dims__(2, 1, 1)", "cutlass::bfloat16_t",
                 "Shape<_64, _128, Shape<_64>>", "KernelImplicitTmaWarpSpecializedSm90", f"{op.name}_build",
                 "r.mode = 1", "record_tma(records[kIm2col]", "kIm2col = 3, kRecords = 4",
                 "info->tma_count = kRecords", "is_integral_v"):
        assert text in unit, text
    # A unit with an SM90 GEMM and an SM90 conv defines the std:: shim once.
    from tests.cpu.test_gemm_sm90 import sm90 as gemm_sm90
    both = emitter.translation_unit([gemm_sm90(), op])
    assert both.count("inline constexpr bool is_integral_v") == 1


@pytest.mark.parametrize("kind", ["dgrad", "wgrad", "fprop-bias-relu"])
def test_emission_per_kind(kind):
    from pycutlass.emit import emitter

    if kind == "fprop-bias-relu":
        op = sm90_conv(functor=_relu_functor(), bias=True)
        expect = ("kFprop", "LinCombPerColBiasEltAct<\n    cutlass::epilogue::thread::ReLu", "fusion.bias_ptr",
                  "fusion.beta = ElementCompute(0)", "kRecords = 4", "cutlass/epilogue/thread/activation.h")
        absent = ("TensorKCSR",)
    elif kind == "dgrad":
        op = sm90_conv(kind=pconv.Operator.dgrad)
        expect = ("Operator::kDgrad", "ConvProblemShape<cutlass::conv::Operator::kDgrad, 2>", "kRecords = 4",
                  "p.mainloop.tma_load_b, tensor_b", "fusion::LinearCombination<")
        absent = ("kFprop", "TensorKCSR", "bias_ptr")
    else:
        op = sm90_conv(kind=pconv.Operator.wgrad, cluster=(1, 2, 1))
        expect = ("Operator::kWgrad", "Shape<_128, Shape<_128>, Shape<_64>>", "TensorKCSR",
                  "NoSmemWarpSpecialized", "kIm2col = 1, kRecords = 2", "p.mainloop.tma_load_a, tensor_a",
                  "size<1>(" + op.name + "_ns::ClusterShape{})", "get<1, 2>(dC) = problem.stride_C[1]")
        absent = ("kFprop", "tma_store_d", "bias_ptr")
    unit = emitter.translation_unit([op])
    for text in expect:
        assert text in unit, text
    body = op.emit_body()
    for text in absent:
        assert text not in body, text


def test_bias_arguments():
    np = pytest.importorskip("numpy")
    ps = _problem()
    A = np.zeros((1, 9, 9, 64), np.float16)
    B = np.zeros((128, 3, 3, 64), np.float16)
    D = np.zeros((1, 9, 9, 128), np.float16)
    vector = np.zeros(128, np.float16)
    plain, fused = sm90_conv(), sm90_conv(functor=_relu_functor(), bias=True)
    with pytest.raises(ArgumentError, match="needs an SM90 operation built with bias=True"):
        cutlass.Conv2dArguments(plain, ps, A, B, vector, D, output_op=plain.epilogue_type(1.0, 1.0))
    with pytest.raises(ArgumentError, match="beta must be 1"):
        cutlass.Conv2dArguments(fused, ps, A, B, vector, D, output_op=fused.epilogue_type(1.0, 0.5))
    with pytest.raises(ArgumentError, match="C must be the bias vector"):
        cutlass.Conv2dArguments(fused, ps, A, B, np.zeros_like(D), D, output_op=fused.epilogue_type(1.0, 1.0))
    with pytest.raises(ArgumentError, match="C is None"):
        cutlass.Conv2dArguments(fused, ps, A, B, None, D, output_op=fused.epilogue_type(1.0, 1.0))


def test_arguments_dispatch_and_reject_split_k():
    np = pytest.importorskip("numpy")
    op = sm90_conv()
    ps = _problem()
    A = np.zeros((1, 9, 9, 64), np.float16)
    B = np.zeros((128, 3, 3, 64), np.float16)
    D = np.zeros((1, 9, 9, 128), np.float16)
    with pytest.raises(ArgumentError, match="no split-K"):
        cutlass.Conv2dArguments(op, ps, A, B, None, D, split_k_slices=2)
    assert Conv2dArgumentsSm90.__mro__[1] is cutlass.Conv2dArguments


@pytest.mark.slow
def test_nvrtc_compiles_sm90_dgrad_wgrad_and_a_fused_bias_fprop():
    """dgrad, wgrad and fprop + bias + ReLU operations of the kind in one unit (about 3-4 minutes on two cores)."""
    from pycutlass.emit import emitter

    ops = [sm90_conv(kind=pconv.Operator.dgrad), sm90_conv(kind=pconv.Operator.wgrad),
           sm90_conv(functor=_relu_functor(), bias=True)]
    cubin = NvrtcBackend().compile(emitter.translation_unit(ops), "90a", ops[0].name)
    for op in ops:
        assert op.name.encode() in cubin and f"{op.name}_build".encode() in cubin


@pytest.mark.slow
def test_nvrtc_compiles_the_conv2d_sm90_kind():
    """One operation of the kind through the project's NVRTC backend (about 80-110 s on two cores)."""
    from pycutlass.emit import emitter

    op = sm90_conv()
    cubin = NvrtcBackend().compile(emitter.translation_unit([op]), "90a", op.name)
    assert op.name.encode() in cubin and f"{op.name}_build".encode() in cubin


# --- wgrad: float32 output and parallel split-K by images -----------------------------------------------------------
def _wgrad_f32(element=_D.float16, c_align=4, tile=(64, 128, 64), **kw):
    return sm90_conv(element, kind=pconv.Operator.wgrad, tile=tile, out=_D.float32, c_align=c_align, **kw)


def test_wgrad_may_write_float32_but_fprop_and_dgrad_may_not():
    op = _wgrad_f32()
    assert isinstance(op, Conv2dOperationSm90) and "_f16f32f32_" in op.name
    assert _wgrad_f32(_D.bfloat16).name != op.name
    for kind in (pconv.Operator.fprop, pconv.Operator.dgrad):
        with pytest.raises(DescriptionError, match="must hold float16 \\(the operands' type; wgrad may also"):
            sm90_conv(kind=kind, out=_D.float32, c_align=4)
    with pytest.raises(DescriptionError, match="alignment must be 4"):
        _wgrad_f32(c_align=8)


def test_image_slices_cover_the_batch_evenly():
    from pycutlass.kinds.conv2d_sm90.arguments import image_slices

    assert image_slices(32, 5) == [(0, 7), (7, 14), (14, 20), (20, 26), (26, 32)]
    assert image_slices(3, 3) == [(0, 1), (1, 2), (2, 3)] and image_slices(7, 1) == [(0, 7)]
    for n in range(1, 40):
        for s in range(1, n + 1):
            bounds = image_slices(n, s)
            sizes = [end - first for first, end in bounds]
            assert bounds[0][0] == 0 and bounds[-1][1] == n and min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


def test_wgrad_split_k_is_parallel_by_images():
    np = pytest.importorskip("numpy")
    op = _wgrad_f32()
    ps = _problem(n=3)
    op.check_problem_size(_problem(n=3, split=3))
    op.check_problem_size(_problem(n=3, split=27))  # every image in nine runs of rows (P = 9)
    for split in (4, 5, 30):
        with pytest.raises(ArgumentError, match=f"at most the batch N = 3 .* multiple of N up to N\\*P = 27 .* "
                                                f"got {split}"):
            op.check_problem_size(_problem(n=3, split=split))
    with pytest.raises(ArgumentError, match="SM90 splits only wgrad"):
        sm90_conv().check_problem_size(_problem(n=3, split=2))
    dy = np.zeros((3, 9, 9, 128), np.float16)
    x = np.zeros((3, 9, 9, 64), np.float16)
    dw = np.zeros((128, 3, 3, 64), np.float32)
    with pytest.raises(ArgumentError, match="splits K in parallel only"):
        cutlass.Conv2dArguments(op, ps, dy, x, None, dw, split_k_slices=2)
    with pytest.raises(ArgumentError, match="at most the batch"):
        cutlass.Conv2dArguments(op, ps, dy, x, None, None, split_k_mode=pconv.SplitKMode.Parallel, split_k_slices=4)
    with pytest.raises(ArgumentError, match="read only padding"):  # 3 rows padded by 5: the first run of rows
        cutlass.Conv2dArguments(op, _problem(n=1, h=3, pad=(5, 1)), np.zeros((1, 11, 9, 128), np.float16),
                                np.zeros((1, 3, 9, 64), np.float16), None, None,
                                split_k_mode=pconv.SplitKMode.Parallel, split_k_slices=11)
    fprop = sm90_conv()
    with pytest.raises(ArgumentError, match="SM90 splits only wgrad"):
        cutlass.Conv2dArguments(fprop, _problem(n=3), x, np.zeros((128, 3, 3, 64), np.float16), None,
                                np.zeros((3, 9, 9, 128), np.float16), split_k_mode=pconv.SplitKMode.Parallel)
    assert op.workspace_elements(_problem(n=3, split=3), pconv.SplitKMode.Parallel) == 3 * 128 * 3 * 3 * 64
    assert op.workspace_elements(_problem(n=3, split=3), pconv.SplitKMode.Serial) == 0
    assert fprop.workspace_elements(_problem(n=3), pconv.SplitKMode.Parallel) == 0


def test_wgrad_units_carry_the_slices_kernel_and_fprop_units_do_not():
    from pycutlass.emit import emitter

    wgrad, fprop = _wgrad_f32(), sm90_conv()
    source = emitter.translation_unit([wgrad])
    assert f"{wgrad.name}_slices(pycutlass_abi::Sm90ConvSlices const slices)" in source
    assert "struct Sm90ConvSlices {" in source and "fence.proxy.tensormap::generic.acquire.gpu" in source
    plain = emitter.translation_unit([fprop])
    assert "_slices" not in plain and "Sm90ConvSlices" not in plain


@pytest.mark.slow
def test_nvrtc_compiles_a_float32_wgrad_with_its_slices_kernel():
    """A float32-output wgrad unit: kernel, slices kernel and builder (about 80-110 s on two cores)."""
    from pycutlass.emit import emitter

    op = _wgrad_f32(_D.bfloat16, cluster=(1, 2, 1))
    cubin = NvrtcBackend().compile(emitter.translation_unit([op]), "90a", op.name)
    for symbol in (op.name, f"{op.name}_slices", f"{op.name}_build"):
        assert symbol.encode() in cubin


def _wgrad64(x, dy, ps):
    """float64 wgrad of NHWC x and NPQK dy (cross-correlation with the problem's padding, stride, dilation)."""
    np = pytest.importorskip("numpy")
    padded = np.zeros((x.shape[0], ps.H + ps.pad_h + ps.upper_pad_h + ps.stride_h * ps.P,
                       ps.W + ps.pad_w + ps.upper_pad_w + ps.stride_w * ps.Q, ps.C))
    padded[:, ps.pad_h:ps.pad_h + ps.H, ps.pad_w:ps.pad_w + ps.W] = x
    dw = np.zeros((ps.K, ps.R, ps.S, ps.C))
    for r in range(ps.R):
        for s in range(ps.S):
            h, w = r * ps.dilation_h, s * ps.dilation_w
            window = padded[:, h:h + ps.stride_h * ps.P:ps.stride_h, w:w + ps.stride_w * ps.Q:ps.stride_w]
            dw[:, r, s] = np.einsum("npqk,npqc->kc", dy, window[:, :ps.P, :ps.Q])
    return dw


@pytest.mark.parametrize("shape, slices", [
    (dict(n=3, h=9, w=7, c=8, k=16, r=3, s=3, pad=(1, 1)), 3),
    (dict(n=5, h=9, w=7, c=8, k=16, r=3, s=3, pad=(1, 1)), 2),
    (dict(n=2, h=11, w=6, c=8, k=8, r=3, s=2, pad=(2, 1), stride=(2, 1)), 6),
    (dict(n=2, h=13, w=5, c=8, k=8, r=3, s=3, pad=(2, 2), dilation=(2, 1)), 14),     # every output row its own
    (dict(n=1, h=20, w=4, c=8, k=8, r=5, s=1, pad=(0, 0), stride=(3, 1), dilation=(2, 1)), 3),
])
def test_wgrad_slices_sum_to_the_whole_gradient(shape, slices):
    """The slices are whole problems whose float64 gradients, read at their offsets, add up to the problem's."""
    np = pytest.importorskip("numpy")
    from pycutlass.kinds.conv2d_sm90.arguments import wgrad_slices

    ps = _problem(**shape)
    rng = np.random.default_rng(slices)
    x = rng.standard_normal((ps.N, ps.H, ps.W, ps.C))
    dy = rng.standard_normal((ps.N, ps.P, ps.Q, ps.K))
    parts = wgrad_slices(ps, slices)
    assert len(parts) == slices
    total = np.zeros((ps.K, ps.R, ps.S, ps.C))
    covered = 0
    for part, activation, gradient in parts:
        sm90_conv(kind=pconv.Operator.wgrad).check_problem_size(part)
        part_x = x.reshape(-1)[activation:activation + part.N * part.H * part.W * part.C]
        part_dy = dy.reshape(-1)[gradient:gradient + part.N * part.P * part.Q * part.K]
        total += _wgrad64(part_x.reshape(part.N, part.H, part.W, part.C),
                          part_dy.reshape(part.N, part.P, part.Q, part.K), part)
        covered += part.N * part.P * part.Q
    assert covered == ps.N * ps.P * ps.Q  # every output pixel in exactly one slice (with the sum below)
    np.testing.assert_allclose(total, _wgrad64(x, dy, ps), rtol=1e-10, atol=1e-10)


# --- explicit stage counts: StageCount<S>, two CTAs per SM where they fit ------------------------------------------
@pytest.mark.parametrize("kw, ctas", [
    (dict(tile=(128, 64, 64), stages=4), 2),                  # 96 KiB of stages: two CTAs in the SM's 228 KiB
    (dict(tile=(64, 128, 64), stages=3), 2),
    (dict(tile=(64, 64, 64), stages=7), 2),                   # 112 KiB + barriers + 1 KiB reserved: just fits
    (dict(tile=(64, 64, 64), stages=8), 1),
    (dict(tile=(128, 64, 64), stages=5), 1),                  # 120 KiB
    (dict(tile=(128, 128, 64), stages=2), 1),                 # fits by shared memory, but 128 accumulators spill
    (dict(tile=(128, 128, 64), stages=6), 1),
    (dict(kind=pconv.Operator.wgrad, tile=(64, 128, 64), stages=4), 2),
    (dict(tile=(128, 64, 64)), 1),                            # stages=0: CUTLASS fills the SM
])
def test_explicit_stages_and_ctas_per_sm(kw, ctas):
    op = sm90_conv(**kw)
    assert op.ctas_per_sm == ctas
    stages = kw.get("stages", 0)
    assert (f"_s{stages}_ws_" in op.name) == bool(stages) and ("stages=" in op.describe()) == bool(stages)


def test_stage_counts_are_rejected_unless_they_fit_one_cta():
    with pytest.raises(DescriptionError, match="TileDescription.stages must be an integer in 2..10") as raised:
        sm90_conv(stages=1)
    assert raised.value.rule == "tile.stages"
    with pytest.raises(DescriptionError, match="more than the 227 KiB .* \\(2 to 8 stages\\)") as raised:
        sm90_conv(tile=(128, 64, 64), stages=9)  # 216 KiB of stages + 16 KiB of epilogue buffers
    assert raised.value.rule == "smem.capacity"
    sm90_conv(tile=(128, 64, 64), stages=8)  # the count CUTLASS's carve-out chooses


def test_stage_counts_name_distinct_operations_and_stages_0_keeps_its_name():
    auto, three, four = (sm90_conv(tile=(128, 64, 64), stages=s) for s in (0, 3, 4))
    assert len({auto.name, three.name, four.name}) == 3 and auto != four and four == sm90_conv(tile=(128, 64, 64),
                                                                                                   stages=4)
    # stages=0 names (and sources) as before explicit stage counts existed: compiled kernels stay cached
    assert auto.name == "pycutlass_conv2d_sm90_fprop_f16f16f32_nhwc_128x64x64_c1x1_ws_a888_94639ce0a7"
    assert "_s4_ws_" in four.name


def test_emission_of_explicit_stages():
    from pycutlass.emit import emitter

    auto = sm90_conv(tile=(128, 64, 64)).emit_body()
    assert "StageCountAutoCarveout<" in auto and "StageCount<" not in auto.replace("StageCountAuto", "")
    assert "::Kernel::MinBlocksPerMultiprocessor)" in auto
    two = sm90_conv(tile=(128, 64, 64), stages=4)
    body = two.emit_body()
    assert "cutlass::conv::collective::StageCount<4>," in body and "StageCountAutoCarveout" not in body
    assert f"__launch_bounds__({two.name}_ns::Kernel::MaxThreadsPerBlock, 2)" in body
    assert "MinBlocksPerMultiprocessor" not in body and "two CTAs co-reside" in body
    one = sm90_conv(tile=(128, 128, 64), stages=3).emit_body()  # one CTA: CUTLASS's launch bounds
    assert "StageCount<3>," in one and "::Kernel::MinBlocksPerMultiprocessor)" in one and "co-reside" not in one
    wgrad = _wgrad_f32(stages=4)  # the slices kernel is the same kernel: the same bounds
    body = emitter.translation_unit([wgrad])
    assert body.count(f"__launch_bounds__({wgrad.name}_ns::Kernel::MaxThreadsPerBlock, 2)") == 2


@pytest.mark.slow
def test_nvrtc_compiles_two_cta_convolutions_without_spills():
    """fprop (bias + ReLU) and a float32 wgrad with 4 stages and two CTAs per SM: NVRTC with ptxas's report (about
    80-100 s on two cores). Two CTAs of 256 threads get at most 128 registers a thread; these kernels need 96-110."""
    ops = [sm90_conv(tile=(128, 64, 64), stages=4, functor=_relu_functor(), bias=True), _wgrad_f32(stages=4)]
    assert all(op.ctas_per_sm == 2 for op in ops)
    report = _ptxas_report(ops)
    for kernel in (ops[0].name, ops[1].name, f"{ops[1].name}_slices"):
        spills, registers = report[kernel]
        assert spills == 0 and registers <= 128, (kernel, spills, registers)


def _ptxas_report(ops) -> dict:
    """{kernel: (spill store bytes, registers)} from ptxas's report of one NVRTC compile of ``ops``' unit."""
    from cuda.bindings import nvrtc
    from pycutlass.emit import emitter

    backend = NvrtcBackend()
    options = [o.encode() for o in (*backend.flags("90a"), *backend.include_flags(), "--ptxas-options=-v")]
    _, program = nvrtc.nvrtcCreateProgram(emitter.translation_unit(ops).encode(), b"unit.cu", 0, [], [])
    try:
        (result,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = b" " * max(size, 2)
        nvrtc.nvrtcGetProgramLog(program, log)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    log = log.decode(errors="replace").replace("\0", "")
    assert result == nvrtc.nvrtcResult.NVRTC_SUCCESS, log[-4000:]
    return {name: (int(spills), int(registers)) for name, spills, registers in re.findall(
        r"Function properties for (\w+)\n.*?(\d+) bytes spill stores.*?\n.*?Used (\d+) registers", log)}


# --- pycutlass's persistent cooperative kernel ---------------------------------------------------------------------
_COOP = cutlass.KernelScheduleType.TmaWarpSpecializedCooperative


def test_the_cooperative_schedule_builds_the_persistent_kernel():
    op = sm90_conv(tile=(256, 128, 64), cluster=(1, 2, 1), kernel_schedule=_COOP)
    assert op.cooperative and op.kernel_schedule is _COOP and op.ctas_per_sm == 1
    assert op.epilogue_schedule is cutlass.EpilogueScheduleType.TmaWarpSpecializedCooperative
    assert "_c1x2_coop_" in op.name and "PersistentCooperative" in op.describe()
    wgrad = sm90_conv(kind=pconv.Operator.wgrad, kernel_schedule=_COOP)
    assert wgrad.epilogue_schedule is cutlass.EpilogueScheduleType.NoSmemWarpSpecialized and "_coop_" in wgrad.name
    plain = sm90_conv(tile=(128, 128, 64))
    assert not plain.cooperative and "_ws_" in plain.name and plain.name != sm90_conv(kernel_schedule=_COOP).name
    # Auto takes the cooperative kernel for what only it runs: tile M 256, or two warpgroups' warp count
    assert sm90_conv(tile=(256, 128, 64), cluster=(1, 2, 1)).name == op.name
    assert sm90_conv(warps=[8, 1, 1]).name == sm90_conv(kernel_schedule=_COOP).name
    assert not sm90_conv(warps=[4, 1, 1]).cooperative and not sm90_conv().cooperative
    # explicit stages count the cooperative epilogue's buffers beside (not over) the mainloop's: persistent CTAs
    # use both at once
    assert sm90_conv(tile=(128, 64, 64), stages=5, kernel_schedule=_COOP).ctas_per_sm == 1


def test_the_cooperative_schedule_is_checked_at_construction():
    with pytest.raises(DescriptionError, match="tile M must be 128 or 256") as raised:
        sm90_conv(tile=(64, 128, 64), kernel_schedule=_COOP)
    assert raised.value.rule == "sm90.cooperative_tile_m"
    with pytest.raises(DescriptionError, match="ping-pong schedule is not built for convolutions") as raised:
        sm90_conv(kernel_schedule=cutlass.KernelScheduleType.TmaWarpSpecializedPingpong)
    assert raised.value.rule == "sm90.kernel_schedule"
    with pytest.raises(DescriptionError, match="or 256 with kernel_schedule=TmaWarpSpecializedCooperative"):
        sm90_conv(tile=(256, 128, 64), kernel_schedule=cutlass.KernelScheduleType.TmaWarpSpecialized)
    with pytest.raises(DescriptionError, match="warp_count is derived"):
        sm90_conv(tile=(128, 128, 64), warps=[8, 1, 1], kernel_schedule=cutlass.KernelScheduleType.TmaWarpSpecialized)
    with pytest.raises(DescriptionError, match="epilogue schedule .* must be Auto or TmaWarpSpecializedCooperative"):
        sm90_conv(kernel_schedule=_COOP, epilogue_schedule=cutlass.EpilogueScheduleType.TmaWarpSpecialized)
    with pytest.raises(DescriptionError, match="more than the 227 KiB") as raised:
        sm90_conv(tile=(256, 128, 64), stages=5, kernel_schedule=_COOP)
    assert raised.value.rule == "smem.capacity"


def test_emission_and_abi_of_the_cooperative_kernel():
    from pycutlass.emit import emitter
    from pycutlass.kinds.conv2d_sm90.abi import Sm90Conv2dArgs, Sm90Conv2dPersistentArgs

    ops = [sm90_conv(tile=(128, 128, 64), kernel_schedule=_COOP),
           sm90_conv(tile=(256, 128, 64), cluster=(2, 1, 1), kernel_schedule=_COOP, functor=_relu_functor(),
                     bias=True)]
    unit = emitter.translation_unit(ops)
    # one definition of the kernel template for the unit, two instantiations of it
    assert unit.count("#define PYCUTLASS_SM90_CONV_PERSISTENT_COOPERATIVE") == 2  # include-guarded copies
    assert unit.count("pycutlass_sm90_conv::PersistentCooperativeKernel<") == 2
    assert "Layout<Shape<_2, _1, _1>>" in unit and "cutlass::epilogue::TmaWarpSpecializedCooperative" in unit
    assert "K::get_grid_shape(p, a.sm_count)" in unit
    assert all(f"{op.name}_build(pycutlass_abi::Sm90Conv2dPersistentArgs a" in unit for op in ops)
    assert ops[0].abi_struct_type is Sm90Conv2dPersistentArgs and sm90_conv().abi_struct_type is Sm90Conv2dArgs
    assert Sm90Conv2dPersistentArgs.sm_count.offset == ctypes.sizeof(Sm90Conv2dArgs)
    ps = _problem()
    with pytest.raises(ArgumentError, match="persistent grid needs the device's SM count"):
        ops[1].make_abi_arguments(ps, 1, 2, 3, 4, ops[1].epilogue_type(1.0, 0.0))
    assert ops[1].make_abi_arguments(ps, 1, 2, 3, 4, ops[1].epilogue_type(1.0, 0.0), sm_count=132).sm_count == 132
    # the single-consumer kernel's unit is unchanged by the cooperative one's existence
    assert "PersistentCooperative" not in emitter.translation_unit([sm90_conv()])


@pytest.mark.slow
def test_nvrtc_compiles_cooperative_convolutions_without_spills():
    """fprop (256x128, bias + ReLU, 1x2 cluster) and a float32 wgrad with its slices kernel: NVRTC with ptxas's
    report (about 60 s on two cores). 384 threads; the consumers take 232 registers with setmaxnreg."""
    ops = [sm90_conv(tile=(256, 128, 64), cluster=(1, 2, 1), functor=_relu_functor(), bias=True,
                     kernel_schedule=_COOP), _wgrad_f32(tile=(128, 128, 64), kernel_schedule=_COOP)]
    report = _ptxas_report(ops)
    for kernel in (ops[0].name, ops[1].name, f"{ops[1].name}_slices"):
        spills, registers = report[kernel]
        assert spills == 0 and registers <= 168, (kernel, spills, registers)  # 65536 / 384 threads


def test_192_wide_tiles_are_built_for_wgrad_only():
    """wgrad's GEMM N is R*S*C, which 192-wide tiles (three 64-channel filter taps) cut into whole tiles on 3x3
    layers; fprop's and dgrad's N is a channel count, where the suite proves 64, 128 and 256."""
    for schedule, tile in ((cutlass.KernelScheduleType.Auto, (64, 192, 64)),
                           (_COOP, (128, 192, 64)), (_COOP, (256, 192, 64))):
        op = sm90_conv(kind=pconv.Operator.wgrad, tile=tile, kernel_schedule=schedule)
        assert f"_{tile[0]}x192x64_" in op.name
        assert f"using TileShape = Shape<_{tile[0]}, Shape<_192>, Shape<_64>>;" in op.emit_body()
    for kind in (pconv.Operator.fprop, pconv.Operator.dgrad):
        with pytest.raises(DescriptionError, match="tile N must be 64, 128 or 256, got 192"):
            sm90_conv(kind=kind, tile=(128, 192, 64))


# --- the filter-tap-reuse wgrad (tile N = 9*64) ---------------------------------------------------------------------
def _taps(element=_D.float16, out=_D.float32, k=64, stages=0, cluster_z=1, instruction_n=64, m=64, **tile_kw):
    math = cutlass.MathInstruction([64, instruction_n, 16], element, element, _D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([m, 576, k], stages, None, math, cluster_shape=[1, 1, cluster_z], **tile_kw)
    operand = cutlass.TensorDescription(element, _NHWC, 8)
    output = cutlass.TensorDescription(out, _NHWC, 4 if out is _D.float32 else 8)
    return cutlass.Conv2dOperation(pconv.Operator.wgrad, pconv.IteratorAlgorithm.optimized, 90, tile, operand,
                                   operand, output, pconv.StrideSupport.Strided,
                                   cutlass.LinearCombination(out, output.alignment, _D.float32, _D.float32))


def test_a_wgrad_tile_over_all_nine_taps_builds_the_filter_taps_kernel():
    from pycutlass.kinds.conv2d_sm90.abi import Sm90WgradTapsArgs
    from pycutlass.kinds.conv2d_sm90.operation import filter_taps_max_stages

    op = _taps()
    assert isinstance(op, Conv2dOperationSm90) and op.filter_taps and not op.cooperative and op.ctas_per_sm == 1
    assert "_64x576x64_c1x1x1_taps_" in op.name and "FilterTapsWgrad(stage_k=64, stages=6, cluster_z=1)" in op.describe()
    assert op.abi_struct_type is Sm90WgradTapsArgs and op.filter_taps_stages == filter_taps_max_stages(1) == 6
    wide = _taps(_D.bfloat16, _D.bfloat16, k=128, cluster_z=4)
    assert wide.filter_taps_stages == 4 and "_c1x1x4_taps_" in wide.name
    assert len({op.name, _taps(cluster_z=2).name, _taps(stages=3).name, wide.name}) == 4
    # 192- and 128-wide wgrad tiles keep the implicit-GEMM kernel
    assert not sm90_conv(kind=pconv.Operator.wgrad, tile=(64, 192, 64)).filter_taps


@pytest.mark.parametrize("kw, match", [
    (dict(m=128), "tile \\[64, 576, 64\\] or \\[64, 576, 128\\]"),
    (dict(k=32), "tile \\[64, 576, 64\\] or \\[64, 576, 128\\]"),
    (dict(instruction_n=128), "instruction_shape must be \\[64, 64, 16\\]"),
    (dict(cluster_z=3), "cluster_shape \\[1, 1, Z\\] with Z in 1, 2, 4"),
    (dict(stages=7), "stages must be 0 \\(as many as fit, 6\\) or 2..6"),
    (dict(k=128, stages=5), "or 2..4"),
    (dict(kernel_schedule=cutlass.KernelScheduleType.TmaWarpSpecializedCooperative), "Auto or TmaWarpSpecialized"),
    (dict(out=_D.bfloat16), "C must hold float16 or float32"),
])
def test_the_filter_taps_kernel_refuses_what_it_does_not_build(kw, match):
    with pytest.raises(DescriptionError, match=match):
        _taps(**kw)


def test_fprop_and_dgrad_have_no_filter_taps_tile():
    math = cutlass.MathInstruction([64, 64, 16], _D.float16, _D.float16, _D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([64, 576, 64], 0, None, math)
    operand = cutlass.TensorDescription(_D.float16, _NHWC, 8)
    for kind in (pconv.Operator.fprop, pconv.Operator.dgrad):
        support = pconv.StrideSupport.Unity if kind is pconv.Operator.dgrad else pconv.StrideSupport.Strided
        with pytest.raises(DescriptionError, match="tile N must be 64, 128 or 256, got 576"):
            cutlass.Conv2dOperation(kind, pconv.IteratorAlgorithm.optimized, 90, tile, operand, operand, operand,
                                    support, cutlass.LinearCombination(_D.float16, 8, _D.float32, _D.float32))


def test_filter_taps_problem_checks():
    op = _taps(cluster_z=4)
    op.check_problem_size(_problem(c=128, k=64))
    op.check_problem_size(_problem(n=2, h=56, w=70, c=64, k=192, pad=(0, 3)))
    op.check_problem_size(_problem(split=16383))
    for problem, match in ((_problem(r=1, s=1, pad=(0, 0)), "built for 3x3 filters, got 1x1"),
                           (_problem(stride=(2, 2)), "stride and dilation must be \\(1, 1\\)"),
                           (_problem(dilation=(2, 2), h=12), "stride and dilation must be \\(1, 1\\)"),
                           (_problem(c=96), "C \\(input channels\\) must be a multiple of 64"),
                           (_problem(k=72), "K \\(output channels\\) must be a multiple of 64"),
                           (_problem(split=16384), "at most 16383 slices")):
        with pytest.raises(ArgumentError, match=match):
            op.check_problem_size(problem)


def test_filter_taps_emission_and_abi():
    from pycutlass.emit import emitter
    from pycutlass.kinds.conv2d_sm90.abi import Sm90Conv2dArgs, Sm90WgradTapsArgs

    ops = [_taps(), _taps(_D.bfloat16, _D.bfloat16, k=128, stages=3, cluster_z=2)]
    unit = emitter.translation_unit(ops)
    assert unit.count("#ifndef PYCUTLASS_FILTER_TAPS_WGRAD") == 2  # the kernel's text is include-guarded
    assert "FilterTapsWgrad<cutlass::half_t, float, 64, 6,\n" in unit
    assert "FilterTapsWgrad<cutlass::bfloat16_t, cutlass::bfloat16_t, 128, 3,\n" in unit
    assert "a.q > 32 ? 64 : a.q > 16 ? 32 : 16" in unit  # the row segment follows the problem's width
    assert "__cluster_dims__(1, 1, 1)" in unit and "__cluster_dims__(1, 1, 2)" in unit
    for op in ops:
        assert f"{op.name}_build(pycutlass_abi::Sm90WgradTapsArgs a" in unit
        assert f"{op.name}_slices" not in unit  # the kernel splits K itself: no per-slice Params
    assert "SM90_TMA_LOAD_4D" in unit and "mapa.shared::cluster" in unit
    assert Sm90WgradTapsArgs.splits.offset == ctypes.sizeof(Sm90Conv2dArgs)
    args = ops[0].make_abi_arguments(_problem(split=5), 1, 2, 0, 4, ops[0].epilogue_type(1.0, 0.0))
    assert (args.splits, args.ptr_C, args.r, args.s) == (5, 4, 3, 3)


def test_filter_taps_split_k_is_parallel_only():
    np = pytest.importorskip("numpy")
    op = _taps()
    ps = _problem(c=64, k=64)
    A = np.zeros((1, 9, 9, 64), np.float16)
    B = np.zeros((1, 9, 9, 64), np.float16)
    D = np.zeros((64, 3, 3, 64), np.float32)
    with pytest.raises(ArgumentError, match="splits K in parallel only"):
        cutlass.Conv2dArguments(op, ps, A, B, None, D, split_k_slices=2)


@pytest.mark.slow
def test_nvrtc_compiles_the_filter_taps_kernel_without_spills():
    """Two filter-tap-reuse operations (one with a cluster of 4) through NVRTC with ptxas's report (about 20 s on two
    cores): 512 threads leave 128 registers a thread, which the consumers' 96 accumulators must fit."""
    ops = [_taps(), _taps(_D.bfloat16, _D.bfloat16, k=128, cluster_z=4)]
    report = _ptxas_report(ops)
    for op in ops:
        spills, registers = report[op.name]
        assert spills == 0 and registers <= 128, (op.name, spills, registers)
