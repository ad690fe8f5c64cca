"""Conv2dOperation: a CUTLASS 2.x (Sm80-family) implicit-GEMM 2-D convolution (fprop, dgrad or wgrad).

The kernel is CUTLASS's ``DefaultConv2d{Fprop,Dgrad,Wgrad}<...>::Kernel``: ``ImplicitGemmConvolution``, or for dgrad
with ``StrideSupport.Strided`` ``ImplicitGemmConvolutionStridedDgrad``. Its ``Params`` are built on the device from
``pycutlass_abi::Conv2dArgs`` (templates/conv2d.cu.j2); the builder also runs the iterators' ``can_implement`` and
reports a failure in ``LaunchInfo.status``. ``check_problem_size`` makes the same checks (and a few more) on the
host first, with messages.

Which CUTLASS specializations exist (cutlass/conv/kernel/default_conv2d_{fprop,dgrad,wgrad}.h, CUTLASS 4.2):

* fprop: TensorOp analytic / optimized / fixed_channels / few_channels (NHWC); TensorOp analytic / optimized with
  interleaved int8 (A TensorNC32HW32, B TensorC32RSK32, C TensorNC32HW32); SIMT analytic / optimized.
  Interleaved kernels read the filter with its output channels permuted within groups of 32
  (``cutlass::reorder_convK``): Conv2dArguments reorders a copy (``reordered=True`` for a filter already in order).
  ``StrideSupport`` does not restrict strides (fprop iterators handle any stride); in the TensorOp optimized
  multistage and SIMT kernels it selects the epilogue's output iterator (Unity: packed row-major NPQ x K;
  Strided: a 4-D NHWC iterator). Both are accepted, as PyCUTLASS accepted them.
* dgrad: TensorOp and SIMT, analytic / optimized, each with Unity (needs stride 1 at run time) or Strided (the
  strided-dgrad kernel, which static_asserts a StridedDgrad* swizzle, and does not support dilation > 1 nor
  parallel split-K; serial split-K works at any stride, see ``check_problem_size``).
* wgrad: TensorOp and SIMT, analytic / optimized; ``StrideSupport`` has no effect.
* swizzles: IdentitySwizzle1/2/4/8, and StridedDgradIdentitySwizzle1/4 for strided dgrad only. HorizontalSwizzle
  and StridedDgradHorizontalSwizzle do not compile with the conv kernels (no ``get_tile_offset(int)``).

Split-K. Serial (``SplitKMode.Serial``, ``split_k_slices`` > 1): slices of one output tile take turns through a
semaphore per (m, n) tile; ``LaunchInfo.semaphore_count`` = grid m * n ints, zeroed before the launch, are needed.
Parallel (``SplitKMode.Parallel``): ``ImplicitGemmConvolution`` writes slice ``k`` of the K reduction with its
epilogue to ``ptr_D + k * implicit_gemm_tensor_c_size(kind, problem)`` elements (ElementC = this operation's
C element), i.e. the workspace is ``split_k_slices`` consecutive packed copies of the C tensor (NPQK for fprop,
NHWC for dgrad, KRSC for wgrad); equivalently each slice is the implicit GEMM's M x N output, row-major with
ld = N (NPQ x K, NHW x C, K x RSC), slices ``partition_stride`` = M * N elements apart. A reduction then sums the
slices and applies alpha, beta and C. To keep the partial sums exact, build the conv operation with ``C.element`` =
the accumulator type and run it with alpha = 1, beta = 0. No semaphores are used in parallel mode.
"""
from __future__ import annotations


from ..families.conv import (Conv2dProblemSize, IteratorAlgorithm, Operator, SplitKMode, StrideSupport,
                             check_conv_enums)
from ...description.tensor_description import TensorDescription
from ...description.tile_description import TileDescription
from ...description.types import (CONV_SWIZZLES, DataType, IdentitySwizzle1, IdentitySwizzle2, IdentitySwizzle4,
                                 IdentitySwizzle8, LayoutType, MathOperation, OpClass, StridedDgradIdentitySwizzle1,
                                 StridedDgradIdentitySwizzle4, SwizzlingFunctor)
from ...emit import names
from ...emit.abi import fill_epilogue
from ...epilogue.functors import EpilogueFunctor
from ...errors import ArgumentError, DescriptionError
from .abi import Conv2dArgs
from .. import registry
from ..base import TiledOperation, check_compute_capability
from ..families.sm80 import (check_congruous_tile, check_crosswise_tile_k, check_interleaved_thread_maps,
                               check_narrow_warp_tiles, check_operand_types, check_simt_warp_tile, thread_map_problem)

# C++ spellings of the conv enums (kept here: only this operation uses them).
CONV_OPERATOR = {Operator.fprop: "cutlass::conv::Operator::kFprop", Operator.dgrad: "cutlass::conv::Operator::kDgrad",
                 Operator.wgrad: "cutlass::conv::Operator::kWgrad"}
ITERATOR_ALGORITHM = {
    IteratorAlgorithm.analytic: "cutlass::conv::IteratorAlgorithm::kAnalytic",
    IteratorAlgorithm.optimized: "cutlass::conv::IteratorAlgorithm::kOptimized",
    IteratorAlgorithm.fixed_channels: "cutlass::conv::IteratorAlgorithm::kFixedChannels",
    IteratorAlgorithm.few_channels: "cutlass::conv::IteratorAlgorithm::kFewChannels",
}
STRIDE_SUPPORT = {StrideSupport.Strided: "cutlass::conv::StrideSupport::kStrided",
                  StrideSupport.Unity: "cutlass::conv::StrideSupport::kUnity"}
DEFAULT_KERNEL = {Operator.fprop: "DefaultConv2dFprop", Operator.dgrad: "DefaultConv2dDgrad",
                  Operator.wgrad: "DefaultConv2dWgrad"}
KERNEL_HEADER = {Operator.fprop: "cutlass/conv/kernel/default_conv2d_fprop.h",
                 Operator.dgrad: "cutlass/conv/kernel/default_conv2d_dgrad.h",
                 Operator.wgrad: "cutlass/conv/kernel/default_conv2d_wgrad.h"}
ALGORITHM_SHORT = {IteratorAlgorithm.analytic: "analytic", IteratorAlgorithm.optimized: "optimized",
                   IteratorAlgorithm.fixed_channels: "fixedch", IteratorAlgorithm.few_channels: "fewch"}

# Swizzles that build with CUTLASS 4.2's conv kernels. The horizontal ones (GemmHorizontalThreadblockSwizzle,
# StridedDgradHorizontalThreadblockSwizzle) lack get_tile_offset(int), which the conv kernels call.
IDENTITY_SWIZZLES = (IdentitySwizzle1, IdentitySwizzle2, IdentitySwizzle4, IdentitySwizzle8)
STRIDED_DGRAD_SWIZZLES = (StridedDgradIdentitySwizzle1, StridedDgradIdentitySwizzle4)

_NHWC = LayoutType.TensorNHWC
_INTERLEAVED = (LayoutType.TensorNC32HW32, LayoutType.TensorC32RSK32, LayoutType.TensorNC32HW32)
_FLOAT_TYPES = (DataType.float64, DataType.float32, DataType.tfloat32, DataType.float16, DataType.bfloat16)
_MAX_FILTER_OPTIMIZED = 32  # optimized fprop/dgrad iterators precompute masks for R, S <= 32
_MAX_TENSOR_BYTES = 2**31  # cutlass::conv::device::ImplicitGemmConvolution::can_implement
_MAX_GRID_YZ = 65535  # CUDA's gridDim.y and z (runtime.launch.GRID_LIMITS, a layer this one may not import)


class Conv2dOperation(TiledOperation):
    """A 2-D convolution as an implicit GEMM; the PyCUTLASS constructor.

    ``A``, ``B`` and ``C`` describe the implicit GEMM's operands (see ``pycutlass.conv``): for fprop the activation,
    the filter and the output; for dgrad the output gradient, the filter and the input gradient; for wgrad the
    output gradient, the activation and the filter gradient. D has C's description.
    """

    kind = "conv2d"
    abi_struct_type = Conv2dArgs

    def __new__(cls, *args, **kwargs):
        if cls is Conv2dOperation:
            # Compute capability 90 with an SM90 tile (the SM90 GEMM's rule) picks kinds/conv2d_sm90; a tile that
            # states an Sm80 warp arrangement keeps the Sm80-family kernel (it runs on Hopper).
            built = registry.operation_class("Conv2dOperation", kwargs.get("arch", args[2] if len(args) > 2 else None),
                                             kwargs.get("tile_description", args[3] if len(args) > 3 else None))
            return object.__new__(built)  # Python then runs its class's __init__
        return super().__new__(cls)

    def __init__(self, conv_kind: Operator, iterator_algorithm: IteratorAlgorithm, arch: int,
                 tile_description: TileDescription, A: TensorDescription, B: TensorDescription, C: TensorDescription,
                 stride_support: StrideSupport, epilogue_functor: EpilogueFunctor,
                 swizzling_functor: SwizzlingFunctor = IdentitySwizzle1, bias: bool = False):
        what = "Conv2dOperation"
        if bias is not False:  # (the SM90 kind's keyword; an Sm80 tile at 90 lands here)
            raise DescriptionError(f"{what}: bias=True fuses a bias vector in the SM90 convolution (compute capability "
                                   f"90 with an SM90 tile); the Sm80-family kernel this tile builds takes a bias as C "
                                   f"(a per-channel vector broadcast, beta = 1: Conv2dArguments(..., C=bias) or "
                                   f"bias=...), so leave bias out here; got bias={bias!r}", rule="bias.unsupported")
        check_conv_enums(conv_kind, iterator_algorithm, stride_support, what)
        self.compute_capability = check_compute_capability(arch)
        check_operand_types(tile_description, A, B, C, epilogue_functor, what, wide_c=True, simt_wide_ab=True)
        if swizzling_functor not in CONV_SWIZZLES:
            raise DescriptionError(f"{what}: swizzling_functor must be one of "
                                   f"{[s.name for s in IDENTITY_SWIZZLES + STRIDED_DGRAD_SWIZZLES]}, "
                                   f"got {swizzling_functor!r}", rule="swizzle.unsupported")
        self.conv_kind = conv_kind
        self.iterator_algorithm = iterator_algorithm
        self.stride_support = stride_support
        self._describe(arch, tile_description, A, B, C, epilogue_functor, swizzling_functor)
        self._check_configuration()
        tile_description.check_shared_memory(arch)

    # --- validation -----------------------------------------------------------------------------------------
    def _check_configuration(self) -> None:
        what = f"Conv2dOperation ({self.conv_kind.name})"
        math = self.tile_description.math_instruction
        element = math.element_a
        layouts = (self.A.layout, self.B.layout, self.C.layout)
        algorithm = self.iterator_algorithm

        if element is DataType.int8:
            if self.conv_kind is not Operator.fprop:
                raise DescriptionError(f"{what}: int8 convolutions are fprop only (CUTLASS has no int8 dgrad/wgrad "
                                       f"kernels); use float16, bfloat16, tfloat32, float32 or float64",
                                       rule="conv2d.int8_kind")
        elif element not in _FLOAT_TYPES:
            raise DescriptionError(f"{what}: unsupported operand type {element.label}", rule="conv2d.operand_type")

        if element is DataType.float64 and math.opcode_class is OpClass.TensorOp:
            for label, desc in (("A", self.A), ("B", self.B)):
                if desc.alignment != 1:
                    raise DescriptionError(
                        f"{what}: float64 tensor-op convolutions load A and B one 64-bit element at a time "
                        f"(CUTLASS's double-precision thread maps), so {label} alignment must be 1, got "
                        f"{desc.alignment}", rule="conv2d.f64_alignment")

        if any(layout.is_interleaved for layout in layouts):
            if layouts != _INTERLEAVED:
                raise DescriptionError(
                    f"{what}: interleaved convolutions take A TensorNC32HW32, B TensorC32RSK32 and C TensorNC32HW32; "
                    f"got {[layout.value for layout in layouts]}", rule="conv2d.interleaved")
            if self.conv_kind is not Operator.fprop or element is not DataType.int8:
                raise DescriptionError(f"{what}: interleaved (NC32HW32 / C32RSK32) layouts are supported for int8 "
                                       f"fprop only", rule="conv2d.interleaved")
            if math.opcode_class is not OpClass.TensorOp:
                raise DescriptionError(f"{what}: interleaved int8 fprop needs OpClass.TensorOp",
                                       rule="conv2d.interleaved")
            if algorithm not in (IteratorAlgorithm.analytic, IteratorAlgorithm.optimized):
                raise DescriptionError(f"{what}: interleaved int8 fprop exists for the analytic and optimized "
                                       f"iterator algorithms only, got {algorithm.name}", rule="conv2d.interleaved")
            if self.C.element is not DataType.int8:
                raise DescriptionError(f"{what}: interleaved int8 fprop writes int8 output (C.element must be "
                                       f"int8, got {self.C.element.label})", rule="conv2d.interleaved")
            for label, desc in (("A", self.A), ("B", self.B)):
                if desc.alignment != 16:
                    raise DescriptionError(f"{what}: interleaved int8 fprop reads 128-bit vectors: {label} "
                                           f"alignment must be 16, got {desc.alignment}", rule="conv2d.interleaved")
            check_interleaved_thread_maps(self.tile_description, what)
        elif layouts != (_NHWC, _NHWC, _NHWC):
            raise DescriptionError(f"{what}: A, B and C must all be TensorNHWC (int8 fprop may use the interleaved "
                                   f"NC32HW32/C32RSK32 layouts); got {[layout.value for layout in layouts]}",
                                   rule="conv2d.layout")

        # The implicit GEMM's K-contiguous operands (DefaultMmaCore layouts of default_conv2d_*.h): fprop reads A
        # (NHWC activation) and B (KRSC filter) along C, dgrad reads A (NPQK output gradient) along K; wgrad none.
        check_crosswise_tile_k(self.tile_description,
                               (("A", self.A, self.conv_kind in (Operator.fprop, Operator.dgrad)),
                                ("B", self.B, self.conv_kind is Operator.fprop)), what)
        # The M- or N-contiguous ones: dgrad B (KRSC filter along C), wgrad A (NPQK gradient along K) and B (NHWC
        # activation along C).
        m, n, _ = self.tile_description.threadblock_shape
        if math.opcode_class is OpClass.Simt:
            # default_conv2d_{fprop,dgrad,wgrad}.h build the SIMT DefaultMmaCore with A RowMajor / B ColumnMajor
            # (fprop), A and B RowMajor (dgrad), A ColumnMajor / B RowMajor (wgrad).
            row, col = LayoutType.RowMajor, LayoutType.ColumnMajor
            layout_a = col if self.conv_kind is Operator.wgrad else row
            layout_b = col if self.conv_kind is Operator.fprop else row
            check_simt_warp_tile(self.tile_description, (("A", self.A, layout_a), ("B", self.B, layout_b)), what)
        if (math.opcode_class is OpClass.TensorOp and element is DataType.float32
                and self.tile_description.stages == 2
                and math.cutlass_math_operation is not MathOperation.multiply_add_fast_f16):
            # The two-stage ImplicitGemmPipelined (conv/threadblock/implicit_gemm_pipelined.h) calls warp_mma on the
            # fragments as loaded, but float operands reach a tf32 / bf16 / 3xTF32 mma through MmaTensorOp's
            # TransformedFragment (gemm/warp/mma_tensor_op.h): "cannot be called with the given argument list".
            # multiply_add_fast_f16 takes the OpMultiplyAddFastF16 core (half_t in shared memory) instead.
            raise DescriptionError(
                f"{what}: CUTLASS's two-stage convolution main loop cannot feed float32 operands to the "
                f"{math.math_operation.name} tensor-op mma (it does not transform the fragments); use stages >= 3, "
                f"tfloat32 operands, or multiply_add_fast_f16", rule="conv2d.two_stage_f32")
        # The main loops copy with DefaultMmaCore's thread maps; the iterators of the K-contiguous operands (fprop A
        # and B, dgrad A: conv2d_fprop_{activation,filter}_tile_access_iterator_*.h, conv2d_dgrad_output_gradient_
        # tile_access_iterator_*.h) also static_assert "Require Iterations::kContiguous == 1".
        k_major = {"A": self.conv_kind in (Operator.fprop, Operator.dgrad), "B": self.conv_kind is Operator.fprop}
        fast_f16 = (element is DataType.float32 and self.tile_description.stages == 2
                    and math.cutlass_math_operation is MathOperation.multiply_add_fast_f16)

        # The optimized filter iterators keep one bit per load in uint32_t predicates_[kAccessesPerVector]
        # (conv2d_fprop_filter_tile_access_iterator_optimized.h: Iterations::kStrided < its bits; conv2d_dgrad_
        # filter_tile_access_iterator_optimized.h: Iterations::kStrided * kContiguous < its bits).
        filter_mask = (self.iterator_algorithm is IteratorAlgorithm.optimized
                       and self.conv_kind in (Operator.fprop, Operator.dgrad))
        # The optimized wgrad output-gradient iterator (operand A) sets bit (c + s * Iterations::kContiguous) of its
        # uint32_t predicates_ for every load, with no static_assert: past 32 loads the shift overflows and the
        # predicates come out wrong (found on an H100: 128x32x16 SIMT on one warp, 64 loads, relative error 0.7).
        wgrad_mask = self.iterator_algorithm is IteratorAlgorithm.optimized and self.conv_kind is Operator.wgrad

        def access_alignment(desc):
            # The SIMT specializations build their iterators with the thread map's one-element access whatever
            # AlignmentA/B say (default_conv2d_*.h); the declared alignment only tightens the arguments' checks.
            return 1 if math.opcode_class is OpClass.Simt else desc.alignment

        def one_contiguous_access(label, desc, is_k_major, per_access, iterations, where):
            if is_k_major and iterations[0] != 1:
                return (f"CUTLASS's convolution iterator for {where} takes one access along K per thread "
                        f"(static_assert 'Require Iterations::kContiguous == 1'), but its thread map gives "
                        f"{iterations[0]}; use a smaller tile K or more warps")
            if label == "A" and wgrad_mask and iterations[0] * iterations[1] > 32:
                return (f"CUTLASS's optimized wgrad output-gradient iterator keeps one predicate bit per load in 32 "
                        f"bits, but {where} takes {iterations[0] * iterations[1]} loads per thread (its shift "
                        f"overflows and the results are wrong); use more warps, a smaller tile M or K, or the "
                        f"analytic iterator")
            if label == "B" and filter_mask:
                loads = iterations[1] * (iterations[0] if self.conv_kind is Operator.dgrad else 1)
                bits = 32 * (per_access // access_alignment(desc))
                if loads >= bits:
                    return (f"CUTLASS's optimized {self.conv_kind.name} filter iterator packs one predicate bit per "
                            f"load into {bits} bits, which must outnumber the {loads} loads of {where} (static_assert "
                            f"'Currently, the number of loads per iteration is limited by the size of the "
                            f"predicates container.'); use more warps, a smaller tile or the analytic iterators")
            return None
        problem = thread_map_problem(self.tile_description,
                                     (("A", self.A, "M", m, k_major["A"]), ("B", self.B, "N", n, k_major["B"])),
                                     fast_f16, one_contiguous_access)
        if problem:
            raise DescriptionError(f"{what}: {problem}", rule="sm80.mainloop_thread_map")
        a_along_m, b_along_n = self.conv_kind is Operator.wgrad, self.conv_kind in (Operator.dgrad, Operator.wgrad)
        check_congruous_tile(self.tile_description, [("A", "M", m)] * a_along_m + [("B", "N", n)] * b_along_n, what)
        # Warp tiles the H100 fuzz runs found wrong (the same congruous operands; the epilogue's accesses).
        check_narrow_warp_tiles(self.tile_description, self.C, a_along_m, b_along_n, what)

        if algorithm in (IteratorAlgorithm.fixed_channels, IteratorAlgorithm.few_channels):
            if self.conv_kind is not Operator.fprop:
                raise DescriptionError(f"{what}: the {algorithm.name} iterator algorithm exists for fprop only; "
                                       f"use analytic or optimized", rule="conv2d.iterator_algorithm")
            if math.opcode_class is not OpClass.TensorOp:
                raise DescriptionError(f"{what}: the {algorithm.name} iterator algorithm exists for "
                                       f"OpClass.TensorOp only; use analytic or optimized with SIMT",
                                       rule="conv2d.iterator_algorithm")
            if algorithm is IteratorAlgorithm.fixed_channels and self.A.alignment != self.B.alignment:
                raise DescriptionError(
                    f"{what}: fixed_channels runs problems with C == the access size of both A and B, so A and B "
                    f"need the same alignment (got A {self.A.alignment}, B {self.B.alignment})",
                    rule="conv2d.iterator_algorithm")

        swizzle = self.swizzling_functor
        if swizzle.kind in ("horizontal", "strided_dgrad_horizontal"):
            raise DescriptionError(
                f"{what}: {swizzle.name} does not build with CUTLASS's convolution kernels (they call "
                f"get_tile_offset(log_tile), which the horizontal swizzles lack); use IdentitySwizzle1/2/4/8, or "
                f"StridedDgradIdentitySwizzle1/4 for strided dgrad", rule="swizzle.unsupported")
        if self.is_strided_dgrad and self.tile_description.stages == 2:
            # The 2-stage strided-dgrad kernels (analytic and optimized) wrap their iterators in
            # TileIteratorStridedDgrad (cutlass/conv/threadblock/conv2d_tile_iterator.h), whose load() makes one
            # AccessType access per thread-map vector: unlike TileIterator it has no kAccessesPerVector loop, so an
            # alignment below the thread map's vector loads a fraction of each vector into the wrong fragment slots
            # and the result is silently wrong. Multistage kernels (ImplicitGemmMultistage) loop correctly.
            # (SIMT iterators access one element whatever the declared alignment: see access_alignment above.)
            simt = math.opcode_class is OpClass.Simt
            vector = 1 if element is DataType.float64 else 128 // element.bits
            for label, desc in () if simt else (("A", self.A), ("B", self.B)):
                if desc.alignment != vector:
                    raise DescriptionError(
                        f"{what}: 2-stage strided dgrad loads A and B through CUTLASS's TileIteratorStridedDgrad, "
                        f"which reads only one {desc.alignment}-element access per {vector}-element thread-map "
                        f"vector (it lacks TileIterator's kAccessesPerVector loop) and computes wrong results unless "
                        f"the alignment equals that vector; {label} alignment is {desc.alignment}. Use alignment "
                        f"{vector} for A and B, stages >= 3 (A/B alignment * bits >= 32), or StrideSupport.Unity for "
                        f"stride-1 problems", rule="conv2d.strided_dgrad_alignment")
        if self.is_strided_dgrad:
            if swizzle not in STRIDED_DGRAD_SWIZZLES:
                raise DescriptionError(
                    f"{what}: dgrad with StrideSupport.Strided runs CUTLASS's strided-dgrad kernel, which needs "
                    f"StridedDgradIdentitySwizzle1 or StridedDgradIdentitySwizzle4 (got {swizzle.name}); or use "
                    f"StrideSupport.Unity for stride-1 problems", rule="conv2d.strided_dgrad_swizzle")
        elif swizzle not in IDENTITY_SWIZZLES:
            raise DescriptionError(
                f"{what}: {swizzle.name} is for dgrad with StrideSupport.Strided only; use IdentitySwizzle1/2/4/8",
                rule="conv2d.strided_dgrad_swizzle")

    @property
    def is_strided_dgrad(self) -> bool:
        return self.conv_kind is Operator.dgrad and self.stride_support is StrideSupport.Strided

    def check_problem_size(self, problem_size: Conv2dProblemSize) -> None:
        """Raise ``ArgumentError`` naming the first constraint of this kernel that ``problem_size`` breaks.

        Mirrors ``cutlass::conv::device::ImplicitGemmConvolution::can_implement`` and the iterators'
        ``can_implement`` (which the device builder also runs).
        """
        if not isinstance(problem_size, Conv2dProblemSize):
            raise ArgumentError(f"{self.name}: problem_size must be a pycutlass.conv.Conv2dProblemSize, "
                                f"got {problem_size!r}")
        ps = problem_size
        algorithm = self.iterator_algorithm
        where = f"{self.name} ({self.conv_kind.name}, {algorithm.name})"
        # Channel counts the operands' vector accesses run along: (tensor, dimension name, extent, alignment).
        if self.conv_kind is Operator.fprop:
            accesses = [("A (activation)", "C", ps.C, self.A.alignment), ("B (filter)", "C", ps.C, self.B.alignment),
                        ("C/D (output)", "K", ps.K, self.C.alignment)]
        elif self.conv_kind is Operator.dgrad:
            accesses = [("A (output gradient)", "K", ps.K, self.A.alignment),
                        ("B (filter)", "C", ps.C, self.B.alignment),
                        ("C/D (input gradient)", "C", ps.C, self.C.alignment)]
        else:
            accesses = [("A (output gradient)", "K", ps.K, self.A.alignment),
                        ("B (activation)", "C", ps.C, self.B.alignment),
                        # The filter gradient is written as the implicit GEMM's K x (R*S*C) row-major matrix
                        # (ConvOutputIteratorParameter: ld = stride of K), so C's vectors run along R*S*C.
                        ("C/D (filter gradient)", "R*S*C", ps.R * ps.S * ps.C, self.C.alignment)]

        if algorithm is IteratorAlgorithm.fixed_channels:
            if ps.C != self.A.alignment:
                raise ArgumentError(f"{where}: fixed_channels needs C == the alignment of A and B "
                                    f"({self.A.alignment}); the problem has C={ps.C}. Use few_channels (C divisible by "
                                    f"the alignment) or analytic/optimized")
        elif algorithm is IteratorAlgorithm.few_channels:
            if ps.C % self.A.alignment or ps.C % self.B.alignment:
                raise ArgumentError(f"{where}: few_channels needs C divisible by the alignment of A and B "
                                    f"({self.A.alignment}, {self.B.alignment}); the problem has C={ps.C}")
        for label, dim, extent, alignment in accesses:
            if extent % alignment:
                raise ArgumentError(f"{where}: channel alignment: {label} is accessed {alignment} elements at a "
                                    f"time along {dim}, so {dim} must be divisible by {alignment}; the problem has "
                                    f"{dim}={extent}")
        if self.A.layout is LayoutType.TensorNC32HW32:
            if ps.C % 32 or ps.K % 32:
                raise ArgumentError(f"{where}: interleaved NC32HW32/C32RSK32 tensors need C and K divisible by 32; "
                                    f"the problem has C={ps.C}, K={ps.K}")
        if algorithm is IteratorAlgorithm.optimized and self.conv_kind in (Operator.fprop, Operator.dgrad):
            if ps.R > _MAX_FILTER_OPTIMIZED or ps.S > _MAX_FILTER_OPTIMIZED:
                raise ArgumentError(f"{where}: the optimized iterators support filters up to "
                                    f"{_MAX_FILTER_OPTIMIZED}x{_MAX_FILTER_OPTIMIZED} (R, S <= 32); the problem has "
                                    f"R={ps.R}, S={ps.S}. Use the analytic iterator algorithm")
        if self.conv_kind is Operator.dgrad:
            if self.stride_support is StrideSupport.Unity and (ps.stride_h, ps.stride_w) != (1, 1):
                raise ArgumentError(f"{where}: StrideSupport.Unity dgrad needs stride (1, 1); the problem has stride "
                                    f"({ps.stride_h}, {ps.stride_w}). Use a StrideSupport.Strided operation with a "
                                    f"StridedDgrad* swizzle")
            if self.is_strided_dgrad:
                if ps.dilation_h > 1 or ps.dilation_w > 1:
                    raise ArgumentError(f"{where}: strided dgrad does not support dilation > 1; the problem has "
                                        f"dilation ({ps.dilation_h}, {ps.dilation_w})")
                # Serial split-K at stride > 1 is allowed although CUTLASS's device-level can_implement refuses
                # it (untested there, not wrong): ImplicitGemmConvolutionStridedDgrad takes one semaphore per
                # (m, n) tile, every m tile belongs to one start filter position whose outputs no other tile
                # writes, its early exit (start_h >= H) is the same for all slices of a tile, and its iterators
                # step K by tile_k * split_k_slices from slice k's offset. Parallel split-K stays refused
                # (Conv2dArguments): that kernel never offsets D per slice.
        sizes = (("A", self.A, ps.tensor_a_size(self.conv_kind)), ("B", self.B, ps.tensor_b_size(self.conv_kind)),
                 ("C/D", self.C, ps.tensor_c_size(self.conv_kind)))
        for label, desc, count in sizes:
            if count * desc.element.bits // 8 >= _MAX_TENSOR_BYTES:
                raise ArgumentError(f"{where}: tensor {label} would take {count * desc.element.bits // 8} bytes; "
                                    f"CUTLASS 2.x convolutions address at most 2 GiB per tensor")
        grid = self.grid_shape(ps)
        if grid[1] > _MAX_GRID_YZ or grid[2] > _MAX_GRID_YZ:
            raise ArgumentError(f"{where}: the launch grid {grid} exceeds 65535 blocks in y or z; use a larger tile, "
                                f"fewer split-K slices or another swizzle")

    # --- launch shape (mirrors CUTLASS's threadblock swizzles) ------------------------------------------------
    def tiled_shape(self, problem_size: Conv2dProblemSize) -> tuple[int, int, int]:
        """Threadblock tiles along the implicit GEMM's (M, N, split-K), as ``Params::grid_tiled_shape``."""
        tm, tn, _ = self.tile_description.threadblock_shape
        gemm = problem_size.implicit_gemm_size(self.conv_kind)
        tiles_n = -(-gemm.n() // tn)
        if self.is_strided_dgrad:
            ps = problem_size
            rows = ps.N * (-(-ps.H // ps.stride_h)) * (-(-ps.W // ps.stride_w))
            tiles_m = -(-rows // tm) * ps.stride_h * ps.stride_w
        else:
            tiles_m = -(-gemm.m() // tm)
        return tiles_m, tiles_n, problem_size.split_k_slices

    def grid_shape(self, problem_size: Conv2dProblemSize) -> tuple[int, int, int]:
        m, n, k = self.tiled_shape(problem_size)
        width = self.swizzling_functor.log_tile  # GemmIdentityThreadblockSwizzle<N>::get_log_tile
        log_tile = 3 if width >= 8 and n >= 6 else 2 if width >= 4 and n >= 3 else 1 if width >= 2 and n >= 2 else 0
        tile = 1 << log_tile
        return m * tile, -(-n // tile), k

    def semaphore_count(self, problem_size: Conv2dProblemSize, split_k_mode: SplitKMode = SplitKMode.Serial) -> int:
        """Zeroed ints serial split-K needs (the builder reports the same in ``LaunchInfo.semaphore_count``)."""
        m, n, k = self.tiled_shape(problem_size)
        return m * n if SplitKMode(split_k_mode) is SplitKMode.Serial and k > 1 else 0

    def workspace_elements(self, problem_size: Conv2dProblemSize, split_k_mode: SplitKMode) -> int:
        """Elements of C's type that parallel split-K writes its partial results to (0 for serial)."""
        if SplitKMode(split_k_mode) is not SplitKMode.Parallel:
            return 0
        return problem_size.split_k_slices * problem_size.tensor_c_size(self.conv_kind)

    # --- the ABI struct -------------------------------------------------------------------------------------
    def make_abi_arguments(self, problem_size: Conv2dProblemSize, ptr_A: int, ptr_B: int, ptr_C: int, ptr_D: int,
                           output_op, split_k_mode: SplitKMode = SplitKMode.Serial, semaphore: int = 0,
                           c_strides: tuple[int, int, int] | None = None) -> Conv2dArgs:
        """Pack a ``pycutlass_abi::Conv2dArgs``. ``c_strides`` = C's (w, h, n) strides in elements for TensorNHWC
        (default packed; zeros broadcast, e.g. (0, 0, 0) reads a bias vector of K); ignored for interleaved C."""
        ps = problem_size
        args = Conv2dArgs()
        for field, value in (("n", ps.N), ("h", ps.H), ("w", ps.W), ("c", ps.C), ("k", ps.K), ("r", ps.R),
                             ("s", ps.S), ("p", ps.P), ("q", ps.Q), ("pad_h", ps.pad_h), ("pad_w", ps.pad_w),
                             ("stride_h", ps.stride_h), ("stride_w", ps.stride_w), ("dilation_h", ps.dilation_h),
                             ("dilation_w", ps.dilation_w), ("mode", int(ps.mode)),
                             ("split_k_slices", ps.split_k_slices), ("groups", ps.groups),
                             ("split_k_mode", int(SplitKMode(split_k_mode)))):
            setattr(args, field, value)
        args.ptr_A, args.ptr_B, args.ptr_C, args.ptr_D = int(ptr_A), int(ptr_B), int(ptr_C), int(ptr_D)
        args.semaphore = int(semaphore)
        if c_strides is None:
            extent = tuple(ps.tensor_c_extent(self.conv_kind))
            c_strides = (extent[3], extent[2] * extent[3], extent[1] * extent[2] * extent[3])
        args.stride_c_w, args.stride_c_h, args.stride_c_n = (int(v) for v in c_strides)
        fill_epilogue(args, output_op)
        return args

    # --- identity -------------------------------------------------------------------------------------------
    def _signature(self) -> tuple:
        return ("conv2d", self.conv_kind, self.iterator_algorithm, self.stride_support, self.compute_capability,
                self.tile_description, self.A, self.B, self.C, self.epilogue_functor, self.swizzling_functor)

    def _readable_name(self) -> str:
        layout = "nc32hw32" if self.A.layout.is_interleaved else "nhwc"
        return (f"conv2d_{self.conv_kind.name}_{ALGORITHM_SHORT[self.iterator_algorithm]}_{self.stride_support.value}_"
                f"{self._types_and_tile_name(layout)}")

    # --- emission -------------------------------------------------------------------------------------------
    def headers(self) -> list[str]:
        return [KERNEL_HEADER[self.conv_kind], "cutlass/conv/conv2d_problem_size.h",
                "cutlass/conv/threadblock/threadblock_swizzle.h", "cutlass/gemm/threadblock/threadblock_swizzle.h",
                *names.epilogue_headers(self.epilogue_functor)]

    def emit_body(self) -> str:
        tile = self.tile_description
        math = tile.math_instruction
        activation = self.epilogue_functor.activation
        return self.render(
            "conv2d.cu.j2", name=self.name, summary=self.describe(),
            epilogue=names.epilogue_functor(self.epilogue_functor),
            default_kernel=DEFAULT_KERNEL[self.conv_kind], conv_operator=CONV_OPERATOR[self.conv_kind],
            element_a=self._operand_element(self.A), layout_a=names.LAYOUT[self.A.layout], alignment_a=self.A.alignment,
            element_b=self._operand_element(self.B), layout_b=names.LAYOUT[self.B.layout], alignment_b=self.B.alignment,
            element_c=names.ELEMENT[self.C.element], layout_c=names.LAYOUT[self.C.layout],
            element_accumulator=names.ELEMENT[math.element_accumulator],
            opclass=names.OPCLASS[math.opcode_class], arch_tag=names.arch_tag(self.family),
            threadblock_shape=tile.threadblock_shape, warp_shape=tile.warp_shape,
            instruction_shape=math.instruction_shape, swizzle=names.gemm_swizzle(self.swizzling_functor),
            stages=tile.stages, math_operation=names.MATH_OPERATION[math.cutlass_math_operation],
            iterator_algorithm=ITERATOR_ALGORITHM[self.iterator_algorithm],
            stride_support=STRIDE_SUPPORT[self.stride_support],
            c_strided=self.C.layout is _NHWC,
            activation_args=activation.argument_names if activation else ())

    def describe(self) -> str:
        math = self.tile_description.math_instruction
        return (f"Conv2d {self.conv_kind.name} {self.iterator_algorithm.name} stride={self.stride_support.name} "
                f"sm{self.compute_capability} {math.opcode_class.name} {math.math_operation.name} "
                f"A={self.A.element.label}/{self.A.layout.value}/{self.A.alignment} "
                f"B={self.B.element.label}/{self.B.layout.value}/{self.B.alignment} "
                f"C={self.C.element.label}/{self.C.layout.value}/{self.C.alignment} "
                f"acc={math.element_accumulator.label} tile={self.tile_description.procedural_name()} "
                f"epilogue={self.epilogue_functor.describe()} swizzle={self.swizzling_functor.name}")
