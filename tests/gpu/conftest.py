"""GPU fixtures: one RMM pool per session, operations precompiled in parallel, allocator checked per test."""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import pycutlass as cutlass


@pytest.fixture(scope="session")
def memory_pool():
    cutlass.get_memory_pool(2**28, 2**34)
    yield


@pytest.fixture(autouse=True)
def allocator_returns_to_baseline(request):
    """Every GPU test must give back what its arguments allocated."""
    if "gpu" not in request.keywords:
        yield
        return
    request.getfixturevalue("memory_pool")
    gc.collect()
    before = cutlass.get_allocated_size()
    yield
    gc.collect()
    after = cutlass.get_allocated_size()
    assert after == before, f"allocator not back to baseline: {after - before} bytes still held"


def precompile(operations, backend: str = "nvcc") -> None:
    """Compile every operation a module needs in parallel units (the host has many cores)."""
    if not operations:
        return
    previous = cutlass.compiler.backend()
    try:
        cutlass.compiler.nvrtc() if backend == "nvrtc" else cutlass.compiler.nvcc()
        # every core: the compiler runs fewer units at once where memory is short
        cutlass.compiler.add_module(operations, jobs=min(16, os.cpu_count() or 1, len(operations)))
    except cutlass.CompilationError as error:
        # Tests of the operations that compiled still run; the others fail with this error when they compile.
        print(f"precompile ({backend}): {str(error)[:2000]}")
    finally:
        cutlass.compiler.use(previous)


def precompile_module(nvcc_operations, nvrtc_operations=()) -> None:
    """What each GPU suite's module fixture does: compile its operations up front, leave nvcc selected."""
    precompile(list(nvcc_operations), "nvcc")
    if nvrtc_operations:
        precompile(list(nvrtc_operations), "nvrtc")
    cutlass.compiler.nvcc()


def relative_error(got, reference) -> float:
    got = np.asarray(got, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if not np.all(np.isfinite(got)):
        return float("inf")  # NaN poison left behind, or an overflow: never passes
    denominator = np.linalg.norm(reference)
    return float(np.linalg.norm(got - reference) / (denominator if denominator else 1.0))


def scan_cubins(ops):
    """Each operation's kernel has a warpgroup MMA and a TMA load, and no cubin holds a trap instruction."""
    import shutil
    import subprocess
    import tempfile

    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        pytest.skip("cuobjdump (CUDA toolkit) is not on PATH")
    seen = {}
    for op in ops:
        kernel = cutlass.compiler.add_module([op])[0]
        seen.setdefault(kernel.sha256, (kernel.binary, []))[1].append(op.name)
    for binary, names in seen.values():
        with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
            handle.write(binary)
            handle.flush()
            done = subprocess.run([cuobjdump, "-sass", handle.name], capture_output=True, text=True)
        if done.returncode or "Function : " not in done.stdout:  # e.g. nvdisasm, which cuobjdump runs, is missing
            pytest.skip(f"cuobjdump could not disassemble: {done.stderr.strip()[:300]}")
        sass = done.stdout
        assert "BPT" not in sass, f"trap instruction in the SASS of {names}"
        functions = sass.split("Function : ")[1:]
        for name in names:
            body = next((f for f in functions if f.startswith(name + "\n") or f.startswith(name + " ")), "")
            assert "HGMMA" in body or "QGMMA" in body or "IGMMA" in body or "GMMA" in body, \
                f"{name}: no warpgroup MMA in its kernel (an empty or wrong kernel)"
            assert "UTMALDG" in body, f"{name}: no TMA load in its kernel"


def draw_accepted(rng, make, count: int, tries: int = 400) -> dict:
    """``count`` operations ``make(rng)`` builds and the descriptions accept, by name (refused draws are drawn
    again): what the drawn-configuration suites test."""
    found = {}
    for _ in range(tries):
        try:
            op = make(rng)
        except cutlass.DescriptionError:
            continue
        found.setdefault(op.name, op)
        if len(found) == count:
            break
    return found
