"""PyCUTLASS 2.11's GEMM testbed: ``GemmUniversalLauncher`` runs one problem and checks it, ``test_all_gemm`` sweeps
PyCUTLASS's problem sizes, modes and split-K slice counts for an operation.

Each run draws small-integer operands from the seed (PyCUTLASS's scheme: exact in every type and every sum), NaN-
poisons D, runs the operation (parallel split-K: the GEMM's partials, then a ReductionOperation), and compares D with
a float64 reference of the whole epilogue, activation included (PyCUTLASS's host reference left activations out).
Cases the operation's arguments refuse (an ``ArgumentError``: e.g. parallel split-K with an activation, or a size
TMA cannot describe) are skipped and counted in ``launcher.skipped``, not failed.
"""
from __future__ import annotations

import numpy as np

from ...description.coords import GemmCoord
from ...description.types import LayoutType, OpClass
from ...errors import ArgumentError
from ...kinds.gemm.modes import Mode
from . import _common


def _pack(matrix: np.ndarray, layout: LayoutType) -> np.ndarray:
    """A logical (rows, cols) matrix as the packed 1-D element order of ``layout``."""
    rows, cols = matrix.shape
    if layout is LayoutType.RowMajor:
        return np.ascontiguousarray(matrix).ravel()
    if layout is LayoutType.ColumnMajor:
        return np.ascontiguousarray(matrix.T).ravel()
    if layout is LayoutType.ColumnMajorInterleaved32:
        return np.ascontiguousarray(matrix.reshape(rows, cols // 32, 32).transpose(1, 0, 2)).ravel()
    if layout is LayoutType.RowMajorInterleaved32:
        return np.ascontiguousarray(matrix.T.reshape(cols, rows // 32, 32).transpose(1, 0, 2)).ravel()
    raise ArgumentError(f"the GEMM testbed does not lay out {layout.value} matrices")


def _unpack(flat: np.ndarray, layout: LayoutType, rows: int, cols: int) -> np.ndarray:
    if layout is LayoutType.RowMajor:
        return flat.reshape(rows, cols)
    if layout is LayoutType.ColumnMajor:
        return flat.reshape(cols, rows).T
    if layout is LayoutType.ColumnMajorInterleaved32:
        return flat.reshape(cols // 32, rows, 32).transpose(1, 0, 2).reshape(rows, cols)
    raise ArgumentError(f"the GEMM testbed does not read {layout.value} outputs")


class GemmUniversalLauncher(_common.Launcher):
    """Runs ``operation`` on one problem at a time and checks it (``run`` returns True or False; with
    ``profiling=True`` the average milliseconds per run instead). ``activation_args``: for activations that take
    arguments (leaky_relu), which PyCUTLASS's testbed could not pass."""

    def __init__(self, operation, seed: int = _common.SEED, interleaved: bool = False, verification: bool = True,
                 profiling: bool = False, warmup_iterations: int = 500, iterations: int = 500,
                 activation_args=(), **kwargs) -> None:
        super().__init__(operation, seed, verification, profiling, warmup_iterations, iterations, activation_args,
                         kwargs)
        self.interleaved = bool(interleaved)
        self.math_operation = operation.tile_description.math_instruction.math_operation

    def _operands(self, m: int, n: int, k: int):
        rng = np.random.default_rng(self.seed)
        op = self.operation
        a = _common.uniform_integers(rng, (m, k), op.A.element, self.bounds)
        b = _common.uniform_integers(rng, (k, n), op.B.element, self.bounds)
        c = _common.uniform_integers(rng, (m, n), op.C.element, self.bounds)
        return a, b, c

    def host_reference(self, problem_size, tensor_A, tensor_B, tensor_C, alpha, beta):
        """The float64 reference of D (logical M x N) from logical operands."""
        accumulator = np.asarray(tensor_A, np.float64) @ np.asarray(tensor_B, np.float64)
        return _common.epilogue_reference(self.functor, self.operation.C.element, accumulator,
                                          np.asarray(tensor_C, np.float64), alpha, beta, self.activation_args)

    def run(self, mode, problem_size, batch_count: int = 1, alpha: float = 1.0, beta: float = 0.0):
        from ...kinds.gemm.arguments import GemmArguments

        op = self.operation
        m, n, k = problem_size.m(), problem_size.n(), problem_size.k()
        a, b, c = self._operands(m, n, k)
        tensor_C = _pack(c, op.C.layout)
        tensor_D = _common.poisoned(m * n, op.C.element)
        parallel = mode is Mode.GemmSplitKParallel

        def build():
            arguments = GemmArguments(op, problem_size, _pack(a, op.A.layout), _pack(b, op.B.layout), tensor_C,
                                      tensor_D, output_op=op.epilogue_type(alpha, beta, *self.activation_args),
                                      gemm_mode=mode, split_k_slices=batch_count)
            return arguments, (self.reduction_arguments(arguments, [m, n], batch_count, tensor_D, tensor_C, alpha,
                                                        beta) if parallel else None)

        return self.execute(
            f"{mode.name} {m}x{n}x{k} split_k_slices={batch_count} alpha={alpha} beta={beta}", build,
            lambda: self.host_reference(problem_size, a, b, c, alpha, beta),
            lambda: _unpack(tensor_D, op.C.layout, m, n), batch_count if mode is Mode.Gemm else 1,
            lambda detail: print(f"problem: {m}, {n}, {k}\n batch_count: {batch_count}\n mode: {mode.name}\n "
                                 f"{detail}"))


def _effective_stages(tile_description) -> int:
    return tile_description.stages or 4  # SM90's automatic stage count (stages=0): size K as for four stages


def test_all_gemm(operation, testcase: str = "universal", compilation_mode: str = "nvcc", **launcher_kwargs) -> bool:
    """PyCUTLASS 2.11's sweep: "universal" (Gemm and parallel split-K, M and N near the alignment and near 512, K
    from one access to three pipelines' worth, 1-7 slices, alpha 1, beta 2), "multistage" or "interleaved". Returns
    False at the first wrong result. ``compilation_mode``: "nvcc" or "nvrtc", the session's backend for this call."""
    from ... import compiler

    if testcase not in ("universal", "multistage", "interleaved"):
        raise ArgumentError(f"testcase must be 'universal', 'multistage' or 'interleaved', got {testcase!r}")
    if compilation_mode not in ("nvcc", "nvrtc"):
        raise ArgumentError(f"compilation_mode must be 'nvcc' or 'nvrtc', got {compilation_mode!r}")
    previous = compiler.backend()
    getattr(compiler, compilation_mode)()
    try:
        if testcase == "interleaved" and not operation.A.layout.is_interleaved:
            raise ArgumentError("testcase='interleaved' needs an operation with interleaved-32 layouts")
        launcher = GemmUniversalLauncher(operation, interleaved=testcase == "interleaved", **launcher_kwargs)
        return sweep(launcher, testcase)
    finally:
        compiler.use(previous)


def sweep(launcher: GemmUniversalLauncher, testcase: str = "universal") -> bool:
    """``test_all_gemm``'s cases on a launcher of one's own (whose ``skipped`` then tells what was refused)."""
    operation = launcher.operation
    tile = operation.tile_description
    math = tile.math_instruction
    smallest = min(operation.A.element.bits, operation.B.element.bits)
    alignment = 1 if math.opcode_class is OpClass.Simt else 128 // smallest
    # PyCUTLASS's sizes, kept multiples of every operand's access width (a wider C would refuse them all)
    alignment = max(alignment, operation.A.alignment, operation.B.alignment, operation.C.alignment)
    simt_int8 = math.opcode_class is OpClass.Simt and operation.A.element.bits == 8
    alignment_m = 4 if simt_int8 and operation.A.layout is LayoutType.ColumnMajor else alignment
    alignment_n = 4 if simt_int8 and operation.A.layout is LayoutType.RowMajor else alignment
    alignment_k = 4 if simt_int8 and (operation.A.layout is LayoutType.RowMajor or
                                      operation.B.layout is LayoutType.ColumnMajor) else alignment
    tile_k, stages = tile.threadblock_shape[2], _effective_stages(tile)
    if testcase == "interleaved":
        modes, ms, ns = [Mode.Gemm], [32, 512 + 32], [32, 512 + 32]
        ks, slices, alphas, betas = [32, tile_k * stages + 32], [1], [1.0], [0.0]
    elif testcase == "multistage":
        modes, ms, ns = [Mode.Gemm], [16, 528], [16, 528]
        ks, slices, alphas, betas = [tile_k, tile_k * stages + math.instruction_shape[2]], [1], [1.0], [0.0]
    else:
        modes = [Mode.Gemm, Mode.GemmSplitKParallel]
        ms, ns = [alignment_m, 512 - 3 * alignment_m], [alignment_n, 512 - 2 * alignment_n]
        ks = [alignment_k, tile_k * stages - alignment_k, tile_k * stages * 3 - alignment_k]
        slices, alphas, betas = [1, 2, 3, 5, 7], [1.0], [2.0]
    skipped_before, attempts = len(launcher.skipped), 0
    for mode in modes:
        for m in ms:
            for n in ns:
                for k in ks:
                    for count in slices:
                        if testcase == "universal" and k // count < 2 * tile_k:
                            continue  # PyCUTLASS skips K too small for its slices
                        for alpha in alphas:
                            for beta in betas:
                                attempts += 1
                                if not launcher.run(mode, GemmCoord(m, n, k), count, alpha, beta):
                                    return False
    return _common.sweep_verdict(launcher, "test_all_gemm", attempts, skipped_before, True)


test_all_gemm.__test__ = False  # a library function: pytest must not collect it from ``from pycutlass.test import *``
