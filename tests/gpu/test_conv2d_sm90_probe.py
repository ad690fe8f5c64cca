"""The SM90 conv compile probe on a GPU, end to end without a registered kind: CUTLASS's own
``to_underlying_arguments`` runs in the NVRTC-compiled device builder; the three im2col descriptors it leaves in
Params (activations, C, D) hold the arguments CUTLASS would have given ``cuTensorMapEncodeIm2col``, the filter's tiled
descriptor comes as a TmaRecord; the test encodes them through the driver, launches the kernel and compares with a
float64 reference (NaN-poisoned output). See docs/sm90.md, "SM90 convolution"."""
from __future__ import annotations

import ctypes

import pytest

from pycutlass.compiler import toolchain
from pycutlass.compiler.backends import NvrtcBackend
from pycutlass.emit.abi import TmaRecord
from pycutlass.kinds.conv2d_sm90 import probe
from pycutlass.runtime import driver

try:
    import torch
except ImportError:
    torch = None
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

NAME = "pycutlass_conv2d_sm90_probe"
# CUtensorMapDataType: CUTLASS moves the activations as 16-bit words, C and D in their own type.
UINT16 = 1
OUTPUT_TYPE = {"f16": 6, "bf16": 9}
TORCH_TYPE = {"f16": "float16", "bf16": "bfloat16"}
TOLERANCE = {"f16": 2e-3, "bf16": 1.5e-2}
CONFIGS = [("f16", (128, 128, 64), (1, 1, 1)), ("bf16", (64, 128, 64), (2, 1, 1))]


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-c{c[2][0]}{c[2][1]}")
def functions(request):
    element, tile, cluster = request.param
    cubin = NvrtcBackend((f"-I{toolchain.cutlass_util_include_dir()}",)).compile(
        probe.probe_source(NAME, element=element, tile=tile, cluster=cluster), "90a", NAME)
    torch.cuda.init()
    torch.empty(1, device="cuda")  # torch's primary context, current
    module = driver.load_module(cubin, NAME)
    return request.param, module, driver.get_function(module, NAME), driver.get_function(module, f"{NAME}_build")


def _launch(function, grid, block, smem, args):
    kernel_params = driver.pointer_array(*(ctypes.addressof(a) for a in args))
    driver.launch(function, grid, block, smem, torch.cuda.current_stream().cuda_stream,
                  ctypes.addressof(kernel_params), NAME)
    torch.cuda.synchronize()


@pytest.mark.parametrize("n, h, w, c, k, r, s, pad, stride, dilation", [
    (2, 9, 9, 64, 128, 3, 3, (1, 1), (1, 1), (1, 1)),
    (1, 17, 23, 32, 64, 5, 3, (2, 0), (2, 1), (1, 2)),
    (3, 7, 5, 64, 16, 1, 1, (0, 0), (1, 1), (1, 1)),
    (2, 31, 30, 72, 136, 3, 3, (1, 1), (2, 2), (1, 1)),
])
def test_probe_runs_a_convolution(functions, n, h, w, c, k, r, s, pad, stride, dilation):
    (element, tile, _), _, kernel, build = functions
    dtype = getattr(torch, TORCH_TYPE[element])
    torch.manual_seed(n * h + w)
    p = (h + 2 * pad[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (w + 2 * pad[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
    dims = torch.tensor([n, h, w, c, k, r, s, *pad, *stride, *dilation], dtype=torch.int32, device="cuda")
    act = torch.randn(n, h, w, c, device="cuda").to(dtype)
    flt = torch.randn(k, r, s, c, device="cuda").to(dtype)
    src = torch.randn(n, p, q, k, device="cuda").to(dtype)
    out = torch.full((n, p, q, k), float("nan"), device="cuda").to(dtype)
    alpha, beta = 0.5, 0.25
    params = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    report = torch.full((11,), -1, dtype=torch.int32, device="cuda")
    record = torch.zeros(ctypes.sizeof(TmaRecord), dtype=torch.uint8, device="cuda")
    _launch(build, (1, 1, 1), (1, 1, 1), 0, [
        ctypes.c_void_p(dims.data_ptr()), ctypes.c_void_p(act.data_ptr()), ctypes.c_void_p(flt.data_ptr()),
        ctypes.c_void_p(src.data_ptr()), ctypes.c_void_p(out.data_ptr()), ctypes.c_float(alpha), ctypes.c_float(beta),
        ctypes.c_void_p(params.data_ptr()), ctypes.c_void_p(report.data_ptr()), ctypes.c_void_p(record.data_ptr())])
    can_implement, off_a, off_b, off_c, off_d, params_bytes, smem, gx, gy, gz, threads = report.tolist()
    assert can_implement == 1
    assert 0 < params_bytes <= params.numel() and smem > 0 and min(gx, gy, gz, threads) > 0
    assert all(o % 64 == 0 and 0 <= o <= params_bytes - 128 for o in (off_a, off_b, off_c, off_d))
    raw = bytearray(bytes(params.cpu().numpy()[:params_bytes]))

    # The activations' capture is what make_im2col_tma_copy_desc computed (CUTLASS's host arithmetic, on the device).
    capture = probe.Im2colCapture(bytes(raw[off_a:off_a + 128]))
    assert capture.address == act.data_ptr() and capture.rank == 4 and capture.data_type == UINT16
    assert capture.dims[:4] == (c, w, h, n)
    assert capture.strides[:3] == (2 * c, 2 * w * c, 2 * h * w * c)
    assert capture.lower[:2] == (-pad[1], -pad[0])
    assert capture.upper[:2] == (pad[1] - (s - 1) * dilation[1], pad[0] - (r - 1) * dilation[0])
    assert capture.elem_strides[:4] == (1, stride[1], stride[0], 1)
    assert capture.range_c == tile[2] and capture.range_whdn == tile[0]  # A is multicast along N: clusters are Mx1
    captures = {off_a: capture}
    for offset, tensor in ((off_c, src), (off_d, out)):
        captures[offset] = probe.Im2colCapture(bytes(raw[offset:offset + 128]))
        assert captures[offset].address == tensor.data_ptr() and captures[offset].data_type == OUTPUT_TYPE[element]
    # The filter's tiled descriptor: NVRTC compiled CUTLASS's encode out (zeros); the record describes it.
    assert raw[off_b:off_b + 128] == bytes(128)
    filter_record = TmaRecord.from_buffer_copy(bytes(record.cpu().numpy()))
    assert filter_record.offset == off_b and filter_record.status == 0 and filter_record.address == flt.data_ptr()

    for offset, cap in captures.items():
        raw[offset:offset + 128] = cap.encode()
    staging = (ctypes.c_byte * 256)()
    aligned = (ctypes.addressof(staging) + 63) & ~63
    driver.encode_tma_descriptor(filter_record, aligned, NAME)
    raw[off_b:off_b + 128] = ctypes.string_at(aligned, 128)

    host_params = (ctypes.c_byte * (params_bytes + 64))()
    at = (ctypes.addressof(host_params) + 63) & ~63
    ctypes.memmove(at, bytes(raw), params_bytes)
    driver.set_dynamic_shared_memory(kernel, smem, NAME)
    _launch(kernel, (gx, gy, gz), (threads, 1, 1), smem, [ctypes.c_byte.from_address(at)])

    reference = torch.nn.functional.conv2d(act.double().permute(0, 3, 1, 2), flt.double().permute(0, 3, 1, 2),
                                           stride=stride, padding=pad, dilation=dilation).permute(0, 2, 3, 1)
    reference = alpha * reference + beta * src.double()
    got = out.double()
    assert torch.isfinite(got).all(), "the kernel left NaN-poisoned outputs"
    error = ((got - reference).norm() / reference.norm()).item()
    assert error < TOLERANCE[element], f"relative error {error}"
