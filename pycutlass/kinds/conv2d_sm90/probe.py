"""SM90 conv probe units: one fprop kernel with its device-side Params builder (tests/cpu/test_conv2d_sm90.py,
tests/gpu/test_conv2d_sm90_probe.py), and dgrad/wgrad kernels alone.

The builder writes Params and each TMA descriptor's offset in them. The im2col descriptors (activations, C, D) hold
the captured encode arguments (``pycutlass_rtc::Im2colCapture``, decoded by :class:`Im2colCapture`); the one tiled
descriptor (the filter) is described by a TmaRecord from its TMA copy type, as the SM90 GEMM kind does.
"""
from __future__ import annotations


from ...emit import abi, emitter
from ...runtime.im2col import Im2colCapture  # noqa: F401  (re-exported: tests and the probe's GPU test use it here)
from ..families.sm90 import helpers_code
from .operation import overlay, preambles

ELEMENTS = {"f16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t"}


CONV_KINDS = {"fprop": "kFprop", "dgrad": "kDgrad", "wgrad": "kWgrad"}


def kernel_source(name: str, conv_kind: str = "fprop", element: str = "f16", tile=(128, 128, 64),
                  cluster=(1, 1, 1)) -> str:
    """The kernel ``{name}`` alone, as CUTLASS 4.2's SM90 conv tests build it: fprop and dgrad write an NHWC tensor
    through the TMA epilogue; wgrad's tile has N and K as modes of their own and writes the KRSC filter (TensorKCSR)
    through the no-smem epilogue."""
    e = ELEMENTS[element]
    m, n, k = tile
    op = CONV_KINDS[conv_kind]
    wgrad = conv_kind == "wgrad"
    tile_shape = f"Shape<_{m}, Shape<_{n}>, Shape<_{k}>>" if wgrad else f"Shape<_{m}, _{n}, Shape<_{k}>>"
    out_layout = "cutlass::layout::TensorKCSR" if wgrad else "cutlass::layout::TensorNHWC"
    epilogue = "cutlass::epilogue::NoSmemWarpSpecialized" if wgrad else "cutlass::epilogue::TmaWarpSpecialized"
    return f"""
namespace {name}_ns {{
using namespace cute;
using Element = {e};
using TileShape = {tile_shape};
using ClusterShape = Shape<_{cluster[0]}, _{cluster[1]}, _{cluster[2]}>;
using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    Element, {out_layout}, 8, Element, {out_layout}, 8, {epilogue}>::CollectiveOp;
using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::{op},
    Element, cutlass::layout::TensorNHWC, 8, Element, cutlass::layout::TensorNHWC, 8, float,
    TileShape, ClusterShape,
    cutlass::conv::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::{op}, 2>;
using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
}}  // namespace {name}_ns

extern "C" __global__ void __cluster_dims__({', '.join(map(str, cluster))})
__launch_bounds__({name}_ns::Kernel::MaxThreadsPerBlock, {name}_ns::Kernel::MinBlocksPerMultiprocessor)
{name}(typename {name}_ns::Kernel::Params const __grid_constant__ params) {{
  extern __shared__ char pycutlass_dynamic_smem[];
  {name}_ns::Kernel op;
  op(params, pycutlass_dynamic_smem);
}}
"""


def backward_probe_source(name: str = "pycutlass_conv2d_sm90_probe", element: str = "f16") -> str:
    """dgrad and wgrad kernels (no builders) in one unit: does the overlay carry them too?"""
    return (emitter.prelude([], [abi.LaunchInfo], preambles()) + kernel_source(f"{name}_dgrad", "dgrad", element)
            + kernel_source(f"{name}_wgrad", "wgrad", element, tile=(128, 128, 64)))


def probe_source(name: str = "pycutlass_conv2d_sm90_probe", element: str = "f16", tile=(128, 128, 64),
                 cluster=(1, 1, 1)) -> str:
    """A unit with ``{name}`` (the kernel) and ``{name}_build``. Only the non-persistent warp-specialized schedule:
    CUTLASS 4.2 refuses the cooperative and ping-pong schedules for conv (dispatch_policy.hpp)."""
    # The project's prelude (LaunchInfo, TmaRecord, construct_params) with the overlay as its preamble, and the SM90
    # GEMM kind's helpers (record_tma) for the one tiled descriptor, the filter's.
    unit = emitter.prelude([], [abi.LaunchInfo, abi.TmaRecord], preambles())
    unit += helpers_code()
    return unit + kernel_source(name, "fprop", element, tile, cluster) + f"""
// d: n, h, w, c, k, r, s, pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w. out: can_implement, the offsets
// of the A, B, C, D descriptors in Params (A, C, D: im2col, holding captures; B: tiled, described by *record_b),
// sizeof(Params), shared memory bytes, grid x/y/z, threads per block.
extern "C" __global__ void {name}_build(int const *d, void const *A, void const *B, void const *C, void *D,
                                        float alpha, float beta, void *params_out, int *out,
                                        pycutlass_abi::TmaRecord *record_b) {{
  using namespace cute;
  using K = {name}_ns::Kernel;
  using E = {name}_ns::Element;
  {name}_ns::ProblemShape problem(
      cutlass::conv::Mode::kCrossCorrelation, {{d[0], d[1], d[2], d[3]}}, {{d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}},
      {{d[4], d[5], d[6], d[3]}}, {{d[5] * d[6] * d[3], d[6] * d[3], d[3], 1}}, {{d[7], d[8]}}, {{d[7], d[8]}},
      {{d[9], d[10]}}, {{d[11], d[12]}}, 1);
  typename K::Arguments args{{}};
  args.problem_shape = problem;
  args.mainloop.ptr_A = static_cast<E const *>(A);
  args.mainloop.ptr_B = static_cast<E const *>(B);
  args.epilogue.thread.alpha = alpha;
  args.epilogue.thread.beta = beta;
  typename K::StrideC dC{{}};  // ((W, H, N), _1, _0) of the NPQK output
  get<0, 0>(dC) = problem.stride_C[2];
  get<0, 1>(dC) = problem.stride_C[1];
  get<0, 2>(dC) = problem.stride_C[0];
  args.epilogue.ptr_C = static_cast<E const *>(C);
  args.epilogue.dC = dC;
  args.epilogue.ptr_D = static_cast<E *>(D);
  args.epilogue.dD = dC;
  out[0] = K::can_implement(args);
  typename K::Params *p = &pycutlass_detail::construct_params<K>(params_out, K::to_underlying_arguments(args, nullptr));
  char const *base = static_cast<char const *>(params_out);
  out[1] = int(reinterpret_cast<char const *>(p->mainloop.tma_load_a.get_tma_descriptor()) - base);
  out[2] = int(reinterpret_cast<char const *>(p->mainloop.tma_load_b.get_tma_descriptor()) - base);
  out[3] = int(reinterpret_cast<char const *>(p->epilogue.tma_load_c.get_tma_descriptor()) - base);
  out[4] = int(reinterpret_cast<char const *>(p->epilogue.tma_store_d.get_tma_descriptor()) - base);
  out[5] = int(sizeof(typename K::Params));
  out[6] = int(K::SharedStorageSize);
  dim3 grid = K::get_grid_shape(*p);
  out[7] = int(grid.x);
  out[8] = int(grid.y);
  out[9] = int(grid.z);
  out[10] = int(K::MaxThreadsPerBlock);
  // The filter's tiled descriptor, over the tensor CUTLASS built it from (KRSC, in the TMA's own element type).
  using TB = typename decltype(p->mainloop.tma_load_b)::ValType;
  auto dB = cutlass::make_cute_packed_stride(typename K::CollectiveMainloop::StrideB{{}}, problem.stride_B,
                                             cutlass::conv::Operator::kFprop);
  auto tensor_b = make_tensor(reinterpret_cast<TB const *>(B), make_layout(problem.get_shape_B(), dB));
  pycutlass_sm90::record_tma(*record_b, p, p->mainloop.tma_load_b, tensor_b, size<0>({name}_ns::ClusterShape{{}}));
}}
"""
