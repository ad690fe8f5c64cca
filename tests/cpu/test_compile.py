"""CPU tests that compile for real: nvcc and NVRTC (with no toolkit in sight) into the SQLite artifact cache.

Everything targets sm_90 explicitly (a ``pycutlass.Session(target=90)`` per test), so no GPU is needed. Compiles are
slow (seconds each on 2 cores), so they are shared through module-scoped fixtures: five translation units in all
(nvcc: one GEMM, two GEMMs in one unit, one in the concurrency test, one deliberately broken unit; NVRTC: one GEMM).
Each test works in its own session, so nothing leaks between tests.
"""
from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import queue as queue_module
import sqlite3
import struct
import time
import traceback
from pathlib import Path

import pytest

import pycutlass as cutlass
from pycutlass import CompilationError, ToolchainError, compiler
from pycutlass.cache import ArtifactCache
from pycutlass.compiler import toolchain
from pycutlass.compiler.backends import NvccBackend, NvrtcBackend
from pycutlass.compiler.manager import Compiler
from pycutlass.emit import abi, emitter
from pycutlass.emit.emitter import translation_unit


ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
TARGET = cutlass.Target(90)


def _have_nvcc() -> bool:
    try:
        toolchain.nvcc_path()
        return True
    except ToolchainError:
        return False


needs_nvcc = pytest.mark.skipif(not _have_nvcc(), reason="nvcc is not installed")


# --- operations -----------------------------------------------------------------------------------------------------
def f16_gemm(stages=3, swizzle=cutlass.IdentitySwizzle1, layout_c=cutlass.RowMajor, epilogue=None):
    """The guide's f16 TensorOp GEMM, 128x128x32, 3 stages."""
    math = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                   cutlass.OpClass.TensorOp, cutlass.MathOperation.multiply_add)
    tile = cutlass.TileDescription([128, 128, 32], stages, [2, 2, 1], math)
    A = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
    B = cutlass.TensorDescription(cutlass.float16, cutlass.ColumnMajor, 8)
    C = cutlass.TensorDescription(cutlass.float16, layout_c, 8)
    epilogue = epilogue or cutlass.LinearCombination(cutlass.float16, 8, cutlass.float32, cutlass.float32)
    return cutlass.GemmOperationUniversal(80, tile, A, B, C, epilogue, swizzle)


def leaky_column_major_gemm():
    epilogue = cutlass.LinearCombinationGeneric(cutlass.leaky_relu(cutlass.float32), cutlass.float16, 8)
    return f16_gemm(stages=4, layout_c=cutlass.ColumnMajor, epilogue=epilogue)


# --- helpers ---------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def global_compiler(backend=None):
    """A fresh session targeting sm_90 with ``backend``, current for the block (the seed API acts on it)."""
    session = cutlass.Session(target=TARGET, cache_path=":memory:")
    with session.activate():
        if backend is not None:
            compiler.use(backend)
        yield Compiler.of(session)


def new_compiler(backend=None) -> Compiler:
    compiler_ = Compiler(cutlass.Session(target=TARGET, cache_path=":memory:"))
    if backend is not None:
        compiler_.use(backend)
    return compiler_


def assert_cubin(binary: bytes, ops) -> None:
    assert binary[:4] == ELF_MAGIC
    assert binary[4] == 2  # ELFCLASS64
    (machine,) = struct.unpack_from("<H", binary, 18)
    assert machine == EM_CUDA
    for op in ops:
        for symbol in (op.kernel_symbol, op.builder_symbol):
            assert symbol.encode() + b"\x00" in binary, symbol


def claims(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT COUNT(*) FROM claims").fetchone()[0]


# --- (a) nvcc, one GEMM; (c) the cache hit in a fresh Compiler --------------------------------------------------------
@pytest.fixture(scope="module")
def nvcc_cache_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("nvcc-cache") / "compiled_cache.db"


@pytest.fixture(scope="module")
def nvcc_compiled(nvcc_cache_file):
    if not _have_nvcc():
        pytest.skip("nvcc is not installed")
    op = f16_gemm()
    with global_compiler(NvccBackend()):
        start = time.perf_counter()
        kernels = compiler.add_module([op], cache=ArtifactCache(nvcc_cache_file))
        seconds = time.perf_counter() - start
        report = compiler.last_report()
    print(f"nvcc: one f16 GEMM in {seconds:.1f} s")
    return op, kernels, report


def test_nvcc_compiles_one_gemm(nvcc_compiled, nvcc_cache_file):
    op, kernels, report = nvcc_compiled
    assert (report.compiled, report.from_disk, report.from_memory) == (1, 0, 0)
    [kernel] = kernels
    assert_cubin(kernel.binary, [op])
    assert kernel.sha256 == hashlib.sha256(kernel.binary).hexdigest()
    assert (kernel.backend, kernel.target) == ("nvcc", "sm_90")
    assert (kernel.kernel_symbol, kernel.builder_symbol) == (op.name, op.name + "_build")
    assert kernel.key == new_compiler().cache_key(op, TARGET, NvccBackend())
    [entry] = ArtifactCache(nvcc_cache_file).entries()
    assert (entry["key"], entry["name"], entry["sha256"], entry["kind"]) == (kernel.key, op.name, kernel.sha256,
                                                                             "cubin")
    assert entry["meta"] == {"kernel": op.kernel_symbol, "builder": op.builder_symbol, "backend": "nvcc",
                             "target": "sm_90", "description": op.describe()}
    assert claims(nvcc_cache_file) == 0  # released


def test_cache_hit_in_a_fresh_compiler(nvcc_compiled, nvcc_cache_file):
    op, [kernel], _ = nvcc_compiled
    fresh = new_compiler(NvccBackend())
    [again] = fresh.add_module([f16_gemm()], cache=ArtifactCache(nvcc_cache_file))  # an equal, new description
    report = fresh.last_report
    assert (report.compiled, report.from_disk, report.from_memory) == (0, 1, 0)
    assert (again.key, again.sha256, again.binary) == (kernel.key, kernel.sha256, kernel.binary)
    # Then from this compiler's memory; equal descriptions given twice are compiled (and reported) once.
    both = fresh.add_module([op, f16_gemm()], cache=ArtifactCache(nvcc_cache_file))
    assert (fresh.last_report.compiled, fresh.last_report.from_disk, fresh.last_report.from_memory) == (0, 0, 1)
    assert [k.key for k in both] == [kernel.key]
    assert fresh.lookup(op, TARGET) == again
    # The global compiler with the same settings finds it on disk too.
    with global_compiler(NvccBackend()):
        [hit] = compiler.add_module([op], cache=ArtifactCache(nvcc_cache_file))
        assert (compiler.last_report().compiled, compiler.last_report().from_disk) == (0, 1)
        assert hit.binary == kernel.binary


def test_a_different_target_is_a_miss(nvcc_compiled, nvcc_cache_file):
    """The cached sm_90 cubin is never handed out for another target (SASS is not forward compatible)."""
    op, [kernel], _ = nvcc_compiled
    fresh = new_compiler(NvccBackend())
    for arch in (cutlass.Target(80), cutlass.Target(89)):
        key = fresh.cache_key(op, arch)
        assert key != kernel.key and ArtifactCache(nvcc_cache_file).lookup(key) is None


# --- (d) key sensitivity, no compile ----------------------------------------------------------------------------------
@needs_nvcc  # it keys nvcc builds, whose key holds the real nvcc's version
def test_cache_key_sensitivity(monkeypatch):
    keys = new_compiler()
    op = f16_gemm()
    nvcc = NvccBackend()
    base = keys.cache_key(op, TARGET, nvcc)
    assert len(base) == 64 and int(base, 16) >= 0
    assert new_compiler().cache_key(f16_gemm(), TARGET, NvccBackend()) == base  # stable, and by value
    variants = {
        "nvrtc backend": keys.cache_key(op, TARGET, NvrtcBackend()),
        "extra flags": keys.cache_key(op, TARGET, NvccBackend(("-lineinfo",))),
        "nvrtc extra flags": keys.cache_key(op, TARGET, NvrtcBackend(("-lineinfo",))),
        "target 80": keys.cache_key(op, cutlass.Target(80), nvcc),
        "other op (stages)": keys.cache_key(f16_gemm(stages=4), TARGET, nvcc),
        "other op (swizzle)": keys.cache_key(f16_gemm(swizzle=cutlass.IdentitySwizzle2), TARGET, nvcc),
    }
    with monkeypatch.context() as patch:
        patch.setattr(toolchain, "cutlass_version", lambda: "9.9.9")
        variants["cutlass version"] = keys.cache_key(op, TARGET, nvcc)
    with monkeypatch.context() as patch:
        patch.setattr(nvcc, "version", lambda: "nvcc 99.9.99")
        variants["nvcc version"] = keys.cache_key(op, TARGET, nvcc)
    with monkeypatch.context() as patch:
        nvrtc = NvrtcBackend()
        nvrtc_key = keys.cache_key(op, TARGET, nvrtc)
        patch.setattr(nvrtc, "version", lambda: "nvrtc 99.9")
        variants["nvrtc version"] = keys.cache_key(op, TARGET, nvrtc)
        assert variants["nvrtc version"] != nvrtc_key
    assert keys.cache_key(op, TARGET, nvcc) == base  # every patch undone
    everything = [base, *variants.values()]
    assert len(set(everything)) == len(everything), {k: v[:12] for k, v in variants.items()}
    # The versions that go into the key are real ones.
    assert toolchain.cutlass_version().count(".") == 2 and "?" not in toolchain.cutlass_version()
    assert NvccBackend().version().startswith("nvcc 13.")


def test_backend_flags():
    nvcc, nvrtc = NvccBackend(("-lineinfo",)).flags(90), NvrtcBackend().flags(90)
    assert "-gencode=arch=compute_90,code=sm_90" in nvcc and "-cubin" in nvcc and nvcc[-1] == "-lineinfo"
    assert "--gpu-architecture=sm_90" in nvrtc and "-default-device" in nvrtc
    assert "-DNDEBUG" in nvcc and "-DNDEBUG" in nvrtc and "-std=c++17" in nvcc and "-std=c++17" in nvrtc
    assert "--expt-relaxed-constexpr" in nvcc and "--expt-relaxed-constexpr" not in nvrtc  # NVRTC rejects it


def test_target_selection():
    op = f16_gemm()
    with global_compiler() as state:
        assert state.target_for(op) == TARGET
        compiler.set_target_arch(None)
        from pycutlass.compiler.target import detected_compute_capability

        expected = detected_compute_capability() or op.compute_capability  # no GPU: the operation's own
        assert state.target_for(op) == cutlass.Target(expected)
    assert cutlass.session.default().options.get("target") is None  # the default session was never touched


# --- (g) two operations in one unit -----------------------------------------------------------------------------------
@needs_nvcc
def test_two_operations_one_unit_one_binary(tmp_path):
    ops = [f16_gemm(), leaky_column_major_gemm()]
    cache = ArtifactCache(tmp_path / "two.db")
    with global_compiler(NvccBackend()):
        kernels = compiler.add_module(ops, cache=cache)
        assert compiler.last_report().compiled == 2
    assert len({k.sha256 for k in kernels}) == 1 and kernels[0].binary is kernels[1].binary
    assert_cubin(kernels[0].binary, ops)
    entries = cache.entries()
    assert len(entries) == 2
    assert {e["key"] for e in entries} == {k.key for k in kernels}
    assert {e["name"] for e in entries} == {op.name for op in ops}
    assert len({e["sha256"] for e in entries}) == 1 and entries[0]["sha256"] == kernels[0].sha256
    assert cache.size_bytes() == len(kernels[0].binary)  # stored once
    # Each key alone finds the shared binary.
    for op, kernel in zip(ops, kernels):
        artifact = cache.lookup(kernel.key)
        assert artifact.binary == kernel.binary and artifact.name == op.name


# --- (e) a compile error -------------------------------------------------------------------------------------------------
FIRST_ERROR = "pycutlass_test_undefined_first_identifier"
FILLER = "x" * 300


def _broken_body(op) -> str:
    """A first, distinctive error, then many long ones (the log of a real CUTLASS error is long too)."""
    lines = [f'extern "C" __global__ void {op.name}(int *out) {{ *out = {FIRST_ERROR}; }}']
    lines += [f'static_assert(sizeof(int) == {1000 + i}, "{FILLER}{i}");' for i in range(150)]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def broken_compile(tmp_path_factory):
    if not _have_nvcc():
        pytest.skip("nvcc is not installed")
    op = f16_gemm(swizzle=cutlass.IdentitySwizzle8)
    op.emit_body = lambda: _broken_body(op)  # this instance only
    op.headers = lambda: ["cutlass/numeric_types.h"]  # keep the failing compile small (see the prelude test)
    path = tmp_path_factory.mktemp("broken") / "compiled_cache.db"
    cache = ArtifactCache(path)
    with global_compiler(NvccBackend()):
        try:
            compiler.add_module([op], cache=cache)
        except CompilationError as exc:
            error = exc
        else:
            pytest.fail("an invalid translation unit compiled")
        state = Compiler.of()
        memory_after = dict(state._memory)
        key = state.cache_key(op, TARGET)
    return op, error, cache, path, key, memory_after


def test_compile_error_is_a_compilation_error_with_the_log(broken_compile):
    op, error, cache, path, key, memory_after = broken_compile
    assert isinstance(error, cutlass.PyCutlassError) and isinstance(error, RuntimeError)
    message = str(error)
    assert "failed to compile with nvcc" in message and op.name in message  # names the operation
    assert "nvcc failed (exit " in message and "for sm_90" in message
    assert "--- compiler log ---" in message and error.log and error.log in message
    assert "error" in error.log and "static assertion failed" in error.log
    assert error.source == translation_unit([op]) and FIRST_ERROR in error.source
    # Nothing half-done is left behind: no entry, no claim, nothing remembered.
    assert cache.lookup(key) is None and cache.entries() == []
    assert claims(path) == 0
    assert key not in memory_after


def test_compile_error_log_keeps_the_first_error(broken_compile):
    _, error, *_ = broken_compile
    assert FIRST_ERROR in error.log


@needs_nvcc
def test_prelude_compiles_on_its_own():
    NvccBackend().compile(emitter.prelude([], [abi.LaunchInfo]), 90, "pycutlass_prelude_only")


def test_compile_error_message_carries_the_log_once(broken_compile):
    _, error, *_ = broken_compile
    assert str(error).count("--- compiler log ---") == 1


# --- (f) concurrency: three processes, one compile ----------------------------------------------------------------------
def _concurrent_worker(cache_path: str, barrier, results) -> None:
    try:
        worker = new_compiler(NvccBackend())
        op = f16_gemm()
        barrier.wait(timeout=300)
        [kernel] = worker.add_module([op], cache=ArtifactCache(cache_path))
        report = worker.last_report
        results.put((os.getpid(), report.compiled, report.from_disk, report.from_memory, kernel.sha256, None))
    except BaseException:
        results.put((os.getpid(), None, None, None, None, traceback.format_exc()))


@needs_nvcc
def test_concurrent_processes_compile_once(tmp_path):
    cache_path = tmp_path / "shared" / "compiled_cache.db"
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    workers = [ctx.Process(target=_concurrent_worker, args=(str(cache_path), barrier, results)) for _ in range(3)]
    for worker in workers:
        worker.start()
    try:
        reports = []
        for _ in workers:
            try:
                reports.append(results.get(timeout=540))
            except queue_module.Empty:
                pytest.fail(f"a worker did not report; got {reports}")
        for worker in workers:
            worker.join(timeout=60)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
    errors = [r[-1] for r in reports if r[-1]]
    assert not errors, "\n".join(errors)
    assert [w.exitcode for w in workers] == [0, 0, 0]
    compiled = sorted(r[1] for r in reports)
    assert compiled == [0, 0, 1], f"exactly one process compiles: {reports}"
    assert sorted(r[2] for r in reports) == [0, 1, 1]  # the others load its result from disk
    assert all(r[3] == 0 for r in reports)
    assert len({r[4] for r in reports}) == 1
    [entry] = ArtifactCache(cache_path).entries()
    assert entry["sha256"] == reports[0][4]
    assert claims(cache_path) == 0


# --- (b) NVRTC with the toolkit hidden ---------------------------------------------------------------------------------
def test_nvrtc_with_pip_headers_only(toolkit_hidden):
    pytest.importorskip("cuda.bindings.nvrtc")
    with pytest.raises(ToolchainError, match="nvcc not found"):
        toolchain.nvcc_path()
    include_dirs = toolchain.cuda_include_dirs()
    assert include_dirs, "no CUDA headers found"
    for directory in include_dirs:
        assert "site-packages" in directory.parts or "dist-packages" in directory.parts, directory
        assert "nvidia" in directory.parts, directory
    flags = NvrtcBackend().include_flags()
    assert not any("/usr/local/cuda" in flag for flag in flags), flags
    assert new_compiler().backend.name == "nvrtc"  # the default without nvcc
    op = f16_gemm()
    with global_compiler(NvrtcBackend()):
        start = time.perf_counter()
        [kernel] = compiler.add_module([op], cache=ArtifactCache(":memory:"))
        seconds = time.perf_counter() - start
        assert (compiler.last_report().compiled, compiler.last_report().from_disk) == (1, 0)
        assert kernel.key == Compiler.of().cache_key(op, TARGET)
    assert (kernel.backend, kernel.target) == ("nvrtc", "sm_90")
    assert_cubin(kernel.binary, [op])
    print(f"nvrtc: one f16 GEMM in {seconds:.1f} s, cubin {len(kernel.binary)} bytes")


def test_nvrtc_does_not_corrupt_shared_bytes_objects():
    """A clean compile has a 1-byte log; writing it into b" " * 1 would overwrite CPython's shared b" "."""
    from pycutlass.compiler.backends import NvrtcBackend

    cubin = NvrtcBackend().compile('extern "C" __global__ void pycutlass_tiny_kernel() {}', 90, "tiny")
    assert cubin[:4] == b"\x7fELF"
    assert b" " == bytes([32]) and " ".join(["a", "b"]).encode() == b"a b"


def test_units_cap_sm90_operations_and_run_as_many_as_memory_holds(monkeypatch):
    """SM90 operations go at most HEAVY_UNIT_OPERATIONS to a translation unit (a unit's NVRTC memory grows with its
    operations) apart from CUTLASS 2.x ones; fewer units run at once where their estimated memory exceeds what is
    available."""
    from pycutlass.compiler import manager
    from pycutlass.description.target import Target

    monkeypatch.setattr(manager, "translation_unit", lambda ops: "")

    class Op:
        unit_macros = ()  # (the operation base's default)

        def __init__(self, name, family):
            self.name, self.family = name, family

    target = Target(90)
    heavy = [(Op(f"h{i}", "sm90"), target) for i in range(30)]
    light = [(Op(f"l{i}", "sm80"), target) for i in range(5)]
    units = manager._units(heavy + light, 2)
    sizes = sorted(len(ops) for ops, *_ in units if ops[0].family == "sm90")
    assert sizes == [7, 7, 8, 8] and max(sizes) <= manager.HEAVY_UNIT_OPERATIONS
    assert [len(ops) for ops, *_ in units if ops[0].family == "sm80"] == [3, 2]
    assert all(len({op.family for op in ops}) == 1 for ops, *_ in units)
    assert sorted(op.name for ops, *_ in units for op in ops) == sorted(op.name for op, _ in heavy + light)
    # jobs=None keeps one unit where the cap allows: a batch of 8 SM90 operations is still one unit
    assert [len(ops) for ops, *_ in manager._units(heavy[:8], None)] == [8]
    assert [len(ops) for ops, *_ in manager._units(heavy[:9], None)] == [5, 4]
    # memory: 8-operation SM90 units take ~8.6 GB each
    monkeypatch.setattr(manager, "_available_gb", lambda: 20.0)
    assert manager._parallel_units(units, 4) == 2
    monkeypatch.setattr(manager, "_available_gb", lambda: 5.0)
    assert manager._parallel_units(units, 4) == 1
    monkeypatch.setattr(manager, "_available_gb", lambda: None)
    assert manager._parallel_units(units, 4) == 4
    light_units = manager._units(light, 3)
    monkeypatch.setattr(manager, "_available_gb", lambda: 1.0)
    assert manager._parallel_units(light_units, 3) == 3  # CUTLASS 2.x units are not held back
