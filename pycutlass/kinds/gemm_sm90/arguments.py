"""GemmArguments for SM90 operations: the same surface as the Sm80 GEMM's, plus the tile scheduler's runtime knobs
and a bias vector. ``GemmArguments(op, ...)`` hands out this class when ``op`` is an SM90 operation."""
from __future__ import annotations

import ctypes

from ...errors import ArgumentError
from ...emit.abi import fill_epilogue
from ...runtime.launch import PreparedLaunch, loaded, prepare
from ...runtime.tensors import describe
from ..gemm.arguments import GemmArguments
from ..families.arguments import UNSET
from ..families.modes import Mode
from ..families.sm90_arguments import check_sm_count, persistent_sm_count  # noqa: F401
from ...description.types import DataType
from .abi import Sm90GemmArgs
from .operation import BLOCK_SCALE, GemmOperationSm90

RASTER_ORDERS = {None: 0, "heuristic": 0, "along_m": 1, "along_n": 2}
DECOMPOSITIONS = {None: 0, "heuristic": 0, "data_parallel": 1, "split_k": 2, "stream_k": 3}


class GemmArgumentsSm90(GemmArguments):
    """``GemmArguments(op, problem_size, A, B, C, D, output_op=None, gemm_mode=Mode.Gemm, split_k_slices=1, batch=1,
    stream=None, device=None, session=None, *, bias=None, raster_order=None, swizzle=None, decomposition=None,
    sm_count=None, pdl=False)`` for an SM90 operation.

    - ``bias``: the vector of an operation built with ``bias="row"`` (M values) or ``"column"`` (N values); one per
      batch in Batched mode if it holds ``batch`` vectors.
    - ``raster_order`` ("heuristic", "along_m", "along_n"), ``swizzle`` (1, 2, 4, 8; default from the operation's
      IdentitySwizzleN), ``sm_count`` (SMs the persistent grid may use, a multiple of the cluster size; default
      all, rounded down to whole clusters): no recompile.
    - ``pdl=True``: launch with programmatic dependent launch (``cuLaunchKernelEx`` with programmatic stream
      serialization). The kernel's blocks may start, set up shared memory and prefetch their TMA descriptors while
      the stream's previous kernel drains; they wait for it (griddepcontrol.wait) before touching global memory.
      Pays in back-to-back chains (layers of a model); no recompile. Not for ``array=True`` operations (CUTLASS's
      pointer-array kernels do not wait) or stream-K ones (CUTLASS 4.2's stream-K scheduler does not compile
      with grid dependency control).
    - Mode.Gemm with ``split_k_slices`` > 1 needs a stream-K operation (``TileSchedulerType.StreamK``): the K
      dimension is split that many ways; ``decomposition`` ("heuristic", "data_parallel", "split_k", "stream_k").
    - Mode.Batched runs the L mode; so does Mode.Array with tensors holding the batch (PyCUTLASS's form: the
      arguments then say Mode.Batched). Lists of matrices need an operation built with ``array=True`` (the
      pointer-array kernel, kinds/gemm_array_sm90).
    - Mode.GemmSplitKParallel (PyCUTLASS's parallel split-K, then a ReductionOperation over ``ptr_D``): runs the L
      mode over ``split_k_slices`` equal K slices (K must divide evenly, each slice 16-byte aligned), one partial
      product per slice into a workspace of C's element; on an operation with the Default tile scheduler.
    - ``scale_a``, ``scale_b``: the float32 scales of an operation built with ``scales="blockwise"`` (Mode.Gemm):
      scale_a of shape (M, ceil(K / 128)) with M contiguous, one per row and K block of A, its K blocks ``ld``
      apart (strides (1, ld)), ld a multiple of 4 and at least M (``s.t().contiguous().t()`` of a row-major one).
      TMA moves its columns in 16-byte units, so for M not a multiple of 4 its rows are padded: shape (M4,
      ceil(K / 128)) with M4 = M rounded up to 4 (DeepGEMM's TMA-aligned ``torch.empty(kb, M4).t()``; the padding
      rows are read and ignored). scale_b of shape (ceil(N / 128), ceil(K / 128)), row-major, one per 128 x 128
      block of B.
    """

    _runs_before_launch = False  # stream-K Arguments turn it on once their workspace exists

    def __init__(self, operation, problem_size, A, B, C, D, *positional, bias=None, raster_order=None, swizzle=None,
                 decomposition=None, sm_count=None, pdl=False, scale_a=None, scale_b=None, **keywords):
        self._knobs = _check_knobs(operation, raster_order, swizzle, decomposition, sm_count)
        given = (scale_a is not None, scale_b is not None)
        if any(given) and not operation.scales:  # (_check_knobs refused anything but an SM90 operation)
            raise ArgumentError(f"{operation.name} was built without block-wise scales; build it with "
                                f"scales='blockwise' (fp8) to pass scale_a= and scale_b=")
        if operation.scales and not all(given):
            raise ArgumentError(f"{operation.name} scales A and B block-wise; pass scale_a= (M x ceil(K/128) float32) "
                                f"and scale_b= (ceil(N/128) x ceil(K/128) float32)")
        self._scale_tensors = (scale_a, scale_b) if all(given) else None
        if pdl is True and operation.scales:
            raise ArgumentError(f"{operation.name}: pdl=True is not tested with the blockwise main loop's scale loads; "
                                f"launch block-scaled operations without it")
        self._pdl = _check_pdl(operation, pdl)
        self._stream_k = operation.tile_scheduler.name == "StreamK"
        self._bias_vector = None
        if bias is True:
            raise ArgumentError("bias=True (C as a broadcast vector, PyCUTLASS's bias) is not built for SM90 "
                                "operations; build the operation with bias='row' or 'column' and pass the vector "
                                "as bias=")
        if bias is None or bias is False:
            if operation.bias is not None:
                raise ArgumentError(f"{operation.name} adds a bias vector ({operation.bias}); pass it as bias=")
        else:
            if operation.bias is None:
                raise ArgumentError(f"{operation.name} was built without a bias; build it with bias='row' or "
                                    f"'column' to pass bias=")
            self._bias_vector = bias
            bias = None  # the vector is ours; GemmArguments' bias= is PyCUTLASS's flag
        super().__init__(operation, problem_size, A, B, C, D, *positional, bias=bias, **keywords)

    # The fast path for seen problems: not with a bias vector or stream-K (its workspace belongs to one Arguments).
    def _from_memo(self, memo_key, session, addresses, keep_alive) -> bool:
        if self._bias_vector is not None or self._stream_k or self._scale_tensors is not None:
            return False
        found = super()._from_memo((memo_key, self._knobs), session, addresses, keep_alive)
        if found and self._pdl:
            self._prepared.use_programmatic_dependent_launch()
        return found

    def _remember(self, memo_key, vector_bytes, attribute_names, extra=None, operands=()) -> None:
        if self._bias_vector is not None or self._stream_k or self._scale_tensors is not None:
            return
        super()._remember((memo_key, self._knobs), vector_bytes, (*attribute_names, "_knobs", "_bias_vector",
                                                                  "workspace", "workspace_bytes"), extra, operands)

    def _validate_and_prepare(self, operation, problem_size, A, B, C, D, output_op, gemm_mode, split_k_slices, batch,
                              stream, device, session, bias=None, reordered=False):
        if not isinstance(operation, GemmOperationSm90):
            raise ArgumentError(f"GemmArgumentsSm90 needs an SM90 GemmOperationUniversal, got {type(operation).__name__}")
        mode = gemm_mode if isinstance(gemm_mode, Mode) else None
        if mode is Mode.GemmSplitKParallel:
            self._check_parallel_split_k(operation, problem_size, split_k_slices)
        if mode is Mode.Array and not operation.array:
            lists = [label for label, x in zip("ABCD", (A, B, C, D)) if isinstance(x, (list, tuple))]
            if lists:
                raise ArgumentError(f"Mode.Array with lists of matrices ({', '.join(lists)}) needs CUTLASS's "
                                    f"pointer-array kernel, which {operation.name} is not: build the operation with "
                                    f"GemmOperationUniversal(90, ..., array=True) (f16/bf16 operands), or pass "
                                    f"tensors holding the batch (they run batched on this operation)")
            # PyCUTLASS's Array form with tensors (its pointer arrays were base + i * batch stride) is the L mode.
            gemm_mode = Mode.Batched
        if split_k_slices not in (1, UNSET) and operation.tile_scheduler.name != "StreamK" and \
                mode is not Mode.GemmSplitKParallel:
            raise ArgumentError(f"split_k_slices={split_k_slices} needs an SM90 operation with the stream-K tile "
                                f"scheduler (TileDescription(..., tile_scheduler=TileSchedulerType.StreamK))")
        self.workspace, self.workspace_bytes = 0, 0
        splits = 1 if split_k_slices is UNSET else split_k_slices
        if splits != 1 and self._knobs[2] in (1, 3):
            raise ArgumentError(f"split_k_slices={splits} splits K only in the 'split_k' or 'heuristic' "
                                f"decomposition (CUTLASS's stream-K scheduler), not in "
                                f"{[k for k, v in DECOMPOSITIONS.items() if v == self._knobs[2]][0]!r}")
        check_sm_count(operation, self._knobs[3])
        super()._validate_and_prepare(operation, problem_size, A, B, C, D, output_op, gemm_mode, split_k_slices,
                                      batch, stream, device, session, bias, reordered)

    def _check_parallel_split_k(self, operation, problem_size, split_k_slices) -> None:
        """Parallel split-K runs the L mode: slice i multiplies the i-th K/split_k_slices columns of A by the same
        rows of B into slice i of the workspace (TMA needs every slice to start 16-byte aligned)."""
        if operation.array:
            raise ArgumentError("GemmSplitKParallel is not built for the pointer-array kernel (array=True); use an "
                                "ordinary SM90 operation")
        if self._stream_k:
            raise ArgumentError("GemmSplitKParallel needs an SM90 operation with the Default tile scheduler (a "
                                "stream-K operation splits K itself: use Mode.Gemm with split_k_slices)")
        if operation.bias is not None:
            raise ArgumentError("GemmSplitKParallel writes raw partial sums: build the operation without bias= and "
                                "add the bias after the ReductionOperation")
        slices = 1 if split_k_slices is UNSET else split_k_slices
        try:
            k = int(problem_size[2]) if not hasattr(problem_size, "k") else int(problem_size.k())
        except (TypeError, IndexError, ValueError):
            return  # GemmArguments' own problem-size check says what is wrong
        if isinstance(slices, bool) or not isinstance(slices, int) or slices < 1:
            return  # likewise for split_k_slices
        if k % slices:
            raise ArgumentError(f"GemmSplitKParallel on an SM90 operation splits K={k} into {slices} equal slices "
                                f"(the L mode): K must be a multiple of split_k_slices")
        chunk = k // slices
        for label, desc in (("A", operation.A), ("B", operation.B)):
            k_contiguous = desc.layout.name == ("RowMajor" if label == "A" else "ColumnMajor")
            if k_contiguous and chunk * desc.element.bits % 128:
                raise ArgumentError(f"GemmSplitKParallel: each K slice of {label} ({chunk} {desc.element.label} "
                                    f"values) must start 16-byte aligned for TMA; choose split_k_slices so that "
                                    f"K / split_k_slices is a multiple of {128 // desc.element.bits}")

    def _describe_operand(self, label, tensor, rows, cols, layout, element, batch):
        found = super()._describe_operand(label, tensor, rows, cols, layout, element, batch)
        geometry = found[2]
        if label == "C" and geometry.broadcast:
            raise ArgumentError(f"{found[1].name}: C broadcast from a vector (PyCUTLASS's bias) is not built for SM90 "
                                f"operations (TMA reads whole matrices); build the operation with bias='row' or "
                                f"'column' and pass the vector as bias=")
        if geometry.batch_stride < 0:  # a reversed batch view (cupy, numpy): TMA strides are unsigned
            raise ArgumentError(f"{found[1].name}: batch stride {geometry.batch_stride} is negative; TMA addresses "
                                f"memory with positive strides only: pass the batches in increasing order")
        m, n, k = self.problem_size
        if label == "A" and k == 0:
            raise ArgumentError(f"{self.operation.name}: K must be at least 1 (TMA descriptors need nonzero extents)")
        return found

    def _tensor_infos(self) -> list:
        infos = super()._tensor_infos()
        if self._bias_vector is not None:
            self._bias_info = self._check_bias(describe(self._bias_vector, "bias"))
            infos.append(self._bias_info)
        if self._scale_tensors is not None:
            self._scale_infos = self._check_scales(*self._scale_tensors)
            infos += list(self._scale_infos)
        return infos

    def _check_scales(self, scale_a, scale_b) -> tuple:
        """Block-wise scales: shapes, element type and strides exactly as the builder's CuTe layouts address them."""
        m, n, k = self.problem_size
        if self.gemm_mode is not Mode.Gemm or self.batch != 1:
            raise ArgumentError(f"{self.operation.name}: block-wise scales are built for Mode.Gemm with one batch, got "
                                f"{self.gemm_mode.name} with batch {self.batch}")
        _, block_n, block_k = BLOCK_SCALE
        k_blocks = -(-k // block_k)
        found = []
        rows = -(-m // 4) * 4  # TMA moves scale_a's columns in 16-byte units: its rows padded to a multiple of 4
        for label, value, shapes in (("scale_a", scale_a, {(m, k_blocks), (rows, k_blocks)}),
                                     ("scale_b", scale_b, {(-(-n // block_n), k_blocks)})):
            info = describe(value, label)
            if info.element is not DataType.float32:
                raise ArgumentError(f"{label}: block-wise scales are float32, got {info.element.label}")
            if tuple(info.shape) not in shapes:
                raise ArgumentError(f"{label}: expected a float32 tensor of shape {' or '.join(map(str, sorted(shapes)))}"
                                    f", got shape {info.shape}")
            found.append(info)
        scale_a_info, scale_b_info = found
        if scale_a_info.shape[0] != rows:
            raise ArgumentError(
                f"scale_a: with M = {m} (not a multiple of 4) pass scale_a with its rows padded to {rows} (shape "
                f"({rows}, {k_blocks}), M contiguous, e.g. torch.empty({k_blocks}, {rows}).t(); the padding rows are "
                f"read and ignored): TMA moves its columns in 16-byte units")
        # M contiguous, K blocks ld apart (one K block: no step along K, so the compact ld)
        unit, ld = scale_a_info.strides
        ld = ld if k_blocks > 1 else rows
        if not (rows == 1 or unit == 1) or ld < rows or ld % 4:
            raise ArgumentError(f"scale_a: expected M contiguous with its K blocks ld apart, ld >= {rows} and a "
                                f"multiple of 4 (TMA moves 16-byte rows), i.e. strides (1, ld); got strides "
                                f"{scale_a_info.strides}")
        if not all(extent == 1 or stride == want for extent, stride, want in
                   zip(scale_b_info.shape, scale_b_info.strides, (k_blocks, 1))):
            raise ArgumentError(f"scale_b: expected a row-major float32 tensor of shape {scale_b_info.shape}; got "
                                f"strides {scale_b_info.strides}")
        self._scale_a_ld = ld
        return scale_a_info, scale_b_info

    def _check_bias(self, info):
        op = self.operation
        m, n, _ = self.problem_size
        length = m if op.bias == "row" else n
        batches = self.batch if self.gemm_mode is Mode.Batched else 1
        if info.element is not op.C.element:
            raise ArgumentError(f"bias: the operation adds a {op.C.element.label} vector, got {info.element.label}")
        if info.numel not in (length, batches * length) or (info.numel > 1 and not info.is_contiguous):
            raise ArgumentError(f"bias: a bias='{op.bias}' operation adds {length} values (one per "
                                f"{'row' if op.bias == 'row' else 'column'} of D{', or one vector per batch' if batches > 1 else ''}) "
                                f"from a contiguous tensor; got shape {info.shape}, strides {info.strides}")
        self._bias_batch_stride = length if info.numel == batches * length and batches > 1 else 0
        return info

    def _allocate(self) -> None:
        super()._allocate()
        self.ptr_bias = 0
        if self._bias_vector is not None:
            self.ptr_bias = self.tensors.address(self._bias_info)
            self._check_address(self._bias_info, self.ptr_bias, 128 // self.operation.C.element.bits)
        self.ptr_scales = (0, 0)
        if self._scale_tensors is not None:
            self.ptr_scales = tuple(self.tensors.address(info) for info in self._scale_infos)
            self._check_address(self._scale_infos[0], self.ptr_scales[0], 4)  # TMA: 16 bytes
            self._check_address(self._scale_infos[1], self.ptr_scales[1], 1)

    def bind(self, loaded_op=None) -> Sm90GemmArgs:
        m, n, k = self.problem_size
        a = self.operation.abi_struct_type()
        a.m, a.n, a.k = m, n, k
        a.l = self.batch if self.gemm_mode is Mode.Batched else 1
        a.mode = int(self.gemm_mode)
        raster, swizzle, decomposition, sm_count = self._knobs
        a.sm_count = persistent_sm_count(self.operation, sm_count, self.device)
        a.raster_order, a.swizzle, a.decomposition = raster, swizzle or self.operation.default_swizzle, decomposition
        a.splits = self.split_k_slices
        a.max_active_clusters = 0
        # Without C (beta == 0) C's descriptor covers D: never read, and the Params equal the fast path's.
        a.ptr_A, a.ptr_B, a.ptr_C, a.ptr_D = (self.addresses[x] for x in "ABCD")
        a.ptr_bias = self.ptr_bias
        a.workspace = self.workspace
        a.lda, a.ldb, a.ldc, a.ldd = (self.lds[x] for x in "ABCD")
        a.batch_stride_A, a.batch_stride_B, a.batch_stride_C, a.batch_stride_D = (self.batch_strides[x] for x in "ABCD")
        a.batch_stride_bias = getattr(self, "_bias_batch_stride", 0)
        if self._scale_tensors is not None:
            a.ptr_scale_a, a.ptr_scale_b = self.ptr_scales
            a.scale_a_ld = self._scale_a_ld
        if self.gemm_mode is Mode.GemmSplitKParallel:  # the L mode over K slices, into the workspace's slices
            chunk = k // self.split_k_slices
            a.k, a.l, a.splits = chunk, self.split_k_slices, 1
            a.batch_stride_A = chunk if self.operation.A.layout.name == "RowMajor" else chunk * a.lda
            a.batch_stride_B = chunk if self.operation.B.layout.name == "ColumnMajor" else chunk * a.ldb
        fill_epilogue(a, self.output_op)
        return a

    def _prepare(self) -> PreparedLaunch:
        if self._prepared is not None:  # every run() comes here: keep it one test
            return self._prepared
        m, n, _ = self.problem_size
        if m == 0 or n == 0:  # nothing to write; TMA descriptors cannot describe empty tensors
            self._prepared = PreparedLaunch(None, (0, 0, 0), (1, 1, 1), 0, (ctypes.c_byte * 8)(), 0,
                                            self.operation.name)
            return self._prepared
        loaded_op = loaded(self.operation, self.device, self.session)
        abi_struct = self.bind(loaded_op)
        launch = prepare(loaded_op, abi_struct, self.stream)
        if launch.workspace_bytes > self.workspace_bytes:
            # The tile scheduler's workspace (stream-K partial tiles and barriers), sized by the builder.
            self.workspace_bytes = launch.workspace_bytes
            self.workspace = abi_struct.workspace = self.tensors.zeros(launch.workspace_bytes)
            launch = prepare(loaded_op, abi_struct, self.stream)
        if self._pdl:
            launch.use_programmatic_dependent_launch()
        self._prepared = launch
        self._loaded_op, self._abi_struct = loaded_op, abi_struct
        # only stream-K builders report bytes to zero; run() skips before_launch otherwise
        self._runs_before_launch = bool(launch.workspace_zero_bytes)
        return self._prepared

    prepared = _prepare

    def before_launch(self) -> None:
        launch = self._prepared
        if launch is not None and launch.workspace_zero_bytes:
            # Stream-K's barriers (the workspace's tail) count arrivals: they must start at zero on every launch.
            # Its reduction tiles before them are written before they are read, so they are left alone.
            from ...runtime import driver

            zeroed = launch.workspace_zero_bytes
            driver.memset_d8(self.workspace + launch.workspace_bytes - zeroed, 0, zeroed, self.stream)


_NO_KNOBS = (0, 0, 0, 0)


def _check_pdl(operation, pdl) -> bool:
    if pdl is False:
        return False
    if pdl is not True:
        raise ArgumentError(f"pdl must be True or False, got {pdl!r}")
    refusal = operation.pdl_refusal
    if refusal:
        raise ArgumentError(f"pdl=True needs a kernel that waits on the previous grid before its first global "
                            f"access; {operation.name} does not: {refusal}")
    return True


def _check_knobs(operation, raster_order, swizzle, decomposition, sm_count) -> tuple:
    if raster_order is None and swizzle is None and decomposition is None and sm_count is None and \
            isinstance(operation, GemmOperationSm90):
        return _NO_KNOBS  # the common call: nothing to check
    if not isinstance(operation, GemmOperationSm90):
        raise ArgumentError(f"GemmArgumentsSm90 needs an SM90 GemmOperationUniversal, got {type(operation).__name__}")
    if raster_order not in RASTER_ORDERS:
        raise ArgumentError(f"raster_order must be one of {list(RASTER_ORDERS)}, got {raster_order!r}")
    if swizzle not in (None, 1, 2, 4, 8):
        raise ArgumentError(f"swizzle must be 1, 2, 4 or 8, got {swizzle!r}")
    if decomposition not in DECOMPOSITIONS:
        raise ArgumentError(f"decomposition must be one of {list(DECOMPOSITIONS)}, got {decomposition!r}")
    if decomposition not in (None, "heuristic") and operation.tile_scheduler.name != "StreamK":
        raise ArgumentError(f"decomposition={decomposition!r} needs a stream-K operation")
    if sm_count is not None and (isinstance(sm_count, bool) or not isinstance(sm_count, int) or sm_count < 1):
        raise ArgumentError(f"sm_count must be a positive integer, got {sm_count!r}")
    return (RASTER_ORDERS[raster_order], swizzle or 0, DECOMPOSITIONS[decomposition], sm_count or 0)
