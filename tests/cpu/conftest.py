"""Fixtures shared by the CPU tests that compile for real."""
from __future__ import annotations

import pytest

from pycutlass import compiler
from pycutlass.compiler import toolchain
from pycutlass.compiler.manager import COMPILER


@pytest.fixture
def compiler_state():
    """Compile for sm_90 here; restore the backend, target, in-memory table and report afterwards."""
    saved = (COMPILER.backend, COMPILER.target_arch, dict(COMPILER._memory), COMPILER.last_report)
    compiler.set_target_arch(90)
    try:
        yield COMPILER
    finally:
        COMPILER.backend, COMPILER.target_arch, COMPILER.last_report = saved[0], saved[1], saved[3]
        COMPILER._memory.clear()
        COMPILER._memory.update(saved[2])


def clear_toolchain_caches() -> None:
    """Forget located tools and headers (after changing PATH or CUDA_HOME in a test)."""
    for fn in (toolchain.cuda_include_dirs, toolchain.nvcc_path, toolchain.nvcc_version, toolchain.nvrtc_version,
               toolchain.cutlass_include_dirs):
        fn.cache_clear()
