#ifndef PYCUTLASS_FILTER_TAPS_WGRAD
#define PYCUTLASS_FILTER_TAPS_WGRAD
// pycutlass's SM90 wgrad for 3x3 stride-1 convolutions that reads each activation once for all nine filter taps.
//
// The implicit-GEMM wgrad (dW[K, R*S*C] = dY^T[K, N*P*Q] x im2col(X)[N*P*Q, R*S*C]) loads the activation once per
// filter tap: nine shifted copies of the same pixels pass from L2 into shared memory. With 64 output channels (a
// 64-row filter gradient) that traffic, not the tensor cores, bounds the kernel. Here a CTA owns 64 output channels
// x all nine taps x 64 input channels (tile 64 x 576), and a stage holds kStageK output pixels: kStageK / Q
// output-row segments of Q pixels (Q = 64, 32 or 16, the narrowest that spans an output row, chosen per problem by
// the builder), their output gradient and the activation halo they read ((rows + 2) x (Q + 2) pixels x 64
// channels), both by tiled TMA whose out-of-bounds zero fill is the convolution's padding. Tap (r, s)
// is the halo seen through a wgmma descriptor moved down r rows and s pixels: one 128-byte swizzled line a pixel,
// and the swizzle follows the shared-memory address, so a view that starts mid-pattern reads the right bytes.
//
// Warp specialization: one producer warpgroup (a thread issues the loads), three consumer warpgroups, one per
// filter row r, each holding its three taps' 64 x 64 float32 accumulators (96 registers a thread). GEMM K (the
// output pixels, in units of one row segment) is split over gridDim.z CTAs in clusters of kClusterZ along z. The
// accumulators are staged in shared memory; the cluster's CTAs then add them through distributed shared memory,
// each CTA summing and writing 64 / kClusterZ of the output channels with coalesced 16-byte stores: cluster z writes
// D_z = alpha * sum + beta * C_z at z * split_stride (parallel split-K partials; one cluster is the whole gradient).
// The cluster's sum is in rank order, so results never depend on timing.
#include <cute/arch/cluster_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

namespace pycutlass_sm90_conv {

template <class Element> struct FilterTapsMma;
template <> struct FilterTapsMma<cutlass::half_t> {
  using Op = cute::SM90::GMMA::MMA_64x64x16_F32F16F16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::MN>;
};
template <> struct FilterTapsMma<cutlass::bfloat16_t> {
  using Op = cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::MN>;
};

template <class Element_, class ElementC_, int kStageK_, int kStages_, int kClusterZ_>
struct FilterTapsWgrad {
  using Element = Element_;
  using ElementC = ElementC_;
  static constexpr int kStageK = kStageK_;  // output pixels a stage: 64 or 128
  static constexpr int kStages = kStages_;
  // A segment of Q pixels (128-byte lines of 64 channels), kStageK / Q rows of them a stage. The 64-pixel segment
  // has the largest halo, so its buffers fit the narrower ones; each buffer starts on a 1024-byte swizzle pattern,
  // as TMA's 128-byte swizzle requires.
  template <int kQ>
  struct Segment {
    static constexpr int kRows = kStageK / kQ;
    static constexpr int kDyBytes = kStageK * 128;
    static constexpr int kXBytes = (kRows + 2) * (kQ + 2) * 128;
  };
  static constexpr int kDyStride = (Segment<64>::kDyBytes + 1023) / 1024 * 1024;
  static constexpr int kXStride = (Segment<64>::kXBytes + 1023) / 1024 * 1024;
  static constexpr int kStageBytes = kDyStride + kXStride;
  static_assert(Segment<32>::kXBytes <= kXStride && Segment<16>::kXBytes <= kXStride, "a halo outgrows its buffer");
  static constexpr int kClusterZ = kClusterZ_;
  // The epilogue's staging of the nine 64 x 64 float32 tiles over the stages ([tap][k][c], rows padded by 4 floats:
  // the accumulator fragments' float2 stores land in distinct banks)
  static constexpr int kStagingRow = 64 + 4;
  static constexpr int kStagingBytes = 9 * 64 * kStagingRow * 4;
  static constexpr int kBufferBytes = kStages * kStageBytes > kStagingBytes ? kStages * kStageBytes : kStagingBytes;
  static constexpr int SharedStorageSize = kBufferBytes + 2 * kStages * 8 + 1024;  // + alignment slack
  static constexpr int MaxThreadsPerBlock = 512;
  // 512 threads: 128 registers each, which the consumers' 96 accumulators fit without spilling (every warp also
  // runs the epilogue's reduction, so none gives registers up with setmaxnreg)
  struct SharedStorage {
    char bytes[SharedStorageSize];
  };

  struct Params {
    cute::TmaDescriptor tma_dy;  // (K, Q, P, N) output gradient, box (64, segment, rows, 1)
    cute::TmaDescriptor tma_x;   // (C, W, H, N) activation, box (64, segment + 2, rows + 2, 1)
    ElementC *ptr_D;
    ElementC const *ptr_C;
    long long split_stride;  // elements from one slice's output to the next's
    float alpha, beta;
    int k, c, pad_h, pad_w, q_chunks, row_steps, total_units;  // k: the output channels (the grid's y covers them)
    int segment;  // Q: 64, 32 or 16 output pixels
  };

  using Op = typename FilterTapsMma<Element>::Op;

  template <int... I>
  CUTLASS_DEVICE static void mma(uint64_t desc_a, uint64_t desc_b, float *d, cute::integer_sequence<int, I...>) {
    Op::fma(desc_a, desc_b, d[I]...);
  }

  CUTLASS_DEVICE static void fence(float (&acc)[3][32]) {
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < 3; ++s) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 32; ++i) cute::warpgroup_fence_operand(acc[s][i]);
    }
  }

  CUTLASS_DEVICE void operator()(Params const &params, char *smem_raw) {
    using namespace cute;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    char *smem = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) / 1024 * 1024);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + kBufferBytes);
    uint64_t *empty = full + kStages;
    int const warp_group = int(threadIdx.x) / 128;
    int const thread_in_group = int(threadIdx.x) % 128;
    if (threadIdx.x == 0) {
      for (int i = 0; i < kStages; ++i) {
        cutlass::arch::ClusterTransactionBarrier::init(&full[i], 1);
        cutlass::arch::ClusterBarrier::init(&empty[i], 3);  // one arrival per consumer warpgroup
      }
      cutlass::arch::fence_barrier_init();
    }
    __syncthreads();

    int const c0 = int(blockIdx.x) * 64, k0 = int(blockIdx.y) * 64, split = int(blockIdx.z);
    int const begin = int((long long)params.total_units * split / gridDim.z);
    int const end = int((long long)params.total_units * (split + 1) / gridDim.z);

    switch (params.segment) {
      case 16: mainloop<16>(params, smem, full, empty, begin, end, c0, k0, warp_group, thread_in_group); break;
      case 32: mainloop<32>(params, smem, full, empty, begin, end, c0, k0, warp_group, thread_in_group); break;
      default: mainloop<64>(params, smem, full, empty, begin, end, c0, k0, warp_group, thread_in_group); break;
    }
    reduce_cluster(params, smem, c0, k0);
#endif
  }

  template <int kQ>
  CUTLASS_DEVICE void mainloop(Params const &params, char *smem, uint64_t *full, uint64_t *empty, int begin, int end,
                               int c0, int k0, int warp_group, int thread_in_group) {
    using namespace cute;
    using S = Segment<kQ>;
    if (warp_group == 0) {  // the producer
      if (thread_in_group == 0) {
        int stage = 0, phase = 0;
        for (int unit = begin; unit < end; ++unit) {
          cutlass::arch::ClusterBarrier::wait(&empty[stage], phase ^ 1);
          cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[stage], S::kDyBytes + S::kXBytes);
          int const chunk = unit % params.q_chunks, rest = unit / params.q_chunks;
          int const q0 = chunk * kQ, p0 = (rest % params.row_steps) * S::kRows, n = rest / params.row_steps;
          char *buffer = smem + stage * kStageBytes;
          uint64_t const hint = uint64_t(TMA::CacheHintSm90::EVICT_NORMAL);
          SM90_TMA_LOAD_4D::copy(&params.tma_dy, &full[stage], hint, buffer, k0, q0, p0, n);
          SM90_TMA_LOAD_4D::copy(&params.tma_x, &full[stage], hint, buffer + kDyStride, c0, q0 - params.pad_w,
                                 p0 - params.pad_h, n);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    } else {
      consume<kQ>(full, empty, smem, begin, end, warp_group - 1, thread_in_group);
    }
  }

  // A consumer warpgroup: the main loop of filter row r, then its accumulators staged in shared memory.
  template <int kQ>
  CUTLASS_DEVICE void consume(uint64_t *full, uint64_t *empty, char *smem, int begin, int end, int r,
                              int thread_in_group) {
    using namespace cute;
    constexpr int kRows = Segment<kQ>::kRows;
    float acc[3][32];
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < 3; ++s) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 32; ++i) acc[s][i] = 0.f;
    }
    // A (dY^T: M = output channels, K = pixels) and B (X: N = input channels, K = pixels) are both MN-major 64 x 16
    // views of 128-byte swizzled lines; the descriptor of one at the start of shared memory, moved by whole lines
    // (16-byte units in the start address field).
    auto canonical = make_tensor(make_smem_ptr(reinterpret_cast<Element *>(smem)),
                                 tile_to_shape(SM90::GMMA::Layout_MN_SW128_Atom<Element>{}, Shape<_64, _16>{}));
    uint64_t const base = uint64_t(SM90::GMMA::make_gmma_desc<SM90::GMMA::Major::MN>(canonical));
    int stage = 0, phase = 0;
    for (int unit = begin; unit < end; ++unit) {
      cutlass::arch::ClusterBarrier::wait(&full[stage], phase);
      warpgroup_arrive();
      fence(acc);
      uint32_t const stage_line = uint32_t(stage * kStageBytes / 128);
      CUTLASS_PRAGMA_UNROLL
      for (int row = 0; row < kRows; ++row) {
        CUTLASS_PRAGMA_UNROLL
        for (int block = 0; block < kQ / 16; ++block) {
          uint64_t const desc_a = base + uint64_t((stage_line + row * kQ + block * 16) * 8);
          CUTLASS_PRAGMA_UNROLL
          for (int s = 0; s < 3; ++s) {
            uint32_t const line = stage_line + kDyStride / 128 + (row + r) * (kQ + 2) + block * 16 + s;
            mma(desc_a, base + uint64_t(line * 8), acc[s], make_integer_sequence<int, 32>{});
          }
        }
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      fence(acc);
      if (thread_in_group == 0) cutlass::arch::ClusterBarrier::arrive(&empty[stage]);
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }

    // Every consumer is done reading the stages before any overwrites them with its accumulators.
    asm volatile("bar.sync 1, 384;" ::: "memory");
    // acc[s][4 i + 2 h + e] holds row 16 warp + lane / 4 + 8 h, column 8 i + 2 (lane % 4) + e of tap (r, s)
    int const warp = thread_in_group / 32, lane = thread_in_group % 32;
    float *staging = reinterpret_cast<float *>(smem);
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < 3; ++s) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 8; ++i) {
        CUTLASS_PRAGMA_UNROLL
        for (int h = 0; h < 2; ++h) {
          int const row = 16 * warp + lane / 4 + 8 * h, column = 8 * i + 2 * (lane % 4);
          *reinterpret_cast<float2 *>(staging + ((r * 3 + s) * 64 + row) * kStagingRow + column) =
              make_float2(acc[s][4 * i + 2 * h], acc[s][4 * i + 2 * h + 1]);
        }
      }
    }
  }

  // The cluster's CTAs add their staged tiles: rank q sums output channels [q, q + 1) * 64 / kClusterZ of every tap
  // over the cluster's shared memories (in rank order) and writes them, 4 channels a thread.
  CUTLASS_DEVICE void reduce_cluster(Params const &params, char *smem, int c0, int k0) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    cute::cluster_arrive();  // release: this CTA's staging is written
    cute::cluster_wait();
    constexpr int kRowsPerRank = 64 / kClusterZ;
    constexpr int kVectors = 9 * kRowsPerRank * 16;  // float4s this CTA sums
    int const rank = int(blockIdx.z) % kClusterZ;
    uint32_t const local = cute::cast_smem_ptr_to_uint(smem);
    uint32_t remote[kClusterZ];
    CUTLASS_PRAGMA_UNROLL
    for (int q = 0; q < kClusterZ; ++q) {
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote[q]) : "r"(local), "r"(q));
    }
    long long const filter = 9LL * params.c;  // one output channel's R*S*C (KRSC, packed)
    long long const slice = (long long)(blockIdx.z / kClusterZ) * params.split_stride;
    for (int v = int(threadIdx.x); v < kVectors; v += MaxThreadsPerBlock) {
      int const column = (v % 16) * 4, rest = v / 16;
      int const row = rank * kRowsPerRank + rest % kRowsPerRank, tap = rest / kRowsPerRank;
      uint32_t const offset = uint32_t(((tap * 64 + row) * kStagingRow + column) * 4);
      float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
      CUTLASS_PRAGMA_UNROLL
      for (int q = 0; q < kClusterZ; ++q) {
        float4 part;
        asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(part.x), "=f"(part.y), "=f"(part.z), "=f"(part.w)
                     : "r"(remote[q] + offset));
        sum.x += part.x;
        sum.y += part.y;
        sum.z += part.z;
        sum.w += part.w;
      }
      long long const index = slice + (k0 + row) * filter + tap * params.c + c0 + column;
      cutlass::Array<float, 4> value;
      value[0] = params.alpha * sum.x;
      value[1] = params.alpha * sum.y;
      value[2] = params.alpha * sum.z;
      value[3] = params.alpha * sum.w;
      if (params.beta != 0.f) {
        auto const c = *reinterpret_cast<cutlass::Array<ElementC, 4> const *>(params.ptr_C + index);
        CUTLASS_PRAGMA_UNROLL
        for (int e = 0; e < 4; ++e) value[e] += params.beta * float(c[e]);
      }
      cutlass::NumericArrayConverter<ElementC, float, 4> convert;
      *reinterpret_cast<cutlass::Array<ElementC, 4> *>(params.ptr_D + index) = convert(value);
    }
    cute::cluster_arrive();  // no CTA leaves while a peer still reads its shared memory
    cute::cluster_wait();
#endif
  }
};

}  // namespace pycutlass_sm90_conv
#endif  // PYCUTLASS_FILTER_TAPS_WGRAD
