"""The SM90 conv compile probe on a GPU: CUTLASS's own ``to_underlying_arguments`` runs in the NVRTC-compiled device
builder, and the im2col descriptor it leaves in Params holds the arguments CUTLASS would have given
``cuTensorMapEncodeIm2col``, which the driver then accepts. (Not a convolution run: the filter and C/D descriptors
are tiled ones the kind's builder will describe as the SM90 GEMM kind does; see docs/sm90.md, "SM90 convolution".)"""
from __future__ import annotations

import ctypes

import pytest

from pycutlass.compiler import toolchain
from pycutlass.compiler.backends import NvrtcBackend
from pycutlass.kinds.conv2d_sm90 import probe
from pycutlass.runtime import driver

try:
    import torch
except ImportError:
    torch = None
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

NAME = "pycutlass_conv2d_sm90_probe"
TILE = (128, 128, 64)


@pytest.fixture(scope="module")
def build_function():
    cubin = NvrtcBackend((f"-I{toolchain.cutlass_util_include_dir()}",)).compile(
        probe.probe_source(NAME, tile=TILE), "90a", NAME)
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the primary context, current
    module = driver.load_module(cubin, NAME)
    return module, driver.get_function(module, f"{NAME}_build")


@pytest.mark.parametrize("n, h, w, c, k, r, s, pad, stride, dilation", [
    (2, 9, 9, 64, 128, 3, 3, (1, 1), (1, 1), (1, 1)),
    (1, 17, 23, 32, 64, 5, 3, (2, 0), (2, 1), (1, 2)),
    (3, 7, 5, 8, 16, 1, 1, (0, 0), (1, 1), (1, 1)),
])
def test_builder_captures_the_im2col_encode_and_the_driver_accepts_it(build_function, n, h, w, c, k, r, s, pad,
                                                                      stride, dilation):
    _, function = build_function
    dims = torch.tensor([n, h, w, c, k, r, s, *pad, *stride, *dilation], dtype=torch.int32, device="cuda")
    act = torch.randn(n, h, w, c, device="cuda").half()
    flt = torch.randn(k, r, s, c, device="cuda").half()
    p = (h + 2 * pad[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (w + 2 * pad[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
    out_c = torch.full((n, p, q, k), float("nan"), device="cuda").half()
    out_d = torch.full((n, p, q, k), float("nan"), device="cuda").half()
    params = torch.zeros(8192, dtype=torch.uint8, device="cuda")
    report = torch.full((10,), -1, dtype=torch.int32, device="cuda")
    args = [ctypes.c_void_p(dims.data_ptr()), ctypes.c_void_p(act.data_ptr()), ctypes.c_void_p(flt.data_ptr()),
            ctypes.c_void_p(out_c.data_ptr()), ctypes.c_void_p(out_d.data_ptr()), ctypes.c_float(1.0),
            ctypes.c_float(0.0), ctypes.c_void_p(params.data_ptr()), ctypes.c_void_p(report.data_ptr())]
    kernel_params = driver.pointer_array(*(ctypes.addressof(a) for a in args))
    stream = torch.cuda.current_stream().cuda_stream
    driver.launch(function, (1, 1, 1), (1, 1, 1), 0, stream, ctypes.addressof(kernel_params), NAME)
    torch.cuda.synchronize()
    can_implement, off_a, off_b, off_c, off_d, params_bytes, smem, *grid = report.tolist()
    assert can_implement == 1
    assert 0 < params_bytes <= params.numel() and smem > 0 and all(g > 0 for g in grid)
    assert all(o % 64 == 0 and 0 <= o <= params_bytes - 128 for o in (off_a, off_b, off_c, off_d))
    raw = bytes(params.cpu().numpy())
    capture = probe.Im2colCapture(raw[off_a:off_a + 128])
    assert capture.address == act.data_ptr() and capture.rank == 4 and capture.data_type == 6  # FLOAT16
    assert capture.dims[:4] == (c, w, h, n)
    assert capture.strides[:3] == (2 * c, 2 * w * c, 2 * h * w * c)
    assert capture.lower[:2] == (-pad[1], -pad[0])
    assert capture.upper[:2] == (pad[1] - (s - 1) * dilation[1], pad[0] - (r - 1) * dilation[0])
    assert capture.elem_strides[:4] == (1, stride[1], stride[0], 1)
    assert capture.range_c == TILE[2] and capture.range_whdn == TILE[0]
    # The tiled descriptors: NVRTC compiled CUTLASS's encode out (zeros); the kind's records fill them.
    assert raw[off_b:off_b + 128] == bytes(128)
    descriptor = capture.encode()
    assert len(descriptor) == 128 and descriptor != raw[off_a:off_a + 128]
