"""``Pack.gemm``: from tensors to the call's class and shape, then the kernel through its GemmArguments.

A call's signature (shapes, strides, types and devices of its tensors, epilogue, bias, whether C is read) is
remembered with the kernel that served it, so a seen call costs a dict lookup and an alignment check of its
addresses on top of the kernel's own launch path.
"""
from __future__ import annotations

from ..errors import ArgumentError
from .classes import CallQuery

_ACTIVATION_EPILOGUE = {None: "linear_combination", "identity": "linear_combination"}


def _signature(t):
    if t is None:
        return None
    stride = getattr(t, "stride", None)
    if callable(stride):  # torch (get_device: -1 on the CPU; a negated view must reach describe, which refuses it)
        is_neg = getattr(t, "is_neg", None)
        return (t.shape, stride(), t.dtype, t.get_device(), is_neg is not None and is_neg())
    device = getattr(t, "device", None)
    return (type(t), t.shape, getattr(t, "strides", None), str(getattr(t, "dtype", None)),
            getattr(device, "id", None))


def _address(t) -> int | None:
    """The device address of a device tensor (alignment is checked on it); None for host arrays (copied)."""
    data_ptr = getattr(t, "data_ptr", None)
    if callable(data_ptr):
        return data_ptr() if t.is_cuda else None
    cai = getattr(t, "__cuda_array_interface__", None)
    return int(cai["data"][0]) if cai is not None else None


def _layout(info, rows: int, cols: int) -> str | None:
    """"row" or "col" for a 2-D operand (rows x cols), None when neither dimension is unit-stride."""
    row_stride, col_stride = info.strides
    if col_stride == 1 or cols == 1:
        return "row"
    if row_stride == 1 or rows == 1:
        return "col"
    return None


def _widest(itemsize: int, values: list[int], addresses: list[int]) -> int:
    """The widest access (elements, up to 16 bytes) that every extent, leading dimension and address allows."""
    width = 16 // itemsize
    while width > 1 and (any(v % width for v in values) or any(a % (width * itemsize) for a in addresses)):
        width //= 2
    return width


def query_of(a_info, b_info, d_info, c_info, bias_info, activation, c_read: bool) -> tuple[CallQuery, tuple]:
    """The call's CallQuery and problem (m, n, k, 1) from its operands' TensorInfo."""
    for info in (a_info, b_info, d_info):
        if len(info.shape) != 2:
            raise ArgumentError(f"Pack.gemm: {info.name} must be 2-D, got shape {info.shape}")
    m, k = a_info.shape
    if b_info.shape[0] != k or tuple(d_info.shape) != (m, b_info.shape[1]):
        raise ArgumentError(f"Pack.gemm: a {a_info.shape}, b {b_info.shape} and out {d_info.shape} do not form "
                            f"(M x K) @ (K x N) -> (M x N)")
    n = b_info.shape[1]
    if c_info is not None and tuple(c_info.shape) != (m, n):
        raise ArgumentError(f"Pack.gemm: c must be M x N = {m} x {n}, got {c_info.shape}")
    a_layout, b_layout, d_layout = _layout(a_info, m, k), _layout(b_info, k, n), _layout(d_info, m, n)
    for what, layout, info in (("a", a_layout, a_info), ("b", b_layout, b_info)):
        if layout is None:
            raise ArgumentError(f"Pack.gemm: {what} is neither row- nor column-major (strides {info.strides})")
    if d_layout != "row" or (c_info is not None and c_read and _layout(c_info, m, n) != "row"):
        raise ArgumentError("Pack.gemm: out (and c) must be row-major")
    bias = None
    if bias_info is not None:
        if tuple(bias_info.shape) != (n,) or (n > 1 and bias_info.strides[0] != 1):
            raise ArgumentError(f"Pack.gemm: bias must be a contiguous vector of N = {n} values, got shape "
                                f"{bias_info.shape}")
        bias = "column"
    itemsize = a_info.itemsize
    lead = lambda info, layout: info.strides[0] if layout == "row" else info.strides[1]  # noqa: E731
    addresses = lambda *infos: [i.device_address for i in infos if i is not None and i.kind == "device"]  # noqa: E731
    alignment = (_widest(itemsize, [k if a_layout == "row" else m, lead(a_info, a_layout)], addresses(a_info)),
                 _widest(itemsize, [n if b_layout == "row" else k, lead(b_info, b_layout)], addresses(b_info)),
                 _widest(d_info.itemsize, [n, d_info.strides[0]] + ([c_info.strides[0]] if c_read and c_info else []),
                         addresses(d_info, c_info if c_read else None, bias_info)))
    epilogue = _ACTIVATION_EPILOGUE.get(activation, activation)
    if not isinstance(epilogue, str):
        raise ArgumentError(f"Pack.gemm: activation must be a name such as 'relu' or 'gelu', got {activation!r}")
    query = CallQuery(a_info.element.label, b_info.element.label, d_info.element.label, a_layout, b_layout,
                      alignment, epilogue, bias, c_read)
    return query, (m, n, k, 1)


def _new_output(a, m: int, n: int, dtype):
    """An empty M x N output of ``a``'s library and device."""
    if callable(getattr(a, "new_empty", None)):  # torch
        return a.new_empty((m, n), dtype=dtype)
    module = type(a).__module__.split(".")[0]
    if module == "cupy":
        import cupy

        with cupy.cuda.Device(a.device.id):
            return cupy.empty((m, n), dtype=dtype)
    import numpy

    return numpy.empty((m, n), dtype=dtype)


def _output(a, b, out):
    if out is not None:
        return out
    a_shape, b_shape = getattr(a, "shape", ()), getattr(b, "shape", ())
    if len(a_shape) != 2 or len(b_shape) != 2:
        raise ArgumentError(f"Pack.gemm: a and b must be 2-D, got shapes {tuple(a_shape)} and {tuple(b_shape)}")
    return _new_output(a, a_shape[0], b_shape[1], a.dtype)


class _Seen:
    """A call signature's kernel choice, and (device operands) its bound launch once one call has run."""

    __slots__ = ("operation", "knobs", "vector_bytes", "problem", "bound", "footprint")

    def __init__(self, operation, knobs, vector_bytes, problem):
        self.operation, self.knobs, self.vector_bytes, self.problem = operation, knobs, vector_bytes, problem
        self.bound = None
        self.footprint = None  # where (a, b, c, bias, out) reach: a seen call's out must not overlap the others

    def aligned(self, operands) -> bool:
        for t, width in zip(operands, self.vector_bytes):
            address = None if t is None else _address(t)
            if address is not None and address % width:
                return False
        return True


def resolve(pack, a, b, out, c, c_read, bias, activation, key=None) -> _Seen:
    """The choice for a call: remembered per signature (``key``), checked against each call's addresses."""
    from ..runtime.tensors import describe

    operands = (a, b, c if c_read else None, bias, out)
    seen = pack._seen.get(key) if key is not None else None
    if seen is not None and seen.aligned(operands):
        return seen
    infos = [None if t is None else describe(t, name) for t, name in
             ((a, "a"), (b, "b"), (out, "out"), (c if c_read else None, "c"), (bias, "bias"))]
    query, problem = query_of(*infos, activation, c_read)
    for device in {i.device_index for i in infos if i is not None and i.device_index is not None}:
        pack.check_device(device)
    operation, knobs = pack.kernel_for(query, problem)
    itemsize = infos[0].itemsize
    vector_bytes = (operation.A.alignment * itemsize, operation.B.alignment * itemsize) + \
        (operation.C.alignment * infos[2].itemsize,) * 3
    seen = _Seen(operation, knobs, vector_bytes, problem)
    if key is not None:
        pack._seen[key] = seen
    return seen


def run_gemm(pack, a, b, out, c, alpha, beta, bias, activation, stream):
    out = _output(a, b, out)
    c_read = c is not None and beta != 0
    key = (_signature(a), _signature(b), _signature(out), _signature(c) if c_read else None, _signature(bias),
           activation, alpha, beta if c_read else 0.0, stream)
    seen = pack._seen.get(key)
    if seen is not None and seen.bound is not None:  # a seen device call: patch its addresses, launch
        pointers = (_address(a), _address(b), _address(c) if c_read else 0, 0 if bias is None else _address(bias),
                    _address(out))
        # an out that may overlap an input goes through GemmArguments, which refuses it or finds it apart
        if seen.footprint.apart(pointers) and seen.bound.launch_pointers(pointers, stream or 0):
            return out
    seen = resolve(pack, a, b, out, c, c_read, bias, activation, key)
    operation = seen.operation
    m, n, k, _ = seen.problem
    arguments = _gemm_arguments(operation, seen.knobs, (m, n, k), a, b, c if c_read else None, out,
                                bias, alpha, beta if c_read else 0.0, stream, pack.session)
    operation.run(arguments)
    addresses = [_address(t) for t in (a, b, c if c_read else None, bias, out)]
    if any(address is None for t, address in zip((a, b, out), addresses[:2] + addresses[4:]) if t is not None):
        arguments.sync()  # host operands: copy the result back
    elif seen.bound is None and (stream is None or isinstance(stream, int)):
        from ..runtime.launch import bind_launch

        seen.bound = bind_launch(arguments, [address or 0 for address in addresses], seen.vector_bytes)
        seen.footprint = _footprint((a, b, c if c_read else None, bias, out))
    return out


def _footprint(operands):
    """The byte reach of a call's (a, b, c, bias, out) from their addresses; out is written, c may be out itself."""
    from ..runtime.arguments import Footprint
    from ..runtime.tensors import describe

    infos = [None if t is None else describe(t, name) for t, name in zip(operands, ("a", "b", "c", "bias", "out"))]
    out, c = infos[4], infos[2]
    return Footprint(infos, [out], [] if c is None else [(out, c)])


def _gemm_arguments(operation, knobs, problem, a, b, c, d, bias, alpha, beta, stream, session):
    """The kernel's GemmArguments for a pack call (a Sm80-family kernel takes the bias as a broadcast C)."""
    from ..kinds import GemmArguments

    if bias is not None and not operation.bias:  # a Sm80-family kernel: the bias is C broadcast over rows
        return GemmArguments(operation, problem, a, b, bias, d, output_op=operation.epilogue_type(alpha, 1.0),
                             stream=stream, session=session, bias=True, **knobs)
    extra = {"bias": bias} if operation.bias else {}
    return GemmArguments(operation, problem, a, b, c, d, output_op=operation.epilogue_type(alpha, beta),
                         stream=stream, session=session, **extra, **knobs)
