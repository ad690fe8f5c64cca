"""SM90 implicit-GEMM convolution under NVRTC: the compile probe (pycutlass/kinds/conv2d_sm90, not yet a kind).

CUTLASS 4.2's SM90 conv headers do not compile under NVRTC as shipped; ``nvrtc_overlay.cuh`` makes them compile
without editing them (docs/sm90.md, "SM90 convolution"). The slow test compiles one fprop kernel and its device-side
Params builder for real.
"""
from __future__ import annotations

import re

import pytest

from pycutlass.compiler import toolchain
from pycutlass.compiler.backends import NvrtcBackend
from pycutlass.kinds.conv2d_sm90 import probe


def test_overlay_comes_first_and_avoids_the_sm100_headers():
    source = probe.probe_source()
    includes = re.findall(r'#include [<"]([^>"]+)[>"]', source)
    assert includes[0] == "cuda/std/type_traits"
    # conv_universal.hpp drags in the SM100 kernel (explicit __host__ members NVRTC rejects); the overlay declares
    # the primary template and includes the SM90 specialization alone.
    assert "cutlass/conv/kernel/conv_universal.hpp" not in includes
    assert "cutlass/conv/kernel/sm90_implicit_gemm_tma_warpspecialized.hpp" in includes
    # The im2col traits are compiled with CUTE_HOST as host-device, and the macro is restored right after.
    at = source.index('#include "cute/atom/copy_traits_sm90_im2col.hpp"')
    assert "#define CUTE_HOST CUTE_HOST_DEVICE" in source[:at]
    assert "#define CUTE_HOST __forceinline__ __host__" in source[at:at + 200]


def test_probe_source_is_parameterized():
    source = probe.probe_source("probe_x", element="bf16", tile=(64, 128, 64), cluster=(2, 1, 1))
    assert "cutlass::bfloat16_t" in source and "Shape<_64, _128, Shape<_64>>" in source
    assert "__cluster_dims__(2, 1, 1)" in source and "probe_x_build" in source
    with pytest.raises(KeyError):
        probe.probe_source(element="f32")


def test_cutlass_util_include_dir_holds_packed_stride():
    assert (toolchain.cutlass_util_include_dir() / "cutlass" / "util" / "packed_stride.hpp").is_file()


@pytest.mark.slow
def test_nvrtc_compiles_an_sm90_fprop_kernel_and_its_builder():
    """A real NVRTC compile (about 80-110 s on two cores): the kernel and the builder that runs CUTLASS's
    ``ConvUniversal::to_underlying_arguments`` (im2col TMA descriptor included) on the device."""
    name = "pycutlass_conv2d_sm90_probe"
    backend = NvrtcBackend((f"-I{toolchain.cutlass_util_include_dir()}",))
    cubin = backend.compile(probe.probe_source(name), "90a", name)
    assert name.encode() in cubin and f"{name}_build".encode() in cubin
    assert len(cubin) > 100_000  # a real kernel, not an empty stub


@pytest.mark.slow
def test_nvrtc_compiles_sm90_dgrad_and_wgrad_kernels():
    """The same overlay carries the backward kernels (about 100 s on two cores for both; no builders yet)."""
    name = "pycutlass_conv2d_sm90_probe"
    backend = NvrtcBackend((f"-I{toolchain.cutlass_util_include_dir()}",))
    cubin = backend.compile(probe.backward_probe_source(name), "90a", name)
    assert f"{name}_dgrad".encode() in cubin and f"{name}_wgrad".encode() in cubin


def test_im2col_capture_decodes_the_overlays_layout():
    """The Python twin of pycutlass_rtc::Im2colCapture (natural C alignment: no padding before the last byte)."""
    assert probe.Im2colCapture.LAYOUT.size == 111  # 112 in C (8-byte alignment), within the 128-byte descriptor
    raw = probe.Im2colCapture.LAYOUT.pack(0x7F0000001000, 64, 9, 9, 2, 1, 128, 1152, 10368, 0, -1, -1, 0, -1, -1, 0,
                                          64, 128, 1, 2, 1, 1, 1, 4, 1, 3, 2, 0, 0xC7) + bytes(17)
    capture = probe.Im2colCapture(raw)
    assert capture.address == 0x7F0000001000 and capture.dims[:4] == (64, 9, 9, 2) and capture.rank == 4
    assert capture.strides[:3] == (128, 1152, 10368) and capture.lower[:2] == (-1, -1) and capture.upper[:2] == (-1, -1)
    assert (capture.range_c, capture.range_whdn, capture.elem_strides[:4]) == (64, 128, (1, 2, 1, 1))
    assert (capture.data_type, capture.swizzle, capture.l2_promotion) == (1, 3, 2)
    with pytest.raises(ValueError, match="not an im2col capture"):
        probe.Im2colCapture(bytes(128))  # a tiled descriptor NVRTC left empty
