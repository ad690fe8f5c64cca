"""The base of the only structs that cross the Python/C++ boundary, and the launch record every builder writes.

Each kernel kind defines its own argument struct in its folder (``kinds/<kind>/abi.py``); a translation unit
carries the structs of the operations in it, so adding a kind re-keys no cached kernel of another kind.

Python packs them with ctypes; the emitted C++ gets the same struct generated from these definitions plus
``static_assert``s on size and every offset, so a layout drift fails the compile instead of corrupting a launch.
CUTLASS's own ``Params`` are built on the device from these (see templates/prelude.h.j2) and never mirrored here.
"""
from __future__ import annotations

import ctypes

from ..errors import ArgumentError

MAX_ACTIVATION_ARGS = 4

_CPP_TYPE = {ctypes.c_int32: "int32_t", ctypes.c_int64: "int64_t", ctypes.c_uint64: "uint64_t",
             ctypes.c_double: "double"}


_INT32_RANGE = (-2**31, 2**31 - 1)


class _CheckedInt32:
    """An int32 field that refuses what it cannot hold: ctypes would store it wrapped around, and the kernel would
    compute another problem. The arguments' own checks name the limits first; this is the net under them. Reads and
    ``offset`` pass through to ctypes' field."""

    def __init__(self, field, owner: str, name: str):
        self.field, self.offset, self.size = field, field.offset, field.size
        self._where = f"{owner}.{name}"

    def __get__(self, instance, owner=None):
        return self if instance is None else self.field.__get__(instance, owner)

    def __set__(self, instance, value):
        if not _INT32_RANGE[0] <= value <= _INT32_RANGE[1]:
            raise ArgumentError(f"{self._where}: {value} does not fit the kernel's int32_t "
                                f"({_INT32_RANGE[0]} to {_INT32_RANGE[1]})")
        self.field.__set__(instance, value)


class _AbiStructType(type(ctypes.Structure)):
    def __init__(cls, name, bases, namespace, **kwargs):
        super().__init__(name, bases, namespace, **kwargs)
        if namespace.get("_device_written_", False):
            return  # only read on the host: ctypes' own fields read fastest
        for field_name, ctype in namespace.get("_fields_", ()):  # ctypes made their descriptors in __new__
            if ctype is ctypes.c_int32:
                setattr(cls, field_name, _CheckedInt32(cls.__dict__[field_name], name, field_name))


class AbiStruct(ctypes.Structure, metaclass=_AbiStructType):
    """A padding-free C struct. Declared without padding, its C++ twin's offsets follow from its field sizes.

    ``_pointers_`` names the fields that hold device addresses: the runtime reuses Params built for one set of
    addresses with another by patching exactly what those fields became (see ``runtime.params``). The int32 fields
    of structs the host writes refuse values they cannot hold (``ArgumentError``); ``_device_written_ = True``
    marks structs only the builder kernels write.
    """

    _pointers_: tuple[str, ...] = ()

    @classmethod
    def pointer_offsets(cls) -> tuple[int, ...]:
        """Byte offsets of the ``_pointers_`` fields (derived once, kept on the class like its fields)."""
        found = cls.__dict__.get("_pointer_offsets_")
        if found is None:
            found = tuple(getattr(cls, name).offset for name in cls._pointers_)
            cls._pointer_offsets_ = found
        return found

    @classmethod
    def check_no_padding(cls) -> None:
        expected = 0
        for name, ctype in cls._fields_:
            field = getattr(cls, name)
            if field.offset != expected:
                raise TypeError(f"{cls.__name__}.{name} is padded (offset {field.offset}, expected {expected}); "
                                f"add explicit reserved fields")
            expected += ctypes.sizeof(ctype)
        if expected != ctypes.sizeof(cls):
            raise TypeError(f"{cls.__name__} has tail padding; add an explicit reserved field")

    @classmethod
    def cpp_definition(cls) -> str:
        cls.check_no_padding()
        lines = [f"struct {cls.__name__} {{"]
        for name, ctype in cls._fields_:
            if issubclass(ctype, ctypes.Array):
                lines.append(f"  {_CPP_TYPE[ctype._type_]} {name}[{ctype._length_}];")
            else:
                lines.append(f"  {_CPP_TYPE[ctype]} {name};")
        lines.append("};")
        # Total size == sum of the field sizes proves the C++ struct has no padding either, so every offset equals
        # Python's. NVRTC has no constant offsetof, so the direct offset checks are for nvcc builds only.
        lines.append(f"static_assert(sizeof({cls.__name__}) == {ctypes.sizeof(cls)}, "
                     f"\"{cls.__name__}: size differs from pycutlass.emit.abi\");")
        for name, ctype in cls._fields_:
            lines.append(f"static_assert(sizeof({cls.__name__}::{name}) == {ctypes.sizeof(ctype)}, "
                         f"\"{cls.__name__}.{name}: size differs from pycutlass.emit.abi\");")
        lines.append("#ifndef __CUDACC_RTC__")
        for name, _ in cls._fields_:
            lines.append(f"static_assert(__builtin_offsetof({cls.__name__}, {name}) == {getattr(cls, name).offset}, "
                         f"\"{cls.__name__}.{name}: offset differs from pycutlass.emit.abi\");")
        lines.append("#endif")
        return "\n".join(lines)


EPILOGUE_FIELDS = [("alpha", ctypes.c_double), ("beta", ctypes.c_double),
                    ("activation_args", ctypes.c_double * MAX_ACTIVATION_ARGS)]


class LaunchInfo(AbiStruct):
    """Written by every builder kernel: how to launch the kernel whose Params it just built.

    ``workspace_bytes``: scratch the kernel needs (the runtime allocates it); ``workspace_zero_bytes``: how many
    bytes at its end must be zero at every launch (stream-K's barriers; the reduction tiles before them are
    written before they are read, so CUTLASS itself zeroes only the barriers)."""

    _device_written_ = True

    _fields_ = [("grid_x", ctypes.c_int32), ("grid_y", ctypes.c_int32), ("grid_z", ctypes.c_int32),
                ("block_x", ctypes.c_int32), ("block_y", ctypes.c_int32), ("block_z", ctypes.c_int32),
                ("shared_memory_bytes", ctypes.c_int32),
                ("params_bytes", ctypes.c_int32), ("status", ctypes.c_int32), ("semaphore_count", ctypes.c_int32),
                ("tma_count", ctypes.c_int32), ("workspace_zero_bytes", ctypes.c_int32),
                ("workspace_bytes", ctypes.c_int64)]


class TmaRecord(AbiStruct):
    """One TMA descriptor inside Params: where it is and the arguments of ``cuTensorMapEncodeTiled`` for it.

    The builder fills these from CUTLASS's own TMA copy types (global shape and strides through cute's
    ``fill_tma_gmem_shape_stride``, the box from the copy's basis, swizzle from its smem layout); the runtime
    encodes each descriptor through the driver and writes its 128 bytes at ``offset``. ``status`` is nonzero when a
    rule of the encoder is broken (then nothing launches).

    ``mode`` 0: tiled (the fields above are ``cuTensorMapEncodeTiled``'s arguments). ``mode`` 1: im2col (SM90
    convolution): only ``offset`` counts; the descriptor's 128 bytes hold the encode arguments CUTLASS's
    ``make_im2col_tma_copy_desc`` computed (``kinds/conv2d_sm90``'s capture), which the runtime encodes through
    ``cuTensorMapEncodeIm2col``."""

    _device_written_ = True

    _fields_ = [("offset", ctypes.c_int32), ("rank", ctypes.c_int32), ("data_type", ctypes.c_int32),
                ("swizzle", ctypes.c_int32), ("interleave", ctypes.c_int32), ("l2_promotion", ctypes.c_int32),
                ("oob_fill", ctypes.c_int32), ("status", ctypes.c_int32), ("address", ctypes.c_uint64),
                ("dims", ctypes.c_uint64 * 5), ("strides", ctypes.c_uint64 * 5),
                ("box", ctypes.c_int32 * 5), ("element_strides", ctypes.c_int32 * 5),
                ("mode", ctypes.c_int32), ("reserved", ctypes.c_int32)]

TMA_TILED, TMA_IM2COL = 0, 1  # TmaRecord.mode


MAX_TMA_RECORDS = 8  # per builder; they follow Params in its output slot


def cpp_definitions(structs) -> str:
    """The C++ twins of ``structs`` (each once), for the prelude of a translation unit."""
    return "\n\n".join(s.cpp_definition() for s in dict.fromkeys(structs))


def fill_epilogue(struct: AbiStruct, output_op) -> None:
    """Copy an EpilogueArguments (alpha, beta, activation args) into an ABI struct."""
    struct.alpha = output_op.alpha
    struct.beta = output_op.beta
    for i, value in enumerate(output_op.activation_args):
        struct.activation_args[i] = value
