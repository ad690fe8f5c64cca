"""``pycutlass.compiler``: choose a backend and compile operations into the artifact cache.

    pycutlass.compiler.add_module([op1, op2])   # one translation unit for all cache misses
    pycutlass.compiler.nvrtc()                  # switch to NVRTC (pip-only, no nvcc needed)
    pycutlass.compiler.nvcc()                   # back to nvcc (the default)
    pycutlass.compiler.set_target_arch(90)      # compile here for another machine's GPU
"""
from __future__ import annotations

from .backends import Backend, NvccBackend, NvrtcBackend
from .manager import COMPILER, CompiledKernel, CompileReport


def add_module(operations, *, jobs: int | None = None, cache=None) -> list[CompiledKernel]:
    """Compile (or load from the cache) ``operations``. ``jobs`` > 1 splits the misses over parallel units."""
    return COMPILER.add_module(operations, jobs=jobs, cache=cache)


def nvcc(*extra_flags: str) -> Backend:
    return COMPILER.use(NvccBackend(extra_flags))


def nvrtc(*extra_flags: str) -> Backend:
    return COMPILER.use(NvrtcBackend(extra_flags))


def backend() -> Backend:
    return COMPILER.current_backend()


def set_target_arch(arch: int | None) -> None:
    """Compile for compute capability ``arch`` (e.g. 90) instead of the local GPU's; None restores detection."""
    COMPILER.target_arch = None if arch is None else int(arch)


def last_report() -> CompileReport:
    return COMPILER.last_report


__all__ = ["Backend", "CompileReport", "CompiledKernel", "NvccBackend", "NvrtcBackend", "add_module", "backend",
           "last_report", "nvcc", "nvrtc", "set_target_arch"]
