"""The only structs that cross the Python/C++ boundary, defined once here.

Python packs them with ctypes; the emitted C++ gets the same struct generated from these definitions plus
``static_assert``s on size and every offset, so a layout drift fails the compile instead of corrupting a launch.
CUTLASS's own ``Params`` are built on the device from these (see templates/prelude.h.j2) and never mirrored here.
"""
from __future__ import annotations

import ctypes

MAX_ACTIVATION_ARGS = 4

_CPP_TYPE = {ctypes.c_int32: "int32_t", ctypes.c_int64: "int64_t", ctypes.c_uint64: "uint64_t",
             ctypes.c_double: "double"}


class AbiStruct(ctypes.Structure):
    """A padding-free C struct. Declared without padding, its C++ twin's offsets follow from its field sizes."""

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


_EPILOGUE_FIELDS = [("alpha", ctypes.c_double), ("beta", ctypes.c_double),
                    ("activation_args", ctypes.c_double * MAX_ACTIVATION_ARGS)]


class LaunchInfo(AbiStruct):
    """Written by every builder kernel: how to launch the kernel whose Params it just built."""

    _fields_ = [("grid_x", ctypes.c_int32), ("grid_y", ctypes.c_int32), ("grid_z", ctypes.c_int32),
                ("block_x", ctypes.c_int32), ("block_y", ctypes.c_int32), ("block_z", ctypes.c_int32),
                ("shared_memory_bytes", ctypes.c_int32),
                ("params_bytes", ctypes.c_int32), ("status", ctypes.c_int32), ("semaphore_count", ctypes.c_int32),
                ("reserved", ctypes.c_int32)]


class GemmUniversalArgs(AbiStruct):
    _fields_ = [("mode", ctypes.c_int32), ("m", ctypes.c_int32), ("n", ctypes.c_int32), ("k", ctypes.c_int32),
                ("batch_count", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("ptr_A", ctypes.c_uint64), ("ptr_B", ctypes.c_uint64), ("ptr_C", ctypes.c_uint64),
                ("ptr_D", ctypes.c_uint64), ("semaphore", ctypes.c_uint64),
                ("lda", ctypes.c_int64), ("ldb", ctypes.c_int64), ("ldc", ctypes.c_int64), ("ldd", ctypes.c_int64),
                ("batch_stride_A", ctypes.c_int64), ("batch_stride_B", ctypes.c_int64),
                ("batch_stride_C", ctypes.c_int64), ("batch_stride_D", ctypes.c_int64)] + _EPILOGUE_FIELDS


class Conv2dArgs(AbiStruct):
    _fields_ = [("n", ctypes.c_int32), ("h", ctypes.c_int32), ("w", ctypes.c_int32), ("c", ctypes.c_int32),
                ("k", ctypes.c_int32), ("r", ctypes.c_int32), ("s", ctypes.c_int32),
                ("p", ctypes.c_int32), ("q", ctypes.c_int32),
                ("pad_h", ctypes.c_int32), ("pad_w", ctypes.c_int32),
                ("stride_h", ctypes.c_int32), ("stride_w", ctypes.c_int32),
                ("dilation_h", ctypes.c_int32), ("dilation_w", ctypes.c_int32),
                ("mode", ctypes.c_int32), ("split_k_slices", ctypes.c_int32), ("groups", ctypes.c_int32),
                ("split_k_mode", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("ptr_A", ctypes.c_uint64), ("ptr_B", ctypes.c_uint64), ("ptr_C", ctypes.c_uint64),
                ("ptr_D", ctypes.c_uint64), ("semaphore", ctypes.c_uint64),
                # Strides (elements) of C's W, H and N dimensions; zeros broadcast a bias vector.
                ("stride_c_w", ctypes.c_int64), ("stride_c_h", ctypes.c_int64), ("stride_c_n", ctypes.c_int64),
                ] + _EPILOGUE_FIELDS


class GemmGroupedArgs(AbiStruct):
    _fields_ = [("problem_count", ctypes.c_int32), ("threadblock_count", ctypes.c_int32),
                ("tile_count", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("problem_sizes", ctypes.c_uint64),  # device array of cutlass::gemm::GemmCoord (3 x int32)
                ("ptr_A", ctypes.c_uint64), ("ptr_B", ctypes.c_uint64), ("ptr_C", ctypes.c_uint64),
                ("ptr_D", ctypes.c_uint64),  # device arrays of pointers
                ("lda", ctypes.c_uint64), ("ldb", ctypes.c_uint64), ("ldc", ctypes.c_uint64),
                ("ldd", ctypes.c_uint64),  # device arrays of int64 leading dimensions
                ("workspace", ctypes.c_uint64),  # the SchedulerMode.Host schedule (ProblemInfo per tile)
                ("workspace_bytes", ctypes.c_int64),  # its size, checked by <name>_precompute
                ] + _EPILOGUE_FIELDS


class ReductionArgs(AbiStruct):
    _fields_ = [("m", ctypes.c_int32), ("n", ctypes.c_int32), ("partitions", ctypes.c_int32),
                ("reserved", ctypes.c_int32), ("partition_stride", ctypes.c_int64),
                ("workspace", ctypes.c_uint64), ("ld_workspace", ctypes.c_int64),
                ("destination", ctypes.c_uint64), ("ld_destination", ctypes.c_int64),
                ("source", ctypes.c_uint64), ("ld_source", ctypes.c_int64)] + _EPILOGUE_FIELDS


ALL_STRUCTS = (LaunchInfo, GemmUniversalArgs, Conv2dArgs, GemmGroupedArgs, ReductionArgs)


def cpp_definitions() -> str:
    return "\n\n".join(s.cpp_definition() for s in ALL_STRUCTS)


def fill_epilogue(struct: AbiStruct, output_op) -> None:
    """Copy an EpilogueArguments (alpha, beta, activation args) into an ABI struct."""
    struct.alpha = output_op.alpha
    struct.beta = output_op.beta
    for i, value in enumerate(output_op.activation_args):
        struct.activation_args[i] = value
