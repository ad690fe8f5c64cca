"""CPU tests of GemmOperationGrouped: construction, rejections, scheduling sizes, emission and real compiles.

The compiles (nvcc, then NVRTC with nvcc hidden) target sm_90 explicitly, so no GPU is needed.
"""
from __future__ import annotations

import ctypes
import re
import shutil
import time

import pytest

import pycutlass
from pycutlass.kinds.gemm_grouped.abi import GemmGroupedArgs
from pycutlass import compiler
from pycutlass.cache.store import ArtifactCache
from pycutlass.compiler import toolchain
from pycutlass.emit import abi
from pycutlass.emit.emitter import translation_unit
from pycutlass.errors import ArgumentError, DescriptionError, ToolchainError
from pycutlass import GemmOperationGrouped, GemmOperationUniversal, SchedulerMode
from pycutlass.kinds.gemm_grouped.operation import PRECOMPUTE_THREADS, PROBLEM_INFO_BYTES


c = pycutlass


# --- fixtures ---------------------------------------------------------------------------------------------------
def _bf16_tile(shape=(128, 128, 32), stages=3, warps=(2, 2, 1)):
    math = c.MathInstruction([16, 8, 16], c.bfloat16, c.bfloat16, c.float32, c.OpClass.TensorOp)
    return c.TileDescription(list(shape), stages, list(warps), math)


def _f16_tile(shape=(64, 128, 32), stages=4, warps=(2, 2, 1)):
    math = c.MathInstruction([16, 8, 16], c.float16, c.float16, c.float32, c.OpClass.TensorOp)
    return c.TileDescription(list(shape), stages, list(warps), math)


def bf16_grouped(layout_c=c.ColumnMajor, mode=SchedulerMode.Device, **kwargs):
    """bf16 grouped GEMM, column-major output by default (the internally transposed kernel)."""
    A = c.TensorDescription(c.bfloat16, c.RowMajor, 8)
    B = c.TensorDescription(c.bfloat16, c.ColumnMajor, 8)
    C = c.TensorDescription(c.bfloat16, layout_c, 8)
    epilogue = c.LinearCombination(c.bfloat16, 8, c.float32, c.float32)
    return GemmOperationGrouped(80, _bf16_tile(), A, B, C, epilogue, precompute_mode=mode, **kwargs)


def f16_grouped_host():
    """f16 grouped GEMM with the Host schedule and an activation with a runtime argument."""
    A = c.TensorDescription(c.float16, c.ColumnMajor, 8)
    B = c.TensorDescription(c.float16, c.RowMajor, 8)
    C = c.TensorDescription(c.float16, c.RowMajor, 4)
    epilogue = c.LinearCombinationGeneric(c.leaky_relu(c.float32), c.float16, 4, c.float32, c.float32)
    return GemmOperationGrouped(80, _f16_tile(), A, B, C, epilogue, c.IdentitySwizzle2, SchedulerMode.Host)


def f16_universal():
    A = c.TensorDescription(c.float16, c.RowMajor, 8)
    B = c.TensorDescription(c.float16, c.RowMajor, 8)
    C = c.TensorDescription(c.float16, c.RowMajor, 8)
    epilogue = c.LinearCombination(c.float16, 8, c.float32, c.float32)
    return GemmOperationUniversal(80, _f16_tile((128, 128, 32), 3), A, B, C, epilogue)


# --- construction and rejections -----------------------------------------------------------------------------------
def test_construction_and_defaults():
    op = bf16_grouped()
    assert op.precompute_mode is SchedulerMode.Device
    assert op.swizzling_functor is c.IdentitySwizzle1
    assert op.compute_capability == 80 and op.transposed
    assert op.kernel_symbol == op.name and op.builder_symbol == op.name + "_build"
    assert op.precompute_symbol is None
    assert op.thread_count == 128
    assert op.name.startswith("pycutlass_gemm_grouped_sm80_tensorop_bf16bf16f32_tnn_128x128x32_2x2x1_s3_a888_device_")
    host = f16_grouped_host()
    assert host.precompute_symbol == host.name + "_precompute" and not host.transposed
    plan = host.launch_plan()
    assert plan["precompute"] == host.precompute_symbol and plan["precompute_threads"] == PRECOMPUTE_THREADS
    assert plan["shared_storage_symbol"] == host.name + "_shared_storage_bytes"
    assert "scheduler=Host" in host.describe()
    # The users' spelling: positional swizzle and mode, as in the guide.
    op2 = GemmOperationGrouped(90, _bf16_tile(), op.A, op.B, op.C, op.epilogue_functor, c.IdentitySwizzle1,
                               SchedulerMode.Host)
    assert op2.precompute_mode is SchedulerMode.Host and op2.compute_capability == 90
    assert repr(SchedulerMode.Host) == "pycutlass.SchedulerMode.Host"


def test_identity_equality_and_unique_names():
    assert bf16_grouped() == bf16_grouped() and hash(bf16_grouped()) == hash(bf16_grouped())
    variants = [bf16_grouped(), bf16_grouped(mode=SchedulerMode.Host), bf16_grouped(layout_c=c.RowMajor),
                bf16_grouped(swizzling_functor=c.IdentitySwizzle4), f16_grouped_host()]
    names = [op.name for op in variants]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) for n in names)
    # A grouped op never shares a name with a GEMM of the same types.
    assert f16_universal().name not in names


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "Host"}, "precompute_mode must be pycutlass.SchedulerMode.Host"),
    ({"mode": None}, "precompute_mode must be"),
    ({"swizzling_functor": c.StridedDgradIdentitySwizzle1}, "schedules its tiles itself"),
])
def test_rejects_bad_mode_and_swizzle(kwargs, message):
    with pytest.raises(DescriptionError, match=message):
        bf16_grouped(**kwargs)


def test_rejects_operand_mismatches_with_the_gemm_checks():
    tile = _bf16_tile()
    A = c.TensorDescription(c.float16, c.RowMajor, 8)  # the instruction multiplies bf16
    B = c.TensorDescription(c.bfloat16, c.ColumnMajor, 8)
    C = c.TensorDescription(c.bfloat16, c.RowMajor, 8)
    epilogue = c.LinearCombination(c.bfloat16, 8, c.float32, c.float32)
    with pytest.raises(DescriptionError, match=r"GemmOperationGrouped: A.element is float16 .* bfloat16"):
        GemmOperationGrouped(80, tile, A, B, C, epilogue)
    A = c.TensorDescription(c.bfloat16, c.RowMajor, 8)
    with pytest.raises(DescriptionError, match="GemmOperationGrouped: the epilogue writes float16 but C is bfloat16"):
        GemmOperationGrouped(80, tile, A, B, C, c.LinearCombination(c.float16, 8, c.float32, c.float32))
    with pytest.raises(DescriptionError, match="GemmOperationGrouped: epilogue alignment 4 must equal C's alignment 8"):
        GemmOperationGrouped(80, tile, A, B, C, c.LinearCombination(c.bfloat16, 4, c.float32, c.float32))
    with pytest.raises(DescriptionError, match="GemmOperationGrouped: tile_description must be a TileDescription"):
        GemmOperationGrouped(80, None, A, B, C, epilogue)
    with pytest.raises(DescriptionError, match="GemmOperationGrouped: B must be a TensorDescription"):
        GemmOperationGrouped(80, tile, A, "B", C, epilogue)
    with pytest.raises(DescriptionError, match="compute capability 70 is not supported"):
        GemmOperationGrouped(70, tile, A, B, C, epilogue)
    with pytest.raises(DescriptionError, match="below the 32-bit minimum of multistage"):
        GemmOperationGrouped(80, tile, c.TensorDescription(c.bfloat16, c.RowMajor, 1), B, C, epilogue)


def test_rejects_layouts():
    math = c.MathInstruction([16, 8, 32], c.int8, c.int8, c.int32, c.OpClass.TensorOp,
                             c.MathOperation.multiply_add_saturate)
    tile = c.TileDescription([128, 128, 64], 3, [2, 2, 1], math)
    epilogue = c.LinearCombinationClamp(c.int8, 16, c.int32, c.float32)
    A = c.TensorDescription(c.int8, c.ColumnMajorInterleaved32, 16)
    B = c.TensorDescription(c.int8, c.RowMajorInterleaved32, 16)
    C = c.TensorDescription(c.int8, c.ColumnMajorInterleaved32, 16)
    with pytest.raises(DescriptionError, match="interleaved and tensor layouts are not supported for grouped GEMM"):
        GemmOperationGrouped(80, tile, A, B, C, epilogue)
    with pytest.raises(DescriptionError, match="must be RowMajor or ColumnMajor"):
        GemmOperationGrouped(80, tile, c.TensorDescription(c.int8, c.TensorNHWC, 16), B, C, epilogue)
    # The GEMM's int8 rule applies too: tensor-op int8 reads K-contiguous A (RowMajor) and B (ColumnMajor).
    row = c.TensorDescription(c.int8, c.RowMajor, 16)
    col = c.TensorDescription(c.int8, c.ColumnMajor, 16)
    C = c.TensorDescription(c.int8, c.RowMajor, 16)
    with pytest.raises(DescriptionError, match="int8 tensor-op GEMM reads K-contiguous operands"):
        GemmOperationGrouped(80, tile, col, col, C, epilogue)
    assert GemmOperationGrouped(80, tile, row, col, C, epilogue).name


def test_rejects_too_much_shared_memory():
    with pytest.raises(DescriptionError, match="KiB of shared memory"):
        GemmOperationGrouped(86, _bf16_tile((256, 128, 64), 6, (4, 2, 1)), c.TensorDescription(c.bfloat16,
                             c.RowMajor, 8), c.TensorDescription(c.bfloat16, c.ColumnMajor, 8),
                             c.TensorDescription(c.bfloat16, c.RowMajor, 8),
                             c.LinearCombination(c.bfloat16, 8, c.float32, c.float32))


# --- scheduling sizes -------------------------------------------------------------------------------------------
def _cutlass_host_precompute(op, problems, block_count):
    """Python transcription of CUTLASS's ProblemVisitor::host_precompute, the layout <name>_precompute writes."""
    tiles = [op.problem_tile_count(p) for p in problems]
    total = sum(tiles)
    entries_per_block = (total - 1 + block_count) // block_count
    schedule = [None] * (entries_per_block * block_count)
    tile = start = 0
    for index, count in enumerate(tiles):
        for _ in range(count):
            schedule[entries_per_block * (tile % block_count) + tile // block_count] = (index, start)
            tile += 1
        start += count
    return schedule


def test_tile_counts_follow_the_internal_transpose():
    col = bf16_grouped()  # 128x128 tiles, column-major C: tiles over (N, M)
    row = f16_grouped_host()  # 64x128 tiles, row-major C
    assert row.problem_tile_count(c.GemmCoord(65, 129, 7)) == 2 * 2
    assert row.problem_tile_count(c.GemmCoord(129, 65, 7)) == 3 * 1
    assert col.problem_tile_count(c.GemmCoord(129, 1, 0)) == 2
    f16_col = GemmOperationGrouped(80, _f16_tile(), row.A, row.B, c.TensorDescription(c.float16, c.ColumnMajor, 4),
                                   row.epilogue_functor)
    assert f16_col.problem_tile_count(c.GemmCoord(65, 129, 7)) == 3 * 1  # m, n swapped against 64x128
    problems = [c.GemmCoord(65, 129, 7), c.GemmCoord(0, 64, 64), c.GemmCoord(64, 0, 64), c.GemmCoord(64, 64, 0),
                (1, 1, 1)]
    assert row.tile_count(problems) == 4 + 0 + 0 + 1 + 1
    with pytest.raises(ArgumentError, match="problem 1: expected a GemmCoord"):
        row.tile_count([(1, 1, 1), (1, 1)])
    with pytest.raises(ArgumentError, match="problem 0: sizes must be >= 0"):
        row.tile_count([(1, -1, 1)])


def test_grid_and_workspace_follow_cutlass():
    op = f16_grouped_host()
    problems = [c.GemmCoord(1024, 1024, 64)] * 3  # 16 * 8 tiles each, 384 in all
    assert op.tile_count(problems) == 384
    assert op.grid_for(132, 2) == 264  # no problems: one full wave
    assert op.grid_for(132, 2, problems) == 264
    assert op.grid_for(132, 4, problems) == 384  # never more blocks than tiles
    assert op.grid_for(132, 2, problems[:1]) == 128  # one problem: one block per tile
    assert op.grid_for(132, 2, [c.GemmCoord(0, 5, 5), c.GemmCoord(5, 0, 5)]) == 0  # nothing to launch
    for bad in ((0, 2), (132, 0), (132, -1), (1.5, 2), (True, 2)):
        with pytest.raises(ArgumentError, match="must be a positive integer"):
            op.grid_for(*bad, problems)
    with pytest.raises(ArgumentError, match="too much shared memory"):
        op.grid_for(132, 0)
    # Host mode: ProblemVisitor::get_workspace_size = sizeof(ProblemInfo) * ceil(tiles / blocks) * blocks.
    assert op.workspace_bytes(problems, 264) == PROBLEM_INFO_BYTES * 2 * 264
    assert op.workspace_bytes(problems, 384) == PROBLEM_INFO_BYTES * 384
    assert len(_cutlass_host_precompute(op, problems, 264)) * PROBLEM_INFO_BYTES == op.workspace_bytes(problems, 264)
    assert bf16_grouped().workspace_bytes(problems, 264) == 0  # Device mode needs none
    with pytest.raises(ArgumentError, match="threadblock_count must be positive"):
        op.workspace_bytes(problems, 0)
    with pytest.raises(ArgumentError, match="counts tiles in int32"):
        op.tile_count([c.GemmCoord(2 ** 20, 2 ** 20, 1)] * 40)


# --- ABI and emission -----------------------------------------------------------------------------------------
def test_abi_struct_is_padding_free_and_carries_the_schedule():
    GemmGroupedArgs.check_no_padding()
    fields = dict(GemmGroupedArgs._fields_)
    for name in ("problem_count", "threadblock_count", "tile_count", "problem_sizes", "ptr_A", "ptr_B", "ptr_C",
                 "ptr_D", "lda", "ldb", "ldc", "ldd", "workspace", "workspace_bytes", "alpha", "beta",
                 "activation_args"):
        assert name in fields
    assert ctypes.sizeof(GemmGroupedArgs) % 8 == 0
    assert "struct GemmGroupedArgs {" in abi.cpp_definitions([GemmGroupedArgs])


def test_emission_shares_a_unit_with_a_gemm():
    ops = [bf16_grouped(), f16_grouped_host(), f16_universal(), bf16_grouped(mode=SchedulerMode.Host)]
    source = translation_unit(ops)
    assert source.count('#include "cutlass/gemm/kernel/default_gemm_grouped.h"') == 1
    assert source.count("struct GemmGroupedArgs {") == 1
    for op in ops:
        assert source.count(f"namespace {op.name}_ns {{") == 1
        assert source.count(f"void {op.builder_symbol}(") == 1
        assert re.search(rf"\b{op.kernel_symbol}\(typename {op.name}_ns::Kernel::Params params\)", source)
    for op in ops[:2] + ops[3:]:
        assert f"extern \"C\" __device__ const int {op.shared_storage_symbol} =\n" in source
        assert f"pycutlass_abi::GemmGroupedArgs a, pycutlass_abi::LaunchInfo *info" in source
    device, host, _, host_bf16 = ops
    assert "GroupScheduleMode::kDeviceOnly" in device.emit_body()
    assert f"{device.name}_precompute" not in source
    for op in (host, host_bf16):
        body = op.emit_body()
        assert "GroupScheduleMode::kHostPrecompute" in body
        assert f"{op.precompute_symbol}(pycutlass_abi::GemmGroupedArgs a, pycutlass_abi::LaunchInfo *info)" in body
        assert "construct_params<K>(params_out, args,\n" in body and "reinterpret_cast<void *>(a.workspace), a.tile_count);" in body
    assert "epilogue.leaky_alpha = Compute(a.activation_args[0]);" in host.emit_body()
    assert "Kernel::kTransposed == true" in device.emit_body()
    assert "Kernel::kTransposed == false" in host.emit_body()
    # Every C++ identifier the grouped bodies define at global scope is prefixed by the operation's name.
    for op in (device, host):
        body = op.emit_body()
        defined = set(re.findall(r"^namespace (\w+) \{", body, re.M)
                      + re.findall(r"^(?!static_assert)(\w+)\(", body, re.M)
                      + re.findall(r"extern \"C\" __global__ void (?!__launch_bounds__)(\w+)\(", body)
                      + re.findall(r"extern \"C\" __device__ const int (\w+) =$", body, re.M))
        expected = {op.name + "_ns", op.kernel_symbol, op.builder_symbol, op.shared_storage_symbol}
        assert defined == expected | ({op.precompute_symbol} if op.precompute_symbol else set())


# --- real compiles (one nvcc, one NVRTC; slow) --------------------------------------------------------------
def _assert_symbols(binary: bytes, ops) -> None:
    for op in ops:
        symbols = [op.kernel_symbol, op.builder_symbol]
        if isinstance(op, GemmOperationGrouped):
            symbols.append(op.shared_storage_symbol)
            if op.precompute_symbol:
                symbols.append(op.precompute_symbol)
        for symbol in symbols:
            assert symbol.encode() + b"\x00" in binary, symbol


def test_compile_with_nvcc(compiler_state):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    compiler.nvcc()
    # BatchedIdentitySwizzle as PyCUTLASS 2.11's own grouped tests pass it (the kernel ignores the type)
    ops = [bf16_grouped(swizzling_functor=c.BatchedIdentitySwizzle), f16_grouped_host(), f16_universal()]
    start = time.perf_counter()
    kernels = compiler.add_module(ops, cache=ArtifactCache(":memory:"))
    seconds = time.perf_counter() - start
    assert compiler.last_report().compiled == 3
    assert len({k.sha256 for k in kernels}) == 1  # one translation unit, one cubin
    assert all(k.backend == "nvcc" and k.target == "sm_90" for k in kernels)
    _assert_symbols(kernels[0].binary, ops)
    print(f"nvcc: 2 grouped + 1 GEMM in {seconds:.1f} s")


def test_compile_with_nvrtc_and_pip_headers_only(compiler_state, toolkit_hidden):
    pytest.importorskip("cuda.bindings.nvrtc")
    with pytest.raises(ToolchainError):
        toolchain.nvcc_path()
    assert all("site-packages" in str(d) or "dist-packages" in str(d) for d in toolchain.cuda_include_dirs())
    compiler.nvrtc()
    ops = [bf16_grouped(swizzling_functor=c.BatchedIdentitySwizzle), f16_grouped_host()]
    start = time.perf_counter()
    kernels = compiler.add_module(ops, cache=ArtifactCache(":memory:"))
    seconds = time.perf_counter() - start
    assert compiler.last_report().compiled == 2
    assert all(k.backend == "nvrtc" and k.target == "sm_90" for k in kernels)
    _assert_symbols(kernels[0].binary, ops)
    print(f"nvrtc: 2 grouped in {seconds:.1f} s")
