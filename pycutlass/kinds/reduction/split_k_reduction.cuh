// pycutlass's split-K reduction: D = epilogue(sum of the workspace's partitions, C).
//
// CUTLASS's ReduceSplitK gives each output vector one thread, which walks every partition in dependent rounds of
// PartitionsPerStage loads. A parallel split-K over a long GEMM K has few output vectors and many partitions (a
// wgrad's 256 x 64 filter gradient in 64 slices: 2048 threads, 16 rounds), so that reduction is latency-bound and
// costs as much as a quarter of the GEMM before it. Here a CTA also spreads the partitions over `lanes` thread
// groups (blockDim.z, chosen by the builder from the partition count): lane l sums partitions l, l + lanes, ...,
// and lane 0 adds the other lanes' sums from shared memory, in lane order (so a result does not depend on timing),
// before the epilogue. With one lane it is ReduceSplitK's loop. Lanes are added only while the grid is small:
// a grid of many blocks already has loads enough in flight, and there the lanes' shared-memory pass costs more than
// it hides (measured on an H200: 0.86x at 256 x 2304 in 7 partitions). MaxLanes > 0 asks for that many lanes
// (within what fits and the partition count) instead.
#ifndef PYCUTLASS_SPLIT_K_REDUCTION
#define PYCUTLASS_SPLIT_K_REDUCTION

namespace pycutlass_reduction {

template <class Shape_, class OutputOp_, class ReductionOp_, int PartitionsPerStage, int MaxLanes = 0>
class SplitKReduction {
 public:
  using Shape = Shape_;
  using OutputOp = OutputOp_;
  using ReductionOp = ReductionOp_;
  static int const kElementsPerAccess = OutputOp::kCount;
  static int const kPartitionsPerStage = PartitionsPerStage;
  static int const kThreadsPerLane = Shape::kRow * (Shape::kColumn / kElementsPerAccess);

  using ElementWorkspace = typename ReductionOp::Element;
  using ElementAccumulator = typename ReductionOp::ElementAccumulator;
  using ElementOutput = typename OutputOp::ElementOutput;
  using WorkspaceTensorRef = cutlass::TensorRef<ElementWorkspace, cutlass::layout::RowMajor>;
  using OutputTensorRef = cutlass::TensorRef<ElementOutput, cutlass::layout::RowMajor>;
  using FragmentWorkspace = cutlass::AlignedArray<ElementWorkspace, kElementsPerAccess>;
  using FragmentAccumulator = cutlass::Array<ElementAccumulator, kElementsPerAccess>;
  using FragmentOutput = cutlass::AlignedArray<ElementOutput, kElementsPerAccess>;

  // The lanes' sums meet in at most 32 KiB of shared memory (no opt-in needed), one slot a thread of a block of at
  // most 1024; blockDim.z allows 64 lanes.
  static int const kSlots = int(32768 / sizeof(FragmentAccumulator)) < 1024 ? int(32768 / sizeof(FragmentAccumulator))
                                                                               : 1024;
  static int const kLanesThatFit = kSlots / kThreadsPerLane < 1 ? 1 : (kSlots / kThreadsPerLane > 64 ? 64
                                                                        : kSlots / kThreadsPerLane);
  static int const kMaxLanes = MaxLanes > 0 && MaxLanes < kLanesThatFit ? MaxLanes : kLanesThatFit;
  static int const kMaxThreads = kThreadsPerLane * kMaxLanes;  // the kernel's __launch_bounds__

  struct Params {
    cutlass::MatrixCoord problem_size;
    int partitions;
    int64_t partition_stride_bytes;
    WorkspaceTensorRef workspace;
    OutputTensorRef destination;
    OutputTensorRef source;
    typename OutputOp::Params output;
    typename ReductionOp::Params reduction;

    CUTLASS_HOST_DEVICE Params() {}
    CUTLASS_HOST_DEVICE Params(cutlass::MatrixCoord problem_size_, int partitions_, int64_t partition_stride,
                               WorkspaceTensorRef workspace_, OutputTensorRef destination_, OutputTensorRef source_,
                               typename OutputOp::Params output_)
        : problem_size(problem_size_), partitions(partitions_),
          partition_stride_bytes(partition_stride * int64_t(cutlass::sizeof_bits<ElementWorkspace>::value / 8)),
          workspace(workspace_), destination(destination_), source(source_), output(output_) {}
  };

  struct SharedStorage {
    FragmentAccumulator partial[kSlots];
  };

  CUTLASS_HOST_DEVICE static dim3 grid_shape(cutlass::MatrixCoord problem_size) {
    return dim3((problem_size.row() + Shape::kRow - 1) / Shape::kRow,
                (problem_size.column() + Shape::kColumn - 1) / Shape::kColumn);
  }

  // The grid's threads at which lanes stop paying: about 8 MiB of 32-byte loads in flight, one stage each.
  static int const kTargetThreads = 65536;

  // Lanes for `partitions` over a grid of `blocks`: about one stage of loads a thread, until the grid holds
  // kTargetThreads; within the shared memory and blockDim.z limits.
  CUTLASS_HOST_DEVICE static int lanes(int partitions, int64_t blocks) {
    int wanted;
    if (MaxLanes > 0) {
      wanted = partitions < MaxLanes ? partitions : MaxLanes;
    } else {
      wanted = (partitions + kPartitionsPerStage - 1) / kPartitionsPerStage;
      int64_t threads = blocks > 0 ? blocks * kThreadsPerLane : 1;  // an empty grid launches nothing
      int to_fill = int((kTargetThreads + threads - 1) / threads);
      wanted = to_fill < wanted ? to_fill : wanted;
    }
    return wanted < 1 ? 1 : (wanted > kMaxLanes ? kMaxLanes : wanted);
  }

  CUTLASS_HOST_DEVICE static dim3 block_shape(cutlass::MatrixCoord problem_size, int partitions) {
    dim3 grid = grid_shape(problem_size);
    return dim3(Shape::kColumn / kElementsPerAccess, Shape::kRow, lanes(partitions, int64_t(grid.x) * grid.y));
  }

  CUTLASS_HOST_DEVICE static int shared_memory_bytes(dim3 block) {
    return block.z > 1 ? int(block.z * kThreadsPerLane * sizeof(FragmentAccumulator)) : 0;
  }

  CUTLASS_DEVICE void operator()(Params const &params, SharedStorage &storage) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Launched with programmatic dependent launch, the blocks may start while the kernel that writes the workspace
    // drains: wait for it before the first global access (without PDL this returns at once).
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    cutlass::MatrixCoord coord(int(blockIdx.x) * Shape::kRow + int(threadIdx.y),
                               int(blockIdx.y) * Shape::kColumn + int(threadIdx.x) * kElementsPerAccess);
    bool const inside = coord.row() < params.problem_size.row() && coord.column() < params.problem_size.column();
    int const lane = int(threadIdx.z);
    int const lane_count = int(blockDim.z);

    ReductionOp reduction_op(params.reduction);
    FragmentAccumulator accumulator;
    accumulator.clear();
    if (inside) {
      char const *ptr = reinterpret_cast<char const *>(params.workspace.data() + params.workspace.offset(coord)) +
                        lane * params.partition_stride_bytes;
      int64_t const step = lane_count * params.partition_stride_bytes;
      CUTLASS_PRAGMA_NO_UNROLL
      for (int k = lane; k < params.partitions; k += lane_count * kPartitionsPerStage) {
        FragmentWorkspace loaded[kPartitionsPerStage];
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kPartitionsPerStage; ++i) {
          if (k + i * lane_count < params.partitions) {
            loaded[i] = *reinterpret_cast<FragmentWorkspace const *>(ptr);
            ptr += step;
          }
        }
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kPartitionsPerStage; ++i) {
          if (k + i * lane_count < params.partitions) {
            accumulator = reduction_op(accumulator, loaded[i]);
          }
        }
      }
    }

    if (lane_count > 1) {  // uniform across the CTA
      int const slot = int(threadIdx.x) + int(blockDim.x) * int(threadIdx.y);
      storage.partial[lane * kThreadsPerLane + slot] = accumulator;
      __syncthreads();
      if (lane != 0) {
        return;
      }
      cutlass::plus<FragmentAccumulator> add;
      for (int other = 1; other < lane_count; ++other) {
        accumulator = add(accumulator, storage.partial[other * kThreadsPerLane + slot]);
      }
    }
    if (!inside) {
      return;
    }

    OutputOp output_op(params.output);
    FragmentOutput source;
    source.clear();
    if (output_op.is_source_needed()) {
      source = *reinterpret_cast<FragmentOutput const *>(params.source.data() + params.source.offset(coord));
    }
    typename OutputOp::FragmentOutput result = output_op(accumulator, source);
    *reinterpret_cast<FragmentOutput *>(params.destination.data() + params.destination.offset(coord)) =
        reinterpret_cast<FragmentOutput const &>(result);
  }
};

}  // namespace pycutlass_reduction

#endif  // PYCUTLASS_SPLIT_K_REDUCTION
