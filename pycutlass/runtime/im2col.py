"""``pycutlass_rtc::Im2colCapture``: the im2col encode arguments the overlay leaves in a descriptor's 128 bytes
(kinds/conv2d_sm90/nvrtc_overlay.cuh). The runtime (``launch.py``) decodes one per im2col TmaRecord and encodes it."""
from __future__ import annotations

import ctypes
import struct


class Im2colCapture:
    """``pycutlass_rtc::Im2colCapture`` as the overlay leaves it in a descriptor's 128 bytes (little-endian)."""

    # address, dims[5], strides[4], lower[3], upper[3], range_c, range_whdn, elem_strides[5], rank, data_type,
    # swizzle, l2_promotion, oob_fill, magic
    LAYOUT = struct.Struct("<Q5Q4Q3h3hII5B6B")
    MAGIC = 0xC7

    def __init__(self, raw: bytes):
        v = self.LAYOUT.unpack_from(raw)
        self.address, self.dims, self.strides = v[0], v[1:6], v[6:10]
        self.lower, self.upper, self.range_c, self.range_whdn = v[10:13], v[13:16], v[16], v[17]
        self.elem_strides, (self.rank, self.data_type, self.swizzle, self.l2_promotion, self.oob_fill,
                            self.magic) = v[18:23], v[23:29]
        if self.magic != self.MAGIC or not 3 <= self.rank <= 5:
            raise ValueError(f"not an im2col capture (magic {self.magic:#x}, rank {self.rank})")

    def encode(self) -> bytes:
        """The real descriptor, through the driver's cuTensorMapEncodeIm2col (needs a GPU)."""
        from . import driver

        staging = (ctypes.c_byte * 256)()
        aligned = (ctypes.addressof(staging) + 63) & ~63  # the encoder writes to 64-byte aligned memory
        driver.encode_im2col_descriptor(self, aligned, "SM90 conv")
        return ctypes.string_at(aligned, 128)
