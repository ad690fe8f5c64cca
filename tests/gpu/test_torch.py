"""pycutlass.torch on the GPU: each operator against float64, the bound (patched-Params) path, SM90 kernels with a fused
bias + GELU, convolutions (fprop, dgrad, wgrad), torch.compile(fullgraph=True), CUDA-graph capture and replay,
gradcheck in float64 and gradients against torch in float16, fallbacks, tuning recorded calls and persisting the
choices, and the model pass on a transformer MLP block and ResNet-50 with outputs checked.

Outputs come from torch's caching allocator, so before each call the block the output will reuse is filled with NaN
(``poison``): a kernel that writes nothing cannot pass on an earlier result."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import pycutlass  # noqa: E402
import pycutlass.torch as pct  # noqa: E402
from pycutlass.compiler.manager import Compiler  # noqa: E402
from pycutlass.torch import kernels, reference  # noqa: E402
from pycutlass.runtime.launch import BoundLaunch  # noqa: E402
from pycutlass.torch.dispatch import TORCH  # noqa: E402

pytestmark = pytest.mark.gpu
F = torch.nn.functional
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 3e-2, torch.float64: 1e-10}


@pytest.fixture(scope="module")
def session():
    session = pycutlass.Session()
    with session.activate():
        yield session


@pytest.fixture()
def dispatch(session):
    found = pct.Dispatch.of(session)
    found.configure(family="auto", fallback=False, tune=False, prefer_faster=True)
    found.fallbacks.clear()
    yield found
    found.configure(family="auto", fallback=True)


def poison(shape, dtype, memory_format=torch.contiguous_format):
    """Fill the block the next allocation of this size will get with NaN."""
    t = torch.empty(shape, dtype=dtype, device="cuda", memory_format=memory_format)
    t.fill_(float("nan"))
    del t


def relative_error(got, expected) -> float:
    got, expected = got.double(), expected.double()
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - expected).norm() / (expected.norm() or 1.0)).item()


def randn(*shape, dtype=torch.float16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def matrix(rows, cols, row_major: bool, dtype, seed):
    return randn(rows, cols, dtype=dtype, seed=seed) if row_major else randn(cols, rows, dtype=dtype, seed=seed).t()


def used_kernels(dispatch) -> list:
    return [bound for bound in dispatch._bound.values() if isinstance(bound, BoundLaunch)]


# --- GEMM -----------------------------------------------------------------------------------------------------------
GEMM_CASES = [  # (dtype, a row-major, b row-major, epilogue input, activation, family)
    *[(dt, ar, br, "none", "identity", "sm80") for dt in (torch.float16, torch.bfloat16)
      for ar in (True, False) for br in (True, False)],
    *[(dt, True, False, "bias", act, "sm80") for dt in (torch.float16, torch.bfloat16)
      for act in ("relu", "gelu", "gelu_taylor", "silu", "leaky_relu", "hardswish", "sigmoid", "tanh")],
    (torch.float16, True, False, "c", "identity", "sm80"), (torch.bfloat16, False, True, "c", "relu", "sm80"),
    (torch.float16, True, False, "bias", "identity", "auto"), (torch.bfloat16, True, False, "bias", "identity", "auto"),
    (torch.bfloat16, True, False, "bias", "gelu", "auto"), (torch.float16, True, True, "c", "gelu", "auto"),
]
M, N, K = 78, 136, 264  # M even but not a multiple of 4: column-major A gets 2-element accesses


def _gemm_inputs(dtype, a_row, b_row, extra, seed=0):
    a, b = matrix(M, K, a_row, dtype, seed), matrix(K, N, b_row, dtype, seed + 1)
    bias = randn(N, dtype=dtype, seed=seed + 2) if extra == "bias" else None
    c = randn(M, N, dtype=dtype, seed=seed + 3) if extra == "c" else None
    return a, b, bias, c


@pytest.fixture(scope="module")
def gemm_kernels(session):
    """Compile every case's default kernel in one parallel add_module (the first calls then only load)."""
    dispatch = pct.Dispatch.of(session)
    operations = {}
    for dtype, a_row, b_row, extra, activation, family in GEMM_CASES:
        dispatch.configure(family=family)
        a, b, bias, c = _gemm_inputs(dtype, a_row, b_row, extra)
        cls, why = dispatch._gemm_class(a, b, bias, c, 0.5 if c is not None else 0.0, activation)
        assert cls is not None, why
        _, operation = kernels.default_gemm(dispatch.candidates(cls), M, N)
        operations[operation.name] = operation
    dispatch.configure(family="auto")
    report = Compiler.of(session).add_module(list(operations.values()), errors="report")
    assert not report.failures, report.failures[:1]
    return operations


@pytest.mark.parametrize("case", GEMM_CASES, ids=lambda c: "-".join(map(str, c)).replace("torch.", ""))
def test_gemm_matches_float64(case, dispatch, gemm_kernels):
    dtype, a_row, b_row, extra, activation, family = case
    dispatch.configure(family=family)
    a, b, bias, c = _gemm_inputs(dtype, a_row, b_row, extra)
    alpha, beta = (0.75, 0.5) if extra == "c" else (1.25 if extra == "none" else 1.0, 0.0)
    expected = reference.activate(alpha * a.double() @ b.double() + (beta * c.double() if c is not None else 0) +
                                  (bias.double() if bias is not None else 0), activation, 0.1)
    for seed in (0, 10):  # the second call takes the bound path with new tensors
        if seed:
            a, b, bias, c = _gemm_inputs(dtype, a_row, b_row, extra, seed)
            expected = reference.activate(alpha * a.double() @ b.double() +
                                          (beta * c.double() if c is not None else 0) +
                                          (bias.double() if bias is not None else 0), activation, 0.1)
        poison((M, N), dtype)
        out = pct.gemm(a, b, bias, c, alpha, beta, activation, 0.1)
        assert out.shape == (M, N) and out.dtype == dtype
        assert relative_error(out, expected) < TOLERANCE[dtype]
    bound = used_kernels(dispatch)
    assert bound, "the call ran torch, not a kernel"
    if family == "auto" and a_row and not b_row:
        assert any(b.loaded_op.name.startswith("pycutlass_gemm_sm90") for b in bound)


def test_bound_path_launches_no_builder_and_follows_the_current_stream(dispatch, gemm_kernels):
    dispatch.configure(family="sm80")
    a, b, bias, _ = _gemm_inputs(torch.float16, True, False, "bias", seed=20)
    pct.gemm(a, b, bias, activation="relu")
    bound = used_kernels(dispatch)[-1]
    builds = bound.loaded_op.builder_launches
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        a2, b2, bias2, _ = _gemm_inputs(torch.float16, True, False, "bias", seed=30)
        poison((M, N), torch.float16)
        out = pct.gemm(a2, b2, bias2, activation="relu")
    stream.synchronize()
    assert bound.loaded_op.builder_launches == builds
    expected = torch.relu(a2.double() @ b2.double() + bias2.double())
    assert relative_error(out, expected) < 1e-2


def test_unaligned_view_takes_a_narrower_kernel(dispatch, gemm_kernels):
    dispatch.configure(family="sm80")
    storage = randn(M * K + 2, seed=40)
    a = storage[2:].view(M, K)  # a 4-byte offset: 8-element accesses would be misaligned
    b = matrix(K, N, False, torch.float16, 41)
    poison((M, N), torch.float16)
    out = pct.gemm(a, b)
    assert relative_error(out, a.double() @ b.double()) < 1e-2


def test_linear_bmm_grouped_match_float64(dispatch, gemm_kernels):
    dispatch.configure(family="sm80")
    x, w, bias = randn(3, 26, K, seed=50), randn(N, K, seed=51), randn(N, seed=52)
    out = pct.linear(x, w, bias, activation="gelu")
    assert relative_error(out, F.gelu(x.double() @ w.double().t() + bias.double())) < 1e-2
    a, b = randn(3, M, K, seed=53), randn(3, K, N, seed=54)
    out = pct.bmm(a, b, alpha=0.5)
    assert relative_error(out, 0.5 * a.double() @ b.double()) < 1e-2
    groups_a = [randn(m, K, seed=55 + m) for m in (8, 78, 200)]
    groups_b = [randn(K, N, seed=60 + i) for i in range(3)]
    outs = pct.grouped_gemm(groups_a, groups_b)
    for x_, y_, o in zip(groups_a, groups_b, outs):
        assert relative_error(o, x_.double() @ y_.double()) < 1e-2


@pytest.mark.parametrize("family,dtype,with_bias", [("sm80", torch.float16, False), ("auto", torch.bfloat16, True)])
def test_linear_residual_is_added_in_the_epilogue(dispatch, gemm_kernels, family, dtype, with_bias):
    """``linear(x, w, b, residual=r)`` = ``F.linear(x, w, b) + r`` in one kernel (r as C, beta 1); the second call
    with new tensors takes the bound path. The Sm80 family adds a bias through C, so only SM90 does both."""
    dispatch.configure(family=family)
    w = randn(N, K, dtype=dtype, seed=81)
    bias = randn(N, dtype=dtype, seed=82) if with_bias else None
    for seed in (0, 1):
        x, r = randn(2, 40, K, dtype=dtype, seed=83 + seed), randn(2, 40, N, dtype=dtype, seed=85 + seed)
        expected = F.linear(x.double(), w.double(), None if bias is None else bias.double()) + r.double()
        poison((80, N), dtype)
        out = pct.linear(x, w, bias, residual=r)
        assert out.shape == (2, 40, N)
        assert relative_error(out, expected) < TOLERANCE[dtype]
    assert used_kernels(dispatch), "torch ran the call, not a kernel"
    assert not dispatch.unbound_calls.get(next(iter(used_kernels(dispatch))).loaded_op.name)


def test_float64_gemm_gradcheck_on_kernels(dispatch):
    a = torch.randn(12, 10, dtype=torch.float64, device="cuda", requires_grad=True)
    b = torch.randn(10, 6, dtype=torch.float64, device="cuda", requires_grad=True)
    bias = torch.randn(6, dtype=torch.float64, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y, z: pct.gemm(x, y, z, activation="tanh"), (a, b, bias))
    assert used_kernels(dispatch), "float64 ran torch, not a kernel"


def test_float16_gemm_gradients_match_torch(dispatch, gemm_kernels):
    dispatch.configure(family="sm80")
    x = randn(64, K, seed=70).requires_grad_(True)
    w = randn(N, K, seed=71).requires_grad_(True)
    bias = randn(N, seed=72).requires_grad_(True)
    pct.linear(x, w, bias, activation="relu").float().square().mean().backward()
    ref = [t.detach().double().requires_grad_(True) for t in (x, w, bias)]
    torch.relu(F.linear(*ref)).square().mean().backward()
    for got, want in zip((x, w, bias), ref):
        assert relative_error(got.grad, want.grad) < 2e-2


# --- convolutions ----------------------------------------------------------------------------------------------------
CONV_CASES = [  # (N, C, H, W, K, R, S, stride, padding, dilation, bias, activation, channels_last input)
    (2, 16, 15, 13, 32, 3, 3, 1, 1, 1, True, "relu", True),
    (2, 16, 15, 13, 32, 3, 3, 2, 1, 1, True, "identity", False),
    (1, 8, 12, 12, 16, 3, 3, 1, 2, 2, False, "silu", True),
    (3, 32, 7, 7, 64, 1, 1, 1, 0, 1, True, "relu", True),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "x".join(map(str, c[:11])) + f"-{c[11]}")
def test_conv2d_fprop_matches_float64(case, dispatch):
    n, c, h, w, k, r, s, stride, padding, dilation, with_bias, activation, channels_last = case
    x = randn(n, c, h, w, seed=80)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    weight, bias = randn(k, c, r, s, seed=81) * 0.2, randn(k, seed=82) if with_bias else None
    expected = reference.activate(F.conv2d(x.double(), weight.double(), None if bias is None else bias.double(),
                                           stride, padding, dilation), activation)
    for _ in range(2):
        poison(expected.shape, torch.float16, torch.channels_last)
        out = pct.conv2d(x, weight, bias, stride, padding, dilation, activation)
        assert out.is_contiguous(memory_format=torch.channels_last)
        assert relative_error(out, expected) < 1e-2
    assert used_kernels(dispatch)


def test_conv2d_gradients_run_dgrad_and_wgrad_kernels(dispatch):
    x = randn(2, 16, 10, 10, seed=90).contiguous(memory_format=torch.channels_last).requires_grad_(True)
    weight = (randn(32, 16, 3, 3, seed=91) * 0.2).contiguous(memory_format=torch.channels_last).requires_grad_(True)
    bias = randn(32, seed=92).requires_grad_(True)
    grad = randn(2, 32, 5, 5, seed=93)
    out = pct.conv2d(x, weight, bias, stride=2, padding=1, activation="relu")
    out.backward(grad)
    ref = [t.detach().double().requires_grad_(True) for t in (x, weight, bias)]
    torch.relu(F.conv2d(ref[0], ref[1], ref[2], 2, 1)).backward(grad.double())
    for got, want in zip((x, weight, bias), ref):
        assert relative_error(got.grad, want.grad) < 2e-2
    names = {b.loaded_op.name for b in used_kernels(dispatch)}
    assert any("dgrad" in name for name in names) and any("wgrad" in name for name in names), names


# --- compile, graphs, fallbacks -------------------------------------------------------------------------------------
def test_torch_compile_fullgraph(dispatch, gemm_kernels):
    dispatch.configure(family="sm80")

    def block(x, w1, b1, w2):
        return pct.linear(pct.linear(x, w1, b1, activation="gelu"), w2)

    args = (randn(78, K, seed=100), randn(N, K, seed=101), randn(N, seed=102), randn(K, N, seed=103))
    compiled = torch.compile(block, fullgraph=True)
    poison((78, K), torch.float16)
    out = compiled(*args)
    x, w1, b1, w2 = (t.double() for t in args)
    assert relative_error(out, F.gelu(x @ w1.t() + b1) @ w2.t()) < 1e-2


def test_cuda_graph_capture_and_replay(dispatch, gemm_kernels):
    dispatch.configure(family="sm80")
    x, w, bias = randn(M, K, seed=110), randn(N, K, seed=111), randn(N, seed=112)
    static_x = x.clone()
    pct.linear(static_x, w, bias, activation="relu")  # warm-up: binds the launch outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = pct.linear(static_x, w, bias, activation="relu")
    for seed in (113, 114):
        static_x.copy_(randn(M, K, seed=seed))
        static_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        expected = torch.relu(static_x.double() @ w.double().t() + bias.double())
        assert relative_error(static_out, expected) < 1e-2


def test_pdl_chain_of_linears_and_graph_replay(dispatch, gemm_kernels):
    """configure(pdl=True): SM90 kernels bound programmatically; a chain with torch kernels between them (poison,
    residual add) computes right, eagerly and replayed from a CUDA graph."""
    dispatch.configure(family="auto", pdl=True)
    try:
        x, w1, b1, w2 = randn(M, K, seed=130), randn(N, K, seed=131), randn(N, seed=132), randn(K, N, seed=133)

        def block(x):
            h = pct.linear(x, w1, b1, activation="gelu")
            return pct.linear(h, w2) + x

        for _ in range(2):  # the first call builds Arguments, the second runs the bound (patched) launch
            out = block(x)
        torch.cuda.synchronize()
        bound = [(name, b) for (name, _, pdl), b in dispatch._by_operation.items() if pdl and "sm90" in name]
        assert bound and all(b.launcher.programmatic for _, b in bound)
        expected = F.gelu(x.double() @ w1.double().t() + b1.double()) @ w2.double().t() + x.double()
        assert relative_error(out, expected) < 1e-2
        static_x = x.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = block(static_x)
        for seed in (134, 135):
            static_x.copy_(randn(M, K, seed=seed))
            static_out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            xs = static_x.double()
            expected = F.gelu(xs @ w1.double().t() + b1.double()) @ w2.double().t() + xs
            assert relative_error(static_out, expected) < 1e-2
    finally:
        dispatch.configure(pdl=False)


def test_first_call_during_capture_is_a_clear_error(dispatch, gemm_kernels):
    dispatch.configure(family="sm80")
    x, w = randn(46, K, seed=120), randn(N, K, seed=121)  # a shape never seen
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(pycutlass.ArgumentError, match="during CUDA graph capture"):
        with torch.cuda.graph(graph):
            pct.linear(x, w)


def test_fallback_to_torch_and_its_switch(dispatch):
    a, b = randn(32, 64, dtype=torch.float32, seed=130), randn(64, 16, dtype=torch.float32, seed=131)
    with pytest.raises(pycutlass.ArgumentError, match="no pycutlass kernel serves this call.*float32"):
        pct.gemm(a, b)
    dispatch.configure(fallback=True)
    out = pct.gemm(a, b, activation="relu")
    assert relative_error(out, torch.relu(a.double() @ b.double())) < 1e-5
    assert any("float32" in why for why in dispatch.fallbacks)
    with pytest.raises(pycutlass.ArgumentError, match="b is torch.float32"):
        pct.gemm(a.half(), b)


# --- tuning and the model pass ----------------------------------------------------------------------------------------
class _TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(256, 512), torch.nn.Linear(512, 256)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def test_tune_calls_persist_and_reload_without_retuning(tmp_path):
    session = pycutlass.Session()
    with session.activate():
        dispatch = pct.Dispatch.of(session).configure(family="sm80", db=str(tmp_path / "tuning.db"))
        x, w1, b1 = randn(96, 256, seed=140), randn(512, 256, seed=141), randn(512, seed=142)
        with dispatch.collecting() as collector:
            pct.linear(x, w1, b1, activation="relu")
            pct.linear(x, w1, b1, activation="relu")  # the same call twice: tuned once
        assert len(collector.calls) == 2 and collector.calls[0].key == collector.calls[1].key
        choices = dispatch.tune_calls(collector.calls, progress=False, prefer_faster=False)
        assert choices[0].kernel not in ("-", TORCH) and choices[0].cutlass_us > 0 and choices[0].torch_us > 0
        poison((96, 512), torch.float16)
        out = pct.linear(x, w1, b1, activation="relu")
        assert relative_error(out, torch.relu(x.double() @ w1.double().t() + b1.double())) < 1e-2
        assert used_kernels(dispatch)[-1].loaded_op.name == choices[0].kernel
    other = pycutlass.Session()
    with other.activate():  # a new session reads the choice from the database: nothing is timed again
        again = pct.Dispatch.of(other).configure(family="sm80", db=str(tmp_path / "tuning.db"))
        assert again.lookup(choices[0].call.key)["kernel"] == choices[0].kernel
        pct.linear(x, w1, b1, activation="relu")
        assert used_kernels(again)[-1].loaded_op.name == choices[0].kernel


def _benchmark_models():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import models

    return models


def test_optimize_transformer_mlp_block_bf16():
    models = _benchmark_models()
    session = pycutlass.Session()
    with session.activate():
        model = models.MLPBlock(768, 3072).cuda().to(torch.bfloat16).eval()
        x = randn(4, 128, 768, dtype=torch.bfloat16, seed=150)
        with torch.no_grad():
            expected = model(x)
            fast = pct.optimize(model, (x,), tune=True, progress=False)
            poison(tuple(expected.shape), torch.bfloat16)
            out = fast(x)
        report = pct.report(fast)
        assert len(report.rows) == 2 and {row["pattern"] for row in report.rows} >= {"linear+gelu"}
        assert relative_error(out, expected) < 2e-2


def test_optimized_layers_skip_the_dispatcher_and_torch_layers_call_torch(monkeypatch):
    import pycutlass.torch.ops as torch_ops
    from pycutlass.torch.model_pass import CutlassLinear

    models = _benchmark_models()
    session = pycutlass.Session()
    with session.activate():
        model = models.MLPBlock(256, 1024).cuda().to(torch.bfloat16).eval()
        x = randn(1, 64, 256, dtype=torch.bfloat16, seed=170)
        with torch.no_grad():
            expected = model(x)
            # end_to_end=False: this host-bound model may be handed back to torch whole; here the layers are tested
            fast = pct.optimize(model, (x,), tune=True, progress=False, end_to_end=False)

            def dispatcher(*args, **kwargs):
                raise AssertionError("an inference call of a model's layer went through torch.ops")

            monkeypatch.setattr(torch_ops, "_GEMM", dispatcher)  # nn.Parameter weights take the direct path
            poison(tuple(expected.shape), torch.bfloat16)
            out = fast(x)
        assert relative_error(out, expected) < 2e-2
        kernels = {row["layer"]: row["kernel"] for row in pct.report(fast).rows}
        for module in fast.modules():
            if isinstance(module, CutlassLinear):
                assert (tuple(x.shape) in module.eager_shapes) == (kernels[module.layer] == "torch")

        # Later calls of a bound layer take its launch plan: no dispatch lookup, new tensors' addresses
        dispatch = pct.Dispatch.of(session)
        calls = []
        full_path = pct.Dispatch.gemm
        monkeypatch.setattr(pct.Dispatch, "gemm", lambda self, *a: calls.append(1) or full_path(self, *a))
        with torch.no_grad():
            for seed in (171, 172):
                x2 = randn(1, 64, 256, dtype=torch.bfloat16, seed=seed)
                expected2 = model(x2)
                poison(tuple(expected2.shape), torch.bfloat16)
                assert relative_error(fast(x2), expected2) < 2e-2
            assert not calls, "a planned layer went through the dispatch"
            dispatch.configure(prefer_faster=True)  # settings changed: plans are stale, the full path rebinds
            assert relative_error(fast(x2), expected2) < 2e-2
        assert len(calls) == sum(1 for row in pct.report(fast).rows if row["kernel"] != "torch")


def test_optimize_end_to_end_check_keeps_the_fastest_placement():
    """A small host-bound GPT-2 stack: optimize times the original model and each placement of its layers, keeps
    the fastest, records it, and every layer it put on torch calls torch for the example's shape."""
    from pycutlass.torch.model_pass import (_E2E_MARGIN, _E2E_NOISE_FACTOR, _E2E_TRACED_MARGIN, CutlassLinear,
                                            OptimizeReport)

    models = _benchmark_models()
    session = pycutlass.Session()
    with session.activate():
        model = models.GPT2Stack(n_layers=2, d_model=256, n_heads=4).cuda().to(torch.bfloat16).eval()
        x = randn(1, 64, 256, dtype=torch.bfloat16, seed=190)
        with torch.no_grad():
            expected = model(x)
            fast = pct.optimize(model, (x,), tune=True, progress=False, end_to_end=True)
            poison(tuple(expected.shape), torch.bfloat16)
            out = fast(x)
        assert relative_error(out, expected) < 2e-2
        report = pct.report(fast)
        record = report.end_to_end
        assert record is not None and record["eager_ms"] > 0 and "tuned" in record["candidates"]
        times = record["candidates"]
        placements = {name: ms for name, ms in times.items() if name != "traced"}
        eager_ms = record["eager_ms"]
        # The margin a placement must win by: 2%, or twice the A/A control's noise on this host when that is more
        # (a fixed 2% here failed on a noisy host, where optimize rightly kept torch on a 2-4% lead).
        margin = record["margin"]
        assert margin >= _E2E_MARGIN and margin == pytest.approx(max(_E2E_MARGIN, _E2E_NOISE_FACTOR * record.get("noise", 0.0)))
        traced_wins = times["traced"] < eager_ms * (1 - max(_E2E_TRACED_MARGIN, margin))
        fallback = times["traced"] if traced_wins else eager_ms
        if record["chosen"] in ("traced", "eager"):  # no placement beat torch by the margin: torch only
            assert record["chosen"] == ("traced" if traced_wins else "eager")
            assert min(placements.values()) >= (1 - margin) * fallback
            assert not any(isinstance(m, CutlassLinear) for m in fast.modules())
            assert isinstance(fast, type(model)) == (record["chosen"] == "eager")
        else:
            assert times[record["chosen"]] == min(placements.values()) < (1 - margin) * fallback
        assert any(note.startswith("end-to-end check") for note in report.notes)
        assert OptimizeReport.from_dict(report.to_dict()).end_to_end == record
        kernels = {row["layer"]: row["kernel"] for row in report.rows}
        for module in fast.modules():
            if isinstance(module, CutlassLinear):
                assert bool(module.eager_shapes) == kernels[module.layer].startswith("torch")
        if record["chosen"] == "torch":
            assert all(k.startswith("torch") for k in kernels.values())


def test_cuda_graphed_optimized_model_replays_with_new_inputs():
    """cuda_graphed(optimize(...)): one capture per input signature, replays on new inputs (NaN-poisoned outputs
    before each), outputs not aliased between calls, a new shape captures a second graph, autograd calls through."""
    models = _benchmark_models()
    session = pycutlass.Session()
    with session.activate():
        model = models.MLPBlock(256, 1024).cuda().to(torch.bfloat16).eval()
        x = randn(2, 64, 256, dtype=torch.bfloat16, seed=180)
        with torch.no_grad():
            fast = pct.cuda_graphed(pct.optimize(model, (x,), tune=True, progress=False))
            outs = []
            for seed in (181, 182):
                x2 = randn(2, 64, 256, dtype=torch.bfloat16, seed=seed)
                expected = model(x2)
                poison(tuple(expected.shape), torch.bfloat16)
                outs.append(fast(x2))
                assert relative_error(outs[-1], expected) < 2e-2
            assert fast.captures == 1
            assert relative_error(outs[0], model(randn(2, 64, 256, dtype=torch.bfloat16, seed=181))) < 2e-2
            x3 = randn(1, 32, 256, dtype=torch.bfloat16, seed=183)
            assert relative_error(fast(x3), model(x3)) < 2e-2 and fast.captures == 2
        x4 = randn(2, 64, 256, dtype=torch.bfloat16, seed=184).requires_grad_(True)
        out = fast(x4)  # gradients wanted: the module runs, no graph
        assert out.requires_grad and fast.captures == 2


def test_optimize_with_cuda_graphs_replays_the_chosen_model_with_new_inputs():
    """optimize(..., cuda_graphs=True) on a host-bound stack (one short sequence, two decoder blocks): the graph
    replay is kept exactly when it timed 10% faster, and the result computes the model on new inputs (NaN-poisoned
    outputs before each call), outputs not aliased between calls."""
    models = _benchmark_models()
    session = pycutlass.Session()
    with session.activate():
        model = models.GPT2Stack(2, 256, 4).cuda().to(torch.bfloat16).eval()
        x = randn(1, 16, 256, dtype=torch.bfloat16, seed=190)
        with torch.no_grad():
            fast = pct.optimize(model, (x,), tune=True, progress=False, cuda_graphs=True)
            graphs = pct.report(fast).end_to_end["graphs"]
            assert graphs["kept"] == (graphs["graphed_ms"] < graphs["plain_ms"] * 0.90)
            assert isinstance(fast, pct.CUDAGraphed) == graphs["kept"]
            outs, expected = [], []
            for seed in (191, 192):
                x2 = randn(1, 16, 256, dtype=torch.bfloat16, seed=seed)
                expected.append(model(x2))
                poison(tuple(expected[-1].shape), torch.bfloat16)
                outs.append(fast(x2))
            for out, want in zip(outs, expected):
                assert relative_error(out, want) < 3e-2
            if graphs["kept"]:
                assert fast.captures == 1


def test_optimize_resnet50_f16_channels_last():
    models = _benchmark_models()
    session = pycutlass.Session()
    with session.activate():
        model = models.resnet50().cuda()
        with torch.no_grad():  # running statistics from random batches: activations stay in float16's range
            models.calibrate_batchnorm(model, (randn(8, 3, 224, 224, dtype=torch.float32, seed=161),))
        x = randn(8, 3, 224, 224, seed=160).contiguous(memory_format=torch.channels_last)
        with torch.no_grad():  # the reference: float64 over the same float16 input
            exact = copy.deepcopy(model).double().eval()(x.double())
        model = model.half().eval().to(memory_format=torch.channels_last)
        with torch.no_grad():
            eager = model(x)
            fast = pct.optimize(model, (x,), tune=True, progress=False)
            poison(tuple(eager.shape), torch.float16)
            out = fast(x)
        rows = pct.report(fast).rows
        assert sum(row["op"] == "conv2d" for row in rows) == 53  # every conv, BN folded in
        # 53 float16 layers drift a few percent from float64 (torch's own eager model too); folding BN into
        # float16 weights rounds once more, so allow 1.5x torch's own error plus 1%.
        assert relative_error(out, exact) < 1.5 * relative_error(eager, exact) + 1e-2
