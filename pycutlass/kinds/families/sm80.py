"""The Sm80 family's (CUTLASS 2.x) rules that several kinds share: operand types against the instruction and the
epilogue, CUTLASS's thread maps for main loops and epilogues, warp tiles, alignment limits, and the GEMM layout rules.
Each rule rejects, with its reason, what CUTLASS would fail to compile."""
from __future__ import annotations

from ...description.tensor_description import TensorDescription
from ...description.tile_description import TileDescription
from ...description.types import DataType, LayoutType, OpClass
from ...emit import names
from ...epilogue.functors import EpilogueFunctor
from ...errors import DescriptionError
from ..base import check_description_types

_PLAIN = (LayoutType.RowMajor, LayoutType.ColumnMajor)
_INTERLEAVED_GEMM = (LayoutType.ColumnMajorInterleaved32, LayoutType.RowMajorInterleaved32,
                     LayoutType.ColumnMajorInterleaved32)


def check_operand_types(tile: TileDescription, A: TensorDescription, B: TensorDescription,
                        C: TensorDescription, epilogue: EpilogueFunctor, what: str, wide_c: bool = False,
                        simt_wide_ab: bool = False) -> None:
    """Shared by GEMM, grouped GEMM and conv2d: operand types must match the instruction and the epilogue.

    ``wide_c``: the kind's tensor-op epilogue may store C/D with 256-bit accesses (GEMM, grouped GEMM, conv2d).
    ``simt_wide_ab``: the kind's SIMT main loop ignores A's and B's alignment (conv2d), so any is correct there.
    """
    check_description_types(tile, A, B, C, epilogue, what)
    tile.check_sm80(what)
    math = tile.math_instruction
    operand = math.element_a
    allowed = {operand}
    if operand is DataType.tfloat32:
        allowed.add(DataType.float32)  # tf32 operands live in memory as float32
    for label, desc in (("A", A), ("B", B)):
        if desc.element not in allowed:
            raise DescriptionError(f"{what}: {label}.element is {desc.element.label} but the math instruction "
                                   f"multiplies {operand.label}; use one of {sorted(e.label for e in allowed)}",
                                   rule="sm80.operand_element")
    if epilogue.element_output is not C.element:
        raise DescriptionError(f"{what}: the epilogue writes {epilogue.element_output.label} but C is "
                               f"{C.element.label}; they must match", rule="epilogue.output_type")
    if epilogue.alignment != C.alignment:
        raise DescriptionError(f"{what}: epilogue alignment {epilogue.alignment} must equal C's alignment "
                               f"{C.alignment}", rule="alignment.epilogue_match")
    for label, desc in (("A", A), ("B", B)):
        if desc.access_bits > 128:
            raise DescriptionError(f"{what}: {label} alignment {desc.alignment} x {desc.element.bits} bits exceeds the "
                                   f"128-bit loads of the main loop (cp.async / ldmatrix move at most 16 bytes)",
                                   rule="alignment.max_128b")
    if C.access_bits > 128:
        # CUTLASS's PredicatedTileIterator stores AlignedArray<ElementOutput, kElementsPerAccess> with
        # arch::global_store<AccessType, 32> (cutlass/arch/memory.h), as CUTLASS's generator does for f16 -> f32 and
        # s8 -> s32 GEMMs with C alignment 8. Grouped GEMMs and convolutions write through the same iterator
        # (PyCUTLASS 2.11's tf32 conv tests and test_sm80.py's grouped GEMMs use float32 C alignment 8). SIMT
        # epilogues and interleaved outputs are kept to 128.
        if not wide_c or math.opcode_class is not OpClass.TensorOp or C.layout.is_interleaved:
            raise DescriptionError(
                f"{what}: C alignment {C.alignment} x {C.element.bits} bits exceeds 128 bits; only the tensor-op "
                f"epilogues of GemmOperationUniversal, GemmOperationGrouped and Conv2dOperation (RowMajor, "
                f"ColumnMajor or NHWC C) store 256-bit vectors. Use alignment {128 // C.element.bits}",
                rule="alignment.max_128b")
    if epilogue.element_accumulator is not math.element_accumulator:
        raise DescriptionError(f"{what}: the epilogue reads {epilogue.element_accumulator.label} accumulators but the "
                               f"math instruction accumulates in {math.element_accumulator.label}",
                               rule="epilogue.accumulator_type")
    if math.opcode_class is OpClass.Simt:
        # CUTLASS's SIMT main loops load one element per access (kElementsPerAccess = 1 in default_mma_core_simt.h
        # and the SIMT cores of default_mma_core_sm80.h: a wider access static_asserts "Vectors implied by the
        # thread map must be divisible by the access type"), and its SIMT epilogue stores scalars (default_gemm.h:
        # "simt epilogue must operate on scalars"). CUTLASS's generator builds SIMT kernels with alignment 1 only.
        # CUTLASS's SIMT conv kernels (default_conv2d_{fprop,dgrad,wgrad}.h) take AlignmentA/B and never use them:
        # their iterators access what the SIMT thread map gives, one element. PyCUTLASS 2.11's own SIMT conv tests
        # declare A and B with alignment 4; the alignment then only tightens what the arguments accept.
        for label, desc in ((("C", C),) if simt_wide_ab else (("A", A), ("B", B), ("C", C))):
            if desc.alignment != 1:
                raise DescriptionError(f"{what}: SIMT kernels access {'C' if simt_wide_ab else 'A, B and C'} one "
                                       f"element at a time (CUTLASS's SIMT thread maps and epilogue), so {label} "
                                       f"alignment must be 1, got {desc.alignment}", rule="alignment.simt")
    if math.opcode_class is OpClass.Simt:
        check_simt_epilogue_width(tile, what)
    check_f64_tensor_op_stages(tile, what)
    if math.opcode_class is OpClass.TensorOp and math.element_a is DataType.float64 and tile.threads < 64:
        # CUTLASS's f64 tensor-op epilogue (found by tools/fuzz_run.py: a 16x16x16 tile on one warp) static_asserts
        # "This specialization requires at least two warps." / "This tile iterator requires at least two warps."
        raise DescriptionError(f"{what}: CUTLASS's float64 tensor-op epilogue needs at least two warps, got "
                               f"warp_count {list(tile.warp_count)}", rule="sm80.f64_warps")
    if math.opcode_class is OpClass.TensorOp and math.element_a.bits < 64:
        # The main loop copies each operand tile global -> shared with a warp-raked thread map of 128-bit accesses
        # (PitchLinearWarpRakedThreadMap, cutlass/transform/pitch_linear_thread_map.h), which static_asserts "Number
        # of iterations must be non-zero" unless every thread gets at least one access.
        m, n, k = tile.threadblock_shape
        per_access = 128 // math.element_a.bits
        for label, extent, rows in (("A", "M", m), ("B", "N", n)):
            accesses = rows * k // per_access
            if accesses < tile.threads:
                raise DescriptionError(
                    f"{what}: the {label} tile ({extent} x K = {rows} x {k} {math.element_a.label}) is {accesses} "
                    f"128-bit accesses, fewer than the {tile.threads} threads of warp_count {list(tile.warp_count)}; "
                    f"CUTLASS's warp-raked thread map gives every thread at least one (static_assert 'Number of "
                    f"iterations must be non-zero'). Use a larger tile or fewer warps", rule="sm80.mainloop_thread_map")
    if math.opcode_class is OpClass.TensorOp and not C.layout.is_interleaved and \
            math.element_accumulator is DataType.int32:
        # DefaultIteratorsTensorOp (default_epilogue_tensor_op.h) for int32 accumulators: int32 and float32 outputs
        # take any alignment; half_t / bfloat16_t exist for 8 elements per access only; every other case falls to
        # the 8-bit integer specialization, which static_asserts "ElementOutput needs to be 4 or 8 bit (unsigned)
        # int." and "ElementsPerAccess needs to be 16 or 8." (4, 8 or 16).
        allowed = {DataType.float16: (8,), DataType.bfloat16: (8,), DataType.int8: (4, 8, 16)}.get(C.element)
        if allowed is not None and C.alignment not in allowed:
            raise DescriptionError(
                f"{what}: CUTLASS's tensor-op epilogue writes {C.element.label} from int32 accumulators with "
                f"{' or '.join(map(str, allowed))} elements per access only (DefaultIteratorsTensorOp "
                f"static_asserts otherwise); C alignment is {C.alignment}. Use C alignment {allowed[-1]}, or an "
                f"int32 / float32 output", rule="sm80.int_epilogue_alignment")
    if math.opcode_class is OpClass.TensorOp:
        check_wide_warp_tile(tile, C, math.element_accumulator, what)
    if math.opcode_class is OpClass.TensorOp and not C.layout.is_interleaved:
        problem = epilogue_thread_map_problem(tile, C)
        if problem:
            raise DescriptionError(f"{what}: {problem}", rule="sm80.epilogue_thread_map")
        check_mixed_epilogue_warp_tile(tile, C, math.element_accumulator, what)
    if math.opcode_class is OpClass.TensorOp and tile.stages > 2:
        # Multistage main loops copy with cp.async, whose smallest transfer is 4 bytes.
        for label, desc in (("A", A), ("B", B)):
            if desc.access_bits < 32:
                raise DescriptionError(
                    f"{what}: {label} alignment {desc.alignment} x {desc.element.bits} bits is below the 32-bit "
                    f"minimum of multistage ({tile.stages}-stage) kernels; raise the alignment or use stages=2",
                    rule="alignment.multistage_32b")


def check_f64_tensor_op_stages(tile: TileDescription, what: str) -> None:
    """float64 tensor ops need a multistage main loop: at two stages both DefaultMmaCore<..., double, ...,
    OpClassTensorOp, Stages, ...> (default_mma_core_sm80.h) and the two-stage DefaultMmaCore<..., ElementA, ...,
    OpClassTensorOp, 2, ...> (default_mma_core_sm75.h) match, which nvcc rejects ("more than one partial
    specialization matches", default_mma.h). Shared by GEMM, grouped GEMM and conv2d."""
    math = tile.math_instruction
    if math.opcode_class is OpClass.TensorOp and math.element_a is DataType.float64 and tile.stages < 3:
        raise DescriptionError(f"{what}: CUTLASS has no two-stage float64 tensor-op main loop (two DefaultMmaCore "
                               f"specializations match and the compile fails as ambiguous); use stages >= 3",
                               rule="sm80.f64_stages")


def check_simt_epilogue_width(tile: TileDescription, what: str) -> None:
    """The SIMT epilogue (DefaultThreadMapSimt -> OutputTileOptimalThreadMap, default_thread_map_simt.h) lays a
    warp's 32 lanes along the tile's N, one element each: Iterations::kColumn = threadblock N / 32, which the output
    iterators (epilogue/threadblock/predicated_tile_iterator*.h) static_assert "ThreadMap::Iterations::kColumn must
    be > 0". Shared by GEMM, grouped GEMM and conv2d (whose SIMT epilogues use the same thread map)."""
    if tile.threadblock_shape[1] < 32:
        raise DescriptionError(f"{what}: CUTLASS's SIMT epilogue stores threadblock N / 32 columns per lane, so the "
                               f"threadblock tile must be at least 32 wide in N (static_assert 'ThreadMap::"
                               f"Iterations::kColumn must be > 0'); got {list(tile.threadblock_shape)}",
                               rule="sm80.simt_epilogue_n")
    if tile.threadblock_shape[1] % 32:
        # The same map's one-row arrangement (RowArrangement<..., false> in output_tile_thread_map.h) steps 32
        # columns at a time, N / 32 times (integer division): the last N % 32 columns would never be written.
        raise DescriptionError(f"{what}: CUTLASS's SIMT epilogue writes the tile's N columns 32 at a time, N / 32 "
                               f"times, so a threadblock N that is not a multiple of 32 leaves its last "
                               f"{tile.threadblock_shape[1] % 32} columns unwritten; got "
                               f"{list(tile.threadblock_shape)}. Use N = 32, 64, 96, 128, ...",
                               rule="sm80.simt_epilogue_n")


def kernel_operands(A: TensorDescription, B: TensorDescription, C: TensorDescription):
    """The (label, TensorDescription, layout) of the A and B operands CUTLASS's kernel reads.

    A ColumnMajor C is computed as the transposed problem D^T = B^T A^T with a RowMajor output (``emit_body``, and
    CUTLASS's kInternalTranspose for grouped GEMM): the kernel's A is the user's B with the transposed layout and
    its B the user's A, while the threadblock and warp tiles stay as given.
    """
    if C.layout is LayoutType.ColumnMajor:
        note = "the kernel's {}; a ColumnMajor C is computed as the transposed problem"
        return ((f"B ({note.format('A')})", B, names.TRANSPOSED[B.layout]),
                (f"A ({note.format('B')})", A, names.TRANSPOSED[A.layout]))
    return (("A", A, A.layout), ("B", B, B.layout))


def check_simt_warp_tile(tile: TileDescription, operands, what: str) -> None:
    """CUTLASS's SIMT main loops arrange a warp's lanes WarpNumThreadsM x WarpNumThreadsN over the warp tile and
    pad a K-contiguous operand in shared memory by a number of elements that must be a multiple of that operand's
    lane tile (static_asserts "WarpShape must be divisible by ThreadTile shape." and "Padding must be divisible by
    Lane"):

    - two stages (default_mma_core_simt.h): lanes 8 x 4 when warp M > warp N, else 4 x 8; padding
      ``simt_transpose_padding(32, K, bits)`` = 32 / K / (bits / 32) (integer division, 0 when K > 32);
    - three or more stages (default_mma_core_sm80.h): lanes 4 x 8; padding K / 32.

    LaneM = min(128 / bits, warp M / lanes M) for the kernel's A, LaneN = min(128 / bits, warp N / lanes N) for its
    B; the kernel's A is K-contiguous when RowMajor, its B when ColumnMajor. ``operands``: the kernel's A and B as
    (label, TensorDescription, layout) (:func:`kernel_operands` for GEMM; conv2d passes the layouts of its
    DefaultMmaCore).
    """
    m, n, k = tile.threadblock_shape
    wm, wn, _ = tile.warp_shape
    two_stage = tile.stages == 2
    lanes_m = (8 if wm > wn else 4) if two_stage else 4
    lanes_n = 32 // lanes_m
    if wm % lanes_m or wn % lanes_n:
        raise DescriptionError(
            f"{what}: CUTLASS's {'two-stage' if two_stage else 'multistage'} SIMT main loop arranges a warp's lanes "
            f"{lanes_m} x {lanes_n} over the warp tile {wm} x {wn}, which must be a multiple of that (DefaultMmaCore's "
            f"static_assert 'WarpShape must be divisible by ThreadTile shape.', and the warp-level MmaSimt's "
            f"'Divisibility'); change warp_count", rule="sm80.simt_lanes")
    (label_a, desc_a, layout_a), (label_b, desc_b, layout_b) = operands
    for label, desc, k_major, warp_extent, lanes in ((label_a, desc_a, layout_a is LayoutType.RowMajor, wm, lanes_m),
                                                     (label_b, desc_b, layout_b is LayoutType.ColumnMajor, wn,
                                                      lanes_n)):
        if not k_major:
            continue
        bits = desc.element.bits
        lane = min(128 // bits, warp_extent // lanes)
        if two_stage:
            padding = 32 // k // (bits // 32)
            formula = f"32 / K / (bits / 32) = 32 / {k} / {bits // 32}"
        else:
            padding = k // 32
            formula = f"K / 32 = {k} / 32"
        if padding % lane:
            raise DescriptionError(
                f"{what}: CUTLASS's {'two-stage' if two_stage else 'multistage'} SIMT main loop pads the "
                f"K-contiguous operand {label} by {formula} = {padding} elements in shared memory, which must be a "
                f"multiple of its lane tile (min(128 / bits, warp tile / lanes) = {lane}; static_assert 'Padding "
                f"must be divisible by Lane'); use another threadblock K, other warps or another stage count",
                rule="sm80.simt_padding")


class _Overrun(str):
    """A thread map CUTLASS accepts (no static_assert) but whose accesses run past the tile."""


def _pitch_linear_iterations(kind: str, contiguous: int, strided: int, threads: int, arrangement, per_access: int):
    """Iterations (contiguous, strided) of CUTLASS's pitch-linear thread map (cutlass/transform/
    pitch_linear_thread_map.h), or the static_assert it fails as a string. ``kind``: "raked"
    (PitchLinearWarpRakedThreadMap), "striped" (PitchLinearWarpStripedThreadMap) or "stripmined"
    (PitchLinearStripminedThreadMap)."""
    if contiguous % per_access:
        return "Shape must be divisible by vector length."
    vec_c, vec_s = contiguous // per_access, strided
    if kind == "stripmined":
        if not ((threads < vec_c and vec_c % threads == 0) or threads % vec_c == 0):
            return "Shape must be divisible by number of iterations of each thread."
        if threads >= vec_c:
            rows = threads // vec_c
            if vec_s % rows:
                # Not a static_assert: CUTLASS rounds the iterations up, and the rows past the tile land past its
                # shared-memory stage (the next stage's data, or past the buffer: an illegal address on an H100).
                return _Overrun(f"its {threads} threads cover {rows} rows of {vec_c} accesses at a time, which does "
                                f"not divide the tile's {vec_s} rows: the rounded-up pass writes rows past the tile "
                                f"in shared memory (an illegal address on an H100)")
            return 1, vec_s // rows
        return vec_c // threads, vec_s
    arr_c, arr_s = arrangement
    if arr_c <= 0 or arr_s <= 0:
        return "the warp's thread arrangement is empty (division by zero)"
    warp_count = threads // (arr_c * arr_s)
    if kind == "raked" and (vec_c % arr_c or vec_s % arr_s):
        return "ShapeInAccesses must be divisible by WarpThreadArrangement."
    iter_c, iter_s = vec_c // arr_c, vec_s // arr_s
    if kind == "raked":
        warps_s = warp_count if iter_s >= warp_count else iter_s
        warps_c = (warp_count // warps_s if warps_s else 0) if warp_count > iter_s else 1
    else:
        warps_s = warp_count if iter_s >= warp_count else (warp_count // iter_s if iter_s else 0)
        warps_c = (iter_c // warps_s if warps_s else 0) if warp_count > iter_s else 1
    if not warps_s or not warps_c or not (iter_c // warps_c) * (iter_s // warps_s):
        return "Number of iterations must be non-zero"
    if warps_c * warps_s != warp_count:
        # Not a static_assert either: the striped map's warp arrangement (contiguous iterations / warps along the
        # strided dimension) can place fewer warps than there are; the rest start past the tile.
        return _Overrun(f"it arranges {warps_c} x {warps_s} of its {warp_count} warps over the tile, and the other "
                        f"{warp_count - warps_c * warps_s} start past it (they read and write outside the tile: wrong "
                        f"results on an H100)")
    return iter_c // warps_c, iter_s // warps_s


def operand_thread_map(tile: TileDescription, k_major: bool, extent: int, fast_f16: bool = False):
    """The global -> shared thread map of one main-loop operand in the DefaultMmaCore that DefaultMma picks
    (cutlass/gemm/threadblock/default_mma_core_{sm75,sm80,simt}.h), as (kind, (contiguous, strided), arrangement,
    elements per access) for :func:`_pitch_linear_iterations`: tensor ops below 64 bits use
    PitchLinearWarpRakedThreadMap with 128-bit accesses (256-bit in GEMM's two-stage float32 main loop,
    ``fast_f16``: default_mma.h's OpMultiplyAddFastF16 cores), warps arranged min(extent / access, 8) x 32 / that
    over a contiguous M or N and K / access x 32 / that over a contiguous K; float64 tensor ops use 64-bit accesses
    arranged 16 x 2, raked over a contiguous K and striped over a contiguous M or N; SIMT uses
    PitchLinearStripminedThreadMap with one element per access. ``extent``: the operand's threadblock M or N."""
    math = tile.math_instruction
    k = tile.threadblock_shape[2]
    bits = math.element_a.bits
    simt = math.opcode_class is OpClass.Simt
    per_access = 1 if simt or bits == 64 else (256 if fast_f16 else 128) // bits
    if simt:
        kind, arrangement = "stripmined", None
    elif bits == 64:
        kind, arrangement = ("raked" if k_major else "striped"), (16, 2)
    elif k_major:
        kind, arrangement = "raked", (k // per_access, 32 // max(k // per_access, 1))
    elif fast_f16:
        kind, arrangement = "raked", (8, 4)
    else:
        contiguous = min(extent // per_access, 8)
        kind, arrangement = "raked", (contiguous, 32 // max(contiguous, 1))
    return kind, ((k, extent) if k_major else (extent, k)), arrangement, per_access


def _thread_map_where(tile, label, desc, axis, extent, k_major) -> str:
    return (f"the {axis} x K = {extent} x {tile.threadblock_shape[2]} {desc.element.label} tile of operand {label}, "
            f"{'K' if k_major else axis}-contiguous, over {tile.threads} threads")


def thread_map_problem(tile: TileDescription, operands, fast_f16: bool = False,
                       iterations_check=None) -> str | None:
    """Why one of ``operands`` (label, TensorDescription, axis "M"/"N", threadblock extent, K-contiguous) has no
    main-loop thread map (:func:`operand_thread_map`'s static_asserts), or None. ``iterations_check(label, desc,
    k_major, per_access, (iter_c, iter_s), where)`` adds the iterator's own limits (a message, or None)."""
    for label, desc, axis, extent, k_major in operands:
        kind, shape, arrangement, per_access = operand_thread_map(tile, k_major, extent, fast_f16)
        iterations = _pitch_linear_iterations(kind, *shape, tile.threads, arrangement, per_access)
        where = _thread_map_where(tile, label, desc, axis, extent, k_major)
        if isinstance(iterations, _Overrun):
            return (f"CUTLASS's main-loop thread map cannot copy {where} ({per_access} element(s) per access): "
                    f"{iterations}; use fewer warps or a tile whose rows the threads divide")
        if isinstance(iterations, str):
            return (f"CUTLASS's main-loop thread map cannot copy {where} ({per_access} element(s) per access"
                    f"{'' if arrangement is None else f', warps arranged {arrangement[0]} x {arrangement[1]}'}; "
                    f"static_assert '{iterations}'); use a larger tile or fewer warps")
        if iterations_check is not None:
            problem = iterations_check(label, desc, k_major, per_access, iterations, where)
            if problem:
                return problem
    return None


def gemm_fast_f16_core(tile: TileDescription) -> bool:
    """Whether a GEMM's main loop uses default_mma.h's OpMultiplyAddFastF16 core (half_t in shared memory): its
    two-stage specialization for float32 tensor-op operands, whatever the math operation."""
    math = tile.math_instruction
    return math.opcode_class is OpClass.TensorOp and math.element_a is DataType.float32 and tile.stages == 2


def mainloop_thread_map_problem(tile: TileDescription, A: TensorDescription, B: TensorDescription,
                                C: TensorDescription) -> str | None:
    """Why CUTLASS's Sm80-family GEMM main loop cannot copy A or B global -> shared with this tile, or None.

    The thread maps of :func:`operand_thread_map` for the kernel's operands (:func:`kernel_operands`), then
    PredicatedTileAccessIterator's (transform/threadblock/predicated_tile_access_iterator.h): its predicates,
    Iterations::kCount x (elements per access / alignment), fill at most four 32-bit words of 4 bits a byte
    ("Too many predicates.", at most 64); and the SIMT cores' TransposePitchLinearThreadMapSimt for a K-contiguous
    operand needs Iterations::kContiguous == 1 (pitch_linear_thread_map.h).
    """
    math = tile.math_instruction
    m, n, _ = tile.threadblock_shape
    fast_f16 = gemm_fast_f16_core(tile)
    (label_a, desc_a, layout_a), (label_b, desc_b, layout_b) = kernel_operands(A, B, C)

    def predicates(label, desc, k_major, per_access, iterations, where):
        if math.opcode_class is OpClass.Simt and k_major and iterations[0] != 1:
            # The SIMT cores store a K-contiguous operand transposed (TransposePitchLinearThreadMapSimt).
            return (f"CUTLASS's SIMT main loop stores {where} transposed, one access along K per thread "
                    f"(TransposePitchLinearThreadMapSimt's static_assert 'Strided iteration has to be one ...'), "
                    f"but its thread map gives {iterations[0]}; use threadblock K <= the {tile.threads} threads")
        count = iterations[0] * iterations[1] * (per_access // desc.alignment)
        if count > 64:
            return (f"CUTLASS's main-loop iterator needs {iterations[0] * iterations[1]} accesses x "
                    f"{per_access // desc.alignment} vectors of alignment {desc.alignment} = {count} predicates per "
                    f"thread for {where}, more than its 64 (static_assert 'Too many predicates.'); raise {label[0]}'s "
                    f"alignment, use a smaller tile or more warps")
        return None
    return thread_map_problem(tile, ((label_a, desc_a, "M", m, layout_a is LayoutType.RowMajor),
                                     (label_b, desc_b, "N", n, layout_b is LayoutType.ColumnMajor)),
                              fast_f16, predicates)


def check_interleaved_thread_maps(tile: TileDescription, what: str) -> None:
    """The interleaved-32 int8 main loop (GEMM and conv fprop) must cover its tiles in one pass per warp.

    DefaultMmaCore for ColumnMajorInterleaved<32> x RowMajorInterleaved<32> (default_mma_core_sm80.h) reads each
    operand with a PitchLinearWarpRakedThreadMap over (extent * 32) x (K / 32) in 16-element vectors, warps first
    along K / 32, and writes shared memory through its TransposePitchLinearThreadMap, which static_asserts
    "Contiguous iteration has to be one": the map's K / 32 rows must be split over the warps with one each, i.e.
    tile K / 32 <= number of warps. (The warps left over split M or N; that every thread gets an access there is
    ``check_operand_types``' rule.) Found by a compile sweep (seed 405): a 32x128x128 tile on two warps was accepted
    and did not compile."""
    k = tile.threadblock_shape[2]
    warps = tile.warp_count[0] * tile.warp_count[1] * tile.warp_count[2]
    k_rows = k // 32
    if k_rows > warps:
        raise DescriptionError(
            f"{what}: the interleaved int8 main loop gives each warp one of the tile's K / 32 = {k_rows} rows of "
            f"32-element groups (TransposePitchLinearThreadMap static_asserts 'Contiguous iteration has to be one'), "
            f"and this tile has {warps} warp(s); use tile K <= {32 * warps} or more warps", rule="sm80.interleaved")


def check_crosswise_tile_k(tile: TileDescription, operands, what: str) -> None:
    """A K-contiguous tensor-op operand must fit one tile K row in a 128-byte shared-memory line.

    CUTLASS's Sm75/Sm80 tensor-op main loops (default_mma_core_sm75.h / _sm80.h) store a K-contiguous operand (GEMM
    A RowMajor or B ColumnMajor; conv fprop A and B, dgrad A) in shared memory as
    ``{RowMajor,ColumnMajor}TensorOpMultiplicandCrosswise<bits, Shape::kK>``, whose
    ``kFactor = 1024 / (bits * kK)`` must be positive (tensor_op_multiplicand_sm75.h static_asserts "kCrosswise
    should be no large than one shared memory cache line"): tile K * bits <= 1024, i.e. K <= 64 for 16-bit, 32 for
    32-bit (tf32) and 128 for int8 operands. (64-bit operands use the 64bCrosswise layouts; SIMT and interleaved
    layouts have no such limit.) ``operands``: (label, TensorDescription, whether K is its contiguous dimension).
    """
    math = tile.math_instruction
    bits = math.element_a.bits
    if math.opcode_class is not OpClass.TensorOp or bits == 64:
        return
    k = tile.threadblock_shape[2]
    for label, desc, k_major in operands:
        if k_major and not desc.layout.is_interleaved and k * bits > 1024:
            raise DescriptionError(
                f"{what}: tile K {k} x {bits}-bit {math.element_a.label} is {k * bits // 8} bytes, more than the "
                f"128-byte shared-memory line CUTLASS's tensor-op layout for the K-contiguous operand {label} "
                f"({desc.layout.value}) holds (TensorOpMultiplicandCrosswise static_asserts 'kCrosswise should be no "
                f"large than one shared memory cache line'); use threadblock K <= {1024 // bits}",
                rule="sm80.crosswise_tile_k")


def check_congruous_tile(tile: TileDescription, operands, what: str, fast_f16: bool = False) -> None:
    """A tensor-op operand contiguous along M or N must have a warp-level shared-memory iterator.

    CUTLASS's Sm75/Sm80 tensor-op main loops store an M- or N-contiguous operand (GEMM A ColumnMajor or B RowMajor
    of the kernel's problem; conv dgrad B, wgrad A and B) as ``TensorOpMultiplicandCongruous<bits, Crosswise>`` with
    ``Crosswise = min(128 bytes / element bytes, threadblock extent)`` (default_mma_core_sm75.h / _sm80.h). The
    warp-level MmaTensorOpMultiplicandTileIterator (gemm/warp/mma_tensor_op_tile_iterator.h) exists for
    Congruous<16, 16>, <16, 32>, <16, 64> and <32, 32> only (any other is an "incomplete type"), and the
    Congruous<16, 16> one keeps TileShape 8 / (4 / (instruction K / 8)) / kFactor 4 pointers: none with a K = 8
    instruction ("the size of an array must be greater than zero" under NVRTC; nvcc builds a zero-length array
    indexed ``c % 0``). ``operands``: (label, axis, threadblock extent) of the congruous operands. ``fast_f16``:
    GEMM's two-stage float32 main loop, which stages float as half_t in Congruous<16, 64> (default_mma.h).
    """
    math = tile.math_instruction
    bits = math.element_a.bits
    if math.opcode_class is not OpClass.TensorOp or bits not in (16, 32) or fast_f16:
        return
    line = 1024 // bits
    for label, axis, extent in operands:
        crosswise = min(line, extent)
        allowed = (16, 32, 64) if bits == 16 else (32,)
        if crosswise not in allowed:
            need = "16, 32 or at least 64" if bits == 16 else "at least 32"
            raise DescriptionError(
                f"{what}: operand {label} is contiguous along {axis}, which CUTLASS's tensor-op main loop stores as "
                f"TensorOpMultiplicandCongruous<{bits}, min({line}, threadblock {axis} = {extent}) = {crosswise}>, "
                f"a layout its warp-level iterator (MmaTensorOpMultiplicandTileIterator) does not have (an "
                f"incomplete type); use threadblock {axis} {need}", rule="sm80.congruous_tile")
        if bits == 16 and crosswise == 16 and math.instruction_shape[2] == 8:
            raise DescriptionError(
                f"{what}: operand {label} is contiguous along {axis} with threadblock {axis} = 16, which CUTLASS's "
                f"warp-level iterator for TensorOpMultiplicandCongruous<16, 16> cannot read with a K = 8 "
                f"instruction (its pointer array has 8 / 4 / 4 = 0 entries: 'the size of an array must be greater "
                f"than zero'); use the {list(math.instruction_shape[:2]) + [16]} instruction or threadblock "
                f"{axis} >= 32", rule="sm80.congruous_tile")


def check_narrow_warp_tiles(tile: TileDescription, C: TensorDescription | None, a_along_m: bool, b_along_n: bool,
                            what: str, half_in_smem: bool = False) -> None:
    """Warp tiles CUTLASS's Sm80-family tensor-op kernels compute wrongly (found by tools/fuzz_run.py on an H100,
    each confirmed on its own and on its transposed twin; CUTLASS's generator emits none of them).

    ``a_along_m`` / ``b_along_n``: the kernel's A is contiguous along M / its B along N (the "congruous" shared-memory
    layouts; for a GEMM with ColumnMajor C these are the transposed problem's operands).
    - 16-bit operands: a congruous operand needs a warp tile of at least 32 along its contiguous dimension. At 16 the
      warp's ldmatrix reads run past its tile (compute-sanitizer: "Invalid __shared__ read of size 16 bytes"; an
      illegal address or a wrong result, with A or B, f16 or bf16, any C).
    - The epilogue needs at least 4 of C's vector accesses per warp-tile row (warp N / C alignment >= 4) for 16-bit
      and wider outputs: with 2 (f32 x 8 or bf16 x 8 on a 16-wide warp tile, f16 x 16 on a 32-wide one) some problem
      sizes come out wrong. (``C`` None: a kernel with another epilogue, e.g. the visitor tree; main loop only.)
    - f32 operands multiplied in f16 or bf16 (``multiply_add_fast_f16`` / ``_fast_bf16``) need a warp tile of at
      least 32 along M: at 16 every problem size comes out wrong, for either A layout, any B layout, C type or
      epilogue (3xTF32, ``multiply_add_fast_f32``, and plain TF32 compute correctly at 16).
    - ``half_in_smem``: a GEMM main loop that keeps f32 operands as half_t in shared memory (the two-stage core,
      :func:`gemm_fast_f16_core`) reads them with the 16-bit warp iterators, so the 16-bit congruous rule holds for
      it (fuzz seed 53: f32 operands, 2 stages, a congruous B 16 wide per warp, every size wrong).
    """
    math = tile.math_instruction
    if math.opcode_class is not OpClass.TensorOp:
        return
    warp_m, warp_n, _ = tile.warp_shape
    fast_16 = math.math_operation.name in ("multiply_add_fast_f16", "multiply_add_fast_bf16")
    if fast_16 and math.element_a.bits == 32 and warp_m < 32:
        raise DescriptionError(
            f"{what}: f32 operands multiplied in {math.math_operation.name.rsplit('_', 1)[1]} "
            f"({math.math_operation.name}) with a warp tile {list(tile.warp_shape)} only {warp_m} along M: CUTLASS "
            f"computes every problem wrongly so (H100). Use at least 32 along M per warp (fewer warps along M or a "
            f"larger tile), or multiply_add / multiply_add_fast_f32", rule="sm80.narrow_warp_tile")
    if math.element_a.bits == 16 or half_in_smem:
        for label, along, extent, congruous in (("A", "M", warp_m, a_along_m), ("B", "N", warp_n, b_along_n)):
            if congruous and extent < 32:
                raise DescriptionError(
                    f"{what}: the kernel's {label} operand is contiguous along {along}, and its warp tile "
                    f"{list(tile.warp_shape)} is {extent} along {along}; CUTLASS's 16-bit tensor-op warp iterators "
                    f"read past such a tile (wrong results or an illegal address on an H100). Use at least 32 along "
                    f"{along} per warp (fewer warps or a larger tile), or a {label} contiguous along K",
                    rule="sm80.narrow_warp_tile")
    if C is not None and not C.layout.is_interleaved and C.element.bits >= 16 and warp_n // C.alignment < 4:
        raise DescriptionError(
            f"{what}: the warp tile is {warp_n} wide in N, {warp_n // C.alignment} of C's {C.alignment}-element "
            f"accesses; CUTLASS's tensor-op epilogue needs at least 4 per warp row (with fewer, some problem sizes "
            f"come out wrong on an H100). Use a C alignment of at most {max(1, warp_n // 4)} or a warp tile at "
            f"least {4 * C.alignment} wide", rule="sm80.epilogue_accesses")


def check_mixed_epilogue_warp_tile(tile: TileDescription, C: TensorDescription, accumulator: DataType,
                                   what: str) -> None:
    """TileIteratorTensorOpMixed (DefaultIteratorsTensorOp's f16<-f32 x8, 16-bit<-s32 x8 and 8-bit<-s32
    specializations) compiles with 16-wide warp tiles but writes wrong results: relative error 0.84 on an H100 for
    f16 output, alignment 8, tile 32x16x32 with 2x1x1 warps; all zeros through the Sm80 visitor epilogue (fuzz seed
    141: tile 16x16x32 on one warp). Every tensor-op Sm80-family epilogue uses these iterators."""
    if tile.warp_shape[1] == 16 and _uses_mixed_epilogue(C, accumulator):
        raise DescriptionError(
            f"{what}: warp tile {list(tile.warp_shape)} is 16 wide in N, which CUTLASS's mixed-precision epilogue "
            f"(C {C.element.label} x {C.alignment} from {accumulator.label} accumulators) computes wrongly; use a "
            f"warp tile 32 or 64 wide, or a smaller C alignment", rule="sm80.warp_tile_n16_mixed")


def check_wide_warp_tile(tile: TileDescription, C: TensorDescription, accumulator: DataType, what: str,
                         visitor: bool = False) -> None:
    """Warp tiles 128 wide in N: CUTLASS's generator never makes them, and its mixed-precision epilogue
    (TileIteratorTensorOpMixed) picks one shared-memory pointer per 1024-bit column block there and writes wrong
    results. The plain TileIteratorTensorOp of a float32 output from float32 accumulators is correct at 128 (GPU
    suite tests/gpu/test_pycutlass211_units.py; PyCUTLASS 2.11's test_sm80.py runs 128x256x16 tiles on 4x2 warps)."""
    if tile.warp_shape[1] != 128:
        return
    if visitor or C.layout.is_interleaved or C.element is not DataType.float32 or accumulator is not DataType.float32:
        kind = ("the epilogue visitor tree" if visitor else "an interleaved output" if C.layout.is_interleaved else
                f"{C.element.label} output from {accumulator.label} accumulators")
        raise DescriptionError(f"{what}: warp tile {list(tile.warp_shape)} is 128 wide in N, which CUTLASS's tensor-op "
                               f"epilogue runs correctly only for a row- or column-major float32 output from float32 "
                               f"accumulators, not {kind}; use a warp tile 16, 32 or 64 wide (change warp_count)",
                               rule="sm80.warp_tile_n128")


def _uses_mixed_epilogue(C: TensorDescription, accumulator: DataType) -> bool:
    """Whether CUTLASS's tensor-op epilogue for this output is TileIteratorTensorOpMixed."""
    if accumulator is DataType.int32:
        return C.element is DataType.int8 or (C.element in (DataType.float16, DataType.bfloat16) and C.alignment == 8)
    return accumulator is DataType.float32 and C.element is DataType.float16 and C.alignment == 8


def epilogue_thread_map_problem(tile: TileDescription, C: TensorDescription) -> str | None:
    """Why CUTLASS's tensor-op epilogue cannot write C with this tile, or None.

    Mirrors ``DefaultThreadMapTensorOp`` -> ``OutputTileOptimalThreadMap`` (cutlass/epilogue/threadblock/
    output_tile_thread_map.h, ``RowArrangement``), whose static_asserts ("Iteration Count Row must be > 0", ...) a
    wide output access on a narrow tile trips: each of the tile's 8-row tensor-op slices is shared by the
    warp_count[1] warps along N, so every warp owns ``8 / warp_count[1]`` rows; a warp stores
    ``access_width = min(N / alignment, 32, 256 bytes / access bytes)`` accesses per row and so covers
    ``min(8, 32 / access_width)`` rows at once, which must not exceed the rows it owns. (When the preferred
    256-byte access already spans more rows than a warp owns, the warp uses its own rows and nothing can fail.)
    """
    warps_m, warps_n, partitions_k = tile.warp_count
    tile_n = tile.threadblock_shape[1]
    epa, bits = C.alignment, C.element.bits
    warps = warps_m * warps_n * partitions_k
    warps_for_rows = 1 if warps_m > warps else warps // warps_m
    if 8 <= warps_for_rows:  # one-dimensional arrangement: each warp takes whole rows
        if tile_n // epa // 32 < 1:
            return (f"the epilogue's output thread map gives each warp whole rows of {tile_n} / {epa} = "
                    f"{tile_n // epa} accesses, fewer than the 32 threads of a warp (warp_count {list(tile.warp_count)})")
        return None
    shape_row = 8 // warps_for_rows
    shape_width = tile_n // epa
    access_bytes = epa * bits // 8
    target_rows = 32 // (256 // access_bytes)
    if target_rows > shape_row:
        access_width, access_rows = 32 // shape_row, shape_row
    else:
        access_width = min(shape_width, 32, 256 // access_bytes)
        access_rows = min(8, 32 // access_width)
    rule = (f"CUTLASS's tensor-op epilogue (OutputTileOptimalThreadMap) gives each warp 8 / warp_count N "
            f"({warps_for_rows}) = {shape_row} row(s) of every 8-row slice and stores min(tile N / alignment, 32, "
            f"256 bytes / access bytes) = {access_width} accesses per row, so a warp covers min(8, 32 / "
            f"{access_width}) = {access_rows} rows at once")
    fix = (f"use a smaller C alignment (now {epa} x {C.element.label} = {access_bytes} bytes), a wider tile N "
           f"(now {tile_n}) or fewer warps along N (now {warps_n})")
    if access_width * epa > tile_n or shape_width // access_width < 1:
        return f"{rule}; {access_width} x {epa} elements exceed the tile's N = {tile_n}; {fix}"
    if shape_row // access_rows < 1:
        return f"{rule}, more than the {shape_row} it owns (static_assert 'Iteration Count Row must be > 0'); {fix}"
    return None


def check_gemm_layouts(op) -> None:
    """The layout rules of a CUTLASS 2.x GEMM (GemmOperationUniversal's, which the grouped GEMM shares): matrix
    layouts, interleaved int8, K-contiguous int8 tensor ops, and the thread maps and warp tiles they imply."""
    math = op.tile_description.math_instruction
    layouts = (op.A.layout, op.B.layout, op.C.layout)
    interleaved = any(layout.is_interleaved for layout in layouts)
    if any(not layout.is_matrix for layout in layouts):
        raise DescriptionError(f"GemmOperationUniversal: A, B and C need matrix layouts (RowMajor, ColumnMajor, "
                               f"or interleaved-32 for int8), got {[layout.value for layout in layouts]}",
                               rule="sm80.layout")
    if interleaved:
        if math.element_a is not DataType.int8 or layouts != _INTERLEAVED_GEMM:
            raise DescriptionError(
                "interleaved int8 GEMM takes A ColumnMajorInterleaved32, B RowMajorInterleaved32 and C "
                f"ColumnMajorInterleaved32; got {[layout.value for layout in layouts]}", rule="sm80.interleaved")
        if op.C.element is not DataType.int8:
            raise DescriptionError("interleaved int8 GEMM writes int8 output (C.element must be int8)",
                                   rule="sm80.interleaved")
        for label, desc in (("A", op.A), ("B", op.B)):
            if desc.alignment != 16:
                raise DescriptionError(f"interleaved int8 GEMM needs {label} alignment 16, got {desc.alignment}",
                                       rule="sm80.interleaved")
        if op.C.alignment != 8:
            # CUTLASS's interleaved epilogue (interleaved_epilogue.h) fails to compile its output operator call
            # for C alignment 2, 4 or 16 (compile sweep seed 414); CUTLASS's generator builds these kernels with
            # 8, the alignment the GPU suites run.
            raise DescriptionError(f"interleaved int8 GEMM writes C with 8 elements per access (CUTLASS's "
                                   f"interleaved epilogue); C alignment must be 8, got {op.C.alignment}",
                                   rule="sm80.interleaved")
        check_interleaved_thread_maps(op.tile_description, type(op).__name__)
        return
    check_crosswise_tile_k(op.tile_description, (("A", op.A, op.A.layout is LayoutType.RowMajor),
                                                   ("B", op.B, op.B.layout is LayoutType.ColumnMajor)),
                           type(op).__name__)
    if math.element_a is DataType.int8 and math.opcode_class is OpClass.TensorOp:
        if (op.A.layout, op.B.layout) != (LayoutType.RowMajor, LayoutType.ColumnMajor):
            raise DescriptionError("int8 tensor-op GEMM reads K-contiguous operands: A must be RowMajor and B "
                                   f"ColumnMajor, got A {op.A.layout.value}, B {op.B.layout.value}",
                                   rule="sm80.int8_k_major")
    what = type(op).__name__
    m, n, _ = op.tile_description.threadblock_shape
    operands = kernel_operands(op.A, op.B, op.C)
    (label_a, _, layout_a), (label_b, _, layout_b) = operands
    a_along_m, b_along_n = layout_a is LayoutType.ColumnMajor, layout_b is LayoutType.RowMajor
    half_in_smem = gemm_fast_f16_core(op.tile_description)
    check_congruous_tile(op.tile_description, [(label_a, "M", m)] * a_along_m + [(label_b, "N", n)] * b_along_n,
                         what, fast_f16=half_in_smem)
    if math.opcode_class is OpClass.Simt:
        check_simt_warp_tile(op.tile_description, operands, what)
    problem = mainloop_thread_map_problem(op.tile_description, op.A, op.B, op.C)
    if problem:
        raise DescriptionError(f"{what}: {problem}", rule="sm80.mainloop_thread_map")
    # (after the rules for what does not compile: those are reported first)
    check_narrow_warp_tiles(op.tile_description, op.C, a_along_m, b_along_n, what, half_in_smem=half_in_smem)
