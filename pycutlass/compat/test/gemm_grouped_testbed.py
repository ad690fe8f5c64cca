"""PyCUTLASS 2.11's grouped GEMM testbed: ``TestbedGrouped(operation).run(problem_count)`` draws that many problems
of random sizes from the seed, runs them as one group and checks every problem's D.

As in the GEMM testbed (``gemm_testbed``): small-integer operands, NaN-poisoned outputs, float64 references of the
whole epilogue (activations included), refused groups skipped into ``skipped``. Each problem is checked on its own,
so a wrong small problem cannot hide behind a large one. Sizes are multiples of every operand's access width (for
SM90 grouped kernels, of 16 bytes, which TMA needs for every stride); about one in eight problems is degenerate (M, N
or K = 0; both grouped kinds take them), the rest span one access to a few hundred rows and columns and up to three
pipelines' worth of K. Operations built with ``bias=`` (pycutlass's SM90 extension) are not what PyCUTLASS tested
and are refused at construction.
"""
from __future__ import annotations

import numpy as np

from ...description.coords import GemmCoord
from ...errors import ArgumentError
from . import _common
from .gemm_testbed import _effective_stages, _pack, _unpack


def _is_sm90(operation) -> bool:
    return operation.family == "sm90"


class TestbedGrouped(_common.Launcher):
    """``run(problem_count, alpha=1.0, beta=0.0)`` -> True when every problem's D is right (with ``profiling=True``
    the average milliseconds per launch instead)."""

    __test__ = False  # a library class whose name starts with "Test": pytest must not collect it

    def __init__(self, operation, seed: int = _common.SEED, verification: bool = True, profiling: bool = False,
                 warmup_iterations: int = 500, iterations: int = 500, activation_args=(), **kwargs) -> None:
        from ...kinds.gemm_grouped.operation import GemmOperationGrouped

        if not isinstance(operation, GemmOperationGrouped):
            raise ArgumentError(f"TestbedGrouped needs a GemmOperationGrouped, got {type(operation).__name__}; "
                                f"check other GEMMs with pycutlass.test.test_all_gemm")
        if operation.bias is not None:
            raise ArgumentError(f"TestbedGrouped runs PyCUTLASS's grouped GEMMs; {operation.name} adds a bias vector "
                                f"(bias=), which it does not pass: check it with pycutlass.utils.reference_model")
        super().__init__(operation, seed, verification, profiling, warmup_iterations, iterations, activation_args,
                         kwargs, with_reduction=False)
        self._rng = np.random.default_rng(self.seed)

    def _unit(self) -> int:
        op = self.operation
        widths = [d.alignment for d in (op.A, op.B, op.C)]
        if _is_sm90(op):
            widths += [128 // d.element.bits for d in (op.A, op.B, op.C)]
        return max(widths)

    def problem_sizes(self, problem_count: int) -> list:
        """``problem_count`` GemmCoords drawn from the testbed's generator (each call draws new ones)."""
        if int(problem_count) < 1:
            raise ArgumentError(f"problem_count must be at least 1, got {problem_count}")
        unit = self._unit()
        tile = self.operation.tile_description
        k_most = max(1, tile.threadblock_shape[2] * _effective_stages(tile) * 3 // unit)
        sizes = []
        for _ in range(int(problem_count)):
            m, n = (int(self._rng.integers(1, 512 // unit + 2)) * unit for _ in range(2))
            k = int(self._rng.integers(1, k_most + 1)) * unit
            if self._rng.random() < 0.125:  # a degenerate problem: no tiles, or D = beta * C
                which = int(self._rng.integers(0, 3))
                m, n, k = [0 if i == which else v for i, v in enumerate((m, n, k))]
            sizes.append(GemmCoord(m, n, k))
        return sizes

    def run(self, problem_count: int, alpha: float = 1.0, beta: float = 0.0):
        from ...kinds.gemm_grouped.arguments import GemmGroupedArguments

        op = self.operation
        sizes = self.problem_sizes(problem_count)
        logical, packed, outputs = [], ([], [], []), []
        for size in sizes:
            m, n, k = size.m(), size.n(), size.k()
            a = _common.uniform_integers(self._rng, (m, k), op.A.element, self.bounds)
            b = _common.uniform_integers(self._rng, (k, n), op.B.element, self.bounds)
            c = _common.uniform_integers(self._rng, (m, n), op.C.element, self.bounds)
            logical.append((a, b, c))
            for store, matrix, layout in zip(packed, (a, b, c), (op.A.layout, op.B.layout, op.C.layout)):
                store.append(_pack(matrix, layout))
            outputs.append(_common.poisoned(m * n, op.C.element))
        case = (f"{len(sizes)} problems (" + ", ".join(f"{s.m()}x{s.n()}x{s.k()}" for s in sizes[:4])
                + (", ..." if len(sizes) > 4 else "") + f") alpha={alpha} beta={beta}")

        def build():
            return GemmGroupedArguments(op, sizes, A=packed[0], B=packed[1], C=packed[2], D=outputs,
                                        output_op=op.epilogue_type(alpha, beta, *self.activation_args)), None

        def compare():
            for index, (size, (a, b, c), d) in enumerate(zip(sizes, logical, outputs)):
                accumulator = a.astype(np.float64) @ b.astype(np.float64)
                reference = _common.epilogue_reference(self.functor, op.C.element, accumulator, c.astype(np.float64),
                                                       alpha, beta, self.activation_args)
                passed, detail = _common.matches(_unpack(d, op.C.layout, size.m(), size.n()), reference,
                                                 self.functor, op.C.element, self.accumulator)
                if not passed:
                    return False, f"problem {index} ({size.m()}x{size.n()}x{size.k()}): {detail}"
            return True, ""

        return self.execute(case, build, None, None, 1, lambda detail: print(f"grouped GEMM {case}: {detail}"),
                            compare=compare)


def sweep(testbed: TestbedGrouped, problem_counts=(1, 5, 24), alphas=(1.0, 2.0), betas=(0.0, 2.0)) -> bool:
    """PyCUTLASS's grouped cases (its tests ran 5, 24 and 27 problems) with alpha and beta varied; False at the first
    wrong result, or when the arguments refused every case."""
    skipped_before, attempts = len(testbed.skipped), 0
    for count in problem_counts:
        for alpha in alphas:
            for beta in betas:
                attempts += 1
                if not testbed.run(count, alpha, beta):
                    return False
    return _common.sweep_verdict(testbed, "TestbedGrouped", attempts, skipped_before, True)
