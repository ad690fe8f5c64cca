"""GemmGroupedArguments: a list of independent GEMMs (each its own M, N, K and tensors) for GemmOperationGrouped.

Validation (sizes, dtypes, shapes, strides, alignment, device-tensor addresses) completes in ``__init__`` before
anything touches the GPU. Then one device buffer holds the per-problem arrays the kernel reads (problem sizes,
A/B/C/D pointers, leading dimensions), owned by these arguments like the copies of host tensors and, in
SchedulerMode.Host, the schedule workspace; all live as long as the arguments object.

Zero-sized problems: M == 0 or N == 0 gives no output tile, so the kernel's scheduler skips the problem (it stays
in the list, keeping problem indices equal to the user's). K == 0 is computed by the kernel as D = epilogue(beta *
C): with an empty K extent every A/B load is predicated off, the accumulators stay zero and the epilogue still runs
over the M x N output. Predicated-off cp.async still needs a mapped address, so the A and B of K == 0 problems point
at a small zeroed stand-in buffer (an empty tensor's pointer may be null). A group without any output tile launches
nothing.
"""
from __future__ import annotations

import ctypes

import numpy as np

from ...emit.abi import LaunchInfo, fill_epilogue
from ...errors import ArgumentError, CudaError
from ...runtime import driver
from ...runtime.arguments import ArgumentsMemo, OperationArguments, memo_key
from ...runtime.launch import PreparedLaunch
from ...runtime.overlap import byte_range, ranges_apart, same_geometry
from ...runtime.tensors import DeviceTensors, describe, storage_type
from ..families.arguments import (check_keywords, check_problem_alignment, coerce_output_op, coerce_problem_size,
                                  problem_alignment_checks)
from ..families.grouped_arguments import (  # noqa: F401  (their names as this module had them)
    fill_group_arrays, pack_arrays, pack_problem_arrays, problem_arrays)
from ..families.grouped_arguments import is_device_sizes, plural_alias as _alias
from ..families.matrix import MatrixGeometry, check_output_geometry, matrix_geometry
from .. import registry
from .abi import GemmGroupedArgs
from ..families.grouped import SchedulerMode
from .operation import PRECOMPUTE_THREADS, GemmOperationGrouped


def _list_of(name: str, values, count: int, allow_none: bool = False) -> list:
    if values is None and allow_none:
        return [None] * count
    if not isinstance(values, (list, tuple)):
        raise ArgumentError(f"{name} must be a list with one tensor per problem, got {type(values).__name__}")
    if len(values) != count:
        raise ArgumentError(f"{name} has {len(values)} tensor(s) but there are {count} problem(s)")
    return list(values)


def _memo_key(operation, problem_sizes, As, Bs, Cs, Ds, output_op, stream, device, session):
    """A signature of the call for the fast path (Device scheduling, non-empty problems, CUDA torch tensors)."""
    if device is not None or not isinstance(operation, GemmOperationGrouped) or \
            operation.precompute_mode is not SchedulerMode.Device or not isinstance(problem_sizes, (list, tuple)) \
            or not problem_sizes or not all(isinstance(x, (list, tuple)) for x in (As, Bs, Ds)) or \
            not (Cs is None or isinstance(Cs, (list, tuple))):
        return None
    try:
        sizes = tuple(tuple(p) for p in problem_sizes)
        count = len(sizes)
        if any(len(p) != 3 or 0 in p for p in sizes) or {len(As), len(Bs), len(Ds)} != {count} or \
                (Cs is not None and len(Cs) != count):
            return None
    except TypeError:  # malformed sizes: the full path says what is wrong
        return None
    return memo_key(operation.name, sizes, output_op, Cs is None, tensors=(*As, *Bs, *(Cs or ()), *Ds), stream=stream,
                    session=session)


class GemmGroupedArguments(OperationArguments):
    """``D_i = epilogue(alpha * A_i @ B_i + beta * C_i)`` for every problem ``i`` of ``problem_sizes``.

    ``As``, ``Bs``, ``Cs``, ``Ds``: one tensor per problem (torch, numpy, cupy, ``__cuda_array_interface__``
    or DLPack): 2-D with the operation's layouts (each may have its own leading dimension), or packed 1-D in the
    operation's layouts as PyCUTLASS's grouped testbed passes them (``np.zeros(M * N)``). A C of one value per column
    (RowMajor C; per row of a ColumnMajor one) is a bias broadcast over the rows, as in PyCUTLASS. ``Cs`` may be None (or hold
    None entries) when beta is 0. One alpha/beta (``output_op``) applies to the whole group.
    """

    operation_type = GemmOperationGrouped  # the operations these arguments take (each grouped kind names its own)

    def __new__(cls, operation=None, *args, **kwargs):
        if cls is GemmGroupedArguments:
            # Another grouped kind (kinds/gemm_grouped_sm90) subclasses these arguments for its operations.
            found = registry.arguments_class("GemmGroupedArguments", operation)
            if kwargs:
                check_keywords(found or cls, operation, kwargs)
            if found is not None:
                return object.__new__(found)  # Python then runs the subclass's __init__
        return super().__new__(cls)

    def __init__(self, operation, problem_sizes, As=None, Bs=None, Cs=None, Ds=None, output_op=None, stream=None,
                 device=None, session=None, *, A=None, B=None, C=None, D=None):
        if A is not None or B is not None or C is not None or D is not None:
            # PyCUTLASS's keywords (its grouped testbed: GemmGroupedArguments(op, problem_sizes=..., A=..., ...))
            As, Bs, Cs, Ds = (_alias(plural, plural_value, single, single_value) for plural, plural_value, single,
                              single_value in (("As", As, "A", A), ("Bs", Bs, "B", B), ("Cs", Cs, "C", C),
                                               ("Ds", Ds, "D", D)))
        memo_key = _memo_key(operation, problem_sizes, As, Bs, Cs, Ds, output_op, stream, device, session)
        if memo_key is not None and self._from_seen(memo_key, session, As, Bs, Cs, Ds):
            return
        self._validate_and_prepare(operation, problem_sizes, As, Bs, Cs, Ds, output_op, stream, device, session)
        if memo_key is not None:
            op = self.operation
            self._remember(memo_key, [x.alignment * x.element.bits // 8 for x in (op.A, op.B, op.C, op.C)],
                           ("problem_sizes", "output_op", "tile_count", "threadblock_count", "workspace",
                            "workspace_bytes"), extra=(self._blob, self._blob_offsets, self._footprint()))

    def _from_seen(self, memo_key, session, As, Bs, Cs, Ds) -> bool:
        """The fast path: the group was validated before; only the tensors' addresses are new."""
        seen = ArgumentsMemo.of(session).get(memo_key)
        if seen is None:
            return False
        if Cs is None:
            Cs = Ds
        else:
            Cs = [d if c is None else c for c, d in zip(Cs, Ds)]
        pointers = np.array([[t.data_ptr() for t in tensors] for tensors in (As, Bs, Cs, Ds)], dtype=np.uint64)
        vector_bytes = np.array(seen.vector_bytes, dtype=np.uint64)[:, None]
        if not pointers.all() or (pointers % vector_bytes).any():
            return False  # the full path says what is wrong
        blob, offsets, (reach, used, in_place) = seen.extra
        lows, highs = pointers.astype(np.int64) + reach[..., 0], pointers.astype(np.int64) + reach[..., 1]
        used = used.copy()
        used[2] &= ~(in_place & (pointers[2] == pointers[3]))  # C the very view of its D: updated in place
        written = np.zeros(used.shape, dtype=bool)
        written[3] = True
        if not ranges_apart(lows[used], highs[used], written[used]):
            return False  # an output may overlap another operand: the full path decides exactly
        blob = bytearray(blob)
        for label, row in zip("ABCD", pointers):
            offset = offsets[f"ptr_{label}"]
            blob[offset:offset + row.nbytes] = row.tobytes()
        self.__dict__.update(seen.attributes)
        self.device.make_current()
        self.tensors = DeviceTensors(self.device, self.stream)
        base = self.tensors.upload(bytes(blob))
        self.device_arrays = {field: base + offset for field, offset in offsets.items()}
        addresses = [self.device_arrays[f] for f in ("problem_sizes", "ptr_A", "ptr_B", "ptr_C", "ptr_D", "lda",
                                                     "ldb", "ldc", "ldd")]
        self._launch_from(seen, addresses, (As, Bs, Cs, Ds))
        return True

    def _validate_and_prepare(self, operation, problem_sizes, As, Bs, Cs, Ds, output_op, stream, device, session):
        if not isinstance(operation, GemmOperationGrouped):
            raise ArgumentError(f"GemmGroupedArguments needs a GemmOperationGrouped, got {type(operation).__name__}")
        super().__init__(operation, stream, device, session)
        if is_device_sizes(problem_sizes):
            raise ArgumentError(f"{operation.name}: group sizes in a tensor (device-side sizes: the MoE packed and "
                                f"masked layouts) need an SM90 grouped operation; this one builds the Sm80-family "
                                f"kernel, which reads a host list of GemmCoord(M, N, K) (an SM90 tile at compute "
                                f"capability 90, not an Sm80 instruction shape or warp arrangement, builds the SM90 "
                                f"kernel)")
        if not isinstance(problem_sizes, (list, tuple)):
            raise ArgumentError(f"problem_sizes must be a list of pycutlass.gemm.GemmCoord(M, N, K), "
                                f"got {type(problem_sizes).__name__}")
        problems = []
        for index, problem in enumerate(problem_sizes):
            try:
                problems.append(coerce_problem_size(problem))
            except ArgumentError as exc:
                raise ArgumentError(f"problem {index}: {exc}") from None
        self.problem_sizes = problems
        count = len(problems)
        As, Bs, Ds = (_list_of(name, values, count) for name, values in (("As", As), ("Bs", Bs), ("Ds", Ds)))
        Cs = _list_of("Cs", Cs, count, allow_none=True)
        self.output_op = coerce_output_op(operation, output_op)
        functor = operation.epilogue_functor
        self.tile_count = operation.tile_count(problems)

        self._operands: list[dict] = []
        alignment_checks = problem_alignment_checks(operation)
        for index, problem in enumerate(problems):
            m, n, k = problem
            try:
                check_problem_alignment(operation, m, n, k, alignment_checks)
            except ArgumentError as exc:
                raise ArgumentError(f"problem {index} {problem}: {exc}") from None
            if functor.kind == "FastLinearCombinationClamp" and k > 256:
                raise ArgumentError(f"problem {index}: FastLinearCombinationClamp is exact only for K <= 256, "
                                    f"got K={k}")
            if Cs[index] is None and self.output_op.beta != 0:
                raise ArgumentError(f"problem {index}: Cs[{index}] is None but beta is {self.output_op.beta}; "
                                    f"pass C or set beta to 0")
            operands = {}
            for label, tensor, rows, cols, desc in (("A", As[index], m, k, operation.A),
                                                    ("B", Bs[index], k, n, operation.B),
                                                    ("C", Cs[index], m, n, operation.C),
                                                    ("D", Ds[index], m, n, operation.C)):
                if tensor is None and label == "C":
                    continue
                operands[label] = self._describe_operand(index, label, tensor, rows, cols, desc)
            self._operands.append(operands)
        self._materialize()

    # --- validation (no GPU) --------------------------------------------------------------------------------
    def _describe_operand(self, index: int, label: str, tensor, rows: int, cols: int, desc):
        name = f"{label}s[{index}] (problem {index}, operand {label})"
        if tensor is None:
            raise ArgumentError(f"{name}: a tensor is required, got None")
        info = describe(tensor, name)
        if info.element is not storage_type(desc.element):
            raise ArgumentError(f"{name}: the operation expects {storage_type(desc.element).label} elements, got "
                                f"{info.element.label}")
        if len(info.shape) not in (1, 2):
            raise ArgumentError(f"{name}: expected a 2-D tensor of shape ({rows}, {cols}), got shape {info.shape} "
                                f"(or pass a packed 1-D one of {rows * cols} elements in the operation's "
                                f"{desc.layout.value} layout)")
        geometry = matrix_geometry(info, desc.layout, rows, cols, 1, allow_broadcast=label == "C")
        if label == "D":
            check_output_geometry(info, geometry, desc.layout, rows, cols, 1)
        if info.numel == 0:  # never accessed (M, N or K is 0): any aligned leading dimension will do
            return info, MatrixGeometry(-(-max(geometry.ld, 1) // desc.alignment) * desc.alignment, 0)
        if geometry.ld % desc.alignment and not geometry.broadcast:
            raise ArgumentError(f"{name}: leading dimension {geometry.ld} is not a multiple of the operation's "
                                f"{label if label != 'D' else 'C'} alignment {desc.alignment}")
        vector_bytes = desc.alignment * info.itemsize
        if info.kind == "device" and info.device_address % vector_bytes:
            raise ArgumentError(f"{name}: address {info.device_address:#x} is not aligned to the operation's "
                                f"{vector_bytes}-byte vector accesses (alignment {desc.alignment}); use an aligned "
                                f"tensor or an operation with a smaller alignment")
        return info, geometry

    # --- device state ---------------------------------------------------------------------------------------
    def _tensor_infos(self) -> list:
        return [info for operands in self._operands for info, _ in operands.values()]

    def _written(self) -> list:
        return [operands["D"][0] for operands in self._operands]

    def _read(self) -> list:
        # Not read: C with beta = 0 (the epilogue loads no source), A and B of K = 0 groups (a stand-in is read).
        skipped = {id(operands[label][0]) for (_, _, k), operands in zip(self.problem_sizes, self._operands)
                   for label in ("A", "B", "C") if label in operands and
                   (label == "C" and self.output_op.beta == 0 or label != "C" and k == 0)}
        return [info for info in self._tensor_infos() if id(info) not in skipped]

    def _in_place(self) -> list:
        return [(operands["D"][0], operands["C"][0]) for operands in self._operands if "C" in operands]

    def _footprint(self):
        """For the fast path: each operand's byte reach from its address (labels x groups x 2), which of them the
        kernel reads or writes, and which groups' C is the same view as their D (geometry; addresses per call)."""
        count = len(self._operands)
        reach, used = np.zeros((4, count, 2), dtype=np.int64), np.zeros((4, count), dtype=bool)
        in_place = np.zeros(count, dtype=bool)
        accessed = {id(info) for info in (*self._read(), *self._written())}
        for g, operands in enumerate(self._operands):
            for row, label in enumerate("ABCD"):
                info = operands.get(label, (None,))[0]
                if info is not None and info.kind == "device" and info.numel and id(info) in accessed:
                    used[row, g] = True
                    reach[row, g] = [edge - info.device_address for edge in byte_range(info)]
            if "C" in operands:
                in_place[g] = same_geometry(operands["D"][0], operands["C"][0])
        return reach, used, in_place

    def _allocate(self) -> None:
        count = len(self.problem_sizes)
        stand_in = self._empty_operand_stand_in()
        # K == 0 still runs the main loop with every load predicated off, but cp.async faults on an unmapped address
        # even with a zero source size (an empty tensor's pointer may be 0). A and B of such problems point at a
        # zeroed stand-in that covers every address the iterators form with ld = 0.
        sizes, pointers, lds = problem_arrays(self.problem_sizes, self._operands, self.tensors.address,
                                              lambda label, m, n: (stand_in, 0))
        self._blob, self._blob_offsets = pack_problem_arrays(sizes, pointers, lds)
        base = self.tensors.upload(self._blob) if count else 0
        self.device_arrays = {field: (base + offset if count else 0) for field, offset in self._blob_offsets.items()}
        self.workspace = 0
        self.workspace_bytes = 0
        self.threadblock_count = 0

    def _empty_operand_stand_in(self) -> int:
        """A zeroed device buffer for the A and B of K == 0 problems (0 when there are none).

        With ld = 0 an iterator's addresses stay within the contiguous extent of one operand (at most the problem's
        M or N rounded up to a tile) plus the K-steps the pipelined main loop advances (a few threadblock K tiles).
        """
        needed = [max(m, n) for m, n, k in self.problem_sizes if k == 0 and m and n]
        if not needed:
            return 0
        tile_m, tile_n, tile_k = self.operation.tile_description.threadblock_shape
        stages = self.operation.tile_description.stages
        elements = max(needed) + max(tile_m, tile_n) + 2 * (stages + 1) * tile_k
        return self.tensors.zeros(elements * 8)  # enough for any element type

    def bind(self, loaded_op) -> GemmGroupedArgs:
        """Size the persistent grid from the occupancy (and, in Host mode, the schedule's workspace)."""
        op = self.operation
        smem = loaded_op.global_int(op.shared_storage_symbol, self.stream)
        occupancy = loaded_op.occupancy(op.thread_count, smem)
        if occupancy <= 0:
            raise CudaError(f"{op.name}: the kernel ({smem} bytes of shared memory, {op.thread_count} threads) "
                            f"cannot be resident on an SM", operation=op.name)
        self.threadblock_count = op.grid_for(self.device.sm_count, occupancy, self.problem_sizes) \
            if self.problem_sizes else 0
        if self.threadblock_count and op.precompute_symbol:
            self.workspace_bytes = op.workspace_bytes(self.problem_sizes, self.threadblock_count)
            self.workspace = self.tensors.allocate(self.workspace_bytes)
        a = GemmGroupedArgs()
        a.problem_count = len(self.problem_sizes)
        a.threadblock_count = self.threadblock_count
        a.tile_count = self.tile_count
        fill_group_arrays(a, self)
        fill_epilogue(a, self.output_op)
        return a

    def _prepare(self):
        if self._prepared is None and self.tile_count == 0:
            self._prepared = _nothing_to_launch(self.operation)  # no output tile in the whole group
        return super()._prepare()

    prepared = _prepare

    def after_build(self, loaded_op, launch, abi_struct) -> None:
        if self.operation.precompute_symbol and self.threadblock_count:
            self._write_schedule(loaded_op, abi_struct)

    def _write_schedule(self, loaded_op, abi_struct) -> None:
        """Run <name>_precompute once; the schedule depends only on the sizes and the grid, fixed per arguments."""
        op = self.operation
        function = loaded_op.function(op.precompute_symbol)
        info = LaunchInfo()
        info_device = self.tensors.zeros(ctypes.sizeof(LaunchInfo))
        info_ptr = ctypes.c_uint64(info_device)
        args = driver.pointer_array(ctypes.addressof(abi_struct), ctypes.addressof(info_ptr))
        driver.launch(function, (1, 1, 1), (PRECOMPUTE_THREADS, 1, 1), 0, self.stream, ctypes.addressof(args),
                      op.name + " precompute")
        driver.memcpy_dtoh(ctypes.addressof(info), info_device, ctypes.sizeof(info), self.stream)
        driver.synchronize_stream(self.stream, op.name + " precompute")
        if info.status != 0:
            raise ArgumentError(f"{op.name}: the Host schedule could not be written (cutlass::Status {info.status}): "
                                f"{self.tile_count} tiles, {self.threadblock_count} blocks, workspace "
                                f"{self.workspace_bytes} bytes")


def _nothing_to_launch(op) -> PreparedLaunch:
    return PreparedLaunch(None, (0, 1, 1), (op.thread_count, 1, 1), 0, (ctypes.c_byte * 1)(), 0, op.name)
