"""Which kind's classes a public constructor builds: one declarative table, ``KINDS``.

The PyCUTLASS constructors stay what scripts call (``GemmOperationUniversal(90, tile, A, B, C, epilogue)``,
``GemmArguments(op, ...)``, ``Conv2dOperation(...)``, ...); each asks this module which kind's class to build. A
kind's classes are imported by module path when first asked for, so the answer never depends on which kind modules
were imported before, and no kind module writes into another one.

Adding a kind is a folder under ``pycutlass/kinds`` (``operation.py``, ``abi.py``, ``arguments.py``, a template)
plus one line in ``KINDS``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..errors import DescriptionError
from .families.sm90 import is_sm90_tile


@dataclass(frozen=True)
class Kind:
    """One kernel kind: its folder, its two classes, and when a public constructor builds them."""

    name: str  # the folder under pycutlass/kinds, and the operation class's ``kind``
    operation: str  # the operation class, in <folder>/operation.py
    arguments: str  # the arguments class, in <folder>/arguments.py
    built_by: str  # the public operation constructor that builds this kind
    arguments_built_by: str  # the public arguments constructor that hands out ``arguments`` for its operations
    sm90_tile: bool = False  # built at compute capability 90 from a tile of the SM90 family (``is_sm90_tile``)
    array: bool = False  # built for ``array=True`` (the pointer-array kernel)
    visitor: bool = False  # built for ``visitor=True`` (an epilogue visitor tree)

    @property
    def module(self) -> str:
        return f"{__package__}.{self.name}"

    def operation_class(self) -> type:
        return getattr(importlib.import_module(f"{self.module}.operation"), self.operation)

    def arguments_class(self) -> type:
        return getattr(importlib.import_module(f"{self.module}.arguments"), self.arguments)


_GEMM, _GEMM_ARGS = "GemmOperationUniversal", "GemmArguments"
_GROUPED, _GROUPED_ARGS = "GemmOperationGrouped", "GemmGroupedArguments"
_CONV, _CONV_ARGS = "Conv2dOperation", "Conv2dArguments"

# Kinds in the order ``pycutlass.kinds`` imports them (and exports their names).
KINDS = (
    Kind("gemm", _GEMM, _GEMM_ARGS, _GEMM, _GEMM_ARGS),
    Kind("gemm_grouped", _GROUPED, _GROUPED_ARGS, _GROUPED, _GROUPED_ARGS),
    Kind("conv2d", _CONV, _CONV_ARGS, _CONV, _CONV_ARGS),
    Kind("reduction", "ReductionOperation", "ReductionArguments", "ReductionOperation", "ReductionArguments"),
    Kind("gemm_evt", "GemmOperationEvt", "GemmEvtArguments", _GEMM, _GEMM_ARGS, visitor=True),
    Kind("gemm_sm90", "GemmOperationSm90", "GemmArgumentsSm90", _GEMM, _GEMM_ARGS, sm90_tile=True),
    Kind("gemm_grouped_sm90", "GemmOperationGroupedSm90", "GemmGroupedArgumentsSm90", _GROUPED, _GROUPED_ARGS,
         sm90_tile=True),
    Kind("gemm_array_sm90", "GemmOperationArraySm90", "GemmArgumentsArraySm90", _GEMM, _GEMM_ARGS, sm90_tile=True,
         array=True),
    Kind("conv2d_sm90", "Conv2dOperationSm90", "Conv2dArgumentsSm90", _CONV, _CONV_ARGS, sm90_tile=True),
)

_BY_NAME = {kind.name: kind for kind in KINDS}


def kind(name: str) -> Kind:
    """The kind whose folder is ``name``."""
    return _BY_NAME[name]


def operation_kind(constructor: str, arch, tile, *, visitor=False, array=False) -> Kind:
    """The kind that ``constructor(arch, tile, ..., visitor=visitor, array=array)`` builds.

    ``visitor`` (truthy) picks the visitor kind whatever the tile; compute capability 90 with an SM90 tile picks the
    constructor's SM90 kind, and ``array=True`` there its pointer-array kind. Anything else is the Sm80-family kind,
    whose constructor then checks the arguments.
    """
    candidates = [k for k in KINDS if k.built_by == constructor]
    if visitor:
        for candidate in candidates:
            if candidate.visitor:
                if array is not False:
                    raise DescriptionError("array=True builds the SM90 pointer-array kernel, which has no epilogue "
                                           "visitor tree; visitor operations run Mode.Array with tensors holding the "
                                           "batch", rule="evt.unsupported")
                return candidate
    sm90 = arch == 90 and not isinstance(arch, bool) and any(k.sm90_tile for k in candidates) and is_sm90_tile(tile)
    return select(constructor, sm90_tile=sm90, array=sm90 and array is True)


def select(constructor: str, *, sm90_tile: bool = False, array: bool = False, visitor: bool = False) -> Kind:
    """The kind ``constructor`` builds for these options (a table lookup)."""
    for candidate in KINDS:
        if candidate.built_by == constructor and (candidate.sm90_tile, candidate.array, candidate.visitor) == \
                (sm90_tile, array, visitor):
            return candidate
    raise LookupError(f"no kind is built by {constructor} with sm90_tile={sm90_tile}, array={array}, "
                      f"visitor={visitor}")


def operation_class(constructor: str, arch, tile, *, visitor=False, array=False) -> type:
    """The class ``constructor(...)`` returns an instance of (see :func:`operation_kind`)."""
    return operation_kind(constructor, arch, tile, visitor=visitor, array=array).operation_class()


def arguments_class(constructor: str, operation) -> type | None:
    """The arguments class that ``constructor(operation, ...)`` hands out for ``operation``'s kind, or None when the
    constructor's own class takes it (or says what is wrong with it)."""
    found = _BY_NAME.get(getattr(type(operation), "kind", None))
    if found is None or found.arguments_built_by != constructor or found.arguments == constructor:
        return None
    return found.arguments_class()
