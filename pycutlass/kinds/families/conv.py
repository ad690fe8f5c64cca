"""Convolution enums and problem sizes (the ``pycutlass.conv`` namespace), spelled as in the users' API, and the
rules both conv kinds share.

    problem = pycutlass.conv.Conv2dProblemSize(
        pycutlass.Tensor4DCoord(N, H, W, C), pycutlass.Tensor4DCoord(K, R, S, C),
        pycutlass.Tensor4DCoord(pad_h, pad_h, pad_w, pad_w), pycutlass.MatrixCoord(stride_h, stride_w),
        pycutlass.MatrixCoord(dilation_h, dilation_w), pycutlass.conv.Mode.cross_correlation, 1, 1)

Implicit GEMM view (CUTLASS's ``implicit_gemm_problem_size``) per convolution kind:

    ===== ========================= ===================== ===================== ======================
    kind  GEMM M x N x K            A                     B                     C / D
    ===== ========================= ===================== ===================== ======================
    fprop NPQ x K x RSC             activation  NHWC      filter      KRSC      output       NPQK
    dgrad NHW x C x RSK             grad output NPQK      filter      KRSC      grad input   NHWC
    wgrad K x RSC x NPQ             grad output NPQK      activation  NHWC      grad filter  KRSC
    ===== ========================= ===================== ===================== ======================
"""
from __future__ import annotations

import enum

from ...description.coords import GemmCoord, MatrixCoord, Tensor4DCoord
from ...errors import ArgumentError, DescriptionError
from ..base import Operation


class Operator(enum.Enum):
    fprop = "fprop"
    dgrad = "dgrad"
    wgrad = "wgrad"


ConvKind = Operator  # the name CUTLASS's own generator uses


class IteratorAlgorithm(enum.Enum):
    analytic = "analytic"
    optimized = "optimized"
    fixed_channels = "fixed_channels"
    few_channels = "few_channels"


class StrideSupport(enum.Enum):
    Strided = "strided"
    Unity = "unity"


class SplitKMode(enum.IntEnum):
    """Values equal cutlass::conv::SplitKMode."""

    Serial = 1
    Parallel = 2


class Mode(enum.IntEnum):
    """Values equal cutlass::conv::Mode."""

    cross_correlation = 0
    convolution = 1


def _as_operator(kind) -> Operator:
    if isinstance(kind, Operator):
        return kind
    if isinstance(kind, str):
        try:
            return Operator(kind.lower())
        except ValueError:
            pass
    raise ArgumentError(f"convolution kind must be pycutlass.conv.Operator.fprop, .dgrad or .wgrad, got {kind!r}")


def _int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ArgumentError(f"Conv2dProblemSize: {name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ArgumentError(f"Conv2dProblemSize: {name} must be >= {minimum}, got {value}")
    return value


def _four(name: str, value) -> tuple:
    if isinstance(value, Tensor4DCoord):
        return tuple(value)
    try:
        values = tuple(value)
    except TypeError:
        raise ArgumentError(f"Conv2dProblemSize: {name} must be a Tensor4DCoord or 4 integers, got {value!r}") \
            from None
    if len(values) != 4:
        raise ArgumentError(f"Conv2dProblemSize: {name} must have 4 entries, got {value!r}")
    return values


def _two(name: str, value) -> tuple:
    if isinstance(value, MatrixCoord):
        return tuple(value)
    try:
        values = tuple(value)
    except TypeError:
        raise ArgumentError(f"Conv2dProblemSize: {name} must be a MatrixCoord or 2 integers, got {value!r}") from None
    if len(values) != 2:
        raise ArgumentError(f"Conv2dProblemSize: {name} must have 2 entries, got {value!r}")
    return values


# 32-bit signed indices: CUTLASS 2.x convolutions index every tensor with int.
_INT32_MAX = 2**31 - 1


class Conv2dProblemSize:
    """An immutable, validated 2-D convolution problem, mirroring ``cutlass::conv::Conv2dProblemSize``.

    ``padding`` is ``(pad_h, upper_pad_h, pad_w, upper_pad_w)``: the kernel pads ``pad_h``/``pad_w`` before the
    image; the upper pads only enter the output size. ``stride`` and ``dilation`` are (h, w). The output size is

        P = (H + pad_h + upper_pad_h - dilation_h * (R - 1) - 1) // stride_h + 1      (likewise Q)

    which is PyTorch's (``torch.nn.functional.conv2d``). CUTLASS's C++ constructor computes
    ``(H + pads - R * dilation_h) / stride_h + 1`` instead, which equals this for dilation 1 and can be one row
    short for dilation > 1; the kernels receive P and Q explicitly, so the larger (correct) size is safe.
    """

    __slots__ = ("N", "H", "W", "C", "K", "R", "S", "P", "Q", "pad_h", "pad_w", "upper_pad_h", "upper_pad_w",
                 "stride_h", "stride_w", "dilation_h", "dilation_w", "mode", "split_k_slices", "groups")

    def __init__(self, input_size, filter_size, padding=(0, 0, 0, 0), stride=(1, 1), dilation=(1, 1),
                 mode: Mode = Mode.cross_correlation, split_k_slices: int = 1, groups: int = 1):
        n, h, w, c = (_int(f"input_size.{d}", v, 1) for d, v in zip("nhwc", _four("input_size", input_size)))
        k, r, s, fc = (_int(f"filter_size.{d}", v, 1) for d, v in zip(("k", "r", "s", "c"),
                                                                          _four("filter_size", filter_size)))
        pad_h, upper_pad_h, pad_w, upper_pad_w = (
            _int(f"padding[{i}]", v, 0) for i, v in enumerate(_four("padding", padding)))
        stride_h, stride_w = (_int(f"stride.{d}", v, 1) for d, v in zip(("row", "column"), _two("stride", stride)))
        dilation_h, dilation_w = (_int(f"dilation.{d}", v, 1)
                                  for d, v in zip(("row", "column"), _two("dilation", dilation)))
        try:
            mode = Mode(mode)
        except ValueError:
            raise ArgumentError(f"Conv2dProblemSize: mode must be pycutlass.conv.Mode.cross_correlation or "
                                f".convolution, got {mode!r}") from None
        split_k_slices = _int("split_k_slices", split_k_slices, 1)
        groups = _int("groups", groups, 1)
        if groups != 1:
            raise ArgumentError(f"Conv2dProblemSize: groups={groups}; grouped and depthwise convolutions are not "
                                f"supported (groups must be 1)")
        if fc != c:
            raise ArgumentError(f"Conv2dProblemSize: the filter has C={fc} channels but the input has C={c}; "
                                f"filter_size is (K, R, S, C) and its C must equal input_size's C")
        p = (h + pad_h + upper_pad_h - dilation_h * (r - 1) - 1) // stride_h + 1
        q = (w + pad_w + upper_pad_w - dilation_w * (s - 1) - 1) // stride_w + 1
        if p < 1 or q < 1:
            raise ArgumentError(
                f"Conv2dProblemSize: the output would be {p} x {q} (P x Q): the {r}x{s} filter with dilation "
                f"({dilation_h}, {dilation_w}) does not fit the padded {h}x{w} input (padding {pad_h}+{upper_pad_h}, "
                f"{pad_w}+{upper_pad_w})")
        values = dict(N=n, H=h, W=w, C=c, K=k, R=r, S=s, P=p, Q=q, pad_h=pad_h, pad_w=pad_w, upper_pad_h=upper_pad_h,
                      upper_pad_w=upper_pad_w, stride_h=stride_h, stride_w=stride_w, dilation_h=dilation_h,
                      dilation_w=dilation_w, mode=mode, split_k_slices=split_k_slices, groups=groups)
        for key, value in values.items():
            object.__setattr__(self, key, value)
        for label, size in (("activation", self.activation_size()), ("filter", self.filter_size()),
                            ("output", self.output_size())):
            if size > _INT32_MAX:
                raise ArgumentError(f"Conv2dProblemSize: the {label} tensor has {size} elements; CUTLASS 2.x "
                                    f"convolutions index tensors with 32-bit integers (at most {_INT32_MAX})")

    # --- immutability and value semantics --------------------------------------------------------------------
    def __setattr__(self, key, value):
        raise AttributeError("Conv2dProblemSize is immutable; build a new one (or use reset_split_k_slices)")

    def __delattr__(self, key):
        raise AttributeError("Conv2dProblemSize is immutable")

    def _key(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"Conv2dProblemSize(input NHWC=({self.N}, {self.H}, {self.W}, {self.C}), filter KRSC=({self.K}, "
                f"{self.R}, {self.S}, {self.C}), output NPQK=({self.N}, {self.P}, {self.Q}, {self.K}), "
                f"pad=({self.pad_h}, {self.upper_pad_h}, {self.pad_w}, {self.upper_pad_w}), "
                f"stride=({self.stride_h}, {self.stride_w}), dilation=({self.dilation_h}, {self.dilation_w}), "
                f"mode={self.mode.name}, split_k_slices={self.split_k_slices})")

    def __reduce__(self):
        return (_rebuild, (self.input_size, self.filter_size_coord, self.padding(), self.stride(),
                           self.dilation(), self.mode, self.split_k_slices, self.groups))

    def reset_split_k_slices(self, split_k_slices: int) -> "Conv2dProblemSize":
        return Conv2dProblemSize(self.input_size, self.filter_size_coord, self.padding(), self.stride(),
                                 self.dilation(), self.mode, split_k_slices, self.groups)

    def reset_mode(self, mode: Mode) -> "Conv2dProblemSize":
        return Conv2dProblemSize(self.input_size, self.filter_size_coord, self.padding(), self.stride(),
                                 self.dilation(), mode, self.split_k_slices, self.groups)

    # --- CUTLASS's accessors ---------------------------------------------------------------------------------
    @property
    def input_size(self) -> Tensor4DCoord:
        return Tensor4DCoord(self.N, self.H, self.W, self.C)

    @property
    def filter_size_coord(self) -> Tensor4DCoord:
        return Tensor4DCoord(self.K, self.R, self.S, self.C)

    def activation_extent(self) -> Tensor4DCoord:
        """NHWC."""
        return Tensor4DCoord(self.N, self.H, self.W, self.C)

    def filter_extent(self) -> Tensor4DCoord:
        """KRSC."""
        return Tensor4DCoord(self.K, self.R, self.S, self.C // self.groups)

    def output_extent(self) -> Tensor4DCoord:
        """NPQK."""
        return Tensor4DCoord(self.N, self.P, self.Q, self.K)

    def activation_size(self) -> int:
        return self.N * self.H * self.W * self.C

    def filter_size(self) -> int:
        """Number of filter elements (as CUTLASS's ``filter_size()``; the KRSC coordinate is ``filter_extent()``)."""
        return self.K * self.R * self.S * self.C // self.groups

    def output_size(self) -> int:
        """Number of output elements (as CUTLASS's ``output_size()``; the NPQK coordinate is ``output_extent()``)."""
        return self.N * self.P * self.Q * self.K

    def padding(self) -> Tensor4DCoord:
        return Tensor4DCoord(self.pad_h, self.upper_pad_h, self.pad_w, self.upper_pad_w)

    def stride(self) -> MatrixCoord:
        return MatrixCoord(self.stride_h, self.stride_w)

    def dilation(self) -> MatrixCoord:
        return MatrixCoord(self.dilation_h, self.dilation_w)

    # --- the implicit GEMM --------------------------------------------------------------------------------------
    def implicit_gemm_size(self, kind) -> GemmCoord:
        kind = _as_operator(kind)
        if kind is Operator.fprop:
            return GemmCoord(self.N * self.P * self.Q, self.K, self.R * self.S * self.C // self.groups)
        if kind is Operator.dgrad:
            return GemmCoord(self.N * self.H * self.W, self.C, self.R * self.S * self.K)
        return GemmCoord(self.K, self.R * self.S * self.C, self.N * self.P * self.Q)

    def tensor_a_extent(self, kind) -> Tensor4DCoord:
        kind = _as_operator(kind)
        return self.activation_extent() if kind is Operator.fprop else self.output_extent()

    def tensor_b_extent(self, kind) -> Tensor4DCoord:
        kind = _as_operator(kind)
        return self.activation_extent() if kind is Operator.wgrad else self.filter_extent()

    def tensor_c_extent(self, kind) -> Tensor4DCoord:
        kind = _as_operator(kind)
        return {Operator.fprop: self.output_extent, Operator.dgrad: self.activation_extent,
                Operator.wgrad: self.filter_extent}[kind]()

    def tensor_a_size(self, kind) -> int:
        return _product(self.tensor_a_extent(kind))

    def tensor_b_size(self, kind) -> int:
        return _product(self.tensor_b_extent(kind))

    def tensor_c_size(self, kind) -> int:
        return _product(self.tensor_c_extent(kind))

    def check_operation(self, operation) -> None:
        """Raise ``ArgumentError`` naming the first constraint of ``operation`` this problem breaks."""
        if not isinstance(operation, Operation) or operation.conv_kind is None:
            raise ArgumentError(f"{operation!r} is not a convolution operation")
        operation.check_problem_size(self)


def check_conv_enums(conv_kind, iterator_algorithm, stride_support, what: str) -> None:
    """The conv kinds' enum arguments have the enum types (both the Sm80-family and the SM90 kind)."""
    if not isinstance(conv_kind, Operator):
        raise DescriptionError(f"{what}: conv_kind must be pycutlass.conv.Operator.fprop, .dgrad or .wgrad, "
                               f"got {conv_kind!r}", rule="description.field_type")
    if not isinstance(iterator_algorithm, IteratorAlgorithm):
        raise DescriptionError(f"{what}: iterator_algorithm must be a pycutlass.conv.IteratorAlgorithm "
                               f"({', '.join(a.name for a in IteratorAlgorithm)}), got {iterator_algorithm!r}",
                               rule="description.field_type")
    if not isinstance(stride_support, StrideSupport):
        raise DescriptionError(f"{what}: stride_support must be pycutlass.conv.StrideSupport.Strided or .Unity, "
                               f"got {stride_support!r}", rule="description.field_type")


def _rebuild(*args) -> Conv2dProblemSize:
    return Conv2dProblemSize(*args)


def _product(coord) -> int:
    result = 1
    for v in coord:
        result *= v
    return result


# Module-level spellings of CUTLASS's helpers (cutlass::conv::implicit_gemm_*), as PyCUTLASS exposed them.
def implicit_gemm_problem_size(kind, problem_size: Conv2dProblemSize) -> GemmCoord:
    return problem_size.implicit_gemm_size(kind)


def implicit_gemm_tensor_a_extent(kind, problem_size: Conv2dProblemSize) -> Tensor4DCoord:
    return problem_size.tensor_a_extent(kind)


def implicit_gemm_tensor_b_extent(kind, problem_size: Conv2dProblemSize) -> Tensor4DCoord:
    return problem_size.tensor_b_extent(kind)


def implicit_gemm_tensor_c_extent(kind, problem_size: Conv2dProblemSize) -> Tensor4DCoord:
    return problem_size.tensor_c_extent(kind)


def implicit_gemm_tensor_a_size(kind, problem_size: Conv2dProblemSize) -> int:
    return problem_size.tensor_a_size(kind)


def implicit_gemm_tensor_b_size(kind, problem_size: Conv2dProblemSize) -> int:
    return problem_size.tensor_b_size(kind)


def implicit_gemm_tensor_c_size(kind, problem_size: Conv2dProblemSize) -> int:
    return problem_size.tensor_c_size(kind)


def interleaved_filter_gather(k: int) -> list[int]:
    """The output-channel order interleaved int8 fprop kernels expect in a TensorC32RSK32 filter.

    CUTLASS's interleaved kernels skip shared memory in the epilogue, which needs the filter's K (output channel)
    index permuted within each group of 32, as ``cutlass::reorder_convK<32>`` (tools/util/host_reorder.h) does:
    ``reordered[..., j, :] = filter[..., gather[j], :]`` along the K axis of the (C/32, R, S, K, 32) tensor.
    """
    from ..families.modes import interleaved_column_gather

    return interleaved_column_gather(k)


def reorder_interleaved_filter(filter_c32rsk32):
    """Return ``filter_c32rsk32`` (a numpy/torch/cupy array of shape (C/32, R, S, K, 32)) with its K axis in the
    order interleaved int8 fprop kernels read (see ``interleaved_filter_gather``). The input is not modified."""
    shape = tuple(getattr(filter_c32rsk32, "shape", ()))
    if len(shape) != 5 or shape[4] != 32:
        raise ArgumentError(f"reorder_interleaved_filter takes a 5-D (C/32, R, S, K, 32) filter, got shape {shape}")
    return filter_c32rsk32[:, :, :, interleaved_filter_gather(shape[3]), :]


__all__ = ["Conv2dProblemSize", "ConvKind", "IteratorAlgorithm", "Mode", "Operator", "SplitKMode", "StrideSupport",
           "implicit_gemm_problem_size", "implicit_gemm_tensor_a_extent", "implicit_gemm_tensor_a_size",
           "implicit_gemm_tensor_b_extent", "implicit_gemm_tensor_b_size", "implicit_gemm_tensor_c_extent",
           "implicit_gemm_tensor_c_size", "interleaved_filter_gather", "reorder_interleaved_filter"]
