"""pycutlass.torch without a GPU: operator registration, fake (meta) implementations, the CPU implementations and the
backward formulas (gradcheck in float64), torch.compile tracing, kernel classes and candidates, dispatch state."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import pycutlass  # noqa: E402
import pycutlass.torch as pct  # noqa: E402
from pycutlass.torch import dispatch as dispatch_module, kernels, reference  # noqa: E402
from pycutlass.torch.kernels import ConvClass, GemmClass  # noqa: E402

OPS = ("gemm", "bmm", "grouped_gemm", "conv2d", "conv2d_dgrad", "conv2d_wgrad")


def test_every_operator_is_registered_with_its_schema():
    for name in OPS:
        op = getattr(torch.ops.pycutlass, name)
        assert op.default._schema.name == f"pycutlass::{name}"
    schema = str(torch.ops.pycutlass.gemm.default._schema)
    assert "Tensor? bias=None" in schema and "str activation=\"identity\"" in schema


@pytest.mark.parametrize("activation", pct.ACTIVATIONS)
def test_cpu_gemm_matches_float64(activation):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(13, 24, generator=g), torch.randn(24, 9, generator=g)
    bias, c = torch.randn(9, generator=g), torch.randn(13, 9, generator=g)
    out = pct.gemm(a, b, bias, c, alpha=0.5, beta=2.0, activation=activation, activation_arg=0.1)
    expected = reference.activate(0.5 * a.double() @ b.double() + 2.0 * c.double() + bias.double(), activation, 0.1)
    assert out.shape == (13, 9)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_cpu_linear_bmm_grouped_conv_match_torch():
    g = torch.Generator().manual_seed(2)
    x, w, bias = torch.randn(2, 5, 16, generator=g), torch.randn(8, 16, generator=g), torch.randn(8, generator=g)
    torch.testing.assert_close(pct.linear(x, w, bias, "silu"), torch.nn.functional.silu(x @ w.t() + bias))
    a, b = torch.randn(3, 4, 6, generator=g), torch.randn(3, 6, 5, generator=g)
    torch.testing.assert_close(pct.bmm(a, b, activation="relu"), torch.relu(a @ b))
    outs = pct.grouped_gemm([a[0], a[1][:2]], [b[0], b[1]], activation="tanh")
    torch.testing.assert_close(outs[1], torch.tanh(a[1][:2] @ b[1]))
    img, weight, kb = torch.randn(2, 6, 9, 7, generator=g), torch.randn(4, 6, 3, 3, generator=g), torch.randn(4)
    out = pct.conv2d(img, weight, kb, stride=2, padding=1, activation="hardswish")
    torch.testing.assert_close(out, torch.nn.functional.hardswish(torch.nn.functional.conv2d(img, weight, kb, 2, 1)),
                               rtol=1e-5, atol=1e-5)
    assert out.is_contiguous(memory_format=torch.channels_last)


def test_fake_implementations_propagate_shapes_and_strides():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, b = torch.empty(7, 5, dtype=torch.float16), torch.empty(5, 3, dtype=torch.float16)
        out = pct.gemm(a, b)
        assert out.shape == (7, 3) and out.dtype == torch.float16
        assert pct.linear(torch.empty(2, 4, 5), torch.empty(6, 5)).shape == (2, 4, 6)
        assert pct.bmm(torch.empty(3, 7, 5), torch.empty(3, 5, 2)).shape == (3, 7, 2)
        shapes = [t.shape for t in pct.grouped_gemm([torch.empty(4, 5), torch.empty(1, 2)],
                                                    [torch.empty(5, 6), torch.empty(2, 3)])]
        assert shapes == [(4, 6), (1, 3)]
        y = pct.conv2d(torch.empty(2, 8, 15, 15), torch.empty(16, 8, 3, 3), stride=2, padding=1, dilation=1)
        assert y.shape == (2, 16, 8, 8) and y.is_contiguous(memory_format=torch.channels_last)
        dx = torch.ops.pycutlass.conv2d_dgrad(y, torch.empty(16, 8, 3, 3), [2, 8, 15, 15], [2, 2], [1, 1], [1, 1])
        assert dx.shape == (2, 8, 15, 15)
        dw = torch.ops.pycutlass.conv2d_wgrad(y, torch.empty(2, 8, 15, 15), [16, 8, 3, 3], [2, 2], [1, 1], [1, 1])
        assert dw.shape == (16, 8, 3, 3)
        with pytest.raises(Exception, match="pycutlass.gemm"):
            pct.gemm(torch.empty(7, 5), torch.empty(4, 3))


def test_opcheck_gemm_and_conv2d():
    """torch's own consistency checks: schema, fake vs real, autograd registration."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(6, 4, generator=g, requires_grad=True)
    b = torch.randn(4, 5, generator=g, requires_grad=True)
    bias = torch.randn(5, generator=g, requires_grad=True)
    torch.library.opcheck(torch.ops.pycutlass.gemm.default, (a, b, bias, None, 1.5, 0.0, "gelu", 0.0, ""))
    x = torch.randn(2, 3, 6, 6, generator=g, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, generator=g, requires_grad=True)
    torch.library.opcheck(torch.ops.pycutlass.conv2d.default, (x, w, None, [1, 1], [1, 1], [1, 1], "relu", 0.0, ""))


def test_gradcheck_float64_gemm_and_conv2d():
    g = torch.Generator().manual_seed(4)
    a = torch.randn(5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(4, 3, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(3, dtype=torch.float64, generator=g, requires_grad=True)
    c = torch.randn(5, 3, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: pct.gemm(*t, alpha=0.7, beta=0.3, activation="tanh"), (a, b, bias, c))
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(2, 3, 3, 3, dtype=torch.float64, generator=g, requires_grad=True)
    kb = torch.randn(2, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: pct.conv2d(*t, stride=2, padding=1, activation="sigmoid"), (x, w, kb))


def test_torch_compile_fullgraph_traces_the_ops():
    def block(x, w1, b1, w2):
        return pct.linear(pct.linear(x, w1, b1, activation="gelu"), w2)

    g = torch.Generator().manual_seed(5)
    args = (torch.randn(3, 8, generator=g), torch.randn(16, 8, generator=g), torch.randn(16, generator=g),
            torch.randn(4, 16, generator=g))
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(*args), block(*args))


def test_inductor_lowers_the_ops():
    """Inductor calls the ops as fallback kernels (an argument named ``kernel`` used to collide with its own)."""
    def block(x, w, b):
        return pct.linear(x, w, b, activation="relu") * 2

    g = torch.Generator().manual_seed(6)
    args = (torch.randn(6, 8, generator=g), torch.randn(4, 8, generator=g), torch.randn(4, generator=g))
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    torch.testing.assert_close(compiled(*args), block(*args))


def test_activation_and_geometry_errors_are_clear():
    with pytest.raises(ValueError, match="activation must be one of"):
        pct.gemm(torch.randn(2, 2), torch.randn(2, 2), activation="swish")
    with pytest.raises(ValueError, match="stride must be"):
        pct.conv2d(torch.randn(1, 2, 4, 4), torch.randn(2, 2, 1, 1), stride=(1, 1, 1))


# --- kernel classes and candidates (descriptions only) ----------------------------------------------------------------
def test_sm90_candidates_need_16_byte_accesses_and_fall_back_to_sm80():
    wide = GemmClass("bfloat16", True, False, 8, "gelu", True, False, 90)
    narrow = GemmClass("bfloat16", True, False, 4, "gelu", True, False, 90)
    assert wide.sm90 and not narrow.sm90
    wide_ops = [op for _, op in kernels.gemm_candidates(wide)]
    assert wide_ops and all(op.compute_capability == 90 and op.bias == "column" for op in wide_ops)
    narrow_ops = [op for _, op in kernels.gemm_candidates(narrow)]
    assert narrow_ops and all(op.compute_capability == 80 and op.A.alignment == 4 for op in narrow_ops)
    # Sm80 kernels add a bias through C: not both a bias and C
    assert kernels.gemm_candidates(GemmClass("float16", True, True, 4, "identity", True, True, 90)) == []
    assert kernels.gemm_candidates(GemmClass("float32", True, True, 4, "identity", False, False, 90)) == []
    f64 = kernels.gemm_candidates(GemmClass("float64", False, True, 1, "relu", False, False, 90))
    assert f64 and all(op.A.element is pycutlass.float64 for _, op in f64)


def test_candidate_params_rebuild_the_same_operation():
    for cls in (GemmClass("float16", True, False, 8, "relu", True, False, 90),
                GemmClass("float16", False, True, 2, "identity", False, True, 80),
                ConvClass("float16", "dgrad", 8, "identity", False, True, 90),
                ConvClass("bfloat16", "fprop", 4, "silu", True, False, 90)):
        found = kernels.gemm_candidates(cls) if isinstance(cls, GemmClass) else kernels.conv_candidates(cls)
        assert found, cls
        for params, operation in found:
            assert kernels.build(params) == operation


def test_defaults_prefer_small_tiles_for_small_problems():
    candidates = kernels.gemm_candidates(GemmClass("float16", True, False, 8, "identity", False, False, 90))
    small = kernels.default_gemm(candidates, 16, 4096)[1]
    large = kernels.default_gemm(candidates, 4096, 4096)[1]
    assert small.tile_description.threadblock_shape[0] == 64
    assert large.tile_description.threadblock_shape[0] >= 128


def test_layout_and_alignment_helpers():
    t = torch.empty(6, 8, dtype=torch.float16)
    assert dispatch_module._major(t) is True and dispatch_module._major(t.t()) is False
    assert dispatch_module._major(torch.empty(6, 16)[:, ::2]) is None
    assert dispatch_module._alignment(torch.float16, [16, 24], [0, 4096]) == 8
    assert dispatch_module._alignment(torch.float16, [16, 12], [0]) == 4
    assert dispatch_module._alignment(torch.float16, [16, 8], [2]) is None  # a 2-byte offset: no 4-byte access
    assert dispatch_module._alignment(torch.float64, [3], [8]) == 1


def test_dispatch_settings_and_state_round_trip():
    session = pycutlass.Session()
    dispatch = pct.Dispatch.of(session)
    with pytest.raises(pycutlass.ArgumentError, match="fallback must be True or False"):
        dispatch.configure(fallback="yes")
    with pytest.raises(pycutlass.ArgumentError, match="key policy"):
        dispatch.configure(policy="nearest")
    with pytest.raises(pycutlass.ArgumentError, match="not a pycutlass.torch dispatch state"):
        dispatch.import_state({"choices": []})
    params, operation = kernels.gemm_candidates(GemmClass("float16", True, False, 8, "identity", False, False, 90))[1]
    state = {"format": 1, "policy": "exact",
             "choices": {'{"k":1}': {"kernel": operation.name, "params": params, "us": 10.0, "torch_us": 11.0},
                         '{"k":2}': {"kernel": "torch", "params": None, "us": None, "torch_us": 3.0}}}
    dispatch.import_state(state)
    assert dispatch.export_state()["choices"] == state["choices"]
    other = pct.Dispatch.of(pycutlass.Session())
    other.import_state(dispatch.export_state())
    assert other._operation(operation.name, params) == operation  # rebuilt from its parameters
    assert pct.Dispatch.of(session) is dispatch and other is not dispatch  # state lives in the session


def test_a_default_candidate_compiles_with_nvrtc(tmp_path):
    """The dispatch's untuned Sm80 choice for a small f16 GEMM with bias + ReLU compiles for sm_90."""
    from pycutlass.compiler.manager import Compiler

    session = pycutlass.Session(backend="nvrtc", target=90, cache_path=str(tmp_path / "cache.db"))
    candidates = kernels.gemm_candidates(GemmClass("float16", True, False, 4, "relu", True, False, 90))
    _, operation = kernels.default_gemm(candidates, 64, 256)
    report = Compiler.of(session).add_module([operation], errors="report")
    assert not report.failures
    assert Compiler.of(session).lookup(operation) is not None


# --- dispatch defects found in review (CPU tensors: signatures, classification, fallbacks) ------------------------------
def _signatures(monkeypatch, dispatch):
    """Record the call signatures the bound-launch table is looked up with (the slow paths stubbed out)."""
    seen = []
    monkeypatch.setattr(dispatch, "_gemm_slow", lambda signature, *args: seen.append(signature))
    monkeypatch.setattr(dispatch, "_conv_slow", lambda kind, signature, *args: seen.append(signature))
    return seen


def test_signatures_tell_apart_what_the_bound_kernel_depends_on(monkeypatch):
    dispatch = pct.Dispatch.of(pycutlass.Session())
    seen = _signatures(monkeypatch, dispatch)
    h = torch.float16
    x, w = torch.empty(2, 8, 6, 6, dtype=h), torch.empty(16, 8, 3, 3, dtype=h)
    geometry = ((1, 1), (1, 1), (1, 1))
    # a weight of another dtype must not reuse an f16 launch
    dispatch.conv2d(x, w, None, *geometry, "identity", 0.0, "")
    dispatch.conv2d(x, w.to(torch.bfloat16), None, *geometry, "identity", 0.0, "")
    # nor a strided bias a contiguous bias's launch (the kernel reads K contiguous values)
    dispatch.conv2d(x, w, torch.empty(16, dtype=h), *geometry, "identity", 0.0, "")
    dispatch.conv2d(x, w, torch.empty(32, dtype=h)[::2], *geometry, "identity", 0.0, "")
    dispatch.conv2d_dgrad(x, w.permute(1, 0, 2, 3), (2, 16, 6, 6), *geometry, "")
    dispatch.conv2d_dgrad(x, w.permute(1, 0, 2, 3).to(torch.bfloat16), (2, 16, 6, 6), *geometry, "")
    dispatch.conv2d_wgrad(x, x, (8, 8, 1, 1), (1, 1), (0, 0), (1, 1), "")
    dispatch.conv2d_wgrad(x, x.to(torch.bfloat16), (8, 8, 1, 1), (1, 1), (0, 0), (1, 1), "")
    a, b = torch.empty(8, 16, dtype=h), torch.empty(16, 8, dtype=h)
    dispatch.gemm(a, b, None, None, 1.0, 0.0, "identity", 0.0, "")
    dispatch.gemm(a, b.to("meta"), None, None, 1.0, 0.0, "identity", 0.0, "")  # another device
    assert len(seen) == 10 and len(set(seen)) == 10


def _cpu_dispatch(monkeypatch, cc=80):
    dispatch = pct.Dispatch.of(pycutlass.Session())
    monkeypatch.setattr(dispatch, "_device_cc", lambda device: cc)
    dispatch._facts[cc] = {"device": "test GPU", "cc": cc}  # (local_device_facts needs a GPU)
    return dispatch


def test_conv_calls_cutlass_cannot_implement_fall_back_to_torch(monkeypatch):
    """Strided dgrad with dilation (and filters above 32x32) are CUTLASS can_implement failures: torch runs them."""
    dispatch = _cpu_dispatch(monkeypatch)
    g = torch.Generator().manual_seed(7)
    dy = torch.randn(1, 8, 4, 4, generator=g).half()
    w = torch.randn(8, 8, 3, 3, generator=g).half()
    out = dispatch.conv2d_dgrad(dy, w, (1, 8, 9, 9), (2, 2), (1, 1), (2, 2), "")
    expected = torch.nn.grad.conv2d_input([1, 8, 9, 9], w.float(), dy.float(), (2, 2), (1, 1), (2, 2))
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
    assert any("dilation" in why for why in dispatch.fallbacks)
    x = torch.randn(1, 8, 40, 40, generator=g).half()
    dispatch.conv2d(x, torch.randn(8, 8, 33, 33, generator=g).half(), None, (1, 1), (0, 0), (1, 1), "identity",
                    0.0, "")
    assert any("32" in why for why in dispatch.fallbacks)
    dispatch.configure(fallback=False)
    with pytest.raises(pycutlass.ArgumentError, match="dilation"):
        dispatch.conv2d_dgrad(dy, w, (1, 8, 9, 9), (2, 2), (1, 1), (2, 2), "")


def test_a_strided_conv_bias_falls_back(monkeypatch):
    dispatch = _cpu_dispatch(monkeypatch)
    x, w = torch.randn(1, 8, 5, 5).half(), torch.randn(8, 8, 1, 1).half()
    bias = torch.randn(16).half()[::2]
    out = dispatch.conv2d(x, w, bias, (1, 1), (0, 0), (1, 1), "identity", 0.0, "")
    torch.testing.assert_close(out.float(), torch.nn.functional.conv2d(x.float(), w.float(), bias.float()),
                               rtol=2e-2, atol=2e-2)
    assert dispatch.fallbacks == {"bias is not contiguous": 1}


def test_overrides_must_compute_what_the_call_asks(monkeypatch):
    dispatch = _cpu_dispatch(monkeypatch)
    h = torch.float16
    _, relu = kernels.gemm_candidates(GemmClass("float16", True, True, 8, "relu", False, False, 80))[0]
    name = dispatch.register_kernel(relu)
    a, b = torch.randn(8, 16).to(h), torch.randn(16, 8).to(h)
    with pytest.raises(pycutlass.ArgumentError, match="activation 'relu'"):
        dispatch.gemm(a, b, None, None, 1.0, 0.0, "identity", 0.0, name)
    _, with_bias = kernels.gemm_candidates(GemmClass("float16", True, True, 8, "identity", True, False, 80))[0]
    name = dispatch.register_kernel(with_bias)
    with pytest.raises(pycutlass.ArgumentError, match="cannot also add C"):
        dispatch.gemm(a, b, torch.randn(8).to(h), torch.randn(8, 8).to(h), 1.0, 1.0, "identity", 0.0, name)
    _, fprop = kernels.conv_candidates(ConvClass("float16", "fprop", 8, "identity", False, True, 80))[0]
    name = dispatch.register_kernel(fprop)
    x, w = torch.randn(1, 8, 5, 5).to(h), torch.randn(8, 8, 3, 3).to(h)
    with pytest.raises(pycutlass.ArgumentError, match="dgrad"):
        dispatch.conv2d_dgrad(x, w, (1, 8, 5, 5), (1, 1), (1, 1), (1, 1), name)


def test_no_candidates_before_sm80():
    assert kernels.gemm_candidates(GemmClass("float16", True, True, 8, "identity", False, False, 75)) == []
    assert kernels.conv_candidates(ConvClass("float16", "fprop", 8, "identity", False, True, 75)) == []


def test_nearest_tuned_shape_comes_from_this_device():
    from pycutlass.tune.autotune import tuning_key

    dispatch = pct.Dispatch.of(pycutlass.Session())
    dispatch._facts[90] = {"device": "this GPU", "cc": 90}
    cls = GemmClass("float16", True, True, 8, "identity", False, False, 90)
    elsewhere = tuning_key({"device": "another GPU", "cc": 90}, cls.signature(), (64, 64, 64), "exact")
    dispatch._choices[elsewhere] = {"kernel": "elsewhere", "params": None}
    assert dispatch._nearest(cls, (64, 64, 64)) is None
    here = tuning_key(dispatch._facts_of(cls), cls.signature(), (128, 64, 64), "exact")
    dispatch._choices[here] = {"kernel": "here", "params": None}
    assert dispatch._nearest(cls, (64, 64, 64))["kernel"] == "here"


def test_the_direct_path_steps_aside_for_functorch_transforms(monkeypatch):
    """Under vmap a plain-looking tensor is a batched wrapper: the call must go through torch.ops (its CPU kernel
    here), never straight to the CUDA dispatch."""
    from pycutlass.torch import ops

    monkeypatch.setattr(ops, "_engine", lambda: pytest.fail("the direct path ran under vmap"))
    seen = []

    def f(x):
        seen.append(ops._direct(x))
        return x

    torch.func.vmap(f)(torch.randn(3, 2))
    assert seen == [False]


def test_calls_that_cannot_be_bound_are_counted_per_operation():
    session = pycutlass.Session()
    dispatch = pct.Dispatch.of(session)
    operation = type("Op", (), {"name": "pycutlass_gemm_x"})()
    assert dispatch.unbound_calls == {}
    dispatch._remember(("sig",), operation, None)  # Params that cannot be patched: the next call builds again
    dispatch._remember(("sig",), operation, None)
    assert dispatch.unbound_calls == {"pycutlass_gemm_x": 2} and ("sig",) not in dispatch._bound


@pytest.mark.parametrize("activation", [a for a in pct.ACTIVATIONS if a != "leaky_relu"])
def test_torch_reference_activations_agree_with_the_float64_formulas(activation):
    """The torch ops' reference (torch's functions, e.g. gelu(approximate="tanh") for gelu_taylor) and the
    descriptions' float64 numpy formulas (what the kernel suites compare against) are the same functions."""
    from pycutlass.epilogue.activations import reference as numpy_reference

    x = torch.linspace(-6.0, 6.0, 241, dtype=torch.float64)
    torch.testing.assert_close(reference.activate(x, activation), torch.from_numpy(numpy_reference(activation,
                                                                                                      x.numpy())),
                               rtol=1e-12, atol=1e-12)
