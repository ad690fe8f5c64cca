"""Coordinates and problem sizes, spelled like the C++ types (``GemmCoord(m, n, k).m()``).

Besides the named accessors, every coordinate has what PyCUTLASS's pybind ``cutlass`` coordinates offered and
its scripts call: ``at(i)`` (also ``coord[i]``), ``len(coord)``, iteration, and ``product()`` (``size()`` on a
``Tensor4DCoord``); ``GemmCoord`` has CUTLASS's ``mk()``, ``kn()``, ``mn()`` (and ``nm``, ``km``, ``nk``) as
``MatrixCoord``s.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

from ..errors import ArgumentError


INT32_MAX = 2**31 - 1  # CUTLASS's coordinates hold 32-bit ints (Coord<rank, int>)


def _nonneg(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int,)) and not hasattr(value, "__index__"):
        raise ArgumentError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < 0:
        raise ArgumentError(f"{name} must be >= 0, got {value}")
    if value > INT32_MAX:  # a kernel would read it wrapped around, and compute a different problem
        raise ArgumentError(f"{name} must be at most {INT32_MAX}: CUTLASS's coordinates hold 32-bit integers, got "
                            f"{value}")
    return value


class _Coord:
    """Indexing shared by the coordinates: ``at(i)``, ``coord[i]``, ``len``, ``product()``."""

    _names = ()  # the accessor names, in order

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Every coordinate has two or more entries: one C-level call returns them all (grouped Arguments read each
        # problem's coordinate several times).
        cls._getter = staticmethod(operator.attrgetter(*(f"{name}_" for name in cls._names)))

    def _values(self) -> tuple[int, ...]:
        return self._getter(self)

    def at(self, dim) -> int:
        """The ``dim``-th entry (CUTLASS's ``Coord::at``); negative indices count from the end."""
        if isinstance(dim, bool) or not hasattr(dim, "__index__"):
            raise ArgumentError(f"{type(self).__name__}.at takes an integer index, got {dim!r}")
        dim = int(dim)
        rank = len(self._names)
        if not -rank <= dim < rank:
            raise IndexError(f"{type(self).__name__}.at({dim}): index out of range for rank {rank}")
        return self._values()[dim]

    def __getitem__(self, dim) -> int:
        return self.at(dim)

    def __len__(self) -> int:
        return len(self._names)

    def __iter__(self):
        return iter(self._values())

    def product(self) -> int:
        result = 1
        for value in self._values():
            result *= value
        return result


@dataclass(frozen=True)
class GemmCoord(_Coord):
    _names = ("m", "n", "k")  # a class attribute (no annotation): not a field

    m_: int
    n_: int
    k_: int

    def __init__(self, m, n, k):
        object.__setattr__(self, "m_", _nonneg("GemmCoord.m", m))
        object.__setattr__(self, "n_", _nonneg("GemmCoord.n", n))
        object.__setattr__(self, "k_", _nonneg("GemmCoord.k", k))

    def m(self) -> int:
        return self.m_

    def n(self) -> int:
        return self.n_

    def k(self) -> int:
        return self.k_

    def mk(self) -> "MatrixCoord":
        return MatrixCoord(self.m_, self.k_)

    def kn(self) -> "MatrixCoord":
        return MatrixCoord(self.k_, self.n_)

    def mn(self) -> "MatrixCoord":
        return MatrixCoord(self.m_, self.n_)

    def nm(self) -> "MatrixCoord":
        return MatrixCoord(self.n_, self.m_)

    def km(self) -> "MatrixCoord":
        return MatrixCoord(self.k_, self.m_)

    def nk(self) -> "MatrixCoord":
        return MatrixCoord(self.n_, self.k_)

    def __repr__(self) -> str:
        return f"GemmCoord({self.m_}, {self.n_}, {self.k_})"



@dataclass(frozen=True)
class MatrixCoord(_Coord):
    _names = ("row", "column")  # a class attribute (no annotation): not a field

    row_: int
    column_: int

    def __init__(self, row, column):
        object.__setattr__(self, "row_", _nonneg("MatrixCoord.row", row))
        object.__setattr__(self, "column_", _nonneg("MatrixCoord.column", column))

    def row(self) -> int:
        return self.row_

    def column(self) -> int:
        return self.column_



@dataclass(frozen=True)
class Tensor4DCoord(_Coord):
    _names = ("n", "h", "w", "c")  # a class attribute (no annotation): not a field

    n_: int
    h_: int
    w_: int
    c_: int

    def __init__(self, n, h, w, c):
        for name, v in zip("nhwc", (n, h, w, c)):
            object.__setattr__(self, f"{name}_", _nonneg(f"Tensor4DCoord.{name}", v))

    def n(self) -> int:
        return self.n_

    def h(self) -> int:
        return self.h_

    def w(self) -> int:
        return self.w_

    def c(self) -> int:
        return self.c_

    def size(self) -> int:
        """n * h * w * c (PyCUTLASS's ``Tensor4DCoord.size``)."""
        return self.product()
