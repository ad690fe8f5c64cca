"""Float64 epilogues stay in float64: the float64 references, the visitor tree's compute type, and (slow) the PTX of
a float64 hardswish epilogue in every kind through both compilers.

A float64 result 2^-25 (3e-8) off is float32's half-ulp: something in the path computed or rounded in float32.
CUTLASS's HardSwish<double> divides by 6 in float64; torch's CUDA F.hardswish multiplies a float64 tensor by
1.0f / 6.0f, so a float64 reference built from it is 2^-25 high on every nonzero element.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import DescriptionError, EpilogueVisitTree
from pycutlass.conv import IteratorAlgorithm, Operator, StrideSupport
from pycutlass.epilogue.activations import reference as numpy_reference

F32, F64 = cutlass.float32, cutlass.float64
ACTIVATIONS = ("identity", "relu", "leaky_relu", "tanh", "sigmoid", "silu", "hardswish", "gelu", "gelu_taylor")


def _values():
    rng = np.random.default_rng(5)
    kinks = np.array([-3.0, 3.0, -3.0 + 2e-16, 3.0 - 4e-16, np.nextafter(-3.0, 0.0), np.nextafter(3.0, 0.0)])
    return np.concatenate([rng.uniform(-8.0, 8.0, 400), kinks + rng.uniform(-1e-6, 1e-6, 6), kinks])


# --- the torch reference (pycutlass.torch.reference.activate): what the torch ops' fallback runs and GPU tests
# compare against --------------------------------------------------------------------------------------------------
def _aten_cuda_hardswish(x):
    """What ATen's CUDA hardswish kernel computes for a float64 tensor: one_sixth is opmath_t(1.0f / 6.0f)."""
    import torch

    one_sixth = float(np.float32(1.0) / np.float32(6.0))
    return x * torch.clamp(x + 3.0, 0.0, 6.0) * one_sixth


def test_torch_reference_hardswish_is_cutlass_float64_formula_whatever_torch_computes(monkeypatch):
    torch = pytest.importorskip("torch")
    from pycutlass.torch import reference

    # torch's CPU kernel divides by 6; its CUDA kernel (on the GPU host) is the stand-in: float64 must not use it.
    monkeypatch.setitem(reference._ACTIVATION_FUNCTIONS, "hardswish", _aten_cuda_hardswish)
    x = _values()
    got = reference.activate(torch.from_numpy(x), "hardswish").numpy()
    assert np.array_equal(got, numpy_reference("hardswish", x))  # bit for bit: x * relu6(x + 3) / 6
    stand_in = _aten_cuda_hardswish(torch.from_numpy(x)).numpy()
    assert abs(np.linalg.norm(stand_in - got) / np.linalg.norm(got) - 2.0 ** -25) < 1e-10  # what it avoids


def test_torch_reference_hardswish_gradient_is_torchs():
    torch = pytest.importorskip("torch")
    from pycutlass.torch import reference

    x = torch.tensor([-4.0, -3.0, -2.5, 0.0, 1.0, 2.9, 3.0, 5.0], dtype=torch.float64, requires_grad=True)
    (ours,) = torch.autograd.grad(reference.activate(x, "hardswish").sum(), x)
    (torchs,) = torch.autograd.grad(torch.nn.functional.hardswish(x).sum(), x)
    torch.testing.assert_close(ours, torchs, rtol=1e-15, atol=1e-15)  # the kinks included: 0 at -3, 1 at 3


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_torch_reference_float64_agrees_with_numpy_reference(activation):
    torch = pytest.importorskip("torch")
    from pycutlass.torch import reference

    x = _values()
    got = reference.activate(torch.from_numpy(x), activation, 0.1).numpy()
    args = (0.1,) if activation == "leaky_relu" else ()
    expected = numpy_reference(activation, x, *args)
    assert np.max(np.abs(got - expected) / np.maximum(np.abs(expected), 1e-300)) < 4e-16 or \
        np.linalg.norm(got - expected) <= 1e-15 * np.linalg.norm(expected)


# --- the visitor tree ----------------------------------------------------------------------------------------------
class _HardswishTree(EpilogueVisitTree):
    def __call__(self, accum: 'tensor', c: 'tensor', alpha: 'scalar', beta: 'scalar'):
        D = cutlass.hardswish.numpy(alpha * accum + beta * c)
        return D


def test_visitor_tree_computes_a_float64_tree_in_float64():
    assert _HardswishTree(None, None, F64, 1, element_output=F64).element_compute is F64
    assert _HardswishTree(None, None, F64, 1, None, F32).element_compute is F64  # float64 accumulators
    assert _HardswishTree(None, None, F32, 1, element_output=F32).element_compute is F32
    assert _HardswishTree(element_output=cutlass.float16).element_compute is F32  # PyCUTLASS's default
    assert _HardswishTree(None, None, F64, 1, F64, F64).element_compute is F64
    with pytest.raises(DescriptionError, match="float64 tree .*must compute in float64"):
        _HardswishTree(None, None, F64, 1, F32, F64)


# --- the compiled epilogue: no float32 instruction in a float64 hardswish kernel --------------------------------------
_TC = dict(inst=[8, 8, 4], opclass=cutlass.OpClass.TensorOp, tile=[64, 64, 16], stages=3)
_SIMT = dict(inst=[1, 1, 1], opclass=cutlass.OpClass.Simt, tile=[32, 32, 8], stages=4)


def _tile(cfg):
    math = cutlass.MathInstruction(cfg["inst"], F64, F64, F64, cfg["opclass"], cutlass.MathOperation.multiply_add)
    return cutlass.TileDescription(cfg["tile"], cfg["stages"], [2, 2, 1], math)


def _generic(activation):
    # element_epilogue left out: float64 for a float64 epilogue
    return cutlass.LinearCombinationGeneric(getattr(cutlass, activation)(F64), F64, 1, F64)


def _f64_operation(kind, activation="hardswish"):
    R, CM, NHWC = cutlass.RowMajor, cutlass.ColumnMajor, cutlass.TensorNHWC
    if kind == "reduction":
        return cutlass.ReductionOperation((4, 32), cutlass.TensorDescription(F64, R, 1), F64,
                                          epilogue_functor=_generic(activation), count=1, arch=80)
    if kind in ("gemm", "grouped", "evt"):
        A, B, C = (cutlass.TensorDescription(F64, layout, 1) for layout in (R, CM, R))
        if kind == "evt":  # element_compute left out, as PyCUTLASS's scripts leave it
            tree = _HardswishTree(None, _tile(_TC), F64, 1, element_output=F64)
            return cutlass.GemmOperationUniversal(80, _tile(_TC), A, B, C, tree, visitor=True)
        cls = cutlass.GemmOperationUniversal if kind == "gemm" else cutlass.GemmOperationGrouped
        return cls(80, _tile(_TC), A, B, C, _generic(activation))
    # the acceptance run's kernel: float64 SIMT, optimized iterator, strided support (and dgrad's swizzle)
    D = cutlass.TensorDescription(F64, NHWC, 1)
    swizzle = cutlass.StridedDgradIdentitySwizzle1 if kind == "dgrad" else cutlass.IdentitySwizzle1
    return cutlass.Conv2dOperation(Operator[kind], IteratorAlgorithm.optimized, 80, _tile(_SIMT), D, D, D,
                                   StrideSupport.Strided, _generic(activation), swizzle)


def _ptx(operations, backend_name, tmp_path) -> str:
    """The PTX of one translation unit holding ``operations``, with the backend's own flags and headers."""
    from pycutlass.compiler.backends import backend_by_name
    from pycutlass.emit.emitter import translation_unit

    source = translation_unit(operations)
    backend = backend_by_name(backend_name)
    if backend_name == "nvcc":
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            pytest.skip("no nvcc")
        flags = [f for f in backend.flags(90) if f != "-cubin" and not f.startswith(("-gencode", "-Xptxas"))]
        (tmp_path / "unit.cu").write_text(source)
        proc = subprocess.run([nvcc, "-ptx", "-arch=compute_90", *flags, *backend.include_flags(), "-o",
                               str(tmp_path / "unit.ptx"), str(tmp_path / "unit.cu")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return (tmp_path / "unit.ptx").read_text()
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
    flags = [f for f in backend.flags(90) if not f.startswith("--gpu-architecture")] + ["--gpu-architecture=compute_90"]
    options = [o.encode() for o in (*flags, *backend.include_flags())]
    _, program = nvrtc.nvrtcCreateProgram(source.encode(), b"unit.cu", 0, [], [])
    try:
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = b" " * max(size, 2)
        nvrtc.nvrtcGetProgramLog(program, log)
        assert status == nvrtc.nvrtcResult.NVRTC_SUCCESS, log.decode(errors="replace")[-3000:]
        _, size = nvrtc.nvrtcGetPTXSize(program)
        ptx = b" " * size
        nvrtc.nvrtcGetPTX(program, ptx)
        return ptx.decode().rstrip("\x00")
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _functions(ptx: str) -> dict[str, str]:
    """Kernel or device function name -> its PTX, up to the next one (inline asm braces make ``}`` no end mark)."""
    heads = list(re.finditer(r"^(?:\.visible |\.weak )?\.(?:entry|func)\s+(?:\([^)]*\)\s*)?(\w+)", ptx, re.M))
    return {m.group(1): ptx[m.start():(heads[i + 1].start() if i + 1 < len(heads) else len(ptx))]
            for i, m in enumerate(heads)}


_FLOAT32 = re.compile(r"^\s*[a-z][\w.]*\.(f32|f16|bf16)\b.*$|^\s*cvt\.[\w.]*(f32|f16|bf16)[\w.]*\s.*$", re.M)
KINDS = ("gemm", "grouped", "fprop", "dgrad", "wgrad", "reduction", "evt")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["nvcc", "nvrtc"])
def test_float64_hardswish_epilogue_has_no_float32_instruction(backend, tmp_path):
    """Each kind's float64 hardswish (and dgrad's identity, relu, leaky_relu) kernel: no float32/16-bit instruction
    or conversion, and hardswish's division by 6 in float64 (div.rn.f64 by 0d4018000000000000), never a multiply
    by a float32 1/6 (0d3FC5555560000000)."""
    labelled = [(kind, "hardswish", _f64_operation(kind)) for kind in KINDS]
    labelled += [("dgrad", act, _f64_operation("dgrad", act)) for act in ("identity", "relu", "leaky_relu")]
    functions = _functions(_ptx([op for _, _, op in labelled], backend, tmp_path))
    # Every kernel and device function of this unit is float64 (builders included): none may hold a narrow one.
    narrow = {name: [m.group(0).strip() for m in _FLOAT32.finditer(body)] for name, body in functions.items()}
    narrow = {name: lines[:4] for name, lines in narrow.items() if lines}
    assert not narrow, f"float32/16-bit instructions ({backend}): {narrow}"
    for kind, activation, op in labelled:
        body = functions.get(op.name)
        assert body is not None, f"{kind}: no kernel {op.name} in the PTX"
        assert "0d3fc5555560000000" not in body.lower(), f"{kind} ({backend}): a float32 1/6"
        if activation == "hardswish":
            assert re.search(r"div\.rn\.f64\s+%fd\d+, %fd\d+, 0d4018000000000000", body), \
                f"{kind} ({backend}): no float64 division by 6"
