"""``pycutlass.compiler``: choose a backend and compile operations into the artifact cache.

    pycutlass.compiler.add_module([op1, op2])   # one translation unit for all cache misses; returns a CompileReport
    pycutlass.compiler.nvrtc()                  # switch to NVRTC (pip-only, no nvcc needed)
    pycutlass.compiler.nvcc()                   # back to nvcc (the default)
    pycutlass.compiler.set_target_arch(90)      # compile here for another machine's GPU (90, "sm_90", "90a")

Each function acts on the current session (``pycutlass.Session``; the default one unless another is active).
"""
from __future__ import annotations

from ..session import current
from .backends import Backend, NvccBackend, NvrtcBackend
from .manager import CompiledKernel, Compiler, CompileReport, parse_target


def add_module(operations, *, jobs: int | None = None, cache=None) -> CompileReport:
    """Compile (or load from the cache) ``operations``. ``jobs`` > 1 splits the misses over parallel units."""
    return Compiler.of().add_module(operations, jobs=jobs, cache=cache)


def nvcc(*extra_flags: str) -> Backend:
    return Compiler.of().use(NvccBackend(extra_flags))


def nvrtc(*extra_flags: str) -> Backend:
    return Compiler.of().use(NvrtcBackend(extra_flags))


def backend() -> Backend:
    return Compiler.of().backend


def use(backend_: Backend) -> Backend:
    """Select a backend object (as returned by ``backend()``), e.g. to restore an earlier choice."""
    return Compiler.of().use(backend_)


def set_target_arch(arch) -> None:
    """Compile for ``arch`` (90, "90", "sm_90", "90a") instead of the local GPU's; None restores detection."""
    current().set_option("target", parse_target(arch))


def last_report() -> CompileReport:
    """The report of the current session's latest ``add_module`` (add_module also returns it)."""
    return Compiler.of().last_report


__all__ = ["Backend", "CompileReport", "CompiledKernel", "Compiler", "NvccBackend", "NvrtcBackend", "add_module",
           "backend", "last_report", "nvcc", "nvrtc", "set_target_arch", "use"]
