"""A compiled unit's binary: one cubin, or several cubins packed together.

A unit compiled as one program gives one cubin. A unit whose kernels and Params builders were compiled as two
programs at once (``manager._split_units``: the builders' front end runs beside the kernels' on a spare core) gives
two cubins, packed here so that the artifact cache, bundles and workers keep handling one ``bytes`` per unit. The
runtime loads every image of a binary and looks each symbol up in all of them.

Packed layout: ``MAGIC``, the image count (u32 little-endian), each image's size (u64 little-endian), the images.
"""
from __future__ import annotations

import struct

from ..errors import CacheError

MAGIC = b"PYCUTLASS-IMAGES\x00\x01"
ELF_MAGIC = b"\x7fELF"


def pack(images) -> bytes:
    """One binary holding ``images`` (a single image is returned as it is)."""
    images = [bytes(image) for image in images]
    if not images:
        raise ValueError("pack() needs at least one image")
    if len(images) == 1:
        return images[0]
    sizes = struct.pack(f"<I{len(images)}Q", len(images), *(len(image) for image in images))
    return MAGIC + sizes + b"".join(images)


def unpack(binary: bytes) -> list[bytes]:
    """The images of a binary: a plain cubin is its own only image."""
    binary = bytes(binary)
    if not binary.startswith(MAGIC):
        return [binary]
    offset = len(MAGIC)
    try:
        (count,) = struct.unpack_from("<I", binary, offset)
        sizes = struct.unpack_from(f"<{count}Q", binary, offset + 4)
    except struct.error:
        raise CacheError("a packed binary's header is truncated") from None
    offset += 4 + 8 * count
    if count < 2 or offset + sum(sizes) != len(binary):
        raise CacheError(f"a packed binary's header does not match its size ({count} images of {list(sizes)} bytes "
                         f"after {offset} header bytes, {len(binary)} bytes in all)")
    images = []
    for size in sizes:
        images.append(binary[offset:offset + size])
        offset += size
    return images


def kind(binary: bytes) -> str:
    """The artifact cache's kind for a binary: "cubin" or "cubins" (packed)."""
    return "cubins" if bytes(binary[:len(MAGIC)]) == MAGIC else "cubin"
