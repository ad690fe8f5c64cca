"""How both grouped GEMM kinds (the Sm80 family's and SM90's pointer-array kernels) lay out their per-problem arrays
(sizes, operand pointers, leading dimensions) in one device buffer, and read PyCUTLASS's keywords."""
from __future__ import annotations

import numpy as np

from ...errors import ArgumentError

_ARRAY_ALIGNMENT = 16  # bytes; each per-problem array starts aligned in the shared buffer


def is_device_sizes(problem_sizes) -> bool:
    """Whether ``problem_sizes`` is a tensor (the device-sizes path) rather than a list of (M, N, K)."""
    if isinstance(problem_sizes, (list, tuple)) or problem_sizes is None:
        return False
    return isinstance(problem_sizes, np.ndarray) or hasattr(problem_sizes, "__cuda_array_interface__") or \
        hasattr(problem_sizes, "__dlpack__") or type(problem_sizes).__module__.startswith("torch")


def fill_group_arrays(struct, arguments) -> None:
    """The per-group device arrays (sizes, operand pointers, leading dimensions) and the workspace of ``arguments``
    into a grouped ABI struct (the Sm80 kernel's and the SM90 pointer-array kernel's have these fields alike)."""
    arrays = arguments.device_arrays
    struct.problem_sizes = arrays["problem_sizes"]
    struct.ptr_A, struct.ptr_B, struct.ptr_C, struct.ptr_D = (arrays[f"ptr_{x}"] for x in "ABCD")
    struct.lda, struct.ldb, struct.ldc, struct.ldd = (arrays[f"ld{x}"] for x in "abcd")
    struct.workspace = arguments.workspace
    struct.workspace_bytes = arguments.workspace_bytes


def pack_arrays(arrays) -> tuple[bytes, dict]:
    """One buffer for (field, numpy array) pairs, each array aligned; and each field's offset in it."""
    blob, offsets = bytearray(), {}
    for field, array in arrays:
        blob.extend(b"\0" * (-len(blob) % _ARRAY_ALIGNMENT))
        offsets[field] = len(blob)
        blob.extend(np.ascontiguousarray(array).tobytes())
    return bytes(blob), offsets


def pack_problem_arrays(sizes, pointers: dict, lds: dict, extra=()) -> tuple[bytes, dict]:
    """One buffer for all per-problem arrays, [sizes][ptr A..D][ld A..D] then ``extra`` (field, array) pairs, each
    aligned; and each one's offset."""
    return pack_arrays([("problem_sizes", sizes)] + [(f"ptr_{x}", pointers[x]) for x in "ABCD"] +
                       [(f"ld{x.lower()}", lds[x]) for x in "ABCD"] + list(extra))


def problem_arrays(problems, operands, address, empty_k_operand, empty_k_size: int | None = None):
    """Per-problem sizes (count x 3 int32), pointers (uint64) and leading dimensions (int64) of A, B, C, D, as
    ``pack_problem_arrays`` takes them. ``operands[i]``: label -> (TensorInfo, MatrixGeometry), C missing when beta
    is 0 (C then aliases D, never read); ``address(info, is_output)``: a device address; ``empty_k_operand(label, m,
    n)``: (pointer, ld) that A and B of a K = 0 problem read instead (``empty_k_size``: the K such a problem runs
    with, if not 0). Built as Python lists, converted once: numpy item assignment costs more per problem than the
    rest of the loop."""
    sizes, pointers, lds = [], {label: [] for label in "ABCD"}, {label: [] for label in "ABCD"}
    for (m, n, k), found in zip(problems, operands):
        empty_k = k == 0 and m > 0 and n > 0
        sizes.append((m, n, empty_k_size if empty_k and empty_k_size is not None else k))
        for label in "ABDC":
            if label not in found:
                pointer, ld = pointers["D"][-1], lds["D"][-1]
            elif empty_k and label in "AB":
                pointer, ld = empty_k_operand(label, m, n)
            else:
                info, geometry = found[label]
                pointer, ld = address(info, is_output=label == "D"), geometry.ld
            pointers[label].append(pointer)
            lds[label].append(ld)
    return (np.array(sizes, dtype=np.int32).reshape(len(sizes), 3),
            {label: np.array(values, dtype=np.uint64) for label, values in pointers.items()},
            {label: np.array(values, dtype=np.int64) for label, values in lds.items()})


def plural_alias(plural: str, plural_value, single: str, single_value):
    """A grouped constructor's plural keyword (``As=``) or PyCUTLASS's singular one (``A=``), not both."""
    if single_value is None:
        return plural_value
    if plural_value is not None:
        raise ArgumentError(f"GemmGroupedArguments: pass {plural}= or PyCUTLASS's {single}=, not both")
    return single_value
