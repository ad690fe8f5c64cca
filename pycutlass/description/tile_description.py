"""TileDescription: threadblock tile, warp arrangement and pipeline depth, checked against the instruction."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import DescriptionError
from .math_instruction import MathInstruction
from .target import Target
from .types import OpClass

# Warp-tile widths (N) that CUTLASS's tensor-op epilogues compute correctly.
WARP_N_TENSOR_OP = (16, 32, 64)


def _triple(name: str, value) -> tuple[int, int, int]:
    try:
        if isinstance(value, (str, bytes)) or any(isinstance(v, (str, bytes, float, bool)) for v in value):
            raise TypeError
        triple = tuple(int(v) for v in value)
    except TypeError:
        raise DescriptionError(f"TileDescription.{name} must be 3 integers, got {value!r}") from None
    if len(triple) != 3 or any(v <= 0 for v in triple):
        raise DescriptionError(f"TileDescription.{name} must be 3 positive integers, got {value!r}")
    return triple


@dataclass(frozen=True)
class TileDescription:
    threadblock_shape: tuple[int, int, int]
    stages: int
    warp_count: tuple[int, int, int]
    math_instruction: MathInstruction

    def __post_init__(self):
        tb = _triple("threadblock_shape", self.threadblock_shape)
        warps = _triple("warp_count", self.warp_count)
        object.__setattr__(self, "threadblock_shape", tb)
        object.__setattr__(self, "warp_count", warps)
        if not isinstance(self.math_instruction, MathInstruction):
            raise DescriptionError(f"TileDescription.math_instruction must be a MathInstruction, "
                                   f"got {self.math_instruction!r}")
        if not isinstance(self.stages, int) or self.stages < 2 or self.stages > 10:
            raise DescriptionError(f"TileDescription.stages must be an integer in 2..10, got {self.stages!r}")
        for axis, t, w in zip("MNK", tb, warps):
            if t % w:
                raise DescriptionError(f"threadblock {axis} extent {t} is not divisible by the warp count "
                                       f"{w} along {axis}; threadblock_shape={list(tb)}, warp_count={list(warps)}")
        if warps[2] != 1:
            raise DescriptionError(f"warp_count along K must be 1 (sliced-K is not supported), got {list(warps)}")
        threads = 32 * warps[0] * warps[1] * warps[2]
        if threads > 1024:
            raise DescriptionError(f"warp_count {list(warps)} gives {threads} threads per block; at most 1024")
        warp = self.warp_shape
        inst = self.math_instruction.instruction_shape
        if self.math_instruction.opcode_class is OpClass.TensorOp:
            for axis, ws, i in zip("MNK", warp, inst):
                if ws % i:
                    raise DescriptionError(
                        f"warp tile {list(warp)} (threadblock {list(tb)} / warps {list(warps)}) is not a multiple "
                        f"of the instruction shape {list(inst)} along {axis}")
            if warp[1] not in WARP_N_TENSOR_OP:
                # CUTLASS's tensor-op epilogues take warp tiles 16, 32 or 64 wide (CUTLASS's generator never makes
                # them wider). At 128 the mixed-precision epilogue (TileIteratorTensorOpMixed) picks one shared-memory
                # pointer per 1024-bit column block and writes wrong results; 8 (and other widths) do not compile.
                raise DescriptionError(f"warp tile {list(warp)} (threadblock {list(tb)} / warps {list(warps)}) must be "
                                       f"16, 32 or 64 wide in N for tensor-op epilogues; change warp_count")
            if self.math_instruction.element_a.bits == 64 and (warp[0] % 16 or warp[1] % 16):
                # The 64-bit operand iterators (MmaTensorOpMultiplicandTileIterator for 64b, mma_tensor_op_tile_
                # iterator_sm80.h) static_assert "Divisibility." unless the warp tile's M and N are multiples of 16.
                raise DescriptionError(f"float64 tensor-op warp tile {list(warp)} (threadblock {list(tb)} / warps "
                                       f"{list(warps)}) must have M and N multiples of 16 (CUTLASS's 64-bit operand "
                                       f"iterators static_assert 'Divisibility.'); change warp_count")
            if tb[2] < 2 * inst[2] and self.math_instruction.element_a.bits < 64:
                raise DescriptionError(f"threadblock K ({tb[2]}) must hold at least two instruction K-steps "
                                       f"({2 * inst[2]}) for {self.math_instruction.element_a.label}")
        else:
            # SIMT warps are 32 lanes arranged 4x8 or 8x4, each lane owning a multiple of one element.
            if (warp[0] * warp[1]) % 32 or warp[0] % 4 or warp[1] % 4:
                raise DescriptionError(f"SIMT warp tile {list(warp)} must have M and N multiples of 4 and "
                                       f"M*N a multiple of 32")

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
                f"memory; {target.name} allows {budget // 1024} KiB per block. Use fewer stages or a smaller tile")

    def procedural_name(self) -> str:
        m, n, k = self.threadblock_shape
        wm, wn, wk = self.warp_count
        return f"{m}x{n}x{k}_{wm}x{wn}x{wk}_s{self.stages}"
