"""The SM90 (CUTLASS 3.x) implicit-GEMM convolution: TMA im2col loads, warpgroup MMA, ``ConvUniversal``.

``Conv2dOperation(conv_kind, iterator_algorithm, 90, tile, A, B, C, stride_support, epilogue, swizzle)`` builds one
when the tile is an SM90 one by the SM90 GEMM's rule (``families.sm90.is_sm90_tile``: no warp_count, stages=0, a wgmma
instruction, a cluster or a schedule); a tile stating an Sm80 warp arrangement keeps the Sm80-family kernel.

``stages=0`` lets CUTLASS fill the SM's shared memory with stages (one CTA per SM). An explicit ``stages=S`` (S >= 2,
fitting one CTA beside the epilogue's buffers as for SM90 GEMMs) builds ``StageCount<S>``; when S stages fit half an
SM and the tile's accumulators fit half the register file (tiles of at most 128x64 outputs), the kernel is built with
``__launch_bounds__(256, 2)`` so that two CTAs co-reside and one's prologue and epilogue overlap the other's
mainloop (``ctas_per_sm``).

Built: fprop, dgrad (stride 1) and wgrad; f16 or bf16 in and out (wgrad: or float32 out, also the partials of its
parallel split-K by images, ``arguments.py``), f32 accumulation, NHWC, 16-byte alignment. Two schedules:

- ``TmaWarpSpecialized`` (and ``Auto`` on tiles of M 64 or 128): CUTLASS 4.2's only SM90 conv kernel
  (``KernelImplicitTmaWarpSpecializedSm90``, one consumer warpgroup, one output tile per CTA);
- ``TmaWarpSpecializedCooperative`` (tile M 128 or 256; ``Auto`` on M 256 or with ``warp_count=[8, 1, 1]``, which
  only it runs): pycutlass's persistent cooperative kernel
  (``persistent_cooperative.cuh``) around the same CUTLASS collectives: two consumer warpgroups split tile M, and
  a grid of at most one CTA per SM walks the tiles, loading the next tile's stages during the last one's epilogue.
  CUTLASS's own builder refuses this schedule for conv ("Persistent schedules not support for conv yet").

wgrad has a third kernel, pycutlass's filter-tap-reuse wgrad (``filter_taps_wgrad.cuh``), built for a tile of N =
9*64 (``[64, 576, 64]`` or ``[64, 576, 128]``: 64 or 128 output pixels a stage, a ``[64, 64, 16]`` instruction,
cluster ``[1, 1, Z]`` with Z 1, 2 or 4): a CTA covers 64 output channels x all nine taps of a 3x3 filter x 64 input
channels and reads each activation pixel once for the nine taps. It computes 3x3, stride-1, dilation-1 problems
with C and K multiples of 64, splits K over its own grid (parallel split-K in one launch) and writes
alpha * sum + beta * C in C's type.

fprop and dgrad write through the
``TmaWarpSpecialized`` epilogue (im2col TMA store; ``TmaWarpSpecializedCooperative`` with the cooperative schedule)
with a linear combination, any of the activations, and with
``bias=True`` a per-channel bias (CUTLASS's ``LinCombPerColBiasEltAct``: one value per column of the implicit GEMM,
i.e. per output channel); wgrad writes the KRSC filter gradient through the ``NoSmemWarpSpecialized`` epilogue (plain
linear combination), as CUTLASS's own SM90 wgrad tests build it. Everything else is rejected here with a typed error
before anything compiles (docs/sm90.md, "SM90 convolution"). The unit carries ``nvrtc_overlay.cuh`` (CUTLASS's SM90
conv headers under NVRTC); the builder runs CUTLASS's ``to_underlying_arguments`` on the device, and the im2col descriptors it "encodes" hold the encode
arguments, which the runtime encodes through ``cuTensorMapEncodeIm2col`` (TmaRecord.mode = im2col).
"""
from __future__ import annotations

from importlib import resources

from ...description.tile_description import TileDescription
from ...description.types import (DataType, EpilogueScheduleType, IdentitySwizzle1, KernelScheduleType,
                                   LayoutType)
from ...emit import names
from ...emit.abi import fill_epilogue
from ...errors import ArgumentError, DescriptionError
from ..conv2d.operation import Conv2dOperation
from ..families.conv import (Conv2dProblemSize, IteratorAlgorithm, Mode, Operator, SplitKMode, StrideSupport,
                             check_conv_enums)
from ..base import check_description_types
from ..families.sm90 import (NVRTC_SHIM, Sm90Operation, check_cluster_shape, check_default_tile_scheduler,
                             check_derived_warp_count, check_epilogue_kind, check_epilogue_schedule,
                             check_epilogue_types, check_explicit_stages, check_schedule_tile_m, check_tensor_op,
                             check_tile_k, check_tile_n, check_tma_alignment, derived_warp_count,
                             epilogue_smem_bytes)
from .abi import Sm90Conv2dArgs, Sm90Conv2dPersistentArgs, Sm90ConvSlices, Sm90WgradTapsArgs

_F16, _BF16, _F32 = DataType.float16, DataType.bfloat16, DataType.float32
_NHWC = LayoutType.TensorNHWC
_KS, _ES = KernelScheduleType, EpilogueScheduleType
_MAX_TENSOR_ELEMENTS = 2**31  # TMA dims and CUTLASS's int problem shape

# Two CTAs per SM (explicit stage counts only). sm_90 has 228 KiB of shared memory per SM and reserves 1 KiB of it per
# resident CTA. The non-persistent conv kernel's shared storage is the union of the mainloop's stages and the
# epilogue's buffers (never used at once) plus both pipelines' barriers (512 bytes as compiled, for 2 to 13 stages).
# Registers: two CTAs of 256 threads leave 128 per thread; tiles of at most 128x64 outputs (64 float32 accumulators
# per consumer thread) compile to 90-110 registers (fprop 90, with bias + ReLU 96, float32 wgrad 102, its slices
# kernel 110; 64x64: 58) without spills, while 128x128 capped at 128 spills and serializes its wgmma.
_SM_SMEM_BYTES = 228 * 1024
_CTA_RESERVED_BYTES = 1024
_BARRIER_BYTES = 1024  # the barriers, rounded up
_TWO_CTA_OUTPUTS = 128 * 64


# The filter-tap-reuse wgrad (filter_taps_wgrad.cuh): tile 64 x 9*64 (64 output channels x the nine taps of a 3x3
# filter x 64 input channels), a stage of 64 or 128 output pixels (tile K) in output-row segments of 64, 32 or 16
# pixels (the builder picks the narrowest that spans a row), 64x64x16 wgmma per tap, three consumer warpgroups and a
# producer warpgroup. The 64-pixel segment's buffers are the largest, and fit the others.
FILTER_TAPS_TILE_N = 9 * 64
_TAPS_SEGMENT = 64  # output pixels of the widest row segment, whose buffers the kernel allocates
_TAPS_MAX_SMEM = 227 * 1024  # an SM90 CTA's dynamic shared memory


def filter_taps_stage_bytes(rows: int) -> int:
    """One stage of the filter-tap-reuse kernel: ``rows`` segments of output gradient and their activation halo
    ((rows + 2) x 66 pixels), 128-byte lines of 64 channels, each buffer on a 1024-byte boundary."""
    def padded(size):
        return -(-size // 1024) * 1024
    return padded(rows * _TAPS_SEGMENT * 128) + padded((rows + 2) * (_TAPS_SEGMENT + 2) * 128)


def filter_taps_max_stages(rows: int) -> int:
    """The most stages that fit a CTA (with the barriers and 1 KiB of alignment slack)."""
    stage = filter_taps_stage_bytes(rows)
    return (_TAPS_MAX_SMEM - 1024) // (stage + 16)


def filter_taps_kernel() -> str:
    """pycutlass's filter-tap-reuse wgrad kernel (include-guarded)."""
    return resources.files(__package__).joinpath("filter_taps_wgrad.cuh").read_text()


def _is_filter_taps(conv_kind, tile: TileDescription) -> bool:
    return conv_kind is Operator.wgrad and tile.threadblock_shape[1] == FILTER_TAPS_TILE_N


def overlay() -> str:
    return resources.files(__package__).joinpath("nvrtc_overlay.cuh").read_text()


def persistent_cooperative_kernel() -> str:
    """pycutlass's persistent cooperative conv kernel (include-guarded: a unit may hold several such operations)."""
    return resources.files(__package__).joinpath("persistent_cooperative.cuh").read_text()


def preambles() -> list[str]:
    """What an SM90 conv unit puts before any include: the SM90 family's std:: shim, then the overlay."""
    return [NVRTC_SHIM, overlay()]


class Conv2dOperationSm90(Sm90Operation, Conv2dOperation):
    """An SM90 implicit-GEMM fprop, dgrad or wgrad (see the module docstring for what is built).

    ``bias=True`` (fprop and dgrad): D = activation(alpha * conv + bias) with a vector of one value per output
    channel, passed as C (a 1-D vector or a broadcast view, as for Sm80 convolutions) with beta = 1."""

    kind = "conv2d_sm90"

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, conv_kind, iterator_algorithm, arch, tile_description: TileDescription, A, B, C,
                 stride_support, epilogue_functor, swizzling_functor=IdentitySwizzle1, bias: bool = False):
        what = "Conv2dOperation(90)"
        if arch != 90 or isinstance(arch, bool):
            raise DescriptionError(f"{what}: Conv2dOperationSm90 is compute capability 90, got {arch!r}",
                                   rule="target.compute_capability")
        check_conv_enums(conv_kind, iterator_algorithm, stride_support, what)
        if not isinstance(bias, bool):
            raise DescriptionError(f"{what}: bias must be True (a per-output-channel bias vector, fused) or False, "
                                   f"got {bias!r}", rule="bias.unsupported")
        if bias and conv_kind is Operator.wgrad:
            raise DescriptionError(f"{what}: bias=True is for fprop and dgrad (a per-channel bias of the output "
                                   f"activation); wgrad writes a filter gradient", rule="bias.unsupported")
        if conv_kind is Operator.dgrad and stride_support is not StrideSupport.Unity:
            # The kernel runs stride (1, 1) only (check_problem_size says why), so "Strided" would promise what no
            # problem can use; the Sm80-family strided dgrad kernel is the one that takes strides.
            raise DescriptionError(f"{what}: SM90 dgrad is built for stride (1, 1) only: pass StrideSupport.Unity, or "
                                   f"an Sm80 tile (e.g. stages=3, warp_count=[2, 2, 1]) for a strided dgrad",
                                   rule="conv2d_sm90.dgrad_stride")
        if iterator_algorithm not in (IteratorAlgorithm.analytic, IteratorAlgorithm.optimized):
            raise DescriptionError(f"{what}: SM90 convolutions read activations through TMA im2col; the "
                                   f"{iterator_algorithm.name} iterator algorithm is Sm80-family only (pass "
                                   f"optimized or analytic, which mean the same kernel here)",
                                   rule="conv2d.iterator_algorithm")
        check_description_types(tile_description, A, B, C, epilogue_functor, what)
        if swizzling_functor is not IdentitySwizzle1:
            raise DescriptionError(f"{what}: the SM90 conv kernel rasterizes tiles itself (no threadblock swizzle); "
                                   f"pass IdentitySwizzle1, got {getattr(swizzling_functor, 'name', swizzling_functor)!r}",
                                   rule="swizzle.unsupported")
        self.compute_capability = 90
        self.conv_kind = conv_kind
        self.iterator_algorithm = iterator_algorithm
        self.stride_support = stride_support
        self._describe(90, tile_description, A, B, C, epilogue_functor, swizzling_functor)
        self.bias = bias
        if self.filter_taps:
            self.kernel_schedule = _KS.TmaWarpSpecialized
            _check_filter_taps(what, tile_description, A, B, C, epilogue_functor)
        else:
            self.kernel_schedule = _KS.TmaWarpSpecializedCooperative if _is_cooperative(tile_description) else \
                _KS.TmaWarpSpecialized
            _check(what, conv_kind, tile_description, A, B, C, epilogue_functor, bias, self.kernel_schedule)
        self.epilogue_schedule = _epilogue_schedule(conv_kind, self.cooperative)

    @property
    def filter_taps(self) -> bool:
        """Built as pycutlass's filter-tap-reuse wgrad (tile N = 9*64: all taps of a 3x3 filter in one CTA)."""
        return _is_filter_taps(self.conv_kind, self.tile_description)

    @property
    def cooperative(self) -> bool:
        """Built as pycutlass's persistent cooperative kernel (else CUTLASS's single-consumer one)."""
        return self.kernel_schedule is _KS.TmaWarpSpecializedCooperative

    @property
    def abi_struct_type(self):
        """The cooperative kernel's builder also takes the SM count its persistent grid may use; the filter-tap-reuse
        kernel's, its split-K slice count."""
        if self.filter_taps:
            return Sm90WgradTapsArgs
        return Sm90Conv2dPersistentArgs if self.cooperative else Sm90Conv2dArgs

    @property
    def filter_taps_stages(self) -> int:
        """The filter-tap-reuse kernel's stages: as given, or as many as fit (stages=0)."""
        return self.tile_description.stages or \
            filter_taps_max_stages(self.tile_description.threadblock_shape[2] // _TAPS_SEGMENT)

    @property
    def ctas_per_sm(self) -> int:
        """CTAs of this kernel that co-reside on an SM: 2 when an explicit stage count's shared storage fits half an
        SM and the tile has at most 128x64 outputs (the kernel is built with ``__launch_bounds__(256, 2)``); else 1
        (``stages=0``: CUTLASS fills the SM's shared memory with stages)."""
        tile = self.tile_description
        if not tile.stages or self.cooperative or self.filter_taps:
            return 1
        m, n, k = tile.threadblock_shape
        mainloop = tile.stages * (m + n) * k * self.A.element.bits // 8
        epilogue = epilogue_smem_bytes(tile.threadblock_shape, False, self.epilogue_schedule, self.C.element)
        storage = max(mainloop, epilogue) + _BARRIER_BYTES
        fits = 2 * (storage + _CTA_RESERVED_BYTES) <= _SM_SMEM_BYTES and m * n <= _TWO_CTA_OUTPUTS
        return 2 if fits else 1

    # --- identity -------------------------------------------------------------------------------------------
    @property
    def is_strided_dgrad(self) -> bool:
        return False

    def _signature(self) -> tuple:
        tile = self.tile_description
        signature = ("conv2d_sm90", self.conv_kind, tile.threadblock_shape, tile.math_instruction, tile.cluster_shape,
                     self.A, self.B, self.C, self.epilogue_functor, self.bias)
        # stages=0 and the single-consumer schedule name their kernels as before these options existed
        signature += (("stages", tile.stages),) if tile.stages else ()
        return signature + (("schedule", self.kernel_schedule),) if self.cooperative else signature

    def _readable_name(self) -> str:
        tile = self.tile_description
        s = names.SHORT
        m, n, k = tile.threadblock_shape
        cm, cn, _ = tile.cluster_shape
        cluster = f"c{cm}x{cn}x{tile.cluster_shape[2]}" if self.filter_taps else f"c{cm}x{cn}"
        return (f"conv2d_sm90_{self.conv_kind.name}_{s[self.A.element]}{s[self.C.element]}"
                f"{s[tile.math_instruction.element_accumulator]}_nhwc_{m}x{n}x{k}_{cluster}_"
                + (f"s{tile.stages}_" if tile.stages else "")
                + ("coop_" if self.cooperative else "taps_" if self.filter_taps else "ws_")
                + f"a{self.A.alignment}{self.B.alignment}{self.C.alignment}"
                + ("_bias" if self.bias else "")
                + (f"_{self.epilogue_functor.activation.name}" if self.epilogue_functor.activation else ""))

    # --- problems ---------------------------------------------------------------------------------------------
    def check_problem_size(self, problem_size: Conv2dProblemSize) -> None:
        """What CUTLASS's ``ConvUniversal::can_implement`` checks (the builder runs it too), stated in Python."""
        if not isinstance(problem_size, Conv2dProblemSize):
            raise ArgumentError(f"{self.name}: problem_size must be a pycutlass.conv.Conv2dProblemSize, "
                                f"got {problem_size!r}")
        ps = problem_size
        kind = self.conv_kind
        where = f"{self.name} (SM90 {kind.name})"
        if self.filter_taps:
            return _check_filter_taps_problem(where, ps, self.tile_description.cluster_shape[2])
        if ps.split_k_slices != 1 and kind is not Operator.wgrad:
            raise ArgumentError(f"{where}: CUTLASS 4.2's SM90 convolution has no split-K; split_k_slices must be 1, "
                                f"got {ps.split_k_slices} (SM90 splits only wgrad, by images; use an Sm80-family "
                                f"operation for split-K of {kind.name})")
        if ps.split_k_slices > ps.N and (ps.split_k_slices % ps.N or ps.split_k_slices > ps.N * ps.P):
            # wgrad's GEMM K is Q*P*N, split into whole problems: runs of whole images, or every image cut into the
            # same number of runs of output rows (kinds/conv2d_sm90/arguments.py, wgrad_slices)
            raise ArgumentError(f"{where}: SM90 wgrad splits K by images and output rows, so split_k_slices must be "
                                f"at most the batch N = {ps.N} (runs of images) or a multiple of N up to N*P = "
                                f"{ps.N * ps.P} (every image cut into that many / N runs of rows), got "
                                f"{ps.split_k_slices}")
        _check_sm90_problem(where, ps)
        if kind is Operator.dgrad and (ps.stride_h, ps.stride_w) != (1, 1):
            # CUTLASS 4.2's SM90 dgrad maps the stride phases to the GEMM's L mode, which its im2col TMA epilogue
            # ignores ("ignore L stride for implicit gemm"): every phase would store to the same pixels.
            raise ArgumentError(f"{where}: SM90 dgrad is built for stride (1, 1) only, got ({ps.stride_h}, "
                                f"{ps.stride_w}); use an Sm80-family strided dgrad operation")
        for label, extent, alignment in (("C (input channels)", ps.C, 8), ("K (output channels)", ps.K, 8)):
            if extent % alignment:
                raise ArgumentError(f"{where}: TMA moves 16-byte vectors along the channels, so {label} must be a "
                                    f"multiple of {alignment}; the problem has {extent}")
        for label, pad in (("pad_h", ps.pad_h), ("pad_w", ps.pad_w), ("upper_pad_h", ps.upper_pad_h),
                           ("upper_pad_w", ps.upper_pad_w)):
            if pad > 255:
                raise ArgumentError(f"{where}: the im2col TMA box corners are 8-bit: {label} must be at most 255, "
                                    f"got {pad}")
        for label, r, dilation in (("R", ps.R, ps.dilation_h), ("S", ps.S, ps.dilation_w)):
            if (r - 1) * dilation >= 255:  # CUTLASS's can_implement: offsets in [0, 2^8 - 1)
                raise ArgumentError(f"{where}: the im2col TMA filter offsets are 8-bit: ({label} - 1) * dilation must "
                                    f"be at most 254, got {(r - 1) * dilation}")
        # The im2col box corners (CUTLASS's compute_lower/upper_corner_whd); 2-D im2col takes [-128, 128).
        for label, pad, upper_pad, r, dilation, extent, out in (
                ("H", ps.pad_h, ps.upper_pad_h, ps.R, ps.dilation_h, ps.H, ps.P),
                ("W", ps.pad_w, ps.upper_pad_w, ps.S, ps.dilation_w, ps.W, ps.Q)):
            lower, upper = _corners(kind, pad, upper_pad, r, dilation, extent, out)
            if not (-128 <= lower < 128 and -128 <= upper < 128):
                raise ArgumentError(f"{where}: the im2col TMA box corners along {label} ({lower}, {upper}) must lie in "
                                    f"[-128, 128) (padding {pad}, filter {r}, dilation {dilation})")

    def make_abi_arguments(self, problem_size: Conv2dProblemSize, ptr_A: int, ptr_B: int, ptr_C: int, ptr_D: int,
                           output_op, *unused, sm_count: int = 0, **unused_keywords) -> Sm90Conv2dArgs:
        """``sm_count``: the SMs the cooperative kernel's persistent grid may use (whole clusters; 0 for the
        single-consumer kernel, whose grid is one CTA per tile)."""
        ps = problem_size
        args = self.abi_struct_type()
        if self.filter_taps:
            args.splits = ps.split_k_slices  # parallel split-K: one launch, a z layer per slice
        if self.cooperative:
            cluster = self.cluster_shape[0] * self.cluster_shape[1]
            if sm_count < cluster:
                raise ArgumentError(f"{self.name}: the persistent grid needs the device's SM count (at least one "
                                    f"cluster of {cluster} CTAs), got sm_count={sm_count}")
            args.sm_count = sm_count
        for field, value in (("n", ps.N), ("h", ps.H), ("w", ps.W), ("c", ps.C), ("k", ps.K), ("r", ps.R),
                             ("s", ps.S), ("p", ps.P), ("q", ps.Q), ("pad_h", ps.pad_h), ("pad_w", ps.pad_w),
                             ("stride_h", ps.stride_h), ("stride_w", ps.stride_w), ("dilation_h", ps.dilation_h),
                             ("dilation_w", ps.dilation_w), ("mode", int(ps.mode)),
                             ("upper_pad_h", ps.upper_pad_h), ("upper_pad_w", ps.upper_pad_w)):
            setattr(args, field, value)
        # Without C (beta == 0) C's im2col descriptor must still encode: it covers D (never read). With bias=True
        # ptr_C is the bias vector: the builder makes it the fusion's bias and reads no C (beta 0 there).
        args.ptr_A, args.ptr_B, args.ptr_D = int(ptr_A), int(ptr_B), int(ptr_D)
        args.ptr_C = int(ptr_C) or int(ptr_D)
        fill_epilogue(args, output_op)
        return args

    def semaphore_count(self, problem_size, split_k_mode=None) -> int:
        return 0

    def workspace_elements(self, problem_size, split_k_mode) -> int:
        """Parallel split-K (wgrad): one partial filter gradient of C's type per slice; nothing otherwise."""
        if self.conv_kind is not Operator.wgrad or SplitKMode(split_k_mode) is not SplitKMode.Parallel:
            return 0
        return problem_size.split_k_slices * problem_size.tensor_c_size(self.conv_kind)

    def abi_structs(self) -> tuple:
        """wgrad units also declare their slices kernel's argument (fprop and dgrad units are unchanged)."""
        extra = (Sm90ConvSlices,) if self.conv_kind is Operator.wgrad and not self.filter_taps else ()
        return (*super().abi_structs(), *extra)

    # --- emission -------------------------------------------------------------------------------------------
    def preamble(self):
        """The SM90 family's std:: shim (shared with GEMM operations of the unit), then the NVRTC overlay."""
        return preambles()

    def headers(self) -> list[str]:
        if self.filter_taps:
            return ["cute/tensor.hpp", "cute/arch/copy_sm90_tma.hpp", "cute/arch/mma_sm90_gmma.hpp",
                    "cute/atom/mma_traits_sm90_gmma.hpp", "cutlass/arch/barrier.h", "cutlass/numeric_conversion.h"]
        return ["cute/tensor.hpp", "cutlass/conv/collective/collective_builder.hpp",
                "cutlass/epilogue/collective/collective_builder.hpp", "cutlass/epilogue/thread/activation.h",
                "cutlass/conv/convnd_problem_shape.hpp", "cutlass/util/packed_stride.hpp"]

    def emit_body(self) -> str:
        tile = self.tile_description
        functor = self.epilogue_functor
        if self.filter_taps:
            return self.render("wgrad_taps.cu.j2", name=self.name, summary=self.describe(),
                               filter_taps_kernel=filter_taps_kernel(), element=names.ELEMENT[self.A.element],
                               element_c=names.ELEMENT[self.C.element], stage_k=tile.threadblock_shape[2],
                               stages=self.filter_taps_stages, cluster_z=tile.cluster_shape[2])
        return self.render(
            "conv2d_sm90.cu.j2", name=self.name, summary=self.describe(), cooperative=self.cooperative,
            abi_struct=self.abi_struct_type.__name__,
            persistent_cooperative_kernel=persistent_cooperative_kernel() if self.cooperative else "",
            element=names.ELEMENT[self.A.element], element_c=names.ELEMENT[self.C.element],
            element_accumulator=names.ELEMENT[tile.math_instruction.element_accumulator],
            element_compute=names.ELEMENT[self.epilogue_functor.element_epilogue],
            alignment_a=self.A.alignment, alignment_b=self.B.alignment, alignment_c=self.C.alignment,
            tile_shape=tile.threadblock_shape, cluster_shape=tile.cluster_shape, stages=tile.stages,
            two_ctas=self.ctas_per_sm == 2, conv_op=_CONV_OPS[self.conv_kind], wgrad=self.conv_kind is Operator.wgrad,
            bias=self.bias,
            activation=functor.activation.cpp_template if functor.activation else None,
            activation_args=functor.activation.argument_names if functor.activation else ())

    def describe(self) -> str:
        tile = self.tile_description
        return (f"Conv2d sm90 {self.conv_kind.name} A={self.A.element.label}/nhwc/{self.A.alignment} "
                f"B={self.B.element.label}/nhwc/{self.B.alignment} C={self.C.element.label}/nhwc/{self.C.alignment} "
                f"acc={tile.math_instruction.element_accumulator.label} tile={list(tile.threadblock_shape)} "
                f"cluster={list(tile.cluster_shape)} kernel="
                f"{self._kernel_label()} "
                f"epilogue={self.epilogue_schedule.value} epilogue_op={self.epilogue_functor.describe()}"
                f"{' bias=per-channel' if self.bias else ''}"
                + (f" stages={tile.stages} ctas_per_sm={self.ctas_per_sm}" if tile.stages else ""))


    def _kernel_label(self) -> str:
        if self.filter_taps:
            return (f"pycutlass FilterTapsWgrad(stage_k={self.tile_description.threadblock_shape[2]}, "
                    f"stages={self.filter_taps_stages}, "
                    f"cluster_z={self.tile_description.cluster_shape[2]})")
        return "pycutlass PersistentCooperative" if self.cooperative else "KernelImplicitTmaWarpSpecializedSm90"


_CONV_OPS = {Operator.fprop: "kFprop", Operator.dgrad: "kDgrad", Operator.wgrad: "kWgrad"}


def _corners(kind, pad: int, upper_pad: int, r: int, dilation: int, extent: int, out: int) -> tuple[int, int]:
    """CUTLASS's im2col box corners along one spatial dimension (conv/collective/detail.hpp)."""
    if kind is Operator.dgrad:
        lower = pad - (r - 1) * dilation
        return lower, lower + extent - out
    return -pad, upper_pad - (r - 1) * dilation


def _is_cooperative(tile: TileDescription) -> bool:
    """The cooperative schedule, asked for or implied: ``Auto`` keeps CUTLASS's single-consumer kernel where it runs
    (tile M 64 or 128 and its warp count) and takes the cooperative one for what only that runs (tile M 256, or
    the two-warpgroup warp count [8, 1, 1]), as ``Auto`` picks it for SM90 GEMMs."""
    if tile.kernel_schedule is _KS.TmaWarpSpecializedCooperative:
        return True
    return tile.kernel_schedule is _KS.Auto and (
        tile.threadblock_shape[0] == 256 or
        (tile.warp_count is not None and tuple(tile.warp_count) == derived_warp_count(tile.threadblock_shape,
                                                                                      _KS.TmaWarpSpecializedCooperative)))


def _epilogue_schedule(conv_kind, cooperative: bool) -> EpilogueScheduleType:
    if conv_kind is Operator.wgrad:
        return _ES.NoSmemWarpSpecialized
    return _ES.TmaWarpSpecializedCooperative if cooperative else _ES.TmaWarpSpecialized


def _check_types(what, conv_kind, tile: TileDescription, A, B, C, functor) -> None:
    """Operand, accumulator, layout and epilogue types (every SM90 conv kernel)."""
    math = tile.math_instruction
    check_tensor_op(what, math, "the SM90 convolution")
    element = math.element_a
    if element not in (_F16, _BF16) or math.element_b is not element:
        raise DescriptionError(f"{what}: SM90 convolutions are built for float16 or bfloat16 operands (both the "
                               f"same) so far, got {math.element_a.label} x {math.element_b.label}; use an Sm80 tile "
                               f"for other types", rule="sm90.operand_type")
    if math.element_accumulator is not _F32:
        raise DescriptionError(f"{what}: SM90 convolutions accumulate in float32 here, got "
                               f"{math.element_accumulator.label}", rule="sm90.accumulator")
    for label, desc in (("A", A), ("B", B), ("C", C)):
        if desc.layout is not _NHWC:
            raise DescriptionError(f"{what}: {label} must be TensorNHWC on SM90, got {desc.layout.value}",
                                   rule="conv2d_sm90.layout")
        # wgrad may also write float32: a float32 filter gradient, and the partial sums of parallel split-K
        allowed = (element, _F32) if label == "C" and conv_kind is Operator.wgrad else (element,)
        if desc.element not in allowed:
            also = "; wgrad may also write float32" if label == "C" else ""
            raise DescriptionError(f"{what}: {label} must hold {' or '.join(e.label for e in allowed)} (the "
                                   f"operands' type{also}), got {desc.element.label}", rule="sm90.output_type")
        check_tma_alignment(what, label, desc)
    if conv_kind is Operator.wgrad:
        if functor.kind != "LinearCombination" or functor.activation is not None:
            raise DescriptionError(f"{what}: SM90 wgrad writes through CUTLASS's NoSmemWarpSpecialized epilogue: only "
                                   f"LinearCombination (no activation) is built, got {functor.describe()}",
                                   rule="sm90.epilogue_kind")
    else:
        check_epilogue_kind(what, functor, ("LinearCombination", "LinearCombinationGeneric"), "SM90 convolutions",
                            "LinearCombination or LinearCombinationGeneric (any activation), optionally with bias=True")
    # The convolution's epilogue has always taken a functor of any accumulator type (it reads float32).
    check_epilogue_types(what, functor, C, accumulator=None)


def _check_no_epilogue_tile(what: str, tile: TileDescription) -> None:
    if tile.epilogue_tile is not None:
        raise DescriptionError(f"{what}: SM90 convolutions write with CUTLASS's automatic epilogue tile; leave "
                               f"epilogue_tile=None (an explicit one is built for the SM90 GEMM kinds), got "
                               f"{tuple(tile.epilogue_tile)}", rule="sm90.epilogue_tile")


def _check(what, conv_kind, tile: TileDescription, A, B, C, functor, bias, schedule: KernelScheduleType) -> None:
    _check_types(what, conv_kind, tile, A, B, C, functor)
    element = tile.math_instruction.element_a
    m, n, k = tile.threadblock_shape
    cooperative = schedule is _KS.TmaWarpSpecializedCooperative
    if tile.kernel_schedule not in (_KS.Auto, _KS.TmaWarpSpecialized, _KS.TmaWarpSpecializedCooperative):
        raise DescriptionError(f"{what}: SM90 convolutions are built with CUTLASS's single-consumer kernel "
                               f"(kernel_schedule Auto or TmaWarpSpecialized) or pycutlass's persistent cooperative "
                               f"one (TmaWarpSpecializedCooperative); got {tile.kernel_schedule.value} (the "
                               f"ping-pong schedule is not built for convolutions)", rule="sm90.kernel_schedule")
    check_schedule_tile_m(what, schedule, m, "the SM90 conv kernel",
                          " (or 256 with kernel_schedule=TmaWarpSpecializedCooperative)")
    # wgrad's N is R*S*C: 192 (three 64-channel filter taps) divides the 3x3 layers' 9*C where 128 and 256 leave a
    # partial tile (conv2_x's 576: three full tiles instead of five with a half-empty one)
    check_tile_n(what, n, (64, 128, 192, 256) if conv_kind is Operator.wgrad else (64, 128, 256))
    check_tile_k(what, k, element)
    check_cluster_shape(what, tile)
    wanted = _epilogue_schedule(conv_kind, cooperative)
    check_epilogue_schedule(what, tile, wanted, f"for SM90 {conv_kind.name}")
    check_default_tile_scheduler(what, tile, "SM90 convolutions have no stream-K (CUTLASS 4.2)")
    _check_no_epilogue_tile(what, tile)
    if tile.stages:  # StageCount<S>: 2 or more stages that fit one CTA beside the epilogue's buffers
        check_explicit_stages(what, tile, cooperative, wanted, C.element, element.bits)
    check_derived_warp_count(what, tile, schedule)


def _check_filter_taps(what, tile: TileDescription, A, B, C, functor) -> None:
    """The filter-tap-reuse wgrad (tile N = 9*64): what its one kernel is built for."""
    _check_types(what, Operator.wgrad, tile, A, B, C, functor)
    m, n, k = tile.threadblock_shape
    if m != 64 or k not in (64, 128):
        raise DescriptionError(f"{what}: the filter-tap-reuse wgrad (tile N = {FILTER_TAPS_TILE_N}: 64 input "
                               f"channels x the nine taps of a 3x3 filter) computes 64 output channels a CTA over "
                               f"stages of 64 or 128 output pixels: tile [64, {FILTER_TAPS_TILE_N}, "
                               f"64] or [64, {FILTER_TAPS_TILE_N}, 128], got {list(tile.threadblock_shape)}",
                               rule="conv2d_sm90.filter_taps_tile")
    if tuple(tile.math_instruction.instruction_shape) != (64, 64, 16):
        raise DescriptionError(f"{what}: the filter-tap-reuse wgrad issues one 64x64x16 wgmma per filter tap: "
                               f"instruction_shape must be [64, 64, 16], got "
                               f"{list(tile.math_instruction.instruction_shape)}", rule="conv2d_sm90.filter_taps_tile")
    if tuple(tile.cluster_shape) not in ((1, 1, 1), (1, 1, 2), (1, 1, 4)):
        raise DescriptionError(f"{what}: the filter-tap-reuse wgrad's clusters lie along z: cluster_shape [1, 1, Z] "
                               f"with Z in 1, 2, 4 CTAs that split a slice's pixels and add their sums through "
                               f"distributed shared memory, got {list(tile.cluster_shape)}", rule="sm90.cluster_shape")
    if tile.kernel_schedule not in (_KS.Auto, _KS.TmaWarpSpecialized):
        raise DescriptionError(f"{what}: the filter-tap-reuse wgrad is its own warp-specialized kernel (a producer "
                               f"and one consumer warpgroup per filter row): kernel_schedule must be Auto or "
                               f"TmaWarpSpecialized, got {tile.kernel_schedule.value}", rule="sm90.kernel_schedule")
    check_epilogue_schedule(what, tile, _ES.NoSmemWarpSpecialized, "for the filter-tap-reuse wgrad")
    check_default_tile_scheduler(what, tile, "the filter-tap-reuse wgrad splits K over its grid itself")
    _check_no_epilogue_tile(what, tile)
    if tile.warp_count is not None and tuple(tile.warp_count) != (12, 1, 1):
        raise DescriptionError(f"{what}: the filter-tap-reuse wgrad's warps are fixed (three consumer warpgroups): "
                               f"pass warp_count None or [12, 1, 1], got {list(tile.warp_count)}",
                               rule="sm90.warp_count_derived")
    most = filter_taps_max_stages(k // _TAPS_SEGMENT)
    if tile.stages and not 2 <= tile.stages <= most:
        raise DescriptionError(f"{what}: the filter-tap-reuse wgrad's stages of tile K {k} are "
                               f"{filter_taps_stage_bytes(k // _TAPS_SEGMENT)} bytes each: stages must be 0 (as many "
                               f"as fit, {most}) or 2..{most}, got {tile.stages}", rule="smem.capacity")


def _check_filter_taps_problem(where: str, ps: Conv2dProblemSize, cluster_z: int) -> None:
    """What the filter-tap-reuse kernel computes: 3x3 filters, stride and dilation 1, channels in 64s."""
    if (ps.R, ps.S) != (3, 3):
        raise ArgumentError(f"{where}: the filter-tap-reuse wgrad (tile N = {FILTER_TAPS_TILE_N}) is built for 3x3 "
                            f"filters, got {ps.R}x{ps.S}; use an implicit-GEMM wgrad tile (N 64..256)")
    if (ps.stride_h, ps.stride_w) != (1, 1) or (ps.dilation_h, ps.dilation_w) != (1, 1):
        raise ArgumentError(f"{where}: the filter-tap-reuse wgrad reads neighbouring pixels as the taps' shifts: "
                            f"stride and dilation must be (1, 1), got stride ({ps.stride_h}, {ps.stride_w}), "
                            f"dilation ({ps.dilation_h}, {ps.dilation_w}); use an implicit-GEMM wgrad tile")
    _check_sm90_problem(where, ps)
    for label, extent in (("C (input channels)", ps.C), ("K (output channels)", ps.K)):
        if extent % 64:
            raise ArgumentError(f"{where}: a CTA of the filter-tap-reuse wgrad covers 64 input and 64 output "
                                f"channels, so {label} must be a multiple of 64; the problem has {extent}")
    if not 1 <= ps.split_k_slices * cluster_z <= 65535:
        raise ArgumentError(f"{where}: split_k_slices clusters of {cluster_z} CTAs make the launch's grid z "
                            f"(at most 65535): at most {65535 // cluster_z} slices, got {ps.split_k_slices}")


def _check_sm90_problem(where: str, ps: Conv2dProblemSize) -> None:
    """What every SM90 conv kernel refuses: groups, true convolution, tensors of 2^31 elements or more."""
    if ps.groups != 1:
        raise ArgumentError(f"{where}: grouped convolution is not built for SM90 (groups={ps.groups})")
    if Mode(ps.mode) is not Mode.cross_correlation:
        raise ArgumentError(f"{where}: only Mode.cross_correlation is built for SM90, got {Mode(ps.mode).name}")
    for label, count in (("A", ps.N * ps.H * ps.W * ps.C), ("B", ps.K * ps.R * ps.S * ps.C),
                         ("C/D", ps.N * ps.P * ps.Q * ps.K)):
        if count >= _MAX_TENSOR_ELEMENTS:
            raise ArgumentError(f"{where}: tensor {label} has {count} elements; at most 2^31 - 1 here")
