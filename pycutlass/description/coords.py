"""Coordinates and problem sizes, spelled like the C++ types (``GemmCoord(m, n, k).m()``)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ArgumentError


def _nonneg(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int,)) and not hasattr(value, "__index__"):
        raise ArgumentError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < 0:
        raise ArgumentError(f"{name} must be >= 0, got {value}")
    return value


@dataclass(frozen=True)
class GemmCoord:
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

    def __iter__(self):
        return iter((self.m_, self.n_, self.k_))

    def __repr__(self) -> str:
        return f"GemmCoord({self.m_}, {self.n_}, {self.k_})"


@dataclass(frozen=True)
class MatrixCoord:
    row_: int
    column_: int

    def __init__(self, row, column):
        object.__setattr__(self, "row_", _nonneg("MatrixCoord.row", row))
        object.__setattr__(self, "column_", _nonneg("MatrixCoord.column", column))

    def row(self) -> int:
        return self.row_

    def column(self) -> int:
        return self.column_

    def __iter__(self):
        return iter((self.row_, self.column_))


@dataclass(frozen=True)
class Tensor4DCoord:
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

    def __iter__(self):
        return iter((self.n_, self.h_, self.w_, self.c_))
