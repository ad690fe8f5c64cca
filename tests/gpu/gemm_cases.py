"""GEMM operations and helpers shared by the GPU tests: operands in every library and layout, float64 references."""
from __future__ import annotations

import numpy as np

import pycutlass as cutlass
from pycutlass.epilogue.activations import reference as activation_reference

R, CM = cutlass.RowMajor, cutlass.ColumnMajor
RI32, CMI32 = cutlass.RowMajorInterleaved32, cutlass.ColumnMajorInterleaved32
TensorOp, Simt = cutlass.OpClass.TensorOp, cutlass.OpClass.Simt
MO = cutlass.MathOperation
D = cutlass.DataType

# Per data type: instruction, tile, stages, warps and the relative-error tolerance of the result.
CONFIGS = {
    "f16": dict(inst=[16, 8, 16], el=D.float16, acc=D.float32, math=MO.multiply_add, cls=TensorOp,
                tile=[128, 128, 32], stages=3, warps=[2, 2, 1], align=8, tol=5e-3),
    "f16acc16": dict(inst=[16, 8, 16], el=D.float16, acc=D.float16, math=MO.multiply_add, cls=TensorOp,
                     tile=[128, 128, 32], stages=3, warps=[2, 2, 1], align=8, tol=2e-2),
    "f16_1688": dict(inst=[16, 8, 8], el=D.float16, acc=D.float32, math=MO.multiply_add, cls=TensorOp,
                     tile=[128, 128, 32], stages=3, warps=[2, 2, 1], align=8, tol=5e-3),
    "bf16": dict(inst=[16, 8, 16], el=D.bfloat16, acc=D.float32, math=MO.multiply_add, cls=TensorOp,
                 tile=[128, 128, 32], stages=3, warps=[2, 2, 1], align=8, tol=2e-2),
    "bf16_1688": dict(inst=[16, 8, 8], el=D.bfloat16, acc=D.float32, math=MO.multiply_add, cls=TensorOp,
                      tile=[128, 128, 32], stages=3, warps=[2, 2, 1], align=8, tol=2e-2),
    "tf32": dict(inst=[16, 8, 8], el=D.tfloat32, acc=D.float32, math=MO.multiply_add, cls=TensorOp,
                 tile=[128, 128, 32], stages=3, warps=[2, 2, 1], align=4, tol=5e-3, storage=D.float32),
    "f32_ma": dict(inst=[16, 8, 8], el=D.float32, acc=D.float32, math=MO.multiply_add, cls=TensorOp,
                   tile=[128, 128, 32], stages=3, warps=[2, 2, 1], align=4, tol=5e-3),  # tf32 internally
    "f32_fast_f32": dict(inst=[16, 8, 8], el=D.float32, acc=D.float32, math=MO.multiply_add_fast_f32, cls=TensorOp,
                         tile=[128, 128, 32], stages=3, warps=[2, 2, 1], align=4, tol=1e-5),
    "f32_fast_f16": dict(inst=[16, 8, 8], el=D.float32, acc=D.float32, math=MO.multiply_add_fast_f16, cls=TensorOp,
                         tile=[128, 128, 32], stages=3, warps=[2, 2, 1], align=4, tol=5e-3),
    "f32_fast_bf16": dict(inst=[16, 8, 8], el=D.float32, acc=D.float32, math=MO.multiply_add_fast_bf16,
                          cls=TensorOp, tile=[128, 128, 32], stages=3, warps=[2, 2, 1], align=4, tol=2e-2),
    "f64": dict(inst=[8, 8, 4], el=D.float64, acc=D.float64, math=MO.multiply_add, cls=TensorOp,
                tile=[64, 64, 16], stages=3, warps=[2, 2, 1], align=1, tol=1e-12),
    "f32_simt": dict(inst=[1, 1, 1], el=D.float32, acc=D.float32, math=MO.multiply_add, cls=Simt,
                     tile=[128, 128, 8], stages=3, warps=[4, 2, 1], align=1, tol=1e-5),
    "f64_simt": dict(inst=[1, 1, 1], el=D.float64, acc=D.float64, math=MO.multiply_add, cls=Simt,
                     tile=[64, 64, 8], stages=3, warps=[2, 2, 1], align=1, tol=1e-12),
    "s8": dict(inst=[16, 8, 32], el=D.int8, acc=D.int32, math=MO.multiply_add_saturate, cls=TensorOp,
               tile=[128, 128, 64], stages=3, warps=[2, 2, 1], align=16, tol=0),
}


def make_op(config: str, layouts=(R, CM, R), out=None, out_align=None, epilogue=None, activation=None,
            swizzle=cutlass.IdentitySwizzle1, align=None, stages=None, tile=None, warps=None):
    c = CONFIGS[config]
    math = cutlass.MathInstruction(c["inst"], c["el"], c["el"], c["acc"], c["cls"], c["math"])
    td = cutlass.TileDescription(tile or c["tile"], stages or c["stages"], warps or c["warps"], math)
    storage = c.get("storage", c["el"])
    a = align or c["align"]
    out = out or (storage if storage is not D.int8 else D.int8)
    out_align = out_align or min(128 // out.bits, max(a * storage.bits // out.bits, 1))
    A = cutlass.TensorDescription(storage, layouts[0], a)
    B = cutlass.TensorDescription(storage, layouts[1], a)
    C = cutlass.TensorDescription(out, layouts[2], out_align)
    compute = D.float64 if c["acc"] is D.float64 else D.float32
    if activation is not None:
        ep = cutlass.LinearCombinationGeneric(getattr(cutlass, activation)(compute), out, out_align, c["acc"], compute)
    elif epilogue == "clamp":
        ep = cutlass.LinearCombinationClamp(out, out_align, c["acc"], compute)
    elif epilogue == "fastclamp":
        ep = cutlass.FastLinearCombinationClamp(out, out_align)
    else:
        ep = cutlass.LinearCombination(out, out_align, c["acc"], compute)
    return cutlass.GemmOperationUniversal(80, td, A, B, C, ep, swizzle)


# --- host data -------------------------------------------------------------------------------------------------

def random_values(rng, shape, element):
    """float64 values exactly representable in ``element`` (so the reference sees what the kernel sees)."""
    if element is D.int8:
        return rng.integers(-4, 5, size=shape).astype(np.float64)
    if element is D.int32:
        return rng.integers(-50, 51, size=shape).astype(np.float64)
    values = rng.standard_normal(shape)
    return round_to(values, element)


def round_to(values, element):
    import torch

    names = {D.float16: torch.float16, D.bfloat16: torch.bfloat16, D.float32: torch.float32,
             D.tfloat32: torch.float32, D.float64: torch.float64, D.float8_e4m3: torch.float8_e4m3fn,
             D.float8_e5m2: torch.float8_e5m2}
    return torch.from_numpy(np.asarray(values, dtype=np.float64)).to(names[element]).double().numpy()


TORCH_DTYPES = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "tfloat32": "float32",
                "float64": "float64", "int8": "int8", "int32": "int32", "float8_e4m3": "float8_e4m3fn",
                "float8_e5m2": "float8_e5m2"}


def interleave(matrix, layout):
    """Logical (rows, cols) -> the flat element order of an interleaved-32 layout."""
    rows, cols = matrix.shape
    if layout is CMI32:  # offset = (col / 32) * 32 * rows + row * 32 + col % 32
        return np.ascontiguousarray(matrix.reshape(rows, cols // 32, 32).transpose(1, 0, 2)).reshape(-1)
    if layout is RI32:  # offset = (row / 32) * 32 * cols + col * 32 + row % 32
        return np.ascontiguousarray(matrix.T.reshape(cols, rows // 32, 32).transpose(1, 0, 2)).reshape(-1)
    raise ValueError(layout)


def deinterleave(flat, layout, rows, cols):
    flat = np.asarray(flat)
    if layout is CMI32:
        return flat.reshape(cols // 32, rows, 32).transpose(1, 0, 2).reshape(rows, cols)
    raise ValueError(layout)


def to_tensor(values, element, layout, lib):
    """Values (rows, cols) or (batch, rows, cols) -> a tensor of ``lib`` whose memory follows ``layout``."""
    import torch

    storage = D.float32 if element is D.tfloat32 else element
    if layout in (RI32, CMI32):
        values = interleave(values, layout)
        layout = R
    host = values
    if layout is CM:  # column-major: a transposed view of a contiguous (cols, rows) buffer
        host = np.swapaxes(values, -1, -2)
    t = torch.from_numpy(np.ascontiguousarray(host)).to(getattr(torch, TORCH_DTYPES[storage.name]))
    if layout is CM:
        t = t.transpose(-1, -2)
    if lib == "torch":
        return t.cuda()
    if lib == "torch_cpu":
        return t
    if lib == "numpy":
        if storage is D.bfloat16:
            raise ValueError("numpy has no bfloat16 without ml_dtypes")
        array = t.numpy()
        return array
    if lib == "cupy":
        import cupy

        return cupy.asarray(t.cuda())  # shares strides through __cuda_array_interface__
    raise ValueError(lib)


def poisoned_output(shape, element, layout, lib):
    filler = np.full(shape, np.nan) if element.is_float else np.full(shape, -77.0)
    return to_tensor(filler, element, layout, lib)


def to_float64(tensor):
    if hasattr(tensor, "detach"):
        return tensor.detach().double().cpu().numpy()
    if type(tensor).__module__.startswith("cupy"):
        return tensor.get().astype(np.float64)
    return np.asarray(tensor, dtype=np.float64)


def epilogue_reference(op, accumulator, C, alpha, beta, activation_args=()):
    x = alpha * accumulator + (beta * C if C is not None else 0.0)
    functor = op.epilogue_functor
    if functor.activation is not None:
        x = activation_reference(functor.activation.name, x, *activation_args)
    out = op.C.element
    if out.is_integer:
        info = np.iinfo(np.int8 if out is D.int8 else np.int32)
        x = np.clip(np.rint(x), info.min, info.max)
    return x


def check_integer(got, reference, op):
    """Integer outputs are exact, except rounding ties of float epilogue math may differ by one."""
    if not np.all(np.isfinite(got)):
        return False
    diff = np.abs(got - reference)
    limit = 0 if op.epilogue_functor.kind == "LinearCombination" else 1
    return diff.max(initial=0) <= limit
