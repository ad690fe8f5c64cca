"""Conv2d throughput: pycutlass fprop / dgrad / wgrad (f16 NHWC, f32 accumulation) against cuDNN through torch, on
the ResNet-50 convolution layers.

    python benchmarks/conv2d.py [--quick] [--kinds fprop dgrad wgrad] [--batches 32 128] [--out benchmarks/results/conv2d.json]

torch: ``torch.nn.functional.conv2d`` (fprop) and ``torch.nn.grad.conv2d_input`` / ``conv2d_weight`` (dgrad /
wgrad, i.e. ``aten.convolution_backward``), channels_last float16 tensors. cuDNN's time is the faster of its two
ways of choosing an algorithm: autotuned (``torch.backends.cudnn.benchmark = True`` with ``benchmark_limit = 0``, every
algorithm tried) and its heuristic (``benchmark = False``). An autotuned pick alone varied by up to 1.6x per layer
between runs (a timing-noise pick persists for the process); the faster of the two is the stronger, steadier baseline.
pycutlass: for each layer, the best of a small grid of tiles (optimized iterators; dgrad with stride 1 runs the
Unity kernels, with stride 2 the strided-dgrad kernels), each also with serial split-K when its tiles alone do not
fill the GPU (not for strided dgrad at stride > 1, as in the recorded results). Each candidate's output (NaN-poisoned
first) is checked once against torch's result before it is timed; times are the tuning harness's (``GemmBench``:
kernel time from CUPTI timestamps spanning every kernel of a call, L2 evicted before each sample, median; docs/tuning.md)
for ``op.run(arguments)`` with the arguments built once, and for torch's call the same way; ``--timer events`` times
both with CUDA events instead. TFLOP/s = 2 * N*P*Q * K * R*S*C / time for every kind.

SM90 column: CUTLASS 3.x implicit-GEMM kernels (``Conv2dOperation(..., 90, <SM90 tile>)``: TMA im2col, wgmma) from a
small candidate set per kind (``SM90_TILES``; a few with explicit stage counts that fit two CTAs per SM, labelled
"s<stages>", next to CUTLASS's automatic count), checked and timed the same way. CUTLASS 4.2's SM90 conv has no
split-K; pycutlass splits SM90 wgrad by images (``SM90_WGRAD_PARALLEL``: float32 partial filter gradients of runs of
whole images in one launch, then the reduction; on SM90 the reduction launches with programmatic dependent launch,
starting while the split-K kernel drains). SM90 dgrad runs stride 1 only (strided dgrad layers show no SM90
result). "best" is the faster of the
two families per layer. A 1x1 stride-1 convolution is a GEMM over the NHWC tensors viewed as matrices, so for
those layers the SM90 column also tries pycutlass's SM90 GEMM (``SM90_GEMM``: stream-K for the long GEMM K, wide persistent tiles for fprop; labelled
"sm90 GEMM"; it splits the long GEMM K of wgrad, which the conv kernels cannot).
Targets, geomean of best/cuDNN over both batches: fprop >= 0.95x, wgrad >= 0.90x, dgrad >= 1.5x.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pycutlass as cutlass  # noqa: E402
from common import device_name, print_table, write_json  # noqa: E402
from pycutlass.conv import Conv2dProblemSize, IteratorAlgorithm, Mode, Operator, SplitKMode, StrideSupport  # noqa: E402
from pycutlass.kinds.conv2d.operation import Conv2dOperation  # noqa: E402
from pycutlass.kinds.conv2d_sm90.operation import FILTER_TAPS_TILE_N as FILTER_TAPS_N  # noqa: E402

D = cutlass.DataType
KINDS = ("fprop", "dgrad", "wgrad")
BATCHES = (32, 128)
TARGETS = {"fprop": 0.95, "wgrad": 0.9, "dgrad": 1.5}  # geomean of the best pycutlass / cuDNN ratio
TOLERANCE = 1e-2  # relative Frobenius error against torch's float16 result

# The distinct ResNet-50 (torchvision, stride on the 3x3) layers benchmarked: name -> (C, K, H, W, R, S, stride),
# H x W the layer's input; padding R // 2.
LAYERS = {
    "conv2_x 3x3 64->64": (64, 64, 56, 56, 3, 3, 1),
    "conv2_x 1x1 64->256": (64, 256, 56, 56, 1, 1, 1),
    "conv2_x 1x1 256->64": (256, 64, 56, 56, 1, 1, 1),
    "conv3_x 3x3 128->128 s2": (128, 128, 56, 56, 3, 3, 2),
    "conv3_x 3x3 128->128": (128, 128, 28, 28, 3, 3, 1),
    "conv3_x 1x1 512->128": (512, 128, 28, 28, 1, 1, 1),
    "conv4_x 3x3 256->256": (256, 256, 14, 14, 3, 3, 1),
    "conv4_x 1x1 256->1024": (256, 1024, 14, 14, 1, 1, 1),
    "conv5_x 3x3 512->512": (512, 512, 7, 7, 3, 3, 1),
    "conv5_x 1x1 1024->2048 s2": (1024, 2048, 14, 14, 1, 1, 2),
}
QUICK_LAYERS = ["conv2_x 3x3 64->64", "conv3_x 3x3 128->128 s2", "conv4_x 3x3 256->256", "conv5_x 3x3 512->512"]

# (threadblock, stages, warps): warp tiles 64x64 (N of a warp tile must be 32 or 64)
TILES = [([128, 128, 32], 3, [2, 2, 1]), ([128, 128, 64], 3, [2, 2, 1]), ([256, 128, 32], 3, [4, 2, 1]),
         ([128, 256, 32], 3, [2, 4, 1])]
# fprop only: tiles as narrow as the 64-channel layers (conv2_x: K = 64), whose N = 64 leaves half of a 128-wide tile
# idle.
FPROP_TILES = [([128, 64, 64], 4, [2, 2, 1]), ([256, 64, 32], 4, [4, 1, 1])]
ALIGN = 8
MAX_SPLIT_K = 16
# SM90 candidates per kind: (tile M, N, K), cluster, stages. A few each, so that the grid compiles in a couple of
# minutes on the 16-core GPU host (an SM90 conv operation is ~30 s of one core there, ~80 s on the 2-core dev
# machine). stages 0: CUTLASS fills the SM's shared memory (one CTA per SM). An explicit count whose stages fit half an
# SM, on a tile of at most 128x64 outputs, builds two CTAs per SM: one's prologue and epilogue overlap the other's
# mainloop, for layers with a short GEMM K (conv2_x 3x3 64->64: nine 64-wide K steps).
COOP = "cooperative"
SM90_TILES = {
    "fprop": [((128, 128, 64), (1, 1, 1), 0), ((128, 256, 64), (1, 1, 1), 0), ((128, 128, 64), (2, 1, 1), 0),
              ((64, 128, 64), (1, 1, 1), 0), ((128, 64, 64), (1, 1, 1), 0), ((128, 64, 64), (2, 1, 1), 0),
              ((128, 64, 64), (1, 1, 1), 4), ((64, 128, 64), (1, 1, 1), 4), ((64, 64, 64), (1, 1, 1), 4),
              # 1x2: the two 64-wide N tiles of a 128-channel layer share the activation tile (multicast)
              ((128, 64, 64), (1, 2, 1), 4), ((128, 64, 64), (1, 2, 1), 0),
              # pycutlass's persistent cooperative kernel: two consumer warpgroups, the next tile's loads under the
              # last one's epilogue (tiles of 128 or 256 rows)
              ((128, 128, 64), (1, 1, 1), 0, COOP), ((128, 128, 64), (2, 1, 1), 0, COOP),
              ((256, 128, 64), (1, 1, 1), 0, COOP), ((128, 256, 64), (1, 1, 1), 0, COOP),
              ((128, 64, 64), (1, 1, 1), 0, COOP), ((256, 64, 64), (1, 1, 1), 0, COOP)],
    "dgrad": [((128, 128, 64), (1, 1, 1), 0), ((128, 256, 64), (1, 1, 1), 0), ((128, 128, 64), (2, 1, 1), 0)],
    "wgrad": [((128, 128, 64), (1, 1, 1), 0), ((128, 256, 64), (1, 1, 1), 0), ((64, 128, 64), (1, 1, 1), 0),
              ((64, 128, 64), (1, 1, 1), 4), ((128, 128, 64), (1, 1, 1), 0, COOP),
              # 192 = three 64-channel filter taps: whole tiles over a 3x3 layer's 9*C (conv5_x's 512 x 4608 is 96
              # 128x192 tiles, one wave, where 128x128 is 144 tiles on 132 SMs)
              ((64, 192, 64), (1, 1, 1), 0), ((128, 192, 64), (1, 1, 1), 0, COOP)],
}
# SM90 wgrad as parallel split-K by images: float32 partials, then the reduction. A wgrad's output (K x R*S*C) is
# often a handful of tiles (conv2_x 3x3: 64 x 576, five 64x128 tiles for 132 SMs) while its GEMM K (N*P*Q) is long.
SM90_WGRAD_PARALLEL = [((64, 128, 64), (1, 1, 1), 0), ((128, 128, 64), (1, 1, 1), 0), ((64, 256, 64), (1, 1, 1), 0),
                       ((64, 128, 64), (1, 2, 1), 0),  # 1x2: the two N tiles of a cluster share the dy tile
                       ((64, 128, 64), (1, 1, 1), 4),  # two CTAs per SM: slices of a few images are short in K
                       ((128, 128, 64), (1, 1, 1), 0, COOP), ((256, 128, 64), (1, 1, 1), 0, COOP),
                       # conv2_x 3x3's 64 x 576: three 64x192 tiles re-read dy three times, not five
                       ((64, 192, 64), (1, 1, 1), 0), ((128, 192, 64), (1, 1, 1), 0, COOP),
                       # pycutlass's filter-tap-reuse wgrad (3x3, stride 1): a CTA covers all nine taps of 64 input
                       # channels, reading the activation once for them; stages of one or two 64-pixel row segments;
                       # clusters of 2 or 4 CTAs along z add their sums in shared memory (fewer partials to write)
                       ((64, FILTER_TAPS_N, 64), (1, 1, 1), 0), ((64, FILTER_TAPS_N, 64), (1, 1, 2), 0),
                       ((64, FILTER_TAPS_N, 64), (1, 1, 4), 0), ((64, FILTER_TAPS_N, 128), (1, 1, 2), 0)]


# Sm80-family wgrad also as parallel split-K (f32 partial sums per slice, then the reduction): its GEMM K is N*P*Q,
# long, and its output K x RSC small, so the output tiles alone leave most SMs idle.
PARALLEL_TILES = [([128, 128, 32], 3, [2, 2, 1]), ([64, 128, 32], 4, [2, 2, 1])]
MAX_PARALLEL_SPLIT = 128


def _op(kind: Operator, stride_support: StrideSupport, shape, stages, warps, partials=False) -> Conv2dOperation:
    math_inst = cutlass.MathInstruction([16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp,
                                        cutlass.MathOperation.multiply_add)
    tile = cutlass.TileDescription(shape, stages, warps, math_inst)
    tensor = cutlass.TensorDescription(D.float16, cutlass.TensorNHWC, ALIGN)
    out = D.float32 if partials else D.float16
    epilogue = cutlass.LinearCombination(out, 4 if partials else ALIGN, D.float32, D.float32)
    strided_dgrad = kind is Operator.dgrad and stride_support is StrideSupport.Strided
    swizzle = cutlass.StridedDgradIdentitySwizzle1 if strided_dgrad else cutlass.IdentitySwizzle4
    output = cutlass.TensorDescription(D.float32, cutlass.TensorNHWC, 4) if partials else tensor
    return Conv2dOperation(kind, IteratorAlgorithm.optimized, 80, tile, tensor, tensor, output, stride_support,
                           epilogue, swizzle)


def parallel_wgrad_ops() -> list[Conv2dOperation]:
    return [_op(Operator.wgrad, StrideSupport.Strided, *config, partials=True) for config in PARALLEL_TILES]


def grid(kinds=None) -> dict[tuple[str, int], list[Conv2dOperation]]:
    """(kind, 1 or 2 = the strides it serves) -> the tile grid's operations; invalid tiles are skipped."""
    ops = {}
    for name in kinds or KINDS:
        kind = Operator(name)
        for stride in (1, 2):
            # dgrad at stride 1 runs the Unity kernel; at stride 2 the strided-dgrad kernel. fprop/wgrad: one grid.
            if kind is not Operator.dgrad and stride == 2:
                ops[name, 2] = ops[name, 1]
                continue
            support = StrideSupport.Unity if kind is Operator.dgrad and stride == 1 else StrideSupport.Strided
            ops[name, stride] = []
            for shape, stages, warps in TILES + (FPROP_TILES if kind is Operator.fprop else []):
                try:
                    ops[name, stride].append(_op(kind, support, shape, stages, warps))
                except cutlass.DescriptionError as error:
                    print(f"skip {name} {shape} s{stages}: {error}")
    return ops


def operations() -> list[Conv2dOperation]:
    """Every benchmarked Sm80-family operation and the split-K reduction (tests/gpu/precompile.py compiles them ahead
    of time)."""
    return list(dict.fromkeys(op for ops in grid().values() for op in ops)) + parallel_wgrad_ops() + \
        [splitk_reduction()]


def _sm90_op(kind: Operator, shape, cluster, stages=0, schedule=None, partials=False) -> Conv2dOperation:
    wgmma_n = 64 if shape[1] == FILTER_TAPS_N else shape[1]  # one 64x64x16 wgmma per filter tap
    math_inst = cutlass.MathInstruction([64, wgmma_n, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    kernel_schedule = cutlass.KernelScheduleType.TmaWarpSpecializedCooperative if schedule == COOP else \
        cutlass.KernelScheduleType.Auto
    tile = cutlass.TileDescription(list(shape), stages, None, math_inst, cluster_shape=list(cluster),
                                   kernel_schedule=kernel_schedule)
    tensor = cutlass.TensorDescription(D.float16, cutlass.TensorNHWC, ALIGN)
    output = cutlass.TensorDescription(D.float32, cutlass.TensorNHWC, 4) if partials else tensor
    epilogue = cutlass.LinearCombination(output.element, output.alignment, D.float32, D.float32)
    return Conv2dOperation(kind, IteratorAlgorithm.optimized, 90, tile, tensor, tensor, output,
                           StrideSupport.Unity if kind is Operator.dgrad else StrideSupport.Strided, epilogue,
                           cutlass.IdentitySwizzle1)


def sm90_grid(kinds=None) -> dict[str, list[Conv2dOperation]]:
    """kind -> the SM90 candidates (one list for every stride; SM90 dgrad refuses stride > 1 at arguments time)."""
    found = {name: [_sm90_op(Operator(name), *config) for config in SM90_TILES[name]] for name in kinds or KINDS}
    if "wgrad" in found:
        found["wgrad"] += [_sm90_op(Operator.wgrad, *config, partials=True) for config in SM90_WGRAD_PARALLEL]
    return found


# 1x1 stride-1 layers as GEMMs (M x N x K; A, B layouts over the channels_last tensors' matrix views):
# fprop  y[NPQ, K]  = x[NPQ, C] @ w[K, C]^T    A row-major, B column-major (w as a C x K column-major matrix)
# dgrad  dx[NHW, C] = dy[NHW, K] @ w[K, C]     A row-major, B row-major
# wgrad  dw[K, C]   = dy[NPQ, K]^T @ x[NPQ, C] A column-major (dy^T), B row-major; GEMM K = N*P*Q
SM90_GEMM_LAYOUTS = {"fprop": ("RowMajor", "ColumnMajor"), "dgrad": ("RowMajor", "RowMajor"),
                     "wgrad": ("ColumnMajor", "RowMajor")}
# (tile, cluster, schedule, tile scheduler). wgrad's GEMM K is N*P*Q (long): stream-K splits it. fprop's 1x1 layers
# are short-K, memory-bound GEMMs: wide tiles read the activations once, persistent (non-stream-K) scheduling.
_COOP, _PINGPONG = "TmaWarpSpecializedCooperative", "TmaWarpSpecializedPingpong"
SM90_GEMM = {
    "fprop": [((128, 128, 64), (1, 1, 1), _COOP, "StreamK"), ((128, 256, 64), (1, 1, 1), _COOP, "Default"),
              ((256, 128, 64), (1, 1, 1), _COOP, "Default"), ((128, 128, 64), (2, 1, 1), _COOP, "Default"),
              ((64, 128, 64), (1, 1, 1), _PINGPONG, "Default"), ((128, 64, 64), (1, 1, 1), _PINGPONG, "Default"),
              # ping-pong 128-row tiles: one warpgroup's epilogue (these short-K GEMMs write more than they read)
              # overlaps the other's main loop
              ((128, 128, 64), (1, 1, 1), _PINGPONG, "Default"), ((128, 128, 64), (2, 1, 1), _PINGPONG, "Default")],
    "dgrad": [((128, 128, 64), (1, 1, 1), _COOP, "StreamK")],
    "wgrad": [((128, 128, 64), (1, 1, 1), _COOP, "StreamK")],
}


# wgrad's 1x1 layers also run as parallel split-K: f32 partial products of K slices (the SM90 GEMM's L mode over
# N*P*Q), then one reduction into dw. Stream-K's serial fix-up chain is long when few output tiles share a very long
# K (two 128x128 tiles over N*P*Q = 100352); the slices here are independent and the reduction is one pass.
SM90_SPLITK = [((128, 128, 64), (1, 1, 1), _COOP), ((64, 128, 64), (1, 1, 1), _PINGPONG),
               # 64-channel outputs (conv2_x 1x1 64->256: dw is 256 x 64): a 64-wide tile wastes no column, and
               # 256 rows read the activations once
               ((128, 64, 64), (1, 1, 1), _PINGPONG), ((256, 64, 64), (1, 1, 1), _COOP)]


def _sm90_splitk_op(shape, cluster, schedule: str):
    layout_a, layout_b = SM90_GEMM_LAYOUTS["wgrad"]
    math_inst = cutlass.MathInstruction([64, shape[1], 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription(list(shape), 0, None, math_inst, cluster_shape=list(cluster),
                                   kernel_schedule=getattr(cutlass.KernelScheduleType, schedule))
    A = cutlass.TensorDescription(D.float16, getattr(cutlass, layout_a), ALIGN)
    B = cutlass.TensorDescription(D.float16, getattr(cutlass, layout_b), ALIGN)
    C = cutlass.TensorDescription(D.float32, cutlass.RowMajor, 4)
    return cutlass.GemmOperationUniversal(90, tile, A, B, C, cutlass.LinearCombination(D.float32, 4, D.float32,
                                                                                         D.float32))


def splitk_reduction(arch: int = 90):
    """Sums the f32 partial products into dw (f16): the second kernel of the parallel split-K candidates. Built for
    SM90 it is launched with programmatic dependent launch (it starts while the split-K kernel drains)."""
    return cutlass.ReductionOperation(cutlass.MatrixCoord(4, 32 * 8), cutlass.TensorDescription(D.float16,
                                      cutlass.RowMajor, 8), D.float32, D.float32, D.float32, count=8, arch=arch)


def _parallel_slices(op, m: int, n: int, gemm_k: int, sm_count: int) -> list[int]:
    """K slices that fill about one and two waves of SMs, each a divisor of gemm_k with a 16-byte aligned start
    (a multiple of 8 halves) and at least 4 K-tiles long."""
    tm, tn, tk = op.tile_description.threadblock_shape
    tiles = -(-m // tm) * -(-n // tn)
    valid = [s for s in range(2, gemm_k // (4 * tk) + 1) if gemm_k % s == 0 and (gemm_k // s) % ALIGN == 0]
    found = []
    for waves in (1, 2):
        if valid:
            want = waves * sm_count / tiles
            found.append(min(valid, key=lambda s: abs(s - want)))
    return sorted(set(found))


def _sm90_gemm_op(kind: str, shape, cluster, schedule: str, scheduler: str):
    layout_a, layout_b = SM90_GEMM_LAYOUTS[kind]
    math_inst = cutlass.MathInstruction([64, shape[1], 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription(list(shape), 0, None, math_inst, cluster_shape=list(cluster),
                                   kernel_schedule=getattr(cutlass.KernelScheduleType, schedule),
                                   tile_scheduler=getattr(cutlass.TileSchedulerType, scheduler))
    A = cutlass.TensorDescription(D.float16, getattr(cutlass, layout_a), ALIGN)
    B = cutlass.TensorDescription(D.float16, getattr(cutlass, layout_b), ALIGN)
    C = cutlass.TensorDescription(D.float16, cutlass.RowMajor, ALIGN)
    return cutlass.GemmOperationUniversal(90, tile, A, B, C, cutlass.LinearCombination(D.float16, ALIGN, D.float32,
                                                                                         D.float32))


def sm90_gemm_grid(kinds=None) -> dict[str, list]:
    return {name: [_sm90_gemm_op(name, *config) for config in SM90_GEMM[name]] for name in kinds or KINDS}


def sm90_splitk_ops(kinds=None) -> list:
    return [_sm90_splitk_op(*config) for config in SM90_SPLITK] if "wgrad" in (kinds or KINDS) else []


def sm90_operations() -> list:
    """Every benchmarked SM90 operation (NVRTC; tests/gpu/precompile.py compiles them ahead of time)."""
    return [op for ops in (*sm90_grid().values(), *sm90_gemm_grid().values()) for op in ops] + sm90_splitk_ops()


def _is_gemm(op) -> bool:
    return not isinstance(op, Conv2dOperation)


def _gemm_views(kind: str, ps, A, B, out):
    """(M, N, K), A, B, D as the matrix views of the channels_last tensors (1x1 filter, stride 1, no padding)."""
    npq = ps.N * ps.P * ps.Q

    def rows(t, channels):  # (N, C, H, W) channels_last -> (N*H*W, C), a view
        return t.permute(0, 2, 3, 1).reshape(-1, channels)

    if A is None:  # the sizes only
        sizes = {"fprop": (npq, ps.K, ps.C), "dgrad": (npq, ps.C, ps.K), "wgrad": (ps.K, ps.C, npq)}
        return sizes[kind], None, None, None
    if kind == "fprop":  # A = x, B = w
        return (npq, ps.K, ps.C), rows(A, ps.C), B.reshape(ps.K, ps.C).t(), rows(out, ps.K)
    if kind == "dgrad":  # A = dy, B = w
        return (npq, ps.C, ps.K), rows(A, ps.K), B.reshape(ps.K, ps.C), rows(out, ps.C)
    return (ps.K, ps.C, npq), rows(A, ps.K).t(), rows(B, ps.C), out.reshape(ps.K, ps.C)  # wgrad: A = dy, B = x


def _label(op, split: int) -> str:
    if _is_gemm(op):
        tile = op.tile_description
        (m, n, k), (cm, cn, _) = tile.threadblock_shape, tile.cluster_shape
        schedule = "pingpong" if "Pingpong" in tile.kernel_schedule.name else "coop"
        scheduler = " stream-K" if tile.tile_scheduler.name == "StreamK" else ""
        if op.C.element is D.float32:  # the parallel split-K candidates: partial products, then a reduction
            return f"sm90 GEMM {m}x{n}x{k} c{cm}x{cn} {schedule} parallel splitK{split} + reduction"
        return f"sm90 GEMM {m}x{n}x{k} c{cm}x{cn} {schedule}{scheduler}"
    if getattr(op, "family", None) == "sm90":
        (m, n, k), (cm, cn, _) = op.tile_description.threadblock_shape, op.tile_description.cluster_shape
        stages = f" s{op.tile_description.stages}" if op.tile_description.stages else ""  # two CTAs per SM
        stages += " coop" if op.cooperative else ""
        if op.filter_taps:
            return f"sm90 {m}x{n}x{k} c1x1x{op.tile_description.cluster_shape[2]} filter taps parallel " \
                   f"splitK{split} + reduction"
        if op.C.element is D.float32:
            return f"sm90 {m}x{n}x{k} c{cm}x{cn}{stages} parallel splitK{split} by images + reduction"
        return f"sm90 {m}x{n}x{k} c{cm}x{cn}{stages}"
    if op.C.element is D.float32:
        return f"{op.tile_description.procedural_name()} parallel splitK{split} + reduction"
    return f"{op.tile_description.procedural_name()}" + (f" splitK{split}" if split > 1 else "")


def _problem(layer, batch: int, split_k: int = 1) -> Conv2dProblemSize:
    c, k, h, w, r, s, stride = LAYERS[layer]
    pad = r // 2
    return Conv2dProblemSize((batch, h, w, c), (k, r, s, c), (pad, pad, pad, pad), (stride, stride), (1, 1),
                             Mode.cross_correlation, split_k, 1)


def _split_k_choices(op, ps, sm_count: int) -> list[int]:
    """1, plus a split-K that brings the op's tile count near one wave when the tiles alone leave SMs idle."""
    if _is_gemm(op) and op.C.element is D.float32:
        (m, n, gemm_k) = _gemm_views("wgrad", ps, None, None, None)[0]
        return _parallel_slices(op, m, n, gemm_k, sm_count)
    if getattr(op, "filter_taps", False):  # one CTA per SM: output tiles x slices x cluster near one wave, or half
        cluster = op.tile_description.cluster_shape[2]
        ctas = (ps.C // 64) * (ps.K // 64) * cluster
        wave = sm_count // ctas
        # clusters of 4 may not all fit at once (a GPC of 18 SMs holds four), so also one cluster fewer
        return sorted({max(1, round(wave / 2)), max(1, wave)} | ({max(1, wave - 1)} if cluster > 2 else set()))
    if getattr(op, "family", None) == "sm90" and op.C.element is D.float32:  # SM90 wgrad split by images/rows
        return _sm90_wgrad_slices(op, ps, sm_count)
    if not _is_gemm(op) and op.C.element is D.float32:  # Sm80-family parallel split-K: about 1 and 2 waves
        m, n, _ = op.tiled_shape(ps)
        k_tiles = -(-ps.implicit_gemm_size(op.conv_kind).k() // op.tile_description.threadblock_shape[2])
        most = min(MAX_PARALLEL_SPLIT, max(1, k_tiles // 8))  # >= 8 K-steps per slice
        return sorted({min(most, max(2, round(waves * sm_count / (m * n)))) for waves in (1, 2)} - {1})
    if _is_gemm(op) or getattr(op, "family", None) == "sm90" or \
            (op.is_strided_dgrad and max(ps.stride_h, ps.stride_w) > 1):
        return [1]  # CUTLASS 4.2's SM90 conv has no split-K
    m, n, _ = op.tiled_shape(ps)
    tiles = m * n
    if tiles >= sm_count:
        return [1]
    gemm_k = ps.implicit_gemm_size(op.conv_kind).k()
    k_tiles = -(-gemm_k // op.tile_description.threadblock_shape[2])
    split = min(MAX_SPLIT_K, max(2, round(sm_count / tiles)), max(1, k_tiles // 4))  # >= 4 K-steps per slice
    return [1] + ([split] if split > 1 else [])


# Rates for the SM90 wgrad split choice (H200): one CTA of the one-warpgroup conv kernel computes at most about
# 6.5 TFLOP/s; the partial sums are written and read back by the reduction at about 3 TB/s.
_CTA_FLOPS, _BYTES_PER_S = 6.5e12, 3e12


def _sm90_wgrad_slices(op, ps, sm_count: int) -> list[int]:
    """SM90 wgrad splits (runs of whole images, or every image in F runs of output rows) that bring the output tiles
    x slices nearest to 1, 2 and 4 waves of CTAs, unless writing and reducing the float32 partials would take more
    than half the unsplit kernel's ideal time (large filter gradients: conv5_x's 512 x 4608 is 9.4 MB a slice).
    Measured on ResNet-50, these layers are bound by operand traffic more than by waves, so the candidates span a
    range instead of trusting one modelled optimum."""
    tm, tn, _ = op.tile_description.threadblock_shape
    cm, cn, _ = op.tile_description.cluster_shape
    gemm = ps.implicit_gemm_size(op.conv_kind)
    # a cluster launches whole: the grid's tiles round up to it (conv2_x 3x3's five 128-wide N tiles are six CTAs
    # with a 1x2 cluster)
    tiles = math.ceil(math.ceil(gemm.m() / tm) / cm) * cm * math.ceil(math.ceil(gemm.n() / tn) / cn) * cn
    allowed = list(range(2, ps.N + 1)) + [ps.N * f for f in range(2, min(ps.P, 16) + 1)]
    slots = sm_count * op.ctas_per_sm  # a wave: two CTAs per SM where the stages fit half an SM
    unsplit = -(-tiles // slots) * 2 * tm * tn * ps.N * ps.P * ps.Q / _CTA_FLOPS
    found = set()
    for waves in (1, 2, 4):
        nearest = min(allowed, key=lambda s: (abs(tiles * s - waves * slots), s))
        if tiles * nearest <= 1.5 * waves * slots and \
                2 * nearest * gemm.m() * gemm.n() * 4 / _BYTES_PER_S <= 0.5 * unsplit:
            found.add(nearest)
    return sorted(found)


def _relative_error(got, reference) -> float:
    import torch

    if not torch.isfinite(got).all().item():
        return float("inf")
    reference = reference.float()
    return ((got.float() - reference).norm() / reference.norm()).item()


def run_layer(kind: str, layer: str, batch: int, ops_by_stride: dict, args, sm_count: int,
              sm90_ops=(), sm90_gemm_ops=(), reduction=None) -> tuple[dict, list]:
    import torch
    import torch.nn.functional as F

    cl = torch.channels_last
    ps = _problem(layer, batch)
    c, k, h, w, r, s, stride = LAYERS[layer]
    pad = r // 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(batch, c, h, w, device="cuda", generator=gen).half().contiguous(memory_format=cl)
    wt = (torch.randn(k, c, r, s, device="cuda", generator=gen) / math.sqrt(c * r * s)).half() \
        .contiguous(memory_format=cl)
    dy = torch.randn(batch, k, ps.P, ps.Q, device="cuda", generator=gen).half().contiguous(memory_format=cl)
    flops = 2.0 * batch * ps.P * ps.Q * k * r * s * c

    if kind == "fprop":
        def torch_fn():
            return F.conv2d(x, wt, stride=stride, padding=pad)
        A, B, out_shape = x, wt, (batch, k, ps.P, ps.Q)
    elif kind == "dgrad":
        def torch_fn():
            return torch.nn.grad.conv2d_input(x.shape, wt, dy, stride=stride, padding=pad)
        A, B, out_shape = dy, wt, (batch, c, h, w)
    else:
        def torch_fn():
            return torch.nn.grad.conv2d_weight(x, wt.shape, dy, stride=stride, padding=pad)
        A, B, out_shape = dy, x, (k, c, r, s)
    reference = torch_fn()
    torch.cuda.synchronize()
    assert tuple(reference.shape) == out_shape, (reference.shape, out_shape)
    torch.backends.cudnn.benchmark = False
    heuristic_ms = timed_ms(args.bench, torch_fn)
    torch.backends.cudnn.benchmark = True
    autotuned_ms = timed_ms(args.bench, torch_fn)
    torch_ms = min(heuristic_ms, autotuned_ms)

    out = torch.empty(out_shape, device="cuda", dtype=torch.float16).contiguous(memory_format=cl)
    rows, best, best90 = [], None, None
    candidates = [(op, False) for op in ops_by_stride[1 if stride == 1 else 2]] + [(op, True) for op in sm90_ops]
    if r == s == 1 and stride == 1:  # a GEMM over the tensors' matrix views
        candidates += [(op, True) for op in sm90_gemm_ops]
    for op, is_sm90 in candidates:
        if is_sm90 and not _is_gemm(op) and op.tile_description.threadblock_shape[1] == 192 and (r * s * c) % 192:
            continue  # 192-wide tiles are for 3x3 filter gradients (R*S*C a multiple of 192)
        if is_sm90 and getattr(op, "filter_taps", False) and (r, s, stride) != (3, 3, 1):
            continue  # the filter-tap-reuse kernel computes 3x3 stride-1 filter gradients
        for split in _split_k_choices(op, ps, sm_count):
            label = _label(op, split)
            try:
                reduce = None
                if _is_gemm(op) and op.C.element is D.float32:  # parallel split-K, then the reduction
                    (m, n, gk), ga, gb, gd = _gemm_views(kind, ps, A, B, out)
                    arguments = cutlass.GemmArguments(op, cutlass.gemm.GemmCoord(m, n, gk), ga, gb, None, gd,
                                                      gemm_mode=cutlass.gemm.Mode.GemmSplitKParallel,
                                                      split_k_slices=split)
                    reduction_args = cutlass.ReductionArguments(reduction, [m, n], split, arguments, gd,
                                                                pdl=reduction.pdl_refusal is None)

                    def reduce(reduction_args=reduction_args):
                        reduction.run(reduction_args)
                elif op.C.element is D.float32:  # conv parallel split-K (SM90 wgrad: by images), then the reduction
                    arguments = cutlass.Conv2dArguments(op, ps, A, B, None, None, split_k_mode=SplitKMode.Parallel,
                                                        split_k_slices=split)
                    m, n = arguments.reduction_problem_size
                    reduction_args = cutlass.ReductionArguments(reduction, [m, n], split, arguments,
                                                                out.permute(0, 2, 3, 1).reshape(m, n),  # a view
                                                                partition_stride=arguments.partition_stride,
                                                                pdl=reduction.pdl_refusal is None)

                    def reduce(reduction_args=reduction_args):
                        reduction.run(reduction_args)
                elif _is_gemm(op):
                    (m, n, gk), ga, gb, gd = _gemm_views(kind, ps, A, B, out)
                    arguments = cutlass.GemmArguments(op, cutlass.gemm.GemmCoord(m, n, gk), ga, gb, None, gd)
                else:
                    arguments = cutlass.Conv2dArguments(op, ps, A, B, None, out, split_k_slices=split)
            except cutlass.ArgumentError as error:
                rows.append({"kind": kind, "layer": layer, "batch": batch, "config": label,
                             "error": str(error)[:160]})
                continue
            def launch(op=op, arguments=arguments, reduce=reduce):
                op.run(arguments)
                if reduce is not None:
                    reduce()

            out.fill_(float("nan"))
            launch()
            torch.cuda.synchronize()
            error = _relative_error(out, reference)
            ok = error < TOLERANCE
            ms = timed_ms(args.bench, launch) if ok else float("nan")
            row = {"kind": kind, "layer": layer, "batch": batch, "config": label, "ms": ms,
                   "TFLOP/s": flops / ms / 1e9 if ok else 0.0, "rel_err": error, "correct": ok}
            rows.append(row)
            if args.verbose:
                print(row, flush=True)
            if ok and is_sm90 and (best90 is None or ms < best90["ms"]):
                best90 = row
            elif ok and not is_sm90 and (best is None or ms < best["ms"]):
                best = row
            del arguments
    cudnn_tflops = flops / torch_ms / 1e9
    overall = max((b for b in (best, best90) if b), key=lambda b: b["TFLOP/s"], default=None)
    summary = {"kind": kind, "layer": layer, "batch": batch,
               "NHWC / KRS": f"{batch}x{h}x{w}x{c} / {k}x{r}x{s}" + (f" s{stride}" if stride > 1 else ""),
               "GFLOP": flops / 1e9, "cuDNN TFLOP/s": cudnn_tflops,
               "cuDNN autotuned TFLOP/s": flops / autotuned_ms / 1e9, "cuDNN heuristic TFLOP/s": flops / heuristic_ms / 1e9,
               "sm80 config": best["config"] if best else "none correct",
               "sm80 TFLOP/s": best["TFLOP/s"] if best else 0.0,
               "sm80 ratio": best["TFLOP/s"] / cudnn_tflops if best else 0.0,
               "sm90 config": best90["config"] if best90 else ("none correct" if sm90_ops else "-"),
               "sm90 TFLOP/s": best90["TFLOP/s"] if best90 else 0.0,
               "sm90 ratio": best90["TFLOP/s"] / cudnn_tflops if best90 else 0.0,
               "best config": overall["config"] if overall else "none correct",
               "pycutlass TFLOP/s": overall["TFLOP/s"] if overall else 0.0,
               "ratio": overall["TFLOP/s"] / cudnn_tflops if overall else 0.0,
               "pycutlass err": overall["rel_err"] if overall else float("nan")}
    print({key: (f"{v:.3g}" if isinstance(v, float) else v) for key, v in summary.items()}, flush=True)
    del x, wt, dy, reference, out
    return summary, rows


def timed_ms(bench, fn) -> float:
    """Median milliseconds of ``fn`` by the tuning harness (the same rules as a sweep's rows)."""
    from pycutlass.tune.bench import summarize

    return summarize(bench.time(lambda i: fn())[0])[0] * 1e3


def geomean(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"batch 32 and {len(QUICK_LAYERS)} layers only")
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
    parser.add_argument("--batches", nargs="*", type=int, default=None, help=f"default {list(BATCHES)}")
    parser.add_argument("--jobs", type=int, default=min(6, os.cpu_count() or 1))
    parser.add_argument("--timer", choices=("launch", "kernel", "events"), default="kernel",
                        help="the harness's timer: CUPTI kernel time (default, as the recorded results were timed), "
                             "the same from the end of the lead (launch), or CUDA events")
    parser.add_argument("--out", help="JSON output (default: benchmarks/results/conv2d.json, from any directory)",
                        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "conv2d.json"))
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--no-sm90", action="store_true", help="Sm80-family kernels only (no SM90 column)")
    args = parser.parse_args()
    capability = cutlass.compiler.target.detected_compute_capability()
    if capability is None:
        print("no GPU: benchmarks/conv2d.py needs the GPU host (tests/gpu/precompile.py can compile its operations "
              "here)")
        return
    import torch

    from pycutlass.tune.bench import BenchConfig, GemmBench

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.benchmark_limit = 0  # autotuning tries every algorithm (the default tries 10)
    args.bench = GemmBench(BenchConfig(timer=args.timer))
    cutlass.get_memory_pool(2**30, 2**36)
    by_key = grid(args.kinds)
    if "wgrad" in args.kinds:
        for stride in (1, 2):  # one list serves both strides (the same object): extend it once
            if parallel_wgrad_ops()[0] not in by_key["wgrad", stride]:
                by_key["wgrad", stride] += parallel_wgrad_ops()
    start = time.perf_counter()
    cutlass.compiler.add_module(list(dict.fromkeys(op for ops in by_key.values() for op in ops)), jobs=args.jobs)
    print(f"grid compile/load: {time.perf_counter() - start:.1f} s ({cutlass.compiler.last_report()})", flush=True)
    sm90_by_kind = {} if args.no_sm90 else sm90_grid(args.kinds)
    sm90_gemm_by_kind = {} if args.no_sm90 else sm90_gemm_grid(args.kinds)
    reduction = splitk_reduction(90 if capability >= 90 else 80) if "wgrad" in args.kinds else None
    if reduction is not None:
        cutlass.compiler.add_module([reduction], jobs=1)
    if not args.no_sm90 and "wgrad" in args.kinds:
        sm90_gemm_by_kind["wgrad"] = sm90_gemm_by_kind.get("wgrad", []) + sm90_splitk_ops()
    if sm90_by_kind:
        start = time.perf_counter()
        cutlass.compiler.add_module([op for ops in (*sm90_by_kind.values(), *sm90_gemm_by_kind.values()) for op in ops],
                                    jobs=args.jobs)
        print(f"SM90 grid compile/load: {time.perf_counter() - start:.1f} s ({cutlass.compiler.last_report()})",
              flush=True)
    sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    batches = args.batches or ([32] if args.quick else list(BATCHES))
    layers = QUICK_LAYERS if args.quick else list(LAYERS)

    summaries, rows = [], []
    for kind in args.kinds:
        ops_by_stride = {stride: by_key[kind, stride] for stride in (1, 2)}
        for batch in batches:
            for layer in layers:
                summary, layer_rows = run_layer(kind, layer, batch, ops_by_stride, args, sm_count,
                                                sm90_by_kind.get(kind, ()), sm90_gemm_by_kind.get(kind, ()),
                                                reduction)
                summaries.append(summary)
                rows += layer_rows
            torch.cuda.empty_cache()

    geomeans = []
    for kind in args.kinds:
        for batch in batches:
            mine = [s for s in summaries if s["kind"] == kind and s["batch"] == batch]
            ratios = [s["ratio"] for s in mine]
            geomeans.append({"kind": kind, "batch": batch, "layers": len(ratios),
                             "geomean ratio vs cuDNN": geomean(ratios),
                             "sm80 geomean ratio": geomean(s["sm80 ratio"] for s in mine),
                             "sm90 geomean ratio": geomean(s["sm90 ratio"] for s in mine),
                             "sm90 layers": sum(1 for s in mine if s["sm90 ratio"] > 0),
                             "geomean pycutlass TFLOP/s": geomean(s["pycutlass TFLOP/s"] for s in summaries
                                                                  if s["kind"] == kind and s["batch"] == batch),
                             "geomean cuDNN TFLOP/s": geomean(s["cuDNN TFLOP/s"] for s in summaries
                                                              if s["kind"] == kind and s["batch"] == batch),
                             "failed layers": sum(1 for r in ratios if r <= 0)})
    targets = []
    for kind in args.kinds:
        ratios = [s["ratio"] for s in summaries if s["kind"] == kind]
        if ratios:
            value = geomean(ratios)
            targets.append({"kind": kind, "geomean_vs_cudnn": TARGETS[kind], "measured": value,
                            "met": value >= TARGETS[kind] and all(r > 0 for r in ratios)})

    print(f"\n# Conv2d benchmark on {device_name()} (torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}), float16 NHWC, f32 accumulation")
    columns = ("layer", "batch", "NHWC / KRS", "cuDNN TFLOP/s", "sm80 config", "sm80 TFLOP/s", "sm80 ratio",
               "sm90 config", "sm90 TFLOP/s", "sm90 ratio", "ratio")
    for kind in args.kinds:
        print_table(f"{kind}: best Sm80-family and SM90 configs vs cuDNN (ratio = the faster one / cuDNN)",
                    [{c: s[c] for c in columns} for s in summaries if s["kind"] == kind])
    print_table("Geomean of the pycutlass / cuDNN throughput ratio", geomeans)
    for target in targets:
        print(f"target: {target['kind']} geomean >= {target['geomean_vs_cudnn']}x cuDNN: measured "
              f"{target['measured']:.2f}x -> {'met' if target['met'] else 'NOT met'}")
    write_json(args.out, {"device": device_name(), "torch": torch.__version__, "timer": args.timer, "cudnn": torch.backends.cudnn.version(),
                          "layers": {name: dict(zip(("C", "K", "H", "W", "R", "S", "stride"), LAYERS[name]))
                                     for name in layers},
                          "batches": batches, "tiles": [f"{s} s{st} {w}" for s, st, w in TILES],
                          "fprop_tiles": [f"{s} s{st} {w}" for s, st, w in FPROP_TILES],
                          "sm90_tiles": {kind: [f"{s} cluster {c}" + (f" stages {st}" if st else "")
                                                + (f" {rest[0]}" if rest else "")
                                                for s, c, st, *rest in SM90_TILES[kind]] for kind in args.kinds},
                          "targets": targets, "geomeans": geomeans, "summary": summaries, "kernels": rows})


if __name__ == "__main__":
    main()
