"""Rank a search space for a problem before anything compiles, so tuning compiles only the likely winners.

    ranked = rank(SearchSpace.preset("sm90-f16").build(), GemmProblem(4096, 4096, 4096), device="H100")
    for candidate in ranked[:8]:
        print(candidate.score, candidate.reason, candidate.point.operation.name)

The score is an estimated fraction of the device's peak tensor throughput (higher is better), from a pure-Python
model of one GEMM (a grouped GEMM is the same model over its groups in one persistent launch, a convolution the
implicit GEMM of its kind): tile quantization and waves over the SMs, the mainloop's arithmetic intensity per tile (a
cluster's TMA multicast halves the loads of the shared operand), the kernel schedule (persistent cooperative and
ping-pong hide a tile's epilogue behind the next tile, the plain warp-specialized kernel runs a CTA per tile and is
the one to beat in a single wave; stream-K for problems under one wave), accumulator registers per consumer thread
(spills), memory bandwidth for skinny problems, and occupancy on the Sm80 family. Compute and memory time combine
by a smooth maximum: limits that come close cost more than either. Deterministic and free of any GPU.

``model="analytic"`` (the default) is this model alone. ``model="nvmmh"`` takes NVIDIA's nvMatmulHeuristics
(``pip install nvidia-matmul-heuristics``, the ``rank`` extra) for the tile/cluster/stage estimate, with this
model's schedule and register terms on top; ``model="auto"`` does so when it is installed. On grids measured on an
H100 the model alone ranked better (docs/design/ranking.md), hence the default. ``history`` (a ResultsDB, its path, or ``(kernel, problem key,
seconds)`` rows) reranks by measured results for shapes within 2x of the problem: kernels that did well there move up.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from ..description.types import DataType
from ..errors import ArgumentError, DescriptionError
from ..kinds.base import Operation
from ..kinds.families.sm90 import automatic_stages, epilogue_tile_shape
from .space import accumulator_register_limit, sm90_schedule


# ---- devices ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceModel:
    """What the ranking needs to know about a GPU: SMs, dense 16-bit tensor peak, DRAM and L2 bandwidth."""

    name: str
    compute_capability: int
    sm_count: int
    peak_flops_16bit: float  # dense f16/bf16 tensor-core FLOP/s
    dram_bytes_per_s: float
    l2_bytes_per_s: float
    smem_per_sm: int  # bytes a CTA may use (Sm80-family occupancy)
    nvmmh_gpu: str | None = None  # nvMatmulHeuristics' predefined GPU name


DEVICES = {
    "H100": DeviceModel("H100", 90, 132, 989e12, 3.35e12, 10e12, 227 * 1024, "H100_SXM"),
    "H200": DeviceModel("H200", 90, 132, 989e12, 4.8e12, 10e12, 227 * 1024, "H200_SXM"),
    "A100": DeviceModel("A100", 80, 108, 312e12, 2.0e12, 5e12, 163 * 1024, "A100_SXM_80GB"),
    "A10": DeviceModel("A10", 86, 72, 125e12, 0.6e12, 2e12, 99 * 1024, "A10_PCIE"),
    "L40S": DeviceModel("L40S", 89, 142, 362e12, 0.86e12, 3e12, 99 * 1024, "L40S"),
}
_BY_CC = {90: "H100", 80: "A100", 86: "A10", 89: "L40S"}


def device_model(device=None, *, compute_capability: int | None = None, sm_count: int | None = None) -> DeviceModel:
    """A DeviceModel from a name in ``DEVICES``, a DeviceModel, or (None) the compute capability's usual GPU; a
    GPU name such as "NVIDIA H100 80GB HBM3" matches by its model word. ``sm_count`` overrides the SM count."""
    if isinstance(device, DeviceModel):
        found = device
    elif device is None:
        found = DEVICES[_BY_CC.get(compute_capability or 90, "H100")]
    elif isinstance(device, str):
        words = device.upper().replace("-", " ").split()
        names = [name for name in DEVICES if name in words or device.upper() == name]
        if not names:
            raise ArgumentError(f"rank: unknown device {device!r}; give one of {list(DEVICES)} or a DeviceModel")
        found = DEVICES[names[0]]
    else:
        raise ArgumentError(f"rank: device must be a name from {list(DEVICES)}, a DeviceModel or None, got {device!r}")
    if sm_count is not None:
        if not isinstance(sm_count, int) or isinstance(sm_count, bool) or sm_count < 1:
            raise ArgumentError(f"rank: sm_count must be a positive integer, got {sm_count!r}")
        found = replace(found, sm_count=sm_count)
    return found


# ---- what a point is, for the model ---------------------------------------------------------------------------------
_PEAK_SCALE = {16: 1.0, 8: 2.0, 32: 0.5, 64: 0.0675}  # tensor peak relative to 16-bit (tf32 half, f64 ~1/15)


@dataclass(frozen=True)
class Config:
    """The fields of one candidate that the model reads."""

    cc: int
    tile: tuple[int, int, int]
    cluster: tuple[int, int]
    schedule: str  # cooperative | pingpong | warpspecialized | sm80
    stream_k: bool
    stages: int
    warps: int
    a_bits: int
    c_bits: int
    acc_bits: int
    ctas_per_sm: int = 1  # SM90: two for a convolution whose explicit stages fit half an SM
    epilogue_tile: tuple[int, int] | None = None  # SM90: an explicit TMA-epilogue sub-tile (None: CUTLASS's own)
    fused_epilogue: bool = True  # a bias or an activation: the epilogue holds registers beside the accumulators
    conv_kind: str | None = None  # a convolution's kind (fprop, dgrad, wgrad): which implicit GEMM it computes

    @property
    def sm90(self) -> bool:
        return self.schedule != "sm80"

    @property
    def consumer_warpgroups(self) -> int:
        # cooperative: two warpgroups split the tile's M; ping-pong and the plain warp-specialized kernel compute a
        # whole tile with one warpgroup
        return 2 if self.schedule == "cooperative" else 1

    @property
    def accumulator_registers(self) -> int:
        """32-bit accumulator registers per consumer thread (SM90: a warpgroup is 128 threads)."""
        threads = 128 * self.consumer_warpgroups if self.sm90 else 32 * self.warps
        return self.tile[0] * self.tile[1] * self.acc_bits // 32 // threads


def _label_bits(element) -> int:
    if hasattr(element, "bits"):
        return element.bits
    from .space import DATA_TYPES

    found = DATA_TYPES.get(str(element))
    return found.bits if found is not None else 16


def _schedule_of(name: str, tile_m: int, sm90: bool, kind: str = "gemm") -> str:
    return sm90_schedule(name, tile_m, kind) if sm90 else "sm80"


def config_of(item) -> Config:
    """The model's view of a candidate: a SpacePoint, a params dict, a (params, operation) pair or an operation."""
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Mapping):
        item = item[0]
    params = getattr(item, "params", None) if not isinstance(item, Mapping) else item
    if isinstance(params, Mapping) and "threadblock_shape" in params:
        from .space import resolve_params

        p = resolve_params({k: v for k, v in params.items() if k != "bias"})
        tile = tuple(p["threadblock_shape"])
        cc = p["compute_capability"]
        sm90 = cc == 90 and p["warp_count"] is None  # the SM90 family of every kind (space.resolve_params)
        cluster = tuple(p.get("cluster_shape", [1, 1, 1]))[:2]
        schedule = _schedule_of(p.get("kernel_schedule", "Auto"), tile[0], sm90, p["kind"])
        warps = math.prod(p["warp_count"]) if p["warp_count"] else 4
        ctas = 1
        if sm90 and p["kind"] == "conv2d" and p["stages"]:  # the operation says whether its stages fit two CTAs
            operation = getattr(item, "operation", None)
            if operation is None:
                from .space import build_operation

                try:
                    operation = build_operation(p)
                except DescriptionError:  # rejected: the space prunes it; ranked as one CTA meanwhile
                    pass
            ctas = getattr(operation, "ctas_per_sm", 1)
        epilogue_tile = p.get("epilogue_tile")
        return Config(cc, tile, cluster, schedule, p.get("tile_scheduler") == "StreamK", p["stages"], warps,
                      _label_bits(p["element_a"]), _label_bits(p["element_c"]),
                      _label_bits(p["element_accumulator"]), ctas,
                      tuple(epilogue_tile) if isinstance(epilogue_tile, (tuple, list)) else None,
                      bool(params.get("bias")) or p.get("epilogue", "linear_combination") != "linear_combination",
                      p.get("conv_kind") if p["kind"] == "conv2d" else None)
    td = getattr(item, "tile_description", None)
    if td is None:
        raise ArgumentError(f"rank: cannot read a configuration from {type(item).__name__}; give SpacePoints, "
                            f"params dicts or operations")
    mi = td.math_instruction
    sm90 = getattr(item, "family", "") == "sm90"
    tile = tuple(td.threadblock_shape)
    kind = {"conv2d": "conv2d", "gemm_grouped": "grouped_gemm"}.get(str(getattr(item, "kind", "")).split("_sm")[0],
                                                                    "gemm")  # the space's kind names
    # an SM90 convolution knows the schedule its Auto resolved to
    resolved = getattr(item, "kernel_schedule", None) if kind == "conv2d" else None
    schedule = _schedule_of(getattr(resolved or td.kernel_schedule, "name", "Auto"), tile[0], sm90, kind)
    warps = math.prod(td.warp_count) if td.warp_count else 4
    return Config(getattr(item, "compute_capability", 90 if sm90 else 80), tile, tuple(td.cluster_shape)[:2],
                  schedule, getattr(td.tile_scheduler, "name", "") == "StreamK", td.stages, warps,
                  _label_bits(mi.element_a), _label_bits(item.C.element), _label_bits(mi.element_accumulator),
                  getattr(item, "ctas_per_sm", 1) if sm90 else 1,
                  tuple(td.epilogue_tile) if sm90 and getattr(td, "epilogue_tile", None) else None,
                  bool(getattr(item, "bias", None)) or
                  getattr(getattr(item, "epilogue_functor", None), "kind", "LinearCombination") != "LinearCombination",
                  getattr(getattr(item, "conv_kind", None), "name", None) if kind == "conv2d" else None)


# ---- cannot win: a rule the space applies before ranking -------------------------------------------------------------
def cannot_win(config: Config) -> str | None:
    """Why a configuration loses on every shape (so it is not worth compiling), or None. Only rules about valid
    configurations: what the descriptions reject keeps their own reason."""
    tm, tn, _ = config.tile
    valid = tm % 128 == 0 if config.schedule == "cooperative" else tm in (64, 128) and not config.stream_k
    if not config.sm90 or not valid:
        return None
    if config.accumulator_registers > accumulator_register_limit(config.schedule, config.fused_epilogue):
        return (f"cannot win: accumulators spill registers ({config.schedule} {tm}x{tn} tile, "
                f"{config.accumulator_registers} per consumer thread)")
    return None


# ---- the SM90 epilogue tile -----------------------------------------------------------------------------------------
# Stream-K past one wave (CUTLASS's data-parallel waves, then the remainder split over K): H200 ran cooperative
# 128x256 and 256x128 stream-K tiles 1.16-1.25x slower than this model's time on bf16 6304x3072x768 (4.55 waves, 12
# k-blocks), where ping-pong 128x192 and 128x128 ran 0.9x of theirs and were 25% faster outright.
_STREAM_K_PAST_ONE_WAVE = 1.22
_EPILOGUE_ROUND = 0.07  # one sub-tile round (a barrier of the consumer warpgroups, a TMA store issued and waited on),
# relative to the time of writing the whole tile's bytes: on H200, a store-bound MoE weight gradient ran 11% faster
# in four rounds of 128x64 than in CUTLASS's eight of 128x32
_TWO_STAGE_MAINLOOP = 0.7  # a main loop left 2 stages: 128x128 buffers on a 128x256 tile ran forward GEMMs 35-55%
# slower on H200


def epilogue_tile_factors(config: Config, k_iterations: int) -> tuple[float, float]:
    """(main-loop efficiency, epilogue store time) of an explicit SM90 epilogue tile relative to CUTLASS's automatic
    one, (1, 1) without one. A wider sub-tile writes a tile in fewer rounds, each behind a barrier, but its larger
    buffers take shared memory from the main loop: with ``stages=0`` the main loop gets what is left, and two stages
    cannot hide the loads of a K loop longer than they are (a short one is loaded whole ahead of the MMAs)."""
    if not config.sm90 or config.epilogue_tile is None:
        return 1.0, 1.0
    cooperative = config.schedule == "cooperative"
    element_c = DataType.float32 if config.c_bits == 32 else DataType.float16  # explicit tiles: 16- or 32-bit D
    tm, tn, _ = config.tile

    def rounds(epilogue_tile):
        epi_m, epi_n = epilogue_tile_shape(config.tile, cooperative, element_c, epilogue_tile)
        return (tm // epi_m) * (tn // epi_n)

    def stages(epilogue_tile):
        return config.stages or automatic_stages(config.tile, config.a_bits, cooperative, element_c, epilogue_tile)

    def efficiency(epilogue_tile):
        return _TWO_STAGE_MAINLOOP if stages(epilogue_tile) <= 2 < k_iterations else 1.0

    mainloop = efficiency(config.epilogue_tile) / efficiency(None)
    store = (1 + _EPILOGUE_ROUND * rounds(config.epilogue_tile)) / (1 + _EPILOGUE_ROUND * rounds(None))
    return mainloop, store


# ---- the analytic model ---------------------------------------------------------------------------------------------
_LAUNCH_S = 3e-6  # launch and pipeline fill
_INTENSITY_HALF = 20.0  # FLOP per byte of operand loads at which the mainloop reaches half its peak
_FILL_S = 1.0e-6  # a tile's pipeline prologue: the first stages' load latency before its first MMA
_OVERLAP = 3.0  # the exponent of the smooth maximum below (1.5-16 rank alike at K = 8 on the measured sweeps)


def _combine(*times: float) -> float:
    """Limits that overlap (the tensor cores' time, the memory system's) cost more than the larger one when they are
    close: loads stall MMAs and MMAs delay the next loads. A smooth maximum, (a^p + b^p)^(1/p): equal limits cost
    1.26x either at p = 3, one at a third of the other adds 1%."""
    top = max(times)
    return top * sum((t / top) ** _OVERLAP for t in times) ** (1 / _OVERLAP) if top > 0 else 0.0


@dataclass(frozen=True)
class Estimate:
    seconds: float
    reason: str


def _problem_shape(problem) -> tuple[int, int, int, int]:
    try:
        return int(problem.m), int(problem.n), int(problem.k), int(getattr(problem, "batch", 1))
    except AttributeError:
        raise ArgumentError(f"rank: the problem must be a GemmProblem (m, n, k, batch), got {problem!r}") from None


def gemm_groups(problem, conv_kind: str | None = None) -> list[tuple[int, int, int, int]]:
    """The (M, N, K, batch) GEMMs one launch computes for ``problem``: a GEMM itself, a grouped GEMM's groups (the
    masked layout's rows up to each count), a convolution's implicit GEMM of ``conv_kind`` (fprop by default)."""
    kind = getattr(problem, "kind", "gemm")
    if kind == "grouped_gemm":
        return [(m, n, k, 1) for m, n, k in problem.shapes]
    if kind == "masked_grouped_gemm":
        return [(count, problem.n, problem.k, 1) for count in problem.counts if count] or [(1, problem.n, problem.k, 1)]
    if kind == "conv2d":
        return [(*problem.gemm_shape(conv_kind or "fprop"), 1)]
    return [_problem_shape(problem)]


_GROUPS_OF_KIND = ("grouped_gemm", "masked_grouped_gemm", "conv2d")  # the kinds gemm_groups reads besides GEMM


def _is_gemm(problem) -> bool:
    return getattr(problem, "kind", "gemm") == "gemm" and hasattr(problem, "m")


def estimate(config: Config, problem, device: DeviceModel) -> Estimate:
    """Estimated seconds of one configuration on one problem, and the terms that decided it.

    A grouped GEMM (and a convolution's implicit GEMM) is the same model over its groups: one persistent launch
    spreads every group's tiles over the SMs, so waves count all the tiles, each tile costs what its own group's K
    asks, and memory moves every group's operands."""
    groups = gemm_groups(problem, config.conv_kind)
    tm, tn, tk = config.tile
    cm, cn = config.cluster
    a_bytes, c_bytes = config.a_bits / 8, config.c_bits / 8
    peak = device.peak_flops_16bit * _PEAK_SCALE.get(config.a_bits, 1.0)
    if config.cc != device.compute_capability and config.sm90 != (device.compute_capability == 90):
        peak *= 0.5  # a kernel of the other family still runs, but not as designed
    # per group: its tiles (a cluster launches whole: round the grid up to it) and K iterations per tile
    tiles_of = [math.ceil(math.ceil(M / tm) / cm) * cm * math.ceil(math.ceil(N / tn) / cn) * cn * batch
                for M, N, K, batch in groups]
    k_iters_of = [max(1, math.ceil(K / tk)) for _, _, K, _ in groups]
    tiles = sum(tiles_of)
    quantization = sum(M * N * batch for M, N, _, batch in groups) / (tiles * tm * tn)

    # Mainloop efficiency from the tile's arithmetic intensity; multicast shares A across a cluster's N and B across
    # its M, halving the shared operand's loads.
    loads = (tm / cn + tn / cm) * tk * a_bytes
    intensity = 2 * tm * tn * tk / loads
    efficiency = intensity / (intensity + _INTENSITY_HALF)
    notes = [f"{tm}x{tn} AI {intensity:.0f}"]
    if len(groups) > 1:
        notes.append(f"{len(groups)} groups")
    if cm * cn > 1:
        notes.append(f"cluster {cm}x{cn} multicast")
    if config.sm90:
        if config.schedule == "pingpong" and tm == 64:
            # one 64-row wgmma per k-step and the two warpgroups' ordered mainloops: measured on H200 sweeps, a
            # 64-row ping-pong tile runs 10-35% behind the plain kernel's over a long K
            efficiency *= 0.85
        if config.schedule == "cooperative" and tm == 128 and tn <= 64:
            efficiency *= 0.92  # two warpgroups on a small tile: 64x64 per warpgroup, little work per barrier
        resident = config.ctas_per_sm
        factors = [epilogue_tile_factors(config, k_iters) for k_iters in k_iters_of]
        if config.epilogue_tile is not None:
            notes.append(f"epilogue tile {config.epilogue_tile[0]}x{config.epilogue_tile[1]}")
    else:
        factors = [(1.0, 1.0)] * len(groups)
        smem = config.stages * (tm + tn) * tk * a_bytes
        # registers allow about 16 warps at 128 per thread (65536 per SM)
        resident = max(1, min(int(device.smem_per_sm // max(smem, 1)), 16 // max(1, config.warps)))
        # a single resident CTA cannot hide its own epilogue and barriers; two or more overlap them
        efficiency *= 0.88 if resident == 1 else 1.0
        efficiency *= min(1.0, 0.7 + 0.1 * config.stages)
    spill = config.accumulator_registers > (accumulator_register_limit(config.schedule, config.fused_epilogue)
                                            if config.sm90 else 255)
    if spill:
        efficiency *= 0.06
        notes.append(f"{config.accumulator_registers} accumulator registers/thread spill")

    slots = (device.sm_count // (cm * cn)) * (cm * cn) * resident
    per_slot = peak / (device.sm_count * resident)
    epilogue_s = tm * tn * c_bytes / (device.dram_bytes_per_s / device.sm_count)
    # a tile's mainloop and epilogue times, averaged over all tiles (one group: exactly its own)
    t_main = sum(count * 2.0 * tm * tn * tk * k_iters / (per_slot * efficiency * mainloop)
                 for count, k_iters, (mainloop, _) in zip(tiles_of, k_iters_of, factors)) / tiles
    t_epilogue = sum(count * epilogue_s * store for count, (_, store) in zip(tiles_of, factors)) / tiles
    k_iters = sum(count * k for count, k in zip(tiles_of, k_iters_of)) / tiles
    # What of a tile's epilogue the next tile's work hides: a persistent ping-pong CTA runs the other warpgroup's
    # mainloop meanwhile, a cooperative one only has its producer load ahead. The plain warp-specialized kernel is
    # not persistent (a CTA per tile): nothing hides its epilogue, and each tile past the first wave pays its own
    # pipeline prologue; in one wave that costs nothing, and it runs a 64-row tile without the ping-pong barriers.
    hidden = {"pingpong": 0.75, "cooperative": 0.4}.get(config.schedule, 0.0)
    if config.ctas_per_sm > 1:
        hidden = max(hidden, 0.5)  # the other resident CTA's mainloop runs under this one's epilogue
    rounds = math.ceil(tiles / slots)  # tiles per CTA (persistent) or waves of CTAs
    # a CTA's last tile has nothing to hide its epilogue behind: with one tile per CTA, the persistent schedules'
    # overlap buys nothing
    t_stores = t_epilogue * (1 + (rounds - 1) * (1 - hidden))
    waves = tiles / slots
    if config.stream_k:
        # stream-K splits the K loop of all tiles evenly over the SMs: no idle last wave, but partial tiles are
        # reduced through global memory (a fixup per split tile)
        units = tiles * k_iters
        share = max(1, math.ceil(units / slots))
        fixup = t_epilogue * (1 - hidden) if tiles % slots else 0.0  # split tiles' partial sums through memory
        t_compute = share * t_main / k_iters * 1.04 + t_stores + fixup
        if waves > 1:
            t_compute *= _STREAM_K_PAST_ONE_WAVE
        notes.append(f"stream-K {waves:.2f} waves")
    else:
        t_compute = rounds * t_main + t_stores
        if config.schedule == "warpspecialized":
            t_compute += (rounds - 1) * _FILL_S
        balance = tiles / (rounds * slots)
        notes.append(f"{waves:.2f} waves ({balance:.0%} busy)")
    # Memory floor: DRAM reads A and B once and writes C; L2 feeds every tile's loads. Few CTAs cannot pull full
    # bandwidth (about 60% of the SMs saturate DRAM on a Hopper).
    active = min(tiles, slots) if not config.stream_k else min(slots, tiles * k_iters)
    pull = min(1.0, active / (0.6 * slots))
    dram = sum(((M + N) * K * a_bytes + M * N * c_bytes) * batch for M, N, K, batch in groups)
    if config.stream_k and math.ceil(tiles * k_iters / slots) < k_iters:
        dram += min(slots, tiles * k_iters) * tm * tn * 4 * 2  # split tiles' float32 partials, written and read
    l2 = tiles * k_iters * loads
    t_memory = max(dram / device.dram_bytes_per_s, l2 / device.l2_bytes_per_s) / pull
    seconds = _combine(t_compute, t_memory) + _LAUNCH_S
    if t_memory > t_compute:
        notes.append(f"memory-bound ({pull:.0%} of bandwidth)")
    if quantization < 0.9:
        notes.append(f"{quantization:.0%} of the tiles' area used")
    return Estimate(seconds, ", ".join(notes))


# ---- nvMatmulHeuristics (optional) ----------------------------------------------------------------------------------
class _Nvmmh:
    """NVIDIA's analytic model for a (tile, cluster, stages) configuration; it has no notion of kernel schedules."""

    def __init__(self, device: DeviceModel):
        import ctypes

        from nvMatmulHeuristics import (NvMatmulHeuristicsInterfaceEx, NvMatmulHeuristicsMatmulLayout,
                                        NvMatmulHeuristicsNvidiaGpu, NvMatmulHeuristicsTarget)

        self._ctypes = ctypes
        target = NvMatmulHeuristicsTarget.CUTLASS3
        gpu = getattr(NvMatmulHeuristicsNvidiaGpu, device.nvmmh_gpu or "", None)
        self.lib = NvMatmulHeuristicsInterfaceEx(backend=target, gpu=gpu)
        self.layout = NvMatmulHeuristicsMatmulLayout.TN_ROW_MAJOR
        self.target = int(target)

    def seconds(self, config: Config, problem) -> float | None:
        # its precision names: operands, compute, output (H f16, S f32). Its 0.1 release estimates no bf16 GEMM
        # ("B" is not bfloat16 there); bf16 runs at f16's rate with f16's bytes on tensor cores, so f16 stands in.
        if not config.sm90 or config.a_bits != 16 or config.acc_bits != 32 or config.c_bits not in (16, 32):
            return None
        precision = "HS" + ("H" if config.c_bits == 16 else "S")
        M, N, K, batch = _problem_shape(problem)
        lib, ctypes = self.lib, self._ctypes
        lib._ensure_discovery_loaded(lib.target, precision, self.layout)
        matmul = lib.makeNvMatmulHeuristicsProblem(M, N, K, self.layout, batch)
        kernel = lib.nvmmhKernelConfiguration()
        tm, tn, tk = config.tile
        kernel.cta[:] = (tm, tn, tk)
        kernel.warp[:] = (64, min(tn, 64), tk)
        kernel.instr[:] = (64, 8, 16)
        kernel.splitK, kernel.loadStages, kernel.gridSwizzle, kernel.ctaOrder = 1, config.stages or 4, 1, 0
        kernel.cluster[:] = config.cluster
        # (the wrapper's own estimateRuntime/estimateSiliconMetric are broken in 0.1: call the C entry point)
        value = lib.nvMatmulHeuristicsEstimateRuntime(lib.handle, precision.encode(), ctypes.c_int(self.target),
                                                      ctypes.byref(matmul), ctypes.byref(kernel),
                                                      lib.hardware_descriptor)
        return value if value and value > 0 and math.isfinite(value) else None


def _nvmmh(device: DeviceModel, model: str):
    if model == "analytic" or device.compute_capability != 90:  # (used for SM90 configurations only)
        return None
    try:
        return _Nvmmh(device)
    except Exception as error:  # noqa: BLE001 - not installed, or a library this wrapper does not know
        if model == "nvmmh":
            raise ArgumentError(f"rank: model='nvmmh' needs nvidia-matmul-heuristics (pip install "
                                f"'pycutlass[rank]'): {error}") from None
        return None


# ---- measured history ------------------------------------------------------------------------------------------------
def _parse_shape(problem_key: str):
    import re

    found = re.match(r"gemm (\d+)x(\d+)x(\d+)(?: b(\d+))?$", problem_key or "")
    return tuple(int(v) for v in found.groups(default="1")) if found else None


def _history_rows(history) -> list[tuple[str, str, float]]:
    if history is None:
        return []
    if isinstance(history, (str, os.PathLike)):  # rank sits below the results DB: the caller opens it
        raise ArgumentError("rank: history must be an open ResultsDB (ResultsDB(path, read_only=True)) or "
                            "(kernel, problem key, seconds) rows, not a path")
    if hasattr(history, "results"):
        return list(history.results())
    try:
        rows = [tuple(row) for row in history]
    except TypeError:
        rows = None
    if rows is None or any(len(row) != 3 for row in rows):
        raise ArgumentError("rank: history must be a ResultsDB or (kernel, problem key, seconds) rows")
    return rows


def history_scores(rows, names: Iterable[str], problem) -> dict[str, float]:
    """Per kernel, the geometric mean of (best time / its time) over measured shapes within 2x of ``problem`` in
    each of M, N and K (same batch), counting only the given kernel names (the same operation class)."""
    M, N, K, batch = _problem_shape(problem)
    names = set(names)
    by_shape: dict[tuple, dict[str, float]] = {}
    for kernel, key, seconds in rows:
        shape = _parse_shape(key)
        if kernel not in names or shape is None or not seconds or seconds <= 0 or shape[3] != batch:
            continue
        if all(0.5 <= have / want <= 2.0 for have, want in zip(shape[:3], (M, N, K))):
            by_shape.setdefault(shape, {})[kernel] = min(seconds, by_shape.get(shape, {}).get(kernel, math.inf))
    logs: dict[str, list[float]] = {}
    for timings in by_shape.values():
        best = min(timings.values())
        for kernel, seconds in timings.items():
            logs.setdefault(kernel, []).append(math.log(best / seconds))
    return {kernel: math.exp(sum(values) / len(values)) for kernel, values in logs.items()}


# ---- rank ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ranked:
    """One ranked candidate: ``score`` is the estimated fraction of peak (with history: reweighted), higher first."""

    point: Any
    score: float
    reason: str

    def __iter__(self):  # unpacks as (point, score, reason)
        return iter((self.point, self.score, self.reason))


def _points(points) -> list:
    if hasattr(points, "points") and callable(points.points):  # a SearchSpace: its buildable points
        return [p for p in points.points() if p.valid]
    if hasattr(points, "operations") and hasattr(points, "params_of"):  # a BuiltSpace
        return list(points.operations)
    return [p for p in points if getattr(p, "valid", True)]


def _name_of(item) -> str | None:
    """The operation's name, or None for a params dict (nothing built yet)."""
    operation = item[1] if isinstance(item, tuple) and len(item) == 2 else getattr(item, "operation", item)
    return operation.name if isinstance(operation, Operation) else None


def rank(points, problem, device=None, history=None, *, sm_count: int | None = None,
         model: str = "analytic") -> list[Ranked]:
    """``points`` (SpacePoints, (params, operation) pairs, params dicts, operations, a SearchSpace or BuiltSpace)
    best first for ``problem`` on ``device`` (a name from ``DEVICES``, a DeviceModel, or None: the usual GPU of the
    points' compute capability). Ties keep the input order, so the result is deterministic."""
    if model not in ("auto", "analytic", "nvmmh"):
        raise ArgumentError(f"rank: model must be 'auto', 'analytic' or 'nvmmh', got {model!r}")
    items = _points(points)
    if not items:
        return []
    configs = [config_of(item) for item in items]
    gemm = _is_gemm(problem)
    if not gemm and getattr(problem, "kind", None) not in _GROUPS_OF_KIND:
        raise ArgumentError(f"rank: the problem must be a GemmProblem, GroupedGemmProblem, MaskedGroupedProblem or "
                            f"Conv2dProblem (pycutlass.tune.problems), got {problem!r}")
    dev = device_model(device, compute_capability=configs[0].cc, sm_count=sm_count)
    nvmmh = _nvmmh(dev, model) if gemm else None  # NVIDIA's model estimates one GEMM
    estimates = [estimate(config, problem, dev) for config in configs]
    seconds = [found.seconds for found in estimates]
    reasons = [found.reason for found in estimates]
    if nvmmh is not None:
        theirs = [nvmmh.seconds(config, problem) for config in configs]
        ratios = []
        for index, (config, value) in enumerate(zip(configs, theirs)):
            if value is None:
                continue
            # NVIDIA's estimate for the tile/cluster/stages, scaled by our schedule terms (ours for this schedule
            # over ours for the same tile with the schedule its model assumes)
            reference = estimate(replace(config, schedule="cooperative" if config.tile[0] % 128 == 0 else
                                         "pingpong", stream_k=False), problem, dev).seconds
            ratios.append(value / reference)
            seconds[index] = value * seconds[index] / reference
            reasons[index] = f"nvMatmulHeuristics {value * 1e6:.1f} us, {reasons[index]}"
        if ratios:  # what it does not estimate keeps our estimate on its scale, pessimistically
            scale = max(ratios)
            for index, value in enumerate(theirs):
                if value is None:
                    seconds[index] *= scale
    flops_of = {}  # by convolution kind (one entry for every other problem)
    scored = []
    for index, (item, config) in enumerate(zip(items, configs)):
        peak = dev.peak_flops_16bit * _PEAK_SCALE.get(config.a_bits, 1.0)
        flops = flops_of.get(config.conv_kind)
        if flops is None:
            flops = flops_of[config.conv_kind] = sum(2.0 * M * N * K * batch for M, N, K, batch in
                                                     gemm_groups(problem, config.conv_kind))
        scored.append([item, flops / seconds[index] / peak, reasons[index], index])
    # measured history is read for GEMM shapes (nearby shapes: within 2x in M, N and K)
    measured = history_scores(_history_rows(history), filter(None, map(_name_of, items)), problem) \
        if history is not None and gemm else {}
    if measured:
        best_model = max(s[1] for s in scored)
        for entry in scored:
            relative = measured.get(_name_of(entry[0]))
            if relative is not None:
                # a measurement nearby outweighs the model: the model's verdict only nudges it (a kernel measured
                # best outranks every unmeasured one the model does not put 10x ahead of it)
                entry[1] = best_model * relative * (entry[1] / best_model) ** 0.1
                entry[2] += f", measured nearby at {relative:.0%} of the best"
            else:
                entry[1] *= 0.8
    scored.sort(key=lambda e: (-round(e[1], 12), e[3]))
    return [Ranked(item, score, reason) for item, score, reason, _ in scored]


def top_k(points, problem, k: int | None, device=None, history=None, *, per_tile: int | None = 2,
          **options) -> list:
    """The ``k`` best items of ``points`` for ``problem``, best first (all of them, ranked, when k is None).

    At most ``per_tile`` items share a tile shape while other tiles remain (None: no limit), and a tile's picks
    differ in cluster shape while it has others: variants of one tile score alike, and spreading the picks over
    tiles and clusters hedges against the model's errors."""
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise ArgumentError(f"top_k must be a positive integer or None (every candidate), got {k!r}")
    ranked = rank(points, problem, device, history, **options)
    if k is None:
        return [r.point for r in ranked]
    if per_tile is None:
        return [r.point for r in ranked[:k]]
    # Per tile, the best variant first, then the best variants with a cluster shape not yet picked for that tile
    # (the model scores clusters alike where memory bounds a problem, and measured they differ most there), then
    # the rest in rank order.
    chosen, deferred, picked = [], [], {}
    for index, entry in enumerate(ranked):
        config = config_of(entry.point)
        clusters = picked.setdefault(config.tile[:2], set())
        if len(clusters) < per_tile and (not clusters or config.cluster not in clusters):
            clusters.add(config.cluster)
            chosen.append(index)
            if len(chosen) == k:
                break
        else:
            deferred.append(index)
    chosen = sorted(chosen + deferred[:k - len(chosen)])
    return [ranked[i].point for i in chosen]
