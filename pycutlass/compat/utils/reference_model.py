"""``pycutlass.utils.reference_model``: float64 host references with PyCUTLASS 2.11's interface.

    reference = ReferenceModule(A, B, C)                  # the operation's TensorDescriptions
    d_ref = reference.run(a, b, c, problem_size, alpha, beta)
    reference = Conv2dReferenceModule(A, B, C, cutlass.conv.Operator.fprop)
    d_ref = reference.run(a, b, c, conv_problem_size, alpha, beta)

Everything is computed in float64 with numpy on the host (PyCUTLASS computed in the tensors' own types, partly
with torch on the GPU). Tensors may be numpy, torch (CPU or CUDA: copied to the host) or cupy arrays, in the
shapes pycutlass's Arguments accept:

- GEMM: 1-D packed in the operand's layout (PyCUTLASS's style: ``batch * rows * cols`` elements), 2-D
  ``(rows, cols)`` or 3-D ``(batch, rows, cols)`` logical matrices (strides say the layout).
- Conv2d: 1-D packed NHWC, 4-D NHWC, or, for torch, 4-D ``(N, C, H, W)`` (channels_last).
- ``bias=True``: C is a vector, one value per column of a RowMajor C (per row of a ColumnMajor one) for each
  batch, or, for Conv2d, one value per channel of the output.

The result has the form of A: packed 1-D (in C's layout) for a 1-D A, as PyCUTLASS returned it, else the logical
shape. It is a numpy array in PyCUTLASS's result type (float64 values rounded once to A's and C's promoted
floating type), except for torch inputs, where it is a torch tensor on A's device in the type
PyCUTLASS's torch path produced (A's and C's types promoted; float64 when that is not a floating type).
"""
from __future__ import annotations

import numpy as np

from ...description.tensor_description import TensorDescription
from ...description.types import LayoutType
from ...errors import ArgumentError
from ...kinds.conv2d.problem import Conv2dProblemSize, Operator, _as_operator, Mode


def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _host64(x, name: str) -> np.ndarray:
    """Any accepted tensor as a float64 numpy array of the same shape."""
    if x is None:
        raise ArgumentError(f"{name} is None")
    if _is_torch(x):
        return x.detach().cpu().double().numpy()
    if type(x).__module__.split(".")[0] == "cupy":
        return np.asarray(x.get(), dtype=np.float64)
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ArgumentError(f"{name}: expected a numpy, torch or cupy tensor, got {type(x).__name__}") from None


def _result(values: np.ndarray, a, c):
    """PyCUTLASS's result type: for numpy inputs of a floating type, A's and C's types promoted (bfloat16 gives C's
    type), computed here in float64 and rounded once; float64 otherwise. For torch inputs, a torch tensor on A's
    device in PyCUTLASS's torch result type."""
    if not _is_torch(a):
        a_type = getattr(a, "dtype", None)
        if not isinstance(a_type, np.dtype) or a_type.kind != "f" and a_type.name != "bfloat16":
            return values
        c_type = getattr(c, "dtype", None)
        if a_type.name == "bfloat16":
            target = c_type if isinstance(c_type, np.dtype) else a_type
        else:
            target = np.result_type(a_type, c_type) if isinstance(c_type, np.dtype) and c_type.kind == "f" \
                else a_type
        return values.astype(target)
    import torch

    dtype = torch.promote_types(a.dtype, c.dtype) if _is_torch(c) else a.dtype
    if not dtype.is_floating_point:
        dtype = torch.float64
    return torch.from_numpy(np.ascontiguousarray(values)).to(device=a.device, dtype=dtype)


def _description_layout(desc, name: str) -> LayoutType:
    layout = desc.layout if isinstance(desc, TensorDescription) else desc
    if not isinstance(layout, LayoutType):
        raise ArgumentError(f"{name} must be a TensorDescription (or a layout), got {desc!r}")
    return layout


def _coord3(problem_size) -> tuple[int, int, int]:
    if hasattr(problem_size, "m") and callable(problem_size.m):
        return problem_size.m(), problem_size.n(), problem_size.k()
    try:
        m, n, k = (int(v) for v in problem_size)
    except (TypeError, ValueError):
        raise ArgumentError(f"problem_size must be a GemmCoord or (M, N, K), got {problem_size!r}") from None
    return m, n, k


# --- GEMM ------------------------------------------------------------------------------------------------------
class ReferenceModule:
    """D = alpha * A @ B + beta * C in float64, for the layouts of an operation's A, B and C descriptions."""

    def __init__(self, A: TensorDescription, B: TensorDescription, C: TensorDescription) -> None:
        self.layout_A = _description_layout(A, "A")
        self.layout_B = _description_layout(B, "B")
        self.layout_C = _description_layout(C, "C")
        for name, layout in (("A", self.layout_A), ("B", self.layout_B), ("C", self.layout_C)):
            if layout not in (LayoutType.RowMajor, LayoutType.ColumnMajor):
                raise ArgumentError(f"ReferenceModule: {name} is {layout.name}; the reference takes RowMajor or "
                                    f"ColumnMajor matrices (reorder interleaved tensors to one of them first)")

    @staticmethod
    def _matrix(x, rows: int, cols: int, layout: LayoutType, batch: int, name: str) -> np.ndarray:
        """(batch, rows, cols) float64 from a packed 1-D, 2-D or 3-D tensor."""
        values = _host64(x, name)
        if values.ndim == 1:
            if values.size != batch * rows * cols:
                raise ArgumentError(f"{name}: a packed 1-D operand needs batch * {rows} * {cols} = "
                                    f"{batch * rows * cols} elements, got {values.size}")
            if layout is LayoutType.RowMajor:
                return values.reshape(batch, rows, cols)
            return values.reshape(batch, cols, rows).transpose(0, 2, 1)
        expected = (rows, cols) if values.ndim == 2 else (batch, rows, cols)
        if values.ndim not in (2, 3) or values.shape != expected or (values.ndim == 2 and batch != 1):
            raise ArgumentError(f"{name}: expected shape {(batch, rows, cols) if batch > 1 else (rows, cols)} "
                                f"(or packed 1-D), got {values.shape}")
        return values.reshape(batch, rows, cols)

    def _bias(self, c, m: int, n: int, batch: int) -> np.ndarray:
        values = _host64(c, "C").ravel()
        length = n if self.layout_C is LayoutType.RowMajor else m
        if values.size != batch * length:
            raise ArgumentError(f"C: a bias for a {self.layout_C.name} C has {length} values per batch "
                                f"({'N' if length == n else 'M'}), so {batch * length} in all; got {values.size}")
        if self.layout_C is LayoutType.RowMajor:
            return values.reshape(batch, 1, n)
        return values.reshape(batch, m, 1)

    def compute(self, A, B, C, problem_size, alpha: float = 1.0, beta: float = 0.0, bias: bool = False,
                batch: int = 1) -> np.ndarray:
        """The float64 result as a (batch, M, N) array, whatever the tensors' form."""
        m, n, k = _coord3(problem_size)
        a = self._matrix(A, m, k, self.layout_A, batch, "A")
        b = self._matrix(B, k, n, self.layout_B, batch, "B")
        out = float(alpha) * np.matmul(a, b)
        if C is not None and float(beta) != 0.0:
            c = self._bias(C, m, n, batch) if bias else self._matrix(C, m, n, self.layout_C, batch, "C")
            out = out + float(beta) * c
        return out

    def run(self, A, B, C, problem_size, alpha: float = 1.0, beta: float = 0.0, bias: bool = False,
            batch: int = 1):
        """PyCUTLASS's ``run``: for a packed 1-D A, D packed 1-D in C's layout (``batch`` matrices); for 2-D or
        3-D operands, D as (M, N) or (batch, M, N)."""
        out = self.compute(A, B, C, problem_size, alpha, beta, bias, batch)
        a_ndim = len(getattr(A, "shape", np.shape(A)))
        if a_ndim == 1:
            if self.layout_C is LayoutType.ColumnMajor:
                out = out.transpose(0, 2, 1)
            out = np.ascontiguousarray(out).ravel()
        elif a_ndim == 2:
            out = out[0]
        return _result(out, A, C)

    def run_grouped(self, As, Bs, Cs, problem_sizes, alpha: float = 1.0, beta: float = 0.0) -> list:
        """The reference of a grouped GEMM: one ``run`` per problem (``Cs`` may be None when beta is 0)."""
        problem_sizes = list(problem_sizes)
        Cs = [None] * len(problem_sizes) if Cs is None else list(Cs)
        if not len(As) == len(Bs) == len(Cs) == len(problem_sizes):
            raise ArgumentError(f"run_grouped: {len(problem_sizes)} problems but {len(As)} As, {len(Bs)} Bs and "
                                f"{len(Cs)} Cs")
        return [self.run(a, b, c, ps, alpha, beta) for a, b, c, ps in zip(As, Bs, Cs, problem_sizes)]


# --- Conv2d ----------------------------------------------------------------------------------------------------
def _padded_window(ps: Conv2dProblemSize, r: int, s: int) -> tuple[slice, slice]:
    """The rows and columns of the padded input that filter tap (r, s) reads for the P x Q outputs."""
    h0, w0 = r * ps.dilation_h, s * ps.dilation_w
    return (slice(h0, h0 + (ps.P - 1) * ps.stride_h + 1, ps.stride_h),
            slice(w0, w0 + (ps.Q - 1) * ps.stride_w + 1, ps.stride_w))


def _padded_shape(ps: Conv2dProblemSize) -> tuple[int, int, int, int]:
    return (ps.N, ps.H + ps.pad_h + ps.upper_pad_h, ps.W + ps.pad_w + ps.upper_pad_w, ps.C)


def conv2d_fprop(x: np.ndarray, w: np.ndarray, ps: Conv2dProblemSize) -> np.ndarray:
    """y[n, p, q, k] = sum over r, s, c of x[n, p*sh - ph + r*dh, q*sw - pw + s*dw, c] * w[k, r, s, c] (NHWC)."""
    if ps.mode is Mode.convolution:
        w = w[:, ::-1, ::-1, :]
    xp = np.zeros(_padded_shape(ps))
    xp[:, ps.pad_h:ps.pad_h + ps.H, ps.pad_w:ps.pad_w + ps.W, :] = x
    y = np.zeros((ps.N * ps.P * ps.Q, ps.K))
    for r in range(ps.R):
        for s in range(ps.S):
            rows, cols = _padded_window(ps, r, s)
            y += xp[:, rows, cols, :].reshape(-1, ps.C) @ w[:, r, s, :].T
    return y.reshape(ps.N, ps.P, ps.Q, ps.K)


def conv2d_dgrad(dy: np.ndarray, w: np.ndarray, ps: Conv2dProblemSize) -> np.ndarray:
    """The input gradient (NHWC) of ``conv2d_fprop`` for the output gradient ``dy`` (NPQK)."""
    if ps.mode is Mode.convolution:
        w = w[:, ::-1, ::-1, :]
    dxp = np.zeros(_padded_shape(ps))
    dy = dy.reshape(-1, ps.K)
    for r in range(ps.R):
        for s in range(ps.S):
            rows, cols = _padded_window(ps, r, s)
            dxp[:, rows, cols, :] += (dy @ w[:, r, s, :]).reshape(ps.N, ps.P, ps.Q, ps.C)
    return dxp[:, ps.pad_h:ps.pad_h + ps.H, ps.pad_w:ps.pad_w + ps.W, :]


def conv2d_wgrad(dy: np.ndarray, x: np.ndarray, ps: Conv2dProblemSize) -> np.ndarray:
    """The filter gradient (KRSC) of ``conv2d_fprop`` for the output gradient ``dy`` (NPQK) and input ``x``."""
    xp = np.zeros(_padded_shape(ps))
    xp[:, ps.pad_h:ps.pad_h + ps.H, ps.pad_w:ps.pad_w + ps.W, :] = x
    dy = dy.reshape(-1, ps.K)
    dw = np.zeros((ps.K, ps.R, ps.S, ps.C))
    for r in range(ps.R):
        for s in range(ps.S):
            rows, cols = _padded_window(ps, r, s)
            dw[:, r, s, :] = dy.T @ xp[:, rows, cols, :].reshape(-1, ps.C)
    if ps.mode is Mode.convolution:
        dw = dw[:, ::-1, ::-1, :]
    return dw


class Conv2dReferenceModule:
    """The float64 convolution of kind ``kind`` (fprop, dgrad or wgrad) on NHWC tensors:
    D = alpha * conv(A, B) + beta * C, with Conv2dProblemSize's padding, stride, dilation and mode."""

    def __init__(self, A: TensorDescription, B: TensorDescription, C: TensorDescription, kind=Operator.fprop) -> None:
        self.layout_A = _description_layout(A, "A")
        self.layout_B = _description_layout(B, "B")
        self.layout_C = _description_layout(C, "C")
        self.kind = _as_operator(kind)
        for name, layout in (("A", self.layout_A), ("B", self.layout_B), ("C", self.layout_C)):
            if layout is not LayoutType.TensorNHWC:
                raise ArgumentError(f"Conv2dReferenceModule: {name} is {layout.name}; the reference takes "
                                    f"TensorNHWC tensors (reorder interleaved ones to NHWC first)")

    @staticmethod
    def _tensor(x, extent, name: str) -> np.ndarray:
        """NHWC float64 from a packed 1-D tensor, a 4-D NHWC one, or a torch (N, C, H, W) channels_last one."""
        extent = tuple(extent)
        shape = tuple(getattr(x, "shape", np.shape(x)))
        nchw = (extent[0], extent[3], extent[1], extent[2])
        if _is_torch(x) and len(shape) == 4 and shape == nchw and not (shape == extent and x.is_contiguous()):
            x = x.permute(0, 2, 3, 1)
        values = _host64(x, name)
        size = extent[0] * extent[1] * extent[2] * extent[3]
        if values.ndim == 1 and values.size == size:
            return values.reshape(extent)
        if values.shape == extent:
            return values
        raise ArgumentError(f"{name}: expected {size} packed NHWC elements or shape {extent} (NHWC), got {shape}")

    def compute(self, A, B, C, problem_size: Conv2dProblemSize, alpha: float = 1.0, beta: float = 0.0,
                bias: bool = False) -> np.ndarray:
        """The float64 result in NHWC (KRSC for wgrad) as a 4-D array."""
        ps = problem_size
        if not isinstance(ps, Conv2dProblemSize):
            raise ArgumentError(f"problem_size must be a pycutlass.conv.Conv2dProblemSize, got {ps!r}")
        a = self._tensor(A, ps.tensor_a_extent(self.kind), "A")
        b = self._tensor(B, ps.tensor_b_extent(self.kind), "B")
        if self.kind is Operator.fprop:
            out = conv2d_fprop(a, b, ps)
        elif self.kind is Operator.dgrad:
            out = conv2d_dgrad(a, b, ps)
        else:
            out = conv2d_wgrad(a, b, ps)
        out = float(alpha) * out
        if C is not None and float(beta) != 0.0:
            extent = tuple(ps.tensor_c_extent(self.kind))
            if bias:
                c = _host64(C, "C").ravel()
                if c.size != extent[3]:
                    raise ArgumentError(f"C: a bias has one value per output channel ({extent[3]}), got {c.size}")
                c = c.reshape(1, 1, 1, extent[3])
            else:
                c = self._tensor(C, extent, "C")
            out = out + float(beta) * c
        return out

    def run(self, A, B, C, problem_size: Conv2dProblemSize, alpha: float = 1.0, beta: float = 0.0,
            bias: bool = False):
        """PyCUTLASS's ``run``: D packed 1-D NHWC for a 1-D A; 4-D NHWC for a 4-D numpy/cupy A; for a 4-D torch A,
        a (N, C, H, W)-shaped channels_last tensor, as pycutlass's Arguments take them."""
        out = self.compute(A, B, C, problem_size, alpha, beta, bias)
        ndim = len(getattr(A, "shape", np.shape(A)))
        if ndim == 1:
            return _result(np.ascontiguousarray(out).ravel(), A, C)
        result = _result(np.ascontiguousarray(out), A, C)
        return result.permute(0, 3, 1, 2) if _is_torch(A) else result


__all__ = ["Conv2dReferenceModule", "ReferenceModule", "conv2d_dgrad", "conv2d_fprop", "conv2d_wgrad"]
