"""PyCUTLASS 2.11's testbeds (pycutlass.test) without a GPU: the sweeps they run, their references and verdicts,
and what they refuse up front."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import ArgumentError
from pycutlass.gemm import Mode
from pycutlass.test import _common, conv2d_testbed, gemm_grouped_testbed, gemm_testbed
from tests.cpu.test_conv2d_arguments import op as conv_arguments_op

D = cutlass.DataType
R, CM = cutlass.RowMajor, cutlass.ColumnMajor


def gemm_op(element=D.float16, acc=D.float32, functor=None, tile=(128, 128, 32), stages=3):
    math = cutlass.MathInstruction([16, 8, 16], element, element, acc, cutlass.OpClass.TensorOp)
    tile_description = cutlass.TileDescription(list(tile), stages, [2, 2, 1], math)
    a, b, c = (cutlass.TensorDescription(element, layout, 8) for layout in (R, CM, R))
    functor = functor or cutlass.LinearCombination(element, 8, acc, D.float32)
    return cutlass.GemmOperationUniversal(80, tile_description, a, b, c, functor)


def conv_op(kind=cutlass.conv.Operator.fprop, algorithm=cutlass.conv.IteratorAlgorithm.optimized,
            stride=cutlass.conv.StrideSupport.Unity, alignment=8, swizzle=cutlass.IdentitySwizzle1):
    math = cutlass.MathInstruction([16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math)
    a, b, c = (cutlass.TensorDescription(D.float16, cutlass.TensorNHWC, alignment) for _ in range(3))
    return cutlass.Conv2dOperation(kind, algorithm, 80, tile, a, b, c, stride,
                                   cutlass.LinearCombination(D.float16, alignment, D.float32, D.float32), swizzle)


def test_star_import_gives_the_testbeds_and_pytest_does_not_collect_them():
    namespace = {}
    exec("from pycutlass.test import *", namespace)
    for name in ("GemmUniversalLauncher", "Conv2dLauncher", "TestbedGrouped", "test_all_gemm", "test_all_conv2d",
                 "GpuTimer"):
        assert name in namespace, name
    assert namespace["test_all_gemm"].__test__ is False and namespace["test_all_conv2d"].__test__ is False
    assert namespace["TestbedGrouped"].__test__ is False


def test_universal_sweep_is_pycutlass_s(monkeypatch):
    """f16 tensor op 128x128x32, 3 stages: M in {8, 488}, N in {8, 496}, K in {8, 88, 280}, slices 1..7 where
    K / slices >= 2 * tile K, both modes, alpha 1, beta 2."""
    calls = []
    monkeypatch.setattr(cutlass.compiler, "add_module", lambda ops, **kw: None)
    monkeypatch.setattr(gemm_testbed.GemmUniversalLauncher, "run",
                        lambda self, mode, size, count, alpha, beta: calls.append(
                            (mode, size.m(), size.n(), size.k(), count, alpha, beta)) or True)
    assert cutlass.test.test_all_gemm(gemm_op(), "universal")
    expected = [(mode, m, n, k, count, 1.0, 2.0) for mode in (Mode.Gemm, Mode.GemmSplitKParallel)
                for m in (8, 488) for n in (8, 496) for k in (8, 88, 280) for count in (1, 2, 3, 5, 7)
                if k // count >= 64]
    assert calls == expected and len(calls) == 32
    calls.clear()
    assert cutlass.test.test_all_gemm(gemm_op(), "multistage")
    assert calls == [(Mode.Gemm, m, n, k, 1, 1.0, 0.0) for m in (16, 528) for n in (16, 528) for k in (32, 112)]
    monkeypatch.setattr(gemm_testbed.GemmUniversalLauncher, "run", lambda self, *a: False)
    assert cutlass.test.test_all_gemm(gemm_op()) is False  # the first wrong result ends the sweep
    with pytest.raises(ArgumentError, match="testcase"):
        cutlass.test.test_all_gemm(gemm_op(), "everything")
    with pytest.raises(ArgumentError, match="interleaved"):
        cutlass.test.test_all_gemm(gemm_op(), "interleaved")


def test_conv_sweep_skips_what_each_kernel_specializes_away(monkeypatch):
    runs = []
    monkeypatch.setattr(cutlass.compiler, "add_module", lambda ops, **kw: None)
    monkeypatch.setattr(conv2d_testbed.Conv2dLauncher, "run",
                        lambda self, size, mode=cutlass.conv.SplitKMode.Serial, alpha=1.0, beta=0.0:
                        runs.append((size, mode, alpha, beta)) or True)
    fprop = conv_op()
    assert cutlass.test.test_all_conv2d(fprop)
    sizes = conv2d_testbed.default_problem_sizes(fprop)
    assert [r[0] for r in runs[:len(sizes)]] == sizes
    assert all(size.C % 8 == 0 and size.K % 8 == 0 for size in sizes)
    split = runs[len(sizes):]
    assert [(r[1], r[0].split_k_slices) for r in split] == [
        (mode, n) for mode in (cutlass.conv.SplitKMode.Parallel, cutlass.conv.SplitKMode.Serial)
        for n in (1, 2, 3, 4, 201)] and all(r[2:] == (2.0, 2.0) for r in split)
    runs.clear()
    cutlass.test.test_all_conv2d(conv_op(cutlass.conv.Operator.dgrad))  # unity-stride dgrad: stride 1 only
    assert runs and all(r[0].stride_h == r[0].stride_w == 1 for r in runs)
    runs.clear()
    cutlass.test.test_all_conv2d(conv_op(cutlass.conv.Operator.dgrad, stride=cutlass.conv.StrideSupport.Strided,
                                         swizzle=cutlass.StridedDgradIdentitySwizzle1))
    assert runs and all((r[0].stride_h, r[0].stride_w) != (1, 1) for r in runs)
    runs.clear()
    fixed = conv_op(algorithm=cutlass.conv.IteratorAlgorithm.fixed_channels, alignment=4)
    cutlass.test.test_all_conv2d(fixed)
    assert runs and all(r[0].C == 4 for r in runs) and all(r[1] == cutlass.conv.SplitKMode.Serial for r in runs)


def test_references_and_verdicts():
    relu = cutlass.LinearCombinationGeneric(cutlass.relu(D.float32), D.float16, 8)
    acc = np.array([[-3.0, 2.0], [5.0, -1.0]])
    c = np.array([[1.0, 1.0], [-1.0, 0.0]])
    ref = _common.epilogue_reference(relu, D.float16, acc, c, 2.0, 1.0)
    assert np.array_equal(ref, [[0.0, 5.0], [9.0, 0.0]])
    plain = cutlass.LinearCombination(D.int8, 16, D.int32, D.float32)
    assert np.array_equal(_common.epilogue_reference(plain, D.int8, np.array([300.0, -2.4]), None, 1.0, 0.0),
                          [127.0, -2.0])  # rounds and saturates
    for out, limit in ((D.float16, 65504.0), (D.bfloat16, 3.3895313892515355e38)):
        clamp = cutlass.LinearCombinationClamp(out, 128 // out.bits, D.float32, D.float32)
        clipped = _common.epilogue_reference(clamp, out, np.array([1e39, -1e39, 3.0]), None, 1.0, 0.0)
        assert np.array_equal(clipped, [limit, -limit, 3.0]), out  # the Clamp epilogues clip to the output's range
    assert _common.matches(ref, ref, relu, D.float16, D.float32)[0]
    poisoned = ref.copy()
    poisoned[0, 0] = np.nan
    assert not _common.matches(poisoned, ref, relu, D.float16, D.float32)[0]  # NaN left behind fails
    assert not _common.matches(ref + 0.5, ref, relu, D.float16, D.float32)[0]
    assert not _common.matches(np.array([127.0, -1.0]), np.array([127.0, -2.0]), plain, D.int8, D.int32)[0]
    assert np.isnan(_common.poisoned(4, D.float16)).all() and (_common.poisoned(4, D.int8) == -77).all()
    values = _common.uniform_integers(np.random.default_rng(2080), (1000,), D.float16, _common.scope(D.float16))
    assert values.dtype == np.float16 and set(np.unique(values)) <= set(range(-4, 5))


def test_what_the_testbeds_refuse_up_front(monkeypatch):
    monkeypatch.setattr(cutlass.compiler, "add_module", lambda ops, **kw: None)
    leaky = gemm_op(functor=cutlass.LinearCombinationGeneric(cutlass.leaky_relu(D.float32), D.float16, 8))
    with pytest.raises(ArgumentError, match="activation_args"):
        cutlass.test.GemmUniversalLauncher(leaky)
    assert cutlass.test.GemmUniversalLauncher(leaky, activation_args=(0.1,)).activation_args == (0.1,)
    with pytest.raises(ArgumentError, match="interleaved=True needs an NC32HW32"):
        cutlass.test.Conv2dLauncher(conv_op(), interleaved=True)
    with pytest.raises(ArgumentError, match="compilation_mode"):
        cutlass.test.test_all_gemm(gemm_op(), compilation_mode="clang")
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        with pytest.raises(ArgumentError, match="ml_dtypes"):
            cutlass.test.GemmUniversalLauncher(gemm_op(D.bfloat16))


def test_a_sweep_whose_cases_were_all_refused_fails(monkeypatch, capsys):
    """A sweep that ran nothing has shown nothing: test_all_gemm returns False when the arguments refused every
    case (e.g. an SM90 operation built with a bias vector, which PyCUTLASS's testbeds never pass)."""
    monkeypatch.setattr(cutlass.compiler, "add_module", lambda ops, **kw: None)

    def refuse(self, mode, size, count, alpha, beta):
        self.skipped.append("refused")
        return True

    monkeypatch.setattr(gemm_testbed.GemmUniversalLauncher, "run", refuse)
    assert cutlass.test.test_all_gemm(gemm_op()) is False
    assert "refused all 32 cases" in capsys.readouterr().out


class _HostGemm:
    """Stands in for GemmArguments on a machine without a GPU: ``sync()`` writes what a correct kernel (or, with
    ``wrong``, a kernel off by one in one element) would have written into D."""

    wrong = False

    def __init__(self, op, problem_size, A, B, C, D, output_op, gemm_mode, split_k_slices):
        self.op, self.size, self.tensors, self.output_op, self.stream = op, problem_size, (A, B, C, D), output_op, 0

    def sync(self):
        m, n, k = self.size.m(), self.size.n(), self.size.k()
        A, B, C, D = self.tensors
        a = A.astype(np.float64).reshape(m, k) if self.op.A.layout is R else A.astype(np.float64).reshape(k, m).T
        b = B.astype(np.float64).reshape(k, n) if self.op.B.layout is R else B.astype(np.float64).reshape(n, k).T
        c = C.astype(np.float64).reshape(m, n) if self.op.C.layout is R else C.astype(np.float64).reshape(n, m).T
        d = _common.epilogue_reference(self.op.epilogue_functor, self.op.C.element, a @ b, c, self.output_op.alpha,
                                       self.output_op.beta, self.output_op.activation_args)
        if self.wrong:
            d[0, 0] += 64.0
        D[:] = (d if self.op.C.layout is R else d.T).ravel()


@pytest.mark.parametrize("layouts", [(R, CM, R), (CM, R, CM)])
def test_the_gemm_launcher_checks_what_the_kernel_wrote(monkeypatch, layouts):
    """The whole launcher path without a GPU: operands packed in each layout, D poisoned, the result unpacked and
    judged against the float64 reference; a kernel that leaves D poisoned, or gets one element wrong, fails."""
    import pycutlass.kinds.gemm.arguments as gemm_arguments
    import pycutlass.runtime.memory as memory

    monkeypatch.setattr(cutlass.compiler, "add_module", lambda ops, **kw: None)
    monkeypatch.setattr(memory, "get_allocated_size", lambda session=None: 0)
    monkeypatch.setattr(gemm_arguments, "GemmArguments", _HostGemm)
    math = cutlass.MathInstruction([16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math)
    a, b, c = (cutlass.TensorDescription(D.float16, layout, 8) for layout in layouts)
    op = cutlass.GemmOperationUniversal(80, tile, a, b, c, cutlass.LinearCombinationGeneric(
        cutlass.relu(D.float32), D.float16, 8))
    ran = []
    monkeypatch.setattr(type(op), "run", lambda self, arguments: ran.append(arguments))
    launcher = cutlass.test.GemmUniversalLauncher(op)
    size = cutlass.GemmCoord(40, 24, 72)
    assert launcher.run(Mode.Gemm, size, 1, 1.0, 2.0) and len(ran) == 1
    monkeypatch.setattr(_HostGemm, "wrong", True)
    assert launcher.run(Mode.Gemm, size, 1, 1.0, 2.0) is False
    monkeypatch.setattr(_HostGemm, "sync", lambda self: None)  # the kernel wrote nothing: NaN stays
    assert launcher.run(Mode.Gemm, size, 1, 1.0, 2.0) is False


class _HostConv:
    """Stands in for Conv2dArguments without a GPU: ``sync()`` writes the correct D (or, with ``wrong``, not)."""

    wrong = False

    def __init__(self, op, problem_size, A, B, C, D, output_op, split_k_mode, split_k_slices):
        self.op, self.size, self.tensors, self.output_op, self.stream = op, problem_size, (A, B, C, D), output_op, 0

    def sync(self):
        from pycutlass.conv import implicit_gemm_tensor_a_extent, implicit_gemm_tensor_b_extent
        from pycutlass.utils.reference_model import conv2d_fprop

        A, B, C, D = self.tensors
        kind, ps = self.op.conv_kind, self.size
        a = A.astype(np.float64).reshape(tuple(implicit_gemm_tensor_a_extent(kind, ps)))
        b = B.astype(np.float64).reshape(tuple(implicit_gemm_tensor_b_extent(kind, ps)))
        acc = conv2d_fprop(a, b, ps)
        d = _common.epilogue_reference(self.op.epilogue_functor, self.op.C.element, acc,
                                       C.astype(np.float64).reshape(acc.shape), self.output_op.alpha,
                                       self.output_op.beta)
        D[:] = (d + (1.0 if self.wrong else 0.0)).ravel()


def _host_conv(monkeypatch, stand_in, op):
    """The conv launcher's path without a GPU: ``stand_in`` for Conv2dArguments, a kernel that does nothing."""
    import pycutlass.kinds.conv2d.arguments as conv_arguments
    import pycutlass.runtime.memory as memory

    monkeypatch.setattr(cutlass.compiler, "add_module", lambda ops, **kw: None)
    monkeypatch.setattr(memory, "get_allocated_size", lambda session=None: 0)
    monkeypatch.setattr(conv_arguments, "Conv2dArguments", stand_in)
    monkeypatch.setattr(type(op), "run", lambda self, arguments: None)
    return op


def test_the_conv_launcher_checks_what_the_kernel_wrote(monkeypatch):
    op = _host_conv(monkeypatch, _HostConv, conv_op())
    launcher = cutlass.test.Conv2dLauncher(op)
    problem = cutlass.Conv2dProblemSize((2, 7, 9, 16), (24, 3, 3, 16), (1, 1, 1, 1), (2, 1), (1, 1))
    assert launcher.run(problem, cutlass.conv.SplitKMode.Serial, 2.0, 1.0)
    monkeypatch.setattr(_HostConv, "wrong", True)
    assert launcher.run(problem, cutlass.conv.SplitKMode.Serial, 2.0, 1.0) is False


def grouped_op(cc=80, layouts=(R, CM, R), functor=None, element=D.float16):
    if cc == 90:  # an SM90 tile: CUTLASS's pointer-array grouped kernel
        math = cutlass.MathInstruction([64, 128, 16], element, element, D.float32, cutlass.OpClass.TensorOp)
        tile = cutlass.TileDescription([128, 128, 64], 0, None, math)
    else:
        math = cutlass.MathInstruction([16, 8, 16], element, element, D.float32, cutlass.OpClass.TensorOp)
        tile = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math)
    a, b, c = (cutlass.TensorDescription(element, layout, 8) for layout in layouts)
    functor = functor or cutlass.LinearCombination(element, 8, D.float32, D.float32)
    return cutlass.GemmOperationGrouped(cc, tile, a, b, c, functor, cutlass.IdentitySwizzle1)


class _HostGrouped:
    """Stands in for GemmGroupedArguments without a GPU: ``sync()`` writes every problem's correct D, or with
    ``wrong_problem`` set, one element of that problem off by 1% of its norm."""

    wrong_problem = None
    built = []

    def __init__(self, op, problem_sizes, A, B, C, D, output_op):
        self.op, self.sizes, self.tensors, self.output_op, self.stream = op, problem_sizes, (A, B, C, D), output_op, 0
        _HostGrouped.built.append(self)

    def sync(self):
        for index, (size, A, B, C, D) in enumerate(zip(self.sizes, *self.tensors)):
            m, n, k = size.m(), size.n(), size.k()
            a = gemm_testbed._unpack(A.astype(np.float64), self.op.A.layout, m, k)
            b = gemm_testbed._unpack(B.astype(np.float64), self.op.B.layout, k, n)
            c = gemm_testbed._unpack(C.astype(np.float64), self.op.C.layout, m, n)
            d = _common.epilogue_reference(self.op.epilogue_functor, self.op.C.element, a @ b, c,
                                           self.output_op.alpha, self.output_op.beta,
                                           self.output_op.activation_args)
            if index == self.wrong_problem and d.size:  # 1% of this problem's norm: far less of the group's
                d[-1, -1] += 0.01 * np.linalg.norm(d) + 1.0
            D[:] = (d if self.op.C.layout is R else d.T).ravel()


@pytest.fixture
def host_grouped(monkeypatch):
    import pycutlass.kinds.gemm_grouped.arguments as grouped_arguments
    import pycutlass.runtime.memory as memory

    monkeypatch.setattr(cutlass.compiler, "add_module", lambda ops, **kw: None)
    monkeypatch.setattr(memory, "get_allocated_size", lambda session=None: 0)
    monkeypatch.setattr(grouped_arguments, "GemmGroupedArguments", _HostGrouped)
    monkeypatch.setattr(_HostGrouped, "built", [])
    return monkeypatch


@pytest.mark.parametrize("layouts", [(R, CM, R), (CM, R, CM)])
def test_the_grouped_testbed_checks_every_problem(host_grouped, layouts):
    """TestbedGrouped end to end without a GPU: problems drawn from the seed in multiples of the access width, a few
    degenerate; a single wrong element in one small problem fails the run, as does a kernel that writes nothing."""
    op = grouped_op(layouts=layouts, functor=cutlass.LinearCombinationGeneric(cutlass.relu(D.float32), D.float16, 8))
    host_grouped.setattr(type(op), "run", lambda self, arguments: None)
    testbed = cutlass.test.TestbedGrouped(operation=op)
    assert testbed.reduction_operation is None
    assert testbed.run(24, 2.0, 1.0)
    sizes = _HostGrouped.built[-1].sizes
    assert len(sizes) == 24 and all(v % 8 == 0 for s in sizes for v in (s.m(), s.n(), s.k()))
    assert any(0 in (s.m(), s.n(), s.k()) for s in sizes) and max(s.m() for s in sizes) > 256
    smallest = min((i for i, s in enumerate(sizes) if s.m() * s.n()), key=lambda i: sizes[i].m() * sizes[i].n())
    testbed = cutlass.test.TestbedGrouped(op)  # same seed: the same problems again
    host_grouped.setattr(_HostGrouped, "wrong_problem", smallest)
    assert testbed.run(24, 2.0, 1.0) is False
    assert _HostGrouped.built[-1].sizes == sizes
    host_grouped.setattr(_HostGrouped, "wrong_problem", None)
    host_grouped.setattr(_HostGrouped, "sync", lambda self: None)  # nothing written: NaN stays
    assert cutlass.test.TestbedGrouped(op).run(5) is False


def test_the_grouped_testbed_sizes_sm90_problems_for_tma_and_refuses_what_it_cannot_check(host_grouped):
    op = grouped_op(cc=90)
    assert type(op).__name__.endswith("Sm90")
    sizes = cutlass.test.TestbedGrouped(op).problem_sizes(64)
    assert all(v % 8 == 0 for s in sizes for v in (s.m(), s.n(), s.k()))  # 16 bytes of float16
    with pytest.raises(ArgumentError, match="problem_count must be at least 1"):
        cutlass.test.TestbedGrouped(op).run(0)
    with pytest.raises(ArgumentError, match="needs a GemmOperationGrouped"):
        cutlass.test.TestbedGrouped(gemm_op())
    biased = cutlass.GemmOperationGrouped(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor,
                                          cutlass.IdentitySwizzle1, bias="column")
    with pytest.raises(ArgumentError, match="bias"):
        cutlass.test.TestbedGrouped(biased)


def test_the_grouped_sweep_fails_when_every_case_was_refused(host_grouped, capsys):
    op = grouped_op()

    def refuse(*args, **kwargs):
        raise ArgumentError("refused for the test")

    host_grouped.setattr(_HostGrouped, "__init__", refuse)
    testbed = cutlass.test.TestbedGrouped(op)
    assert gemm_grouped_testbed.sweep(testbed) is False
    assert len(testbed.skipped) == 12 and "refused all 12 cases" in capsys.readouterr().out


class _HostInterleavedConv(_HostConv):
    """Reads NC32HW32 / C32RSK32 operands as the kernel does (its own index arithmetic, not the testbed's) and
    writes an NC32HW32 D."""

    def sync(self):
        from pycutlass.utils.reference_model import conv2d_fprop

        A, B, C, D = self.tensors
        ps = self.size
        n, h, w, c, k, r, s = ps.N, ps.H, ps.W, ps.C, ps.K, ps.R, ps.S
        p, q = ps.P, ps.Q
        a = np.empty((n, h, w, c))
        flat_a = A.astype(np.float64)
        for ni, hi, wi, ci in np.ndindex(n, h, w, c):  # offset = (((n * C/32 + c/32) * H + h) * W + w) * 32 + c%32
            a[ni, hi, wi, ci] = flat_a[(((ni * (c // 32) + ci // 32) * h + hi) * w + wi) * 32 + ci % 32]
        b = np.empty((k, r, s, c))
        flat_b = B.astype(np.float64)
        for ki, ri, si, ci in np.ndindex(k, r, s, c):  # offset = (((c/32 * R + r) * S + s) * K + k) * 32 + c%32
            b[ki, ri, si, ci] = flat_b[(((ci // 32 * r + ri) * s + si) * k + ki) * 32 + ci % 32]
        source = np.empty((n, p, q, k))
        flat_c = C.astype(np.float64)
        for ni, pi, qi, ki in np.ndindex(n, p, q, k):
            source[ni, pi, qi, ki] = flat_c[(((ni * (k // 32) + ki // 32) * p + pi) * q + qi) * 32 + ki % 32]
        d = _common.epilogue_reference(self.op.epilogue_functor, self.op.C.element, conv2d_fprop(a, b, ps), source,
                                       self.output_op.alpha, self.output_op.beta)
        if self.wrong:
            d[0, 0, 0, 1] += 5.0
        for ni, pi, qi, ki in np.ndindex(n, p, q, k):
            D[(((ni * (k // 32) + ki // 32) * p + pi) * q + qi) * 32 + ki % 32] = d[ni, pi, qi, ki]


def test_the_conv_launcher_runs_interleaved_int8_as_pycutlass_did(monkeypatch):
    # PyCUTLASS's interleaved int8 fprop: NC32HW32 activation and output, C32RSK32 filter, a clamping epilogue
    op = _host_conv(monkeypatch, _HostInterleavedConv, conv_arguments_op(interleaved=True))
    launcher = cutlass.test.Conv2dLauncher(op, interleaved=True)
    assert launcher.interleaved and cutlass.test.Conv2dLauncher(op).interleaved  # the operation says
    problem = cutlass.Conv2dProblemSize((1, 5, 6, 64), (32, 3, 3, 64), (1, 1, 1, 1), (2, 1), (1, 1))
    assert launcher.run(problem, cutlass.conv.SplitKMode.Serial, 0.5, 1.0)
    monkeypatch.setattr(_HostInterleavedConv, "wrong", True)
    assert launcher.run(problem, cutlass.conv.SplitKMode.Serial, 0.5, 1.0) is False
    sizes = conv2d_testbed.default_problem_sizes(op)
    assert all(size.C % 32 == 0 and size.K % 32 == 0 for size in sizes)


def test_testbed_sweep_draws_deterministically_without_a_gpu():
    """tools/testbed_sweep.py --dry-run: the configurations a seed draws (no bias vectors)."""
    import subprocess
    import sys

    command = [sys.executable, "tools/testbed_sweep.py", "--gemm80", "3", "--conv80", "2", "--gemm90", "1",
               "--seed", "5", "--dry-run"]
    first, again = (subprocess.run(command, capture_output=True, text=True, check=True).stdout for _ in range(2))
    lines = first.splitlines()
    assert first == again and [line.split()[0] for line in lines] == ["gemm80"] * 3 + ["conv80"] * 2 + ["gemm90"]
    assert "bias=row" not in first and "bias=column" not in first


@pytest.mark.parametrize("feature", ["direct_store", "simt_conv_alignment", "wide_c", "warp_n128", "int32_epilogue"])
def test_testbed_sweep_draws_only_the_features_asked_for(feature):
    """tools/testbed_sweep.py --feature: every drawn configuration uses it."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / "testbed_sweep.py"
    spec = importlib.util.spec_from_file_location("testbed_sweep_under_test", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    family = {"simt_conv_alignment": "conv80", "int32_epilogue": "gemm80"}.get(feature, "gemm80")
    configs = sweep.draw_configs(7, {family: 3}, [feature])
    assert len(configs) == 3
    for cfg in configs:
        assert sweep.FEATURES[feature](sweep.fuzz_accept.build(cfg)), cfg


def test_testbed_sweep_compile_only_targets_the_given_arch(monkeypatch, capsys):
    """tools/testbed_sweep.py --compile-only --arch 90: compiles the drawn operations (and their split-K
    reductions) for sm_90 and stops; a failed unit exits 1."""
    import importlib.util
    from pathlib import Path

    import pycutlass as cutlass

    path = Path(__file__).resolve().parents[2] / "tools" / "testbed_sweep.py"
    spec = importlib.util.spec_from_file_location("testbed_sweep_compile_only", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    calls, failures = [], []

    class FakeCompiler:
        @staticmethod
        def of():
            return FakeCompiler

        @staticmethod
        def add_module(ops, jobs=None, errors=None):
            calls.append((cutlass.session.current().options["target"].compute_capability, [op.name for op in ops]))
            return type("Report", (), {"failures": failures})()

    monkeypatch.setattr(sweep, "Compiler", FakeCompiler)
    monkeypatch.setattr(sweep, "child", lambda cfg, timeout: pytest.fail("--compile-only ran a configuration"))
    session = cutlass.Session()
    with session.activate():
        assert sweep.main(["--gemm80", "2", "--conv80", "1", "--seed", "3", "--compile-only", "--arch", "90"]) == 0
        assert calls and all(arch == 90 for arch, _ in calls)
        assert any(name.startswith("pycutlass_reduce") for _, names in calls for name in names)
        assert "compiled 3 configurations; 0 compile unit(s) failed" in capsys.readouterr().out
        failures.append(([type("Op", (), {"name": "pycutlass_broken"})()], "error: boom"))
        assert sweep.main(["--gemm80", "1", "--seed", "3", "--compile-only", "--arch", "90"]) == 1


def test_the_filter_tap_reuse_wgrad_gets_default_sizes_it_computes():
    """PyCUTLASS's default conv sizes are 1x1 to 7x7 filters with channels in 8s, none of which the filter-tap-reuse
    wgrad (3x3, stride 1, channels in 64s) computes: test_all_conv2d would refuse every case and fail. It gets 3x3
    stride-1 sizes of its own; other operations keep the defaults."""
    D = cutlass.DataType
    math = cutlass.MathInstruction([64, 64, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    nhwc = cutlass.TensorDescription(D.float16, cutlass.LayoutType.TensorNHWC, 8)
    taps = cutlass.Conv2dOperation(cutlass.conv.Operator.wgrad, cutlass.conv.IteratorAlgorithm.optimized, 90,
                                   cutlass.TileDescription([64, 9 * 64, 64], 0, None, math), nhwc, nhwc, nhwc,
                                   cutlass.conv.StrideSupport.Strided, cutlass.LinearCombination(D.float16, 8,
                                                                                                  D.float32))
    assert taps.filter_taps
    sizes = conv2d_testbed.default_problem_sizes(taps)
    assert len(sizes) >= 4
    for size in sizes:
        taps.check_problem_size(size)  # raises ArgumentError on a size it does not compute
    implicit = cutlass.Conv2dOperation(cutlass.conv.Operator.wgrad, cutlass.conv.IteratorAlgorithm.optimized, 90,
                                       cutlass.TileDescription([64, 128, 64], 0, None, math), nhwc, nhwc, nhwc,
                                       cutlass.conv.StrideSupport.Strided,
                                       cutlass.LinearCombination(D.float16, 8, D.float32))
    assert any((size.R, size.S) != (3, 3) for size in conv2d_testbed.default_problem_sizes(implicit))
