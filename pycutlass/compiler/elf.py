"""Cubin post-processing for binaries that are loaded far more often than they are built (kernel packs).

NVRTC's ``-default-device`` makes every namespace-scope constant of the CUDA and CUTLASS headers a device variable:
an SM90 GEMM's cubin carries ~8,600 local data symbols (``numeric_limits<...>::has_quiet_NaN`` and the like) that no
instruction refers to, and the driver spends ~45 ms of ``cuModuleLoadData`` on them (2 ms without). ``slim_cubin``
turns each local data symbol that no relocation names into a null symbol and drops its name from the string table.
Symbol indices, sections and the variables' bytes stay where they are, so relocations and ``.nv.info`` records keep
their meaning; what a kernel reads through a section symbol is untouched, and exported (global) symbols are kept.
"""
from __future__ import annotations

import struct

_ELF_MAGIC = b"\x7fELF"
_SHT_SYMTAB, _SHT_RELA, _SHT_REL = 2, 4, 9
_STB_LOCAL, _STT_OBJECT = 0, 1
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, section, value, size
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr


def slim_cubin(binary: bytes) -> bytes:
    """``binary`` with its unreferenced local data symbols nulled; unchanged if it is not a 64-bit
    little-endian ELF with one symbol table."""
    if binary[:4] != _ELF_MAGIC or binary[4] != 2 or binary[5] != 1:
        return binary
    data = bytearray(binary)
    section_offset = struct.unpack_from("<Q", data, 0x28)[0]
    entry_size, count = struct.unpack_from("<HH", data, 0x3A)
    if entry_size != _SECTION.size or section_offset + entry_size * count > len(data):
        return binary
    sections = [_SECTION.unpack_from(data, section_offset + i * entry_size) for i in range(count)]
    tables = [s for s in sections if s[1] == _SHT_SYMTAB]
    if len(tables) != 1:
        return binary
    _, _, _, _, table_offset, table_size, _, _, _, _ = tables[0]
    named = set()  # symbols a relocation refers to
    for _, kind, _, _, offset, size, _, _, _, _ in sections:
        if kind in (_SHT_RELA, _SHT_REL):
            stride = 24 if kind == _SHT_RELA else 16
            named.update(struct.unpack_from("<Q", data, offset + stride * i + 8)[0] >> 32
                         for i in range(size // stride))
    null = bytes(_SYMBOL.size)
    for index in range(table_size // _SYMBOL.size):
        offset = table_offset + index * _SYMBOL.size
        info = data[offset + 4]
        if info >> 4 == _STB_LOCAL and info & 0xF == _STT_OBJECT and index not in named:
            data[offset:offset + _SYMBOL.size] = null
    _compact_names(data, sections[tables[0][6]], table_offset, table_size)
    return bytes(data)


def _compact_names(data: bytearray, strings: tuple, table_offset: int, table_size: int) -> None:
    """Rewrite the symbol names still in use at the start of the string table and zero the rest (same size and
    place: the file's layout does not move; the zeros compress to nothing)."""
    offset, size = strings[4], strings[5]
    old = bytes(data[offset:offset + size])
    new, where = bytearray(b"\0"), {b"": 0}
    for index in range(table_size // _SYMBOL.size):
        entry = table_offset + index * _SYMBOL.size
        name_at = struct.unpack_from("<I", data, entry)[0]
        if not name_at:
            continue
        name = old[name_at:old.index(b"\0", name_at)]
        if name not in where:
            where[name] = len(new)
            new += name + b"\0"
        struct.pack_into("<I", data, entry, where[name])
    data[offset:offset + size] = bytes(new) + bytes(size - len(new))
