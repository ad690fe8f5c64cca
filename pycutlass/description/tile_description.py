"""TileDescription: threadblock tile, warp arrangement and pipeline depth, checked against the instruction."""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import DescriptionError
from .math_instruction import MathInstruction
from .target import Target
from .types import EpilogueScheduleType, KernelScheduleType, OpClass, TileSchedulerType

# The warp counts CUTLASS 3.x derives (4 per consumer warpgroup along M): a tile stating one may mean the SM90
# family, so its Sm80 checks wait for the operation.
SM90_WARP_COUNTS = ((4, 1, 1), (8, 1, 1))

# Warp-tile widths (N) that CUTLASS's tensor-op epilogues compute correctly.
WARP_N_TENSOR_OP = (16, 32, 64, 128)  # 128: float32 output from float32 accumulators only (the operations check)


def _positive_ints(name: str, value, count: int, spelled: str = "") -> tuple[int, ...]:
    """``value`` as ``count`` positive integers, or a DescriptionError naming the field (``spelled``: how the
    message describes the values, e.g. " (rows, columns) or None")."""
    try:
        if isinstance(value, (str, bytes)) or any(isinstance(v, (str, bytes, float, bool)) for v in value):
            raise TypeError
        ints = tuple(int(v) for v in value)
    except TypeError:
        raise DescriptionError(f"TileDescription.{name} must be {count} integers{spelled}, got {value!r}",
                               rule="description.field_type") from None
    if len(ints) != count or any(v <= 0 for v in ints):
        raise DescriptionError(f"TileDescription.{name} must be {count} positive integers{spelled}, got {value!r}",
                               rule="description.field_type")
    return ints


def _triple(name: str, value) -> tuple[int, int, int]:
    return _positive_ints(name, value, 3)


@dataclass(frozen=True)
class TileDescription:
    """The tile of one thread block (CTA) and how it is computed.

    CUTLASS 2.x (Sm80 family) reads ``threadblock_shape``, ``stages`` (2..10) and ``warp_count``. The SM90 family
    (CUTLASS 3.x, compute capability 90) also reads ``cluster_shape``, ``kernel_schedule``, ``epilogue_schedule``,
    ``tile_scheduler`` and ``epilogue_tile``; there ``stages=0`` means CUTLASS's automatic stage count and
    ``warp_count`` may be None (it is derived from the schedule). ``epilogue_tile=(rows, columns)`` is the sub-tile
    the TMA epilogue writes at a time (None: the one CUTLASS's builder picks, 32 columns wide for 16- and 32-bit
    outputs); wider ones suit store-bound GEMMs such as weight gradients over few tokens. A description that uses any
    SM90-only value is checked by the SM90 operation; the others are checked against the Sm80 rules here, as
    PyCUTLASS did.
    """

    threadblock_shape: tuple[int, int, int]
    stages: int
    warp_count: tuple[int, int, int] | None
    math_instruction: MathInstruction
    cluster_shape: tuple[int, int, int] = (1, 1, 1)
    kernel_schedule: KernelScheduleType = KernelScheduleType.Auto
    epilogue_schedule: EpilogueScheduleType = EpilogueScheduleType.Auto
    tile_scheduler: TileSchedulerType = TileSchedulerType.Default
    epilogue_tile: tuple[int, int] | None = None

    def __post_init__(self):
        tb = _triple("threadblock_shape", self.threadblock_shape)
        object.__setattr__(self, "threadblock_shape", tb)
        object.__setattr__(self, "cluster_shape", _triple("cluster_shape", self.cluster_shape))
        for name, kind in (("kernel_schedule", KernelScheduleType), ("epilogue_schedule", EpilogueScheduleType),
                           ("tile_scheduler", TileSchedulerType)):
            if not isinstance(getattr(self, name), kind):
                raise DescriptionError(f"TileDescription.{name} must be a pycutlass.{kind.__name__}, got "
                                       f"{getattr(self, name)!r}", rule="description.field_type")
        if not isinstance(self.math_instruction, MathInstruction):
            raise DescriptionError(f"TileDescription.math_instruction must be a MathInstruction, "
                                   f"got {self.math_instruction!r}", rule="description.field_type")
        if isinstance(self.stages, bool) or not isinstance(self.stages, int) or \
                not (self.stages == 0 or 2 <= self.stages <= 10):
            raise DescriptionError(f"TileDescription.stages must be an integer in 2..10 (or 0: CUTLASS's automatic "
                                   f"count, SM90 family), got {self.stages!r}", rule="tile.stages")
        if self.warp_count is not None:
            object.__setattr__(self, "warp_count", _triple("warp_count", self.warp_count))
        if self.epilogue_tile is not None:
            object.__setattr__(self, "epilogue_tile",
                               _positive_ints("epilogue_tile", self.epilogue_tile, 2, " (rows, columns) or None"))
        if self.sm90_only or self.warp_count in SM90_WARP_COUNTS:
            return  # the operation checks it: the SM90 rules differ from the warp-level Sm80 ones below
        self._check_sm80_rules()

    def __repr__(self) -> str:
        # without epilogue_tile when it is None: the Sm80 kinds hash this text into their kernels' names
        shown = (f for f in fields(self) if f.name != "epilogue_tile" or self.epilogue_tile is not None)
        return f"{type(self).__qualname__}({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

    def _check_sm80_rules(self) -> None:
        tb = self.threadblock_shape
        warps = self.warp_count
        for axis, t, w in zip("MNK", tb, warps):
            if t % w:
                raise DescriptionError(f"threadblock {axis} extent {t} is not divisible by the warp count "
                                       f"{w} along {axis}; threadblock_shape={list(tb)}, warp_count={list(warps)}",
                                       rule="sm80.warp_divides_tile")
        if warps[2] != 1:
            raise DescriptionError(f"warp_count along K must be 1 (sliced-K is not supported), got {list(warps)}",
                                   rule="sm80.warp_count_k")
        threads = 32 * warps[0] * warps[1] * warps[2]
        if threads > 1024:
            raise DescriptionError(f"warp_count {list(warps)} gives {threads} threads per block; at most 1024",
                                   rule="sm80.threads_per_block")
        warp = self.warp_shape
        inst = self.math_instruction.instruction_shape
        if self.math_instruction.opcode_class is OpClass.TensorOp:
            for axis, ws, i in zip("MNK", warp, inst):
                if ws % i:
                    raise DescriptionError(
                        f"warp tile {list(warp)} (threadblock {list(tb)} / warps {list(warps)}) is not a multiple "
                        f"of the instruction shape {list(inst)} along {axis}", rule="sm80.warp_tile_instruction")
            if warp[1] not in WARP_N_TENSOR_OP:
                # CUTLASS's tensor-op epilogues take warp tiles 16, 32 or 64 wide, and 128 for float32 output
                # (check_wide_warp_tile); 8 (and other widths) do not compile.
                raise DescriptionError(f"warp tile {list(warp)} (threadblock {list(tb)} / warps {list(warps)}) must be "
                                       f"16, 32 or 64 wide in N for tensor-op epilogues (128 for float32 outputs); "
                                       f"change warp_count", rule="sm80.warp_tile_n")
            if self.math_instruction.element_a.bits == 64 and (warp[0] % 16 or warp[1] % 16):
                # The 64-bit operand iterators (MmaTensorOpMultiplicandTileIterator for 64b, mma_tensor_op_tile_
                # iterator_sm80.h) static_assert "Divisibility." unless the warp tile's M and N are multiples of 16.
                raise DescriptionError(f"float64 tensor-op warp tile {list(warp)} (threadblock {list(tb)} / warps "
                                       f"{list(warps)}) must have M and N multiples of 16 (CUTLASS's 64-bit operand "
                                       f"iterators static_assert 'Divisibility.'); change warp_count",
                                       rule="sm80.warp_tile_f64")
            if tb[2] < 2 * inst[2] and self.math_instruction.element_a.bits < 64:
                raise DescriptionError(f"threadblock K ({tb[2]}) must hold at least two instruction K-steps "
                                       f"({2 * inst[2]}) for {self.math_instruction.element_a.label}",
                                       rule="sm80.tile_k_steps")
        else:
            # SIMT warps are 32 lanes arranged 4x8 or 8x4, each lane owning a multiple of one element.
            if (warp[0] * warp[1]) % 32 or warp[0] % 4 or warp[1] % 4:
                raise DescriptionError(f"SIMT warp tile {list(warp)} must have M and N multiples of 4 and "
                                       f"M*N a multiple of 32", rule="sm80.simt_warp_tile")

    @property
    def sm90_only(self) -> bool:
        """Whether a value here exists only in the SM90 family (so Sm80-family operations reject it)."""
        return (self.warp_count is None or self.stages == 0 or self.math_instruction.is_warpgroup
                or self.math_instruction.element_a.is_fp8 or self.cluster_shape != (1, 1, 1)
                or self.kernel_schedule is not KernelScheduleType.Auto
                or self.epilogue_schedule is not EpilogueScheduleType.Auto
                or self.tile_scheduler is not TileSchedulerType.Default or self.epilogue_tile is not None)

    def check_sm80(self, what: str) -> None:
        """Sm80-family operations call this: SM90-only values have no meaning there."""
        if self.sm90_only:
            raise DescriptionError(
                f"{what}: this TileDescription uses SM90-only values (warp_count=None, stages=0, a warpgroup or fp8 "
                f"instruction, a cluster, a kernel/epilogue/tile schedule, or an epilogue tile), which the CUTLASS "
                f"2.x Sm80 family this operation builds does not have; build it with compute capability 90 (the "
                f"SM90 GEMM, grouped GEMM or convolution), or give warp_count, stages >= 2 and an Sm80 instruction shape",
                rule="tile.sm90_only_values")
        if self.warp_count in SM90_WARP_COUNTS:
            self._check_sm80_rules()  # deferred in __post_init__: the SM90 family may have meant these warps

    @property
    def warp_shape(self) -> tuple[int, int, int]:
        return tuple(t // w for t, w in zip(self.threadblock_shape, self.warp_count))

    @property
    def threads(self) -> int:
        return 32 * self.warp_count[0] * self.warp_count[1] * self.warp_count[2]

    def shared_memory_bytes(self) -> int:
        """Main-loop shared memory (the dominant term): one A and one B tile per stage."""
        m, n, k = self.threadblock_shape
        bits = self.math_instruction.element_a.bits
        return self.stages * (m * k + k * n) * bits // 8

    def check_shared_memory(self, compute_capability) -> None:
        target = Target.parse(compute_capability)
        budget = target.shared_memory_per_block
        need = self.shared_memory_bytes()
        if need > budget:
            raise DescriptionError(
                f"tile {list(self.threadblock_shape)} with {self.stages} stages needs {need // 1024} KiB of shared "
                f"memory; {target.name} allows {budget // 1024} KiB per block. Use fewer stages or a smaller tile",
                rule="smem.capacity")

    def procedural_name(self) -> str:
        m, n, k = self.threadblock_shape
        if self.warp_count is None:
            return f"{m}x{n}x{k}_s{self.stages}"
        wm, wn, wk = self.warp_count
        return f"{m}x{n}x{k}_{wm}x{wn}x{wk}_s{self.stages}"
