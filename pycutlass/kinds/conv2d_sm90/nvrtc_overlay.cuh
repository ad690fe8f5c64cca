// pycutlass's overlay for CUTLASS 4.2 SM90 implicit-GEMM convolution under NVRTC. Included before any other CUTLASS
// header of the unit; edits no CUTLASS file. Every item says what NVRTC lacks and why the replacement is faithful.
// The std:: names these headers use that NVRTC lacks come first, from the SM90 GEMM kind's shim (one string, so
// that a unit holding GEMM and conv operations defines them once): gemm_sm90.operation._NVRTC_SHIM.

#include "cute/config.hpp"
#include "cute/tensor.hpp"
#include "cute/arch/copy_sm90_desc.hpp"
#include "cute/atom/copy_traits_sm90_tma.hpp"

#ifdef __CUDACC_RTC__
// copy_traits_sm90_im2col.hpp's make_im2col_tma_copy_desc is CUTE_HOST (NVRTC rejects explicit __host__ functions)
// and names cuda.h's tensor-map types without the __CUDACC_RTC__ guard the tiled path has. Declare those names with
// the driver's values and compile that one header with CUTE_HOST meaning host-device: the function then runs in the
// device-side Params builder, computes CUTLASS's im2col TMA tensor exactly as on the host, and hands the encode
// arguments to the capture below instead of to the driver.
enum CUtensorMapDataType { CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0 };
enum CUtensorMapInterleave { CU_TENSOR_MAP_INTERLEAVE_NONE = 0 };
enum CUtensorMapL2promotion { CU_TENSOR_MAP_L2_PROMOTION_NONE = 0 };
enum CUtensorMapFloatOOBfill { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0 };
enum CUtensorMapSwizzle { CU_TENSOR_MAP_SWIZZLE_NONE = 0 };
enum CUresult { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_NOT_INITIALIZED = 3,
                CUDA_ERROR_DEINITIALIZED = 4, CUDA_ERROR_INVALID_CONTEXT = 201 };

namespace cute::TMA {
// The driver's enum values (cuda.h, CUDA 12/13), for the types an SM90 conv moves.
template <class T>
CUTE_HOST_DEVICE CUtensorMapDataType to_CUtensorMapDataType() {
  if constexpr (is_same_v<T, half_t>) return CUtensorMapDataType(6);
  else if constexpr (is_same_v<T, bfloat16_t>) return CUtensorMapDataType(9);
  else if constexpr (is_same_v<T, tfloat32_t>) return CUtensorMapDataType(11);
  else if constexpr (is_same_v<T, float>) return CUtensorMapDataType(7);
  else if constexpr (sizeof(T) == 2) return CUtensorMapDataType(1);  // 16-bit words
  else if constexpr (sizeof(T) == 1) return CUtensorMapDataType(0);  // bytes (int8, fp8)
  else { static_assert(sizeof(T) < 0, "no TMA data type for this element"); }
}
// CU_TENSOR_MAP_SWIZZLE_{NONE,32B,64B,128B} are 0..3, the SmemSwizzleBits values; other bases are not used on SM90.
CUTE_HOST_DEVICE CUtensorMapSwizzle to_CUtensorMapSwizzle(SmemSwizzleBits bits, SmemSwizzleBase) {
  return CUtensorMapSwizzle(int(bits));
}
CUTE_HOST_DEVICE CUtensorMapFloatOOBfill to_CUtensorMapFloatOOBfill(OOBFill fill) {
  return CUtensorMapFloatOOBfill(fill == OOBFill::ZERO ? 0 : 1);  // NONE, NAN_REQUEST_ZERO_FMA
}
CUTE_HOST_DEVICE CUtensorMapL2promotion to_CUtensorMapL2promotion(L2Promotion promo) {
  return CUtensorMapL2promotion(promo == L2Promotion::DISABLE ? 0 : promo == L2Promotion::B64 ? 1
                                : promo == L2Promotion::B128 ? 2 : 3);
}
}  // namespace cute::TMA

namespace cute {
// Under NVRTC the tiled and im2col descriptors are two distinct 128-byte structs (both CUtensorMap under nvcc); the
// SM90 conv mainloop and epilogue prefetch im2col descriptors through the tiled signature.
CUTE_HOST_DEVICE void prefetch_tma_descriptor(Im2ColTmaDescriptor const *desc) {
  prefetch_tma_descriptor(reinterpret_cast<TmaDescriptor const *>(desc));
}
}  // namespace cute

namespace pycutlass_rtc {
// What cuTensorMapEncodeIm2col would have been given. The stand-in leaves it in the descriptor's own 128 bytes;
// CUTLASS copies the descriptor into Params, so the host finds it at the descriptor's offset there and encodes in
// place (cuTensorMapEncodeIm2col), as the tiled path does from its records.
struct Im2colCapture {
  uint64_t address;
  uint64_t dims[5];
  uint64_t strides[4];  // bytes, of dims 1..rank-1 (dim 0 is the element)
  int16_t lower[3], upper[3];  // pixel box corners of the spatial dims (W, H, D)
  uint32_t range_c, range_whdn;
  uint8_t elem_strides[5], rank, data_type, swizzle, l2_promotion, oob_fill, magic;
};
static_assert(sizeof(Im2colCapture) <= 128, "the capture must fit in the descriptor it stands for");
constexpr uint8_t kIm2colMagic = 0xC7;

template <class Desc>
CUTE_HOST_DEVICE CUresult cuTensorMapEncodeIm2col(
    Desc *desc, CUtensorMapDataType type, unsigned rank, void *address, uint64_t const *dims,
    uint64_t const *strides, int const *lower, int const *upper, unsigned range_c, unsigned range_whdn,
    unsigned const *elem_strides, CUtensorMapInterleave, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
    CUtensorMapFloatOOBfill oob) {
  static_assert(sizeof(Desc) == 128, "an im2col descriptor is 128 bytes");
  Im2colCapture c{};
  c.address = reinterpret_cast<uint64_t>(address);
  for (unsigned i = 0; i < rank && i < 5; ++i) {
    c.dims[i] = dims[i];
    c.elem_strides[i] = uint8_t(elem_strides[i]);
    if (i + 1 < rank) c.strides[i] = strides[i];
    if (i + 2 < rank && i < 3) {
      c.lower[i] = int16_t(lower[i]);
      c.upper[i] = int16_t(upper[i]);
    }
  }
  c.range_c = range_c;
  c.range_whdn = range_whdn;
  c.rank = uint8_t(rank);
  c.data_type = uint8_t(type);
  c.swizzle = uint8_t(swizzle);
  c.l2_promotion = uint8_t(l2);
  c.oob_fill = uint8_t(oob);
  c.magic = kIm2colMagic;
  memcpy(static_cast<void *>(desc), &c, sizeof(c));
  return CUDA_SUCCESS;
}
}  // namespace pycutlass_rtc

// cuda_host_adapter.hpp defines this only for host compiles; here it routes the im2col encode to the capture.
#define CUTLASS_CUDA_DRIVER_WRAPPER_CALL(func) ::pycutlass_rtc::func
// NVRTC ignores #pragma push_macro: redefine, include, then restore cute/config.hpp's definition by hand.
#undef CUTE_HOST
#define CUTE_HOST CUTE_HOST_DEVICE
#include "cute/atom/copy_traits_sm90_im2col.hpp"
#undef CUTE_HOST
#define CUTE_HOST __forceinline__ __host__
#endif  // __CUDACC_RTC__

// conv_universal.hpp (the kernel's primary template) also includes the SM100 kernel, whose members are explicit
// __host__ functions: declare the primary template here, with its defaults, and include only the SM90 specialization.
namespace cutlass::conv::kernel {
template <class ProblemShape_, class CollectiveMainloop_, class CollectiveEpilogue_, class TileSchedulerTag_ = void,
          class Enable = void>
class ConvUniversal;
}  // namespace cutlass::conv::kernel
#include "cutlass/conv/kernel/sm90_implicit_gemm_tma_warpspecialized.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
