// pycutlass's persistent cooperative SM90 convolution kernel.
//
// CUTLASS 4.2 runs SM90 convolutions only through its non-persistent warp-specialized GEMM kernel: one consumer
// warpgroup per CTA and one output tile per CTA, so every tile pays the pipeline's fill and the whole epilogue with
// the tensor cores idle. This kernel keeps CUTLASS's conv collectives (im2col TMA mainloop, epilogue) and its
// Arguments/Params (it derives from the ConvUniversal it replaces) and changes the schedule around them:
//   - two consumer warpgroups split tile M (a 2x1 warpgroup TiledMma, as CUTLASS's cooperative GEMM);
//   - persistent CTAs: a grid of at most one cluster per SM-cluster slot walks the output tiles, so the producer
//     warp loads the next tile's stages while the consumers run the epilogue of the last one (the mainloop and
//     epilogue shared memory are separate, not a union).
// Tiles are taken cluster by cluster along M first (a cluster's CTAs always share the tile sequence, as their
// multicast needs). The tile grid rounded up to whole clusters is ConvUniversal's own (get_grid_shape).
#ifndef PYCUTLASS_SM90_CONV_PERSISTENT_COOPERATIVE
#define PYCUTLASS_SM90_CONV_PERSISTENT_COOPERATIVE

namespace pycutlass_sm90_conv {

// The mainloop's schedule tag. It derives from CUTLASS's conv schedule, so ConvUniversal (and the GEMM kernel it
// forwards to) supplies Arguments, Params, to_underlying_arguments and can_implement; the operator() is ours.
struct PersistentCooperative : cutlass::conv::KernelImplicitTmaWarpSpecializedSm90 {};

template <class Base>
class PersistentCooperativeKernel : public Base {
 public:
  using Params = typename Base::Params;
  using CollectiveMainloop = typename Base::CollectiveMainloop;
  using CollectiveEpilogue = typename Base::CollectiveEpilogue;
  using TiledMma = typename CollectiveMainloop::TiledMma;
  using TileShape = typename CollectiveMainloop::TileShape;
  using ClusterShape = typename CollectiveMainloop::DispatchPolicy::ClusterShape;
  static_assert(cute::is_same_v<typename CollectiveMainloop::DispatchPolicy::Schedule, PersistentCooperative>);

  static constexpr uint32_t NumMmaThreads = CUTE_STATIC_V(cute::size(TiledMma{}));
  static_assert(NumMmaThreads == 2 * cutlass::NumThreadsPerWarpGroup, "two consumer warpgroups");
  static constexpr uint32_t MaxThreadsPerBlock = NumMmaThreads + cutlass::NumThreadsPerWarpGroup;
  static constexpr uint32_t MinBlocksPerMultiprocessor = 1;
  // The producer warpgroup gives registers to the consumers (CUTLASS's cooperative GEMM's split).
  static constexpr uint32_t ProducerRegisters = 40;
  static constexpr uint32_t ConsumerRegisters = 232;

  struct SharedStorage {
    struct PipelineStorage : cute::aligned_struct<16, cute::_1> {
      alignas(16) typename CollectiveMainloop::PipelineStorage mainloop;
      alignas(16) typename CollectiveEpilogue::PipelineStorage epi_load;
    } pipelines;
    struct TensorStorage : cute::aligned_struct<128, cute::_1> {
      typename CollectiveEpilogue::TensorStorage epilogue;
      typename CollectiveMainloop::TensorStorage mainloop;
    } tensors;
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);

  // Clusters of the tile grid: (along M, along N).
  CUTLASS_HOST_DEVICE static dim3 cluster_grid(Params const &params) {
    dim3 tiles = Base::get_grid_shape(params);
    return dim3(tiles.x / cute::size<0>(ClusterShape{}), tiles.y / cute::size<1>(ClusterShape{}), 1);
  }

  // The persistent grid: (cluster M x clusters, cluster N, 1) CTAs, at most sm_count CTAs (whole clusters).
  CUTLASS_HOST_DEVICE static dim3 get_grid_shape(Params const &params, int sm_count) {
    constexpr int cluster_m = cute::size<0>(ClusterShape{}), cluster_n = cute::size<1>(ClusterShape{});
    dim3 clusters = cluster_grid(params);
    int total = int(clusters.x * clusters.y);
    int slots = sm_count / (cluster_m * cluster_n);
    int launched = total < slots ? total : slots;
    return dim3(cluster_m * (launched > 0 ? launched : 1), cluster_n, 1);
  }

  CUTLASS_DEVICE void operator()(Params const &params, char *smem_buf) {
    using namespace cute;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    SharedStorage &shared_storage = *reinterpret_cast<SharedStorage *>(smem_buf);
    int thread_idx = int(threadIdx.x);
    int lane_idx = cutlass::canonical_lane_idx();
    int warp_idx = cutlass::canonical_warp_idx_sync();
    int warp_in_group = warp_idx % cutlass::NumWarpsPerWarpGroup;
    int warp_group_thread_idx = thread_idx % cutlass::NumThreadsPerWarpGroup;
    bool is_producer = cutlass::canonical_warp_group_idx() == 0;
    int mma_thread_idx = thread_idx - int(cutlass::NumThreadsPerWarpGroup);  // consumers: 0..255
    int lane_predicate = cute::elect_one_sync();
    uint32_t block_rank_in_cluster = cute::block_rank_in_cluster();

    if (warp_idx == 0 && lane_predicate) {
      CollectiveMainloop::prefetch_tma_descriptors(params.mainloop);
      CollectiveEpilogue::prefetch_tma_descriptors(params.epilogue);
    }

    // Warp 0 of the producer warpgroup loads the mainloop's stages, warp 1 the epilogue's source C (when read).
    using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
    typename MainloopPipeline::Params mainloop_pipeline_params;
    if (is_producer && warp_in_group == 0) {
      mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Producer;
    }
    if (!is_producer) {
      mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Consumer;
    }
    mainloop_pipeline_params.is_leader = warp_group_thread_idx == 0;
    mainloop_pipeline_params.num_consumers = NumMmaThreads;
    mainloop_pipeline_params.transaction_bytes = params.mainloop.tma_transaction_bytes;
    MainloopPipeline mainloop_pipeline(shared_storage.pipelines.mainloop, mainloop_pipeline_params, ClusterShape{});

    using EpiLoadPipeline = typename CollectiveEpilogue::LoadPipeline;
    typename EpiLoadPipeline::Params epi_load_pipeline_params;
    if (is_producer && warp_in_group == 1) {
      epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Producer;
    }
    if (!is_producer) {
      epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Consumer;
    }
    epi_load_pipeline_params.dst_blockid = block_rank_in_cluster;
    epi_load_pipeline_params.producer_arv_count = cutlass::NumThreadsPerWarp;
    epi_load_pipeline_params.consumer_arv_count = NumMmaThreads;
    if constexpr (CollectiveEpilogue::RequiresTransactionBytes) {
      epi_load_pipeline_params.transaction_bytes = params.epilogue.tma_transaction_bytes;
    }
    EpiLoadPipeline epi_load_pipeline(shared_storage.pipelines.epi_load, epi_load_pipeline_params);

    using EpiStorePipeline = typename CollectiveEpilogue::StorePipeline;
    typename EpiStorePipeline::Params epi_store_pipeline_params;
    epi_store_pipeline_params.always_wait = true;
    EpiStorePipeline epi_store_pipeline(epi_store_pipeline_params);

    typename CollectiveMainloop::PipelineState mainloop_pipe_consumer_state;
    typename CollectiveEpilogue::LoadPipelineState epi_load_pipe_consumer_state;
    auto mainloop_pipe_producer_state = cutlass::make_producer_start_state<MainloopPipeline>();
    auto epi_load_pipe_producer_state = cutlass::make_producer_start_state<EpiLoadPipeline>();
    auto epi_store_pipe_producer_state = cutlass::make_producer_start_state<EpiStorePipeline>();

    // The pipelines' barriers must be initialized in every CTA of the cluster before any of them signals one.
    if constexpr (size(ClusterShape{}) > 1) {
      cute::cluster_arrive_relaxed();
      cute::cluster_wait();
    } else {
      __syncthreads();
    }

    auto blk_shape = TileShape{};
    TiledMma tiled_mma;
    auto problem_shape_MNKL = append<4>(params.problem_shape, Int<1>{});
    CollectiveMainloop collective_mainloop;
    CollectiveEpilogue collective_epilogue(params.epilogue, shared_storage.tensors.epilogue);
    auto load_inputs = collective_mainloop.load_init(problem_shape_MNKL, params.mainloop);
    Tensor gA_mkl = get<0>(load_inputs);  // (BLK_M, BLK_K, m, k)
    Tensor gB_nkl = get<1>(load_inputs);  // (BLK_N, BLK_K, n, k)
    auto k_tile_count = size<3>(gA_mkl);

    // This CTA's tiles: clusters first, first_cluster + i * cluster_stride, along M first; its place in the cluster.
    constexpr int cluster_m = size<0>(ClusterShape{});
    dim3 clusters = cluster_grid(params);
    int cluster_count = int(clusters.x * clusters.y);
    int first_cluster = int(blockIdx.x) / cluster_m;
    int cluster_stride = int(gridDim.x) / cluster_m;
    int m_in_cluster = int(blockIdx.x) % cluster_m;
    int n_in_cluster = int(blockIdx.y);
    auto tile_coord = [&](int cluster) {
      int m_tile = (cluster % int(clusters.x)) * cluster_m + m_in_cluster;
      int n_tile = (cluster / int(clusters.x)) * int(size<1>(ClusterShape{})) + n_in_cluster;
      return make_coord(idx2crd(m_tile, shape<2>(gA_mkl)), idx2crd(n_tile, shape<2>(gB_nkl)), _, Int<0>{});
    };

    if (is_producer) {
      cutlass::arch::warpgroup_reg_dealloc<ProducerRegisters>();
      if (warp_in_group == 0) {
        cutlass::arch::wait_on_dependent_grids();
        for (int cluster = first_cluster; cluster < cluster_count; cluster += cluster_stride) {
          collective_mainloop.load(params.mainloop, mainloop_pipeline, mainloop_pipe_producer_state, load_inputs,
                                   tile_coord(cluster), cute::make_coord_iterator(shape<3>(gA_mkl)), k_tile_count,
                                   lane_idx, block_rank_in_cluster, shared_storage.tensors.mainloop);
          mainloop_pipe_producer_state.advance(k_tile_count);
        }
        // No CTA of the cluster may exit while its multicast loads still target another's shared memory.
        collective_mainloop.load_tail(mainloop_pipeline, mainloop_pipe_producer_state);
      } else if (warp_in_group == 1 && collective_epilogue.is_producer_load_needed()) {
        cutlass::arch::wait_on_dependent_grids();
        for (int cluster = first_cluster; cluster < cluster_count; cluster += cluster_stride) {
          epi_load_pipe_producer_state = collective_epilogue.load(
              epi_load_pipeline, epi_load_pipe_producer_state, problem_shape_MNKL, blk_shape, tile_coord(cluster),
              tiled_mma, lane_idx, shared_storage.tensors.epilogue);
        }
        collective_epilogue.load_tail(epi_load_pipeline, epi_load_pipe_producer_state);
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<ConsumerRegisters>();
      bool stored = false;
      for (int cluster = first_cluster; cluster < cluster_count; cluster += cluster_stride) {
        auto blk_coord = tile_coord(cluster);
        Tensor accumulators = partition_fragment_C(tiled_mma, take<0, 2>(blk_shape));  // (MMA, MMA_M, MMA_N)
        collective_mainloop.mma(mainloop_pipeline, mainloop_pipe_consumer_state, accumulators, k_tile_count,
                                mma_thread_idx, shared_storage.tensors.mainloop, params.mainloop);
        // Waits for the tile's last MMAs and hands their stages back to the producer, which is already loading the
        // next tile while this epilogue runs.
        collective_mainloop.mma_tail(mainloop_pipeline, mainloop_pipe_consumer_state, k_tile_count);
        mainloop_pipe_consumer_state.advance(k_tile_count);
        auto [epi_load_next, epi_store_next] = collective_epilogue.store(
            epi_load_pipeline, epi_load_pipe_consumer_state, epi_store_pipeline, epi_store_pipe_producer_state,
            problem_shape_MNKL, blk_shape, blk_coord, accumulators, tiled_mma, mma_thread_idx,
            shared_storage.tensors.epilogue);
        epi_load_pipe_consumer_state = epi_load_next;
        epi_store_pipe_producer_state = epi_store_next;
        stored = true;
      }
      cutlass::arch::launch_dependent_grids();
      if (stored) {
        collective_epilogue.store_tail(epi_load_pipeline, epi_load_pipe_consumer_state, epi_store_pipeline,
                                       epi_store_pipe_producer_state);
      }
    }
#endif
  }
};

}  // namespace pycutlass_sm90_conv

#endif  // PYCUTLASS_SM90_CONV_PERSISTENT_COOPERATIVE
