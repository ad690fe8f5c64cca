"""Typed errors. Every failure a user can cause names what was wrong and what is allowed."""
from __future__ import annotations


class PyCutlassError(Exception):
    """Base class of every error pycutlass raises on purpose."""


class DescriptionError(PyCutlassError, ValueError):
    """An operation, tile, tensor or math-instruction description is not a valid configuration.

    ``rule``: the stable code of the rule it breaks (``"sm90.tile_n"``, ``"smem.capacity"``; the table of codes is
    ``pycutlass.description.rules.RULES``), or None. Tuning groups rejected configurations by it; the message says
    what was wrong and what is allowed."""

    def __init__(self, message: str = "", rule: str | None = None):
        super().__init__(message)
        self.rule = rule  # kept through pickling (BaseException pickles __dict__): errors cross worker processes


class ArgumentError(PyCutlassError, ValueError):
    """Runtime arguments (tensors, sizes, modes) do not fit the operation they are given to."""


class UnknownKeywordError(ArgumentError, TypeError):
    """A keyword the arguments of this kind of operation do not take (a TypeError as well, as Python raises for an
    unexpected keyword); the message says which keywords it takes."""


class CompilationError(PyCutlassError, RuntimeError):
    """The backend compiler failed; ``log`` holds its output and ``source`` the translation unit."""

    def __init__(self, message: str, log: str = "", source: str = ""):
        super().__init__(message + (f"\n--- compiler log ---\n{log}" if log else ""))
        self.log = log
        self.source = source


class ToolchainError(PyCutlassError, RuntimeError):
    """A required tool or header tree (nvcc, NVRTC, CUTLASS, CUDA headers) could not be found."""


class CudaError(PyCutlassError, RuntimeError):
    """A CUDA driver call failed. ``code`` is the CUresult name, ``operation`` the operation involved."""

    def __init__(self, message: str, code: str = "", operation: str = ""):
        super().__init__(message)
        self.code = code
        self.operation = operation


class NoGpuError(PyCutlassError, RuntimeError):
    """A GPU is needed (to allocate, copy or launch) but none is usable on this machine."""


class CacheError(PyCutlassError, RuntimeError):
    """The artifact cache could not be opened or written."""


class ResultsDatabaseError(ArgumentError):
    """A results database file (``--db``, ``ResultsDB``, ``Tuned(db=...)``) cannot be used: it is a directory, not
    an SQLite database, not a pycutlass results database, or not readable or writable where writing is needed."""


class CacheIntegrityWarning(UserWarning):
    """A cached artifact or the cache file failed verification; it was discarded and will be rebuilt."""
