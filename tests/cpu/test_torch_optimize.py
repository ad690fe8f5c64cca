"""The model pass on the CPU: which layers it fuses, that the fused model computes what the original does (the ops
run torch's math here), BatchNorm folding, save/load, and the tuning plumbing against a fake dispatch."""
from __future__ import annotations

import contextlib
import json
import types
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pycutlass.torch.ops as torch_ops  # noqa: E402
from pycutlass.errors import ArgumentError  # noqa: E402
from pycutlass.torch.model_pass import (CutlassConv2d, CutlassLinear, OptimizeReport, load, optimize,  # noqa: E402
                                      report, save)


# --- models 
class MLP(nn.Module):
    """Linear+GELU (module), Linear+ReLU (F.relu), Linear+relu (method), Linear+GELU(tanh) (gelu_taylor)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act1 = nn.Linear(16, 32), nn.GELU()
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 24, bias=False)
        self.fc4, self.act4 = nn.Linear(24, 8), nn.GELU(approximate="tanh")

    def forward(self, x):
        x = self.act1(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = self.fc3(x).relu()
        return self.act4(self.fc4(x))


class ConvNet(nn.Module):
    """Conv+BN+ReLU, Conv+SiLU, F.conv2d+leaky_relu, then a view of NCHW code and a Linear."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                                      nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.SiLU(),
                                      nn.MaxPool2d(2))
        self.proj = nn.Module()
        self.proj.weight = nn.Parameter(torch.randn(8, 16, 1, 1) * 0.2)
        self.proj.bias = nn.Parameter(torch.randn(8))
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = self.features(x)
        x = F.leaky_relu(F.conv2d(x, self.proj.weight, self.proj.bias), 0.2)
        x = x.view(x.size(0), -1)  # fails on channels_last unless the pass makes it contiguous
        return self.fc(x)


class SharedBN(nn.Module):
    """The conv's output feeds the BN and a residual add: folding would change the add's input."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(self.bn(y)) + y


class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.depthwise = nn.Conv2d(4, 4, 3, groups=4)
        self.reflect = nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")
        self.same = nn.Conv2d(4, 4, 3, padding="same")

    def forward(self, x):
        return self.same(self.reflect(x)) + 0, self.depthwise(x)


def randomize_batchnorm(model: nn.Module) -> nn.Module:
    """Non-trivial running statistics and affine parameters, so folding is really tested."""
    generator = torch.Generator().manual_seed(1)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            n = module.num_features
            module.running_mean.copy_(torch.rand(n, generator=generator) * 2 - 1)
            module.running_var.copy_(torch.rand(n, generator=generator) * 2 + 0.5)
            module.weight.data.copy_(torch.rand(n, generator=generator) + 0.5)
            module.bias.data.copy_(torch.rand(n, generator=generator) - 0.5)
    return model


def fused(model) -> dict[str, str]:
    """layer -> pattern of every fused module."""
    return {m.layer: m.pattern for m in model.modules() if isinstance(m, (CutlassLinear, CutlassConv2d))}


def assert_close(actual, expected):
    for a, e in zip(actual if isinstance(actual, tuple) else (actual,),
                    expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


# --- matching and equivalence 
def test_mlp_fuses_every_spelling_of_the_activation():
    model = MLP().eval()
    x = torch.randn(5, 3, 16)
    optimized = optimize(model, (x,), tune=False)
    assert fused(optimized) == {"fc1": "linear+gelu", "fc2": "linear+relu", "fc3": "linear+relu",
                                "fc4": "linear+gelu_taylor"}  # GELU(approximate="tanh") is CUTLASS's GELU_taylor
    assert not hasattr(optimized, "act1") and not hasattr(optimized, "act4")  # fused and dropped
    assert_close(optimized(x), model(x))
    assert isinstance(model.fc1, nn.Linear)  # the original model is unchanged


def test_convnet_folds_batchnorm_and_keeps_views_working():
    model = randomize_batchnorm(ConvNet()).eval()
    x = torch.randn(2, 3, 16, 16)
    optimized = optimize(model, x, tune=False)
    assert fused(optimized) == {"features.0": "conv2d+bn+relu", "features.3": "conv2d+silu",
                                "proj": "conv2d+leaky_relu", "fc": "linear"}
    conv = optimized.get_submodule("features.0")
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in optimized.modules())
    assert "proj.weight" not in dict(optimized.named_parameters())  # only the fused module holds it now
    assert_close(optimized(x), model(x))
    assert model.features[1].running_mean.abs().sum() > 0 and isinstance(model.features[0], nn.Conv2d)


def test_functional_leaky_relu_slope_goes_to_the_epilogue():
    model = ConvNet().eval()
    optimized = optimize(model, torch.randn(1, 3, 16, 16), tune=False)
    (proj,) = [m for m in optimized.modules() if getattr(m, "layer", None) == "proj"]
    assert (proj.activation, proj.activation_arg) == ("leaky_relu", pytest.approx(0.2))


def test_conv_output_with_two_users_keeps_its_batchnorm():
    model = randomize_batchnorm(SharedBN()).eval()
    x = torch.randn(2, 4, 8, 8)
    optimized = optimize(model, x, tune=False)
    assert fused(optimized) == {"conv": "conv2d"}
    assert isinstance(optimized.bn, nn.BatchNorm2d)
    assert_close(optimized(x), model(x))


def test_training_mode_does_not_fold_batchnorm():
    model = randomize_batchnorm(ConvNet()).train()
    x = torch.randn(2, 3, 16, 16)
    optimized = optimize(model, x, tune=False)
    assert fused(optimized)["features.0"] == "conv2d"  # the BN (and so the ReLU behind it) stay
    assert isinstance(optimized.get_submodule("features.1"), nn.BatchNorm2d) and optimized.training
    assert any("not folded (training mode" in note for note in report(optimized).notes)
    bn = optimized.get_submodule("features.1")
    assert torch.equal(bn.running_mean, model.features[1].running_mean)  # the pass's forwards updated no stats
    optimized.eval(), model.eval()
    assert_close(optimized(x), model(x))


def test_fold_batchnorm_false_keeps_batchnorm():
    model = randomize_batchnorm(ConvNet()).eval()
    optimized = optimize(model, torch.randn(1, 3, 16, 16), tune=False, fold_batchnorm=False)
    assert fused(optimized)["features.0"] == "conv2d"


def test_unsupported_convs_are_left_to_torch_and_reported():
    model = Unsupported().eval()
    x = torch.randn(1, 4, 8, 8)
    optimized = optimize(model, x, tune=False)
    assert fused(optimized) == {"same": "conv2d"}
    reasons = {s["layer"]: s["reason"] for s in report(optimized).skipped}
    assert "groups=4" in reasons["depthwise"] and "padding_mode='reflect'" in reasons["reflect"]
    assert optimized.get_submodule("same").padding == (1, 1)  # 'same' with an odd kernel is symmetric
    assert_close(optimized(x), model(x))


def test_computed_weights_and_unbatched_inputs_are_left_to_torch():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 8))
            self.conv = nn.Conv2d(3, 3, 1)

        def forward(self, x, image):
            return F.linear(x, self.w.t()), self.conv(image[0]), self.conv(image)

    model = Odd()
    inputs = (torch.randn(2, 8), torch.randn(1, 3, 4, 4))
    optimized = optimize(model, inputs, tune=False)
    reasons = [s["reason"] for s in report(optimized).skipped]
    assert any("computed in the graph" in r for r in reasons) and any("3-D" in r for r in reasons)
    # the conv is still called unfused once: the fused call gets a module of its own
    assert isinstance(optimized.conv, nn.Conv2d) and isinstance(optimized.conv_cutlass, CutlassConv2d)
    assert_close(optimized(*inputs), model(*inputs))


def test_a_module_called_twice_with_different_fusions_gets_two_modules():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return torch.sigmoid(self.fc(x)) + self.fc(x)

    model = Twice()
    x = torch.randn(3, 8)
    optimized = optimize(model, x, tune=False)
    patterns = sorted(m.pattern for m in optimized.modules() if isinstance(m, CutlassLinear))
    assert patterns == ["linear+residual", "linear+sigmoid"]  # the second call adds the first's result as C
    assert_close(optimized(x), model(x))


def test_graph_module_input_is_not_modified():
    traced = torch.fx.symbolic_trace(MLP().eval())
    code = traced.code
    optimized = optimize(traced, torch.randn(2, 16), tune=False)
    assert traced.code == code and len(fused(optimized)) == 4


def test_report_table_lists_every_fused_layer():
    optimized = optimize(MLP().eval(), torch.randn(4, 16), tune=True)  # CPU model: tuning is skipped
    rep = report(optimized)
    assert [r["layer"] for r in rep.rows] == ["fc1", "fc2", "fc3", "fc4"]
    assert rep.rows[0]["shape"] == "M=4 N=32 K=16 float32" and rep.rows[0]["kernel"] == "-"
    assert any("not tuned" in n for n in rep.notes)
    text = str(rep)
    assert "linear+gelu" in text and "fc4" in text and "cutlass_us" in text
    assert OptimizeReport.from_dict(json.loads(json.dumps(rep.to_dict()))) == rep


def test_bad_arguments_are_typed_errors():
    with pytest.raises(ArgumentError, match="torch.nn.Module"):
        optimize(lambda x: x, torch.randn(2))
    with pytest.raises(ArgumentError, match="example_inputs"):
        optimize(MLP(), torch.randn(2, 3), tune=False)  # 3 features where fc1 wants 16
    with pytest.raises(ArgumentError, match="no pycutlass report"):
        report(MLP())


# --- tuning plumbing (fake dispatch: no GPU here) 
@dataclass
class FakeCall:
    op: str
    layer: str | None
    key: tuple = ()

    def describe(self) -> str:
        return f"{self.op} call"


@dataclass
class FakeChoice:
    call: FakeCall
    kernel: str
    cutlass_us: float | None
    torch_us: float | None


@dataclass
class FakeDispatch:
    layer: str = ""
    calls: list = field(default_factory=list)
    collecting_now: bool = False
    state: dict = field(default_factory=lambda: {"choices": {"k1": "cutlass_gemm_x"}})
    imported: list = field(default_factory=list)
    by_layer: dict | None = None  # layer -> (kernel, cutlass_us, torch_us); default: torch for convs, else a kernel

    @contextmanager
    def collecting(self):
        self.collecting_now = True
        try:
            yield self
        finally:
            self.collecting_now = False

    def tune_calls(self, calls, jobs=None, progress=True, prefer_faster=True, max_compiles="auto", timed=None):
        self.tuned = (list(calls), jobs, progress, prefer_faster)
        if timed is not None:
            with timed("compile"):
                pass
        self.max_compiles = max_compiles
        if self.by_layer is not None:
            return [FakeChoice(call, *self.by_layer[call.layer]) for call in calls]
        return [FakeChoice(call, "torch" if call.op == "conv2d" else "cutlass_gemm_x", 20.0, 10.0 if
                           call.op == "conv2d" else 30.0) for call in calls]

    def export_state(self):
        return self.state

    def import_state(self, state):
        self.imported.append(state)


def recording(dispatch: FakeDispatch, monkeypatch):
    """The real ops record (op, current layer) while the fake dispatch collects, as Dispatch does on CUDA."""
    for name, op in (("linear", "gemm"), ("conv2d", "conv2d")):
        real = getattr(torch_ops, name)

        def wrapper(*args, _real=real, _op=op, **kwargs):
            if dispatch.collecting_now:
                dispatch.calls.append(FakeCall(_op, dispatch.layer))
            return _real(*args, **kwargs)

        monkeypatch.setattr(torch_ops, name, wrapper)


def test_tuning_records_each_call_with_its_layer(monkeypatch):
    import importlib

    module = importlib.import_module("pycutlass.torch.model_pass")
    monkeypatch.setattr(module, "_on_cuda", lambda gm, inputs: True)  # as if model and inputs were on CUDA
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    dispatch = FakeDispatch()
    recording(dispatch, monkeypatch)
    model = randomize_batchnorm(ConvNet()).eval()
    optimized = optimize(model, torch.randn(2, 3, 16, 16), dispatch=dispatch, jobs=3, progress=False,
                         end_to_end=False)
    calls, jobs, progress, prefer_faster = dispatch.tuned
    assert [c.layer for c in calls] == ["features.0", "features.3", "proj", "fc"]
    assert (jobs, progress, prefer_faster, dispatch.max_compiles) == (3, False, True, "auto")
    optimize(model, torch.randn(2, 3, 16, 16), dispatch=dispatch, max_compiles=None, progress=False,
             end_to_end=False)
    assert dispatch.max_compiles is None
    rows = {r["layer"]: r for r in report(optimized).rows}
    assert rows["fc"]["kernel"] == "cutlass_gemm_x" and rows["fc"]["speedup"] == pytest.approx(1.5)
    assert rows["proj"]["kernel"] == "torch" and rows["proj"]["speedup"] == pytest.approx(0.5)
    assert dispatch.layer == ""  # the hooks reset it after each fused module
    # where the time went: the pass's own phases and the dispatch's, in the order they ran
    seconds = report(optimized).seconds
    assert list(seconds) == ["trace", "record", "compile"] and all(s >= 0.0 for s in seconds.values())
    assert "time: trace " in str(report(optimized))
    assert OptimizeReport.from_dict(report(optimized).to_dict()).seconds == seconds


def test_layers_tuned_to_torch_call_torch_directly_for_that_shape(monkeypatch):
    import importlib

    module = importlib.import_module("pycutlass.torch.model_pass")
    monkeypatch.setattr(module, "_on_cuda", lambda gm, inputs: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    dispatch = FakeDispatch()  # chooses torch for every conv, a kernel for every linear
    recording(dispatch, monkeypatch)
    model = randomize_batchnorm(ConvNet()).eval()
    x = torch.randn(2, 3, 16, 16)
    optimized = optimize(model, x, dispatch=dispatch, progress=False, end_to_end=False)
    convs = [m for m in optimized.modules() if isinstance(m, CutlassConv2d)]
    linears = [m for m in optimized.modules() if isinstance(m, CutlassLinear)]
    assert convs and all(len(m.eager_shapes) == 1 for m in convs)
    assert linears and all(not m.eager_shapes for m in linears)
    assert (2, 3, 16, 16) in convs[0].eager_shapes

    def no_dispatch(*args, **kwargs):
        raise AssertionError("a layer tuned to torch went through the dispatch")

    monkeypatch.setattr(torch_ops, "conv2d", no_dispatch)
    with torch.no_grad():
        assert_close(optimized(x), model(x))
        with pytest.raises(AssertionError, match="went through the dispatch"):  # another shape: the dispatch
            optimized(torch.randn(1, 3, 16, 16))


# --- save / load 
def test_save_load_round_trip(tmp_path):
    model = randomize_batchnorm(ConvNet()).eval()
    x = torch.randn(2, 3, 16, 16)
    optimized = optimize(model, x, tune=False)
    dispatch = FakeDispatch()
    save(optimized, tmp_path / "saved", dispatch=dispatch)
    saved = json.loads((tmp_path / "saved" / "pycutlass-torch.json").read_text())
    assert saved["dispatch"] == dispatch.state and len(saved["report"]["rows"]) == 4

    other = FakeDispatch(state={})
    loaded = load(tmp_path / "saved", map_location="cpu", dispatch=other)
    assert other.imported == [dispatch.state]
    assert torch.equal(loaded(x), optimized(x))
    assert fused(loaded) == fused(optimized) and report(loaded).rows == report(optimized).rows
    assert loaded.get_submodule("features.0").weight.is_contiguous(memory_format=torch.channels_last)


def test_load_names_what_is_missing(tmp_path):
    with pytest.raises(ArgumentError, match="pycutlass-torch.json"):
        load(tmp_path, dispatch=FakeDispatch())


def test_save_load_with_the_session_dispatch(tmp_path):
    pytest.importorskip("pycutlass.torch.dispatch")
    model = MLP().eval()
    x = torch.randn(2, 16)
    optimized = optimize(model, x, tune=False)
    save(optimized, tmp_path)
    assert torch.equal(load(tmp_path)(x), optimized(x))


class SeparateBias(nn.Module):
    """A bias added after the layer (a parameter of its own): fused as the layer's bias; a (K,) vector added to a
    conv's NCHW output broadcasts along W, not over channels, and must stay as it is."""

    def __init__(self):
        super().__init__()
        self.w1, self.b1 = nn.Parameter(torch.randn(12, 8)), nn.Parameter(torch.randn(12))
        self.conv = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.conv_bias = nn.Parameter(torch.randn(1, 6, 1, 1))
        self.bn = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 5, 1, bias=False)
        self.along_w = nn.Parameter(torch.randn(5))

    def forward(self, x, image):
        y = torch.relu(F.linear(x, self.w1) + self.b1)
        z = self.bn(self.conv(image) + self.conv_bias).relu()
        return y, self.conv2(z) + self.along_w


def test_a_following_bias_add_is_fused_with_the_layer():
    model = randomize_batchnorm(SeparateBias()).eval()
    x, image = torch.randn(4, 8), torch.randn(2, 3, 5, 5)
    optimized = optimize(model, (x, image), tune=False)
    assert fused(optimized) == {"linear": "linear+bias+relu", "conv": "conv2d+bias+bn+relu", "conv2": "conv2d"}
    assert_close(optimized(x, image), model(x, image))


class Residual(nn.Module):
    """``x + linear(...)`` in both operand orders (fused: C in the epilogue), after an activation (not fused: the
    epilogue adds C before the activation) and with a broadcast operand (not fused: C is one value per element)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.fc1, self.fc2, self.fc3, self.fc4 = (nn.Linear(16, 16) for _ in range(4))

    def forward(self, x):
        x = x + self.fc1(self.norm(x))
        x = self.fc2(x) + x
        x = F.gelu(self.fc3(x)) + x
        return self.fc4(x) + x.mean(0, keepdim=True)


def test_a_following_residual_add_goes_into_the_epilogue():
    model = Residual().eval()
    x = torch.randn(3, 5, 16)
    optimized = optimize(model, (x,), tune=False)
    assert fused(optimized) == {"fc1": "linear+residual", "fc2": "linear+residual", "fc3": "linear+gelu",
                                "fc4": "linear"}
    adds = [n for n in optimized.graph.nodes if n.op == "call_function" and "add" in str(n.target)]
    assert len(adds) == 2  # the adds after GELU and of the broadcast mean stay
    assert_close(optimized(x), model(x))
    # the layer's torch path (a shape tuned to torch) computes the same
    layer = optimized.get_submodule("fc1")
    h, r = torch.randn(3, 5, 16), torch.randn(3, 5, 16)
    fast = layer(h, r)
    layer.eager_shapes.add(h.shape)
    assert_close(layer(h, r), fast)
    assert_close(fast, F.linear(h, layer.weight, layer.bias) + r)


def test_linear_residual_must_have_the_output_shape():
    with pytest.raises(ValueError, match="residual must have the output's shape"):
        torch_ops.linear(torch.randn(4, 8), torch.randn(6, 8), residual=torch.randn(1, 6))


def test_cuda_graphed_passes_cpu_and_gradient_calls_through():
    from pycutlass.torch import CUDAGraphed, cuda_graphed

    model = Residual().eval()
    wrapped = cuda_graphed(optimize(model, (torch.randn(2, 3, 16),), tune=False))
    assert isinstance(wrapped, CUDAGraphed)
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        assert_close(wrapped(x), model(x))  # CPU tensors: no graph, the module itself runs
    assert wrapped.captures == 0
    for bad in ({"max_graphs": 0}, {"warmup": -1}, {"warmup": True}):
        with pytest.raises(ArgumentError):
            cuda_graphed(model, **bad)
    with pytest.raises(ArgumentError, match="torch.nn.Module"):
        cuda_graphed(lambda x: x)


# --- the torch-bound launch plan 
@pytest.mark.parametrize("activation,with_residual,dims", [("gelu", False, 3), ("identity", True, 3),
                                                          ("leaky_relu", True, 2)])
def test_a_plan_bound_to_torch_calls_torch_itself_with_the_dispatchs_math(monkeypatch, activation, with_residual,
                                                                          dims):
    """A launch-less plan (the dispatch bound the signature to torch) skips ops.linear; the result is what the
    dispatch computes for a torch-bound signature, bit for bit, and the full path's result within rounding."""
    from pycutlass.torch.dispatch import TORCH, Dispatch, _gemm_signature

    layer = CutlassLinear(nn.Parameter(torch.randn(12, 16)), nn.Parameter(torch.randn(12)), activation, 0.1)
    shape = (3, 5, 16) if dims == 3 else (15, 16)
    x = torch.randn(shape)
    residual = torch.randn(*shape[:-1], 12) if with_residual else None
    with torch.no_grad():
        full = layer(x, residual)  # CPU: ops.linear, no plan
    assert not layer._plans
    dispatch = Dispatch.current()
    key = (x.shape, residual is None, layer.kernel, layer.activation, layer.activation_arg)
    layer._plans[key] = torch_ops.LinearPlan(dispatch, None, x, layer.weight, layer.bias, residual)

    def full_path(*args, **kwargs):
        raise AssertionError("a torch-bound plan went through ops.linear")

    monkeypatch.setattr(torch_ops, "linear", full_path)
    with torch.no_grad():
        fast = layer(x, residual)
    assert_close(fast, full)
    # the dispatch's own answer for a signature bound to torch
    rows, c = x.reshape(-1, 16), None if residual is None else residual.reshape(-1, 12)
    args = (rows, layer.weight.t(), layer.bias, c, 1.0, 0.0 if c is None else 1.0, activation, 0.1, "")
    monkeypatch.setitem(dispatch._bound, _gemm_signature(*args), TORCH)
    with torch.no_grad():
        assert torch.equal(fast, dispatch.gemm(*args).reshape(fast.shape))

    # another signature (strides) or stale bindings: the full path
    with pytest.raises(AssertionError, match="went through ops.linear"):
        layer(x.mT.contiguous().mT, residual)
    monkeypatch.setattr(dispatch, "generation", dispatch.generation + 1)
    with pytest.raises(AssertionError, match="went through ops.linear"):
        layer(x, residual)


# --- the end-to-end check (fake dispatch and timer: no GPU here) 
class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3, self.fc4 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 16), \
            nn.Linear(16, 8)

    def forward(self, x):
        return self.fc4(self.fc3(F.relu(self.fc2(self.fc1(x)))))


# fc1: a clear kernel win; fc2: a small one, but the kernel fuses the ReLU; fc3: a small win, nothing fused; fc4: torch
TOWER_CHOICES = {"fc1": ("k1", 10.0, 15.0), "fc2": ("k2", 10.0, 10.2), "fc3": ("k3", 10.0, 10.2),
                 "fc4": ("torch", 12.0, 10.0)}


def _model_pass():
    import importlib

    return importlib.import_module("pycutlass.torch.model_pass")


def _measure():
    import importlib

    return importlib.import_module("pycutlass.torch.measure")


def tuned_on_cuda(monkeypatch, model, x, times=None, **kwargs):
    """optimize on a faked CUDA with TOWER_CHOICES and a fake timer returning ``times`` (name -> ms); returns the
    result and what the timer saw: {name: {layer: eager shapes after prepare}}."""
    module = _model_pass()
    monkeypatch.setattr(module, "_on_cuda", lambda gm, inputs: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    seen = {}

    def timer(entries, sync):
        for name, (prepare, forward) in entries.items():
            prepare()
            forward()
            seen[name] = {m.layer: set(m.eager_shapes) for m in optimized_modules}
        return dict(times)

    optimized_modules = []
    real_choose = module._choose_end_to_end

    def choose(gm, model, example_inputs, sites, **kwargs):
        optimized_modules.extend(m for m in gm.modules() if isinstance(m, CutlassLinear))
        return real_choose(gm, model, example_inputs, sites, timer=timer, **kwargs)

    monkeypatch.setattr(module, "_choose_end_to_end", choose)
    dispatch = FakeDispatch(by_layer=TOWER_CHOICES)
    recording(dispatch, monkeypatch)
    return optimize(model, x, dispatch=dispatch, progress=False, **kwargs), seen


def eager_layers(model) -> set[str]:
    return {m.layer for m in model.modules() if isinstance(m, CutlassLinear) and m.eager_shapes}


def test_end_to_end_candidates_and_their_placements(monkeypatch):
    x = torch.randn(4, 16)
    times = {"eager": 1.0, "tuned": 1.2, "selective": 1.1, "torch": 1.05, "traced": 1.2}
    optimized, seen = tuned_on_cuda(monkeypatch, Tower().eval(), x, times)
    shape = {(4, 16), (4, 32)}
    # the original model first, then each placement, then the plain trace, then eager again (the A/A control)
    assert list(seen) == ["eager", "tuned", "selective", "torch", "traced", "eager (control)"]
    on_torch = {name: {layer for layer, shapes in placed.items() if shapes} for name, placed in seen.items()
                if name not in ("eager", "traced", "eager (control)")}
    assert on_torch == {"tuned": {"fc4"}, "selective": {"fc3", "fc4"}, "torch": {"fc1", "fc2", "fc3", "fc4"}}
    assert all(shapes <= shape for placed in seen.values() for shapes in placed.values())


@pytest.mark.parametrize("times,chosen,layers", [
    ({"eager": 1.2, "tuned": 1.2, "selective": 1.1, "torch": 1.05, "traced": 1.2}, "torch",
     {"fc1", "fc2", "fc3", "fc4"}),
    ({"eager": 1.0, "tuned": 0.8, "selective": 0.9, "torch": 1.05, "traced": 1.0}, "tuned", {"fc4"}),
    ({"eager": 1.0, "tuned": 0.9, "selective": 0.85, "torch": 1.05, "traced": 1.0}, "selective", {"fc3", "fc4"}),
])
def test_end_to_end_keeps_the_fastest_placement_and_reports_it(monkeypatch, tmp_path, times, chosen, layers):
    model = Tower().eval()
    x = torch.randn(4, 16)
    optimized, _ = tuned_on_cuda(monkeypatch, model, x, times)
    assert eager_layers(optimized) == layers
    with torch.no_grad():
        assert_close(optimized(x), model(x))
    found = report(optimized)
    assert found.end_to_end == {"eager_ms": times["eager"],
                                "candidates": {k: v for k, v in times.items() if k != "eager"}, "chosen": chosen,
                                "margin": 0.02}  # an injected timer reports no control noise: the 2% floor
    kernels = {row["layer"]: row["kernel"] for row in found.rows}
    moved = layers - {"fc4"}
    assert kernels == {layer: "torch (end-to-end)" if layer in moved else TOWER_CHOICES[layer][0]
                       for layer in TOWER_CHOICES}
    assert all(row["tuned_kernel"] == TOWER_CHOICES[row["layer"]][0] for row in found.rows if row["layer"] in moved)
    note = found.notes[-1]
    assert note.startswith("end-to-end check") and f"kept {chosen!r}" in note and f"eager {times['eager']:.3f}" in note
    assert "torch (end-to-end)" in found.table() or not moved
    again = OptimizeReport.from_dict(json.loads(json.dumps(found.to_dict())))
    assert again == found
    save(optimized, tmp_path, dispatch=FakeDispatch())
    loaded = load(tmp_path, dispatch=FakeDispatch())
    assert report(loaded).end_to_end == found.end_to_end and eager_layers(loaded) == layers


@pytest.mark.parametrize("times,chosen", [
    ({"eager": 1.0, "tuned": 0.99, "selective": 1.0, "torch": 1.05, "traced": 1.0}, "eager"),  # within 2%
    ({"eager": 1.0, "tuned": 0.8, "selective": 0.9, "torch": 1.05, "traced": 0.99}, "tuned"),
    ({"eager": 1.0, "tuned": 0.99, "selective": 1.0, "torch": 1.05, "traced": 0.93}, "eager"),  # traced: not 10%
    ({"eager": 1.0, "tuned": 0.85, "selective": 1.0, "torch": 1.05, "traced": 0.8}, "traced"),  # beats eager by 10%
    ({"eager": 1.0, "tuned": 1.2, "selective": 1.1, "torch": 1.05, "traced": 0.85}, "traced"),
])
def test_end_to_end_falls_back_to_torch_when_no_placement_clearly_wins(monkeypatch, tmp_path, times, chosen):
    model = Tower().eval()
    x = torch.randn(4, 16)
    optimized, _ = tuned_on_cuda(monkeypatch, model, x, times)
    found = report(optimized)
    assert found.end_to_end["chosen"] == chosen
    if chosen == "tuned":
        assert eager_layers(optimized) == {"fc4"}
        return
    if chosen == "eager":  # a shallow copy of the model: its class, its layers, and the report on the copy only
        assert type(optimized) is Tower and optimized is not model and not hasattr(model, "pycutlass_report")
        optimized.extra = nn.ReLU()
        assert "extra" not in dict(model.named_children())
    else:
        assert isinstance(optimized, torch.fx.GraphModule)
    assert not any(isinstance(m, CutlassLinear) for m in optimized.modules())  # torch only
    assert optimized.fc1 is model.fc1  # sharing the model's layers
    with torch.no_grad():
        assert_close(optimized(x), model(x))
    assert {row["layer"]: row["kernel"] for row in found.rows} == {"fc1": "torch (end-to-end)",
                                                                   "fc2": "torch (end-to-end)",
                                                                   "fc3": "torch (end-to-end)", "fc4": "torch"}
    assert f"kept {chosen!r}" in found.notes[-1] and "torch only" in found.notes[-1]
    save(optimized, tmp_path, dispatch=FakeDispatch())
    loaded = load(tmp_path, dispatch=FakeDispatch())
    assert report(loaded).end_to_end == found.end_to_end
    with torch.no_grad():
        assert_close(loaded(x), model(x))


@pytest.mark.parametrize("noise,chosen", [(0.01, "tuned"), (0.024, "tuned"), (0.03, "eager"), (0.06, "eager")])
def test_the_control_noise_raises_the_margin_a_placement_must_beat(monkeypatch, noise, chosen):
    """eager timed against itself strays ``noise`` a round: a 5% lead counts only where twice that is below 5%."""
    module = _model_pass()
    times = {"eager": 1.0, "tuned": 0.95, "selective": 1.0, "torch": 1.05, "traced": 1.0, "eager (control)": 1.0}

    def timed(entries, sync, spread=None):
        assert "eager (control)" in entries and entries["eager (control)"] == entries["eager"]
        spread.update({name: noise for name in entries})
        return {name: times[name] for name in entries}

    monkeypatch.setattr(_measure(), "_time_interleaved", timed)  # the check's timer, where the check runs
    monkeypatch.setattr(module, "_on_cuda", lambda gm, inputs: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    dispatch = FakeDispatch(by_layer=TOWER_CHOICES)
    recording(dispatch, monkeypatch)
    optimized = optimize(Tower().eval(), torch.randn(4, 16), dispatch=dispatch, progress=False)
    record = report(optimized).end_to_end
    assert record["chosen"] == chosen and record["noise"] == noise and record["margin"] == max(0.02, 2 * noise)
    assert f"strays {noise:.1%} a round" in report(optimized).notes[-1]


def test_end_to_end_false_skips_the_check(monkeypatch):
    def no_timer(*args, **kwargs):
        raise AssertionError("timed although end_to_end=False")

    monkeypatch.setattr(_measure(), "_time_interleaved", no_timer)
    optimized, seen = tuned_on_cuda(monkeypatch, Tower().eval(), torch.randn(4, 16), end_to_end=False)
    assert not seen and report(optimized).end_to_end is None and eager_layers(optimized) == {"fc4"}
    assert not any(n.startswith("end-to-end") for n in report(optimized).notes)
    with pytest.raises(ArgumentError, match="end_to_end"):
        optimize(Tower(), torch.randn(4, 16), end_to_end=1)


def test_duplicate_placements_are_timed_once():
    module = _model_pass()
    layer = CutlassLinear(nn.Parameter(torch.randn(8, 8)), None)
    sites = [module._Site(layer, (2, 8), FakeChoice(FakeCall("gemm", ""), "torch", 5.0, 4.0))]
    assert module._end_to_end_candidates(sites) == {"tuned": frozenset({(layer, (2, 8))})}
    sites = [module._Site(layer, (2, 8), FakeChoice(FakeCall("gemm", ""), "k", 5.0, 10.0))]
    assert list(module._end_to_end_candidates(sites)) == ["tuned", "torch"]  # selective is the tuned one
    sites = [module._Site(layer, (2, 8), FakeChoice(FakeCall("gemm", ""), "-", None, 10.0))]
    assert list(module._end_to_end_candidates(sites)) == ["tuned", "torch"]  # selective is the torch one


def test_an_interrupted_check_leaves_the_tuned_placement():
    module = _model_pass()
    layer = CutlassLinear(nn.Parameter(torch.randn(8, 8)), None)
    sites = [module._Site(layer, (2, 8), FakeChoice(FakeCall("gemm", ""), "k", 5.0, 5.1))]

    def interrupted(entries, sync):
        entries["torch"][0]()
        assert layer.eager_shapes == {(2, 8)}
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        module._choose_end_to_end(nn.Identity(), nn.Identity(), (torch.randn(2, 8),), sites, timer=interrupted)
    assert layer.eager_shapes == set()


def test_the_interleaved_timer_runs_every_entry_each_round():
    module = _model_pass()
    calls = {"a": [0, 0], "b": [0, 0]}
    syncs = []

    def entry(name):
        return (lambda: calls[name].__setitem__(0, calls[name][0] + 1),
                lambda: calls[name].__setitem__(1, calls[name][1] + 1))

    medians = module._time_interleaved({"a": entry("a"), "b": entry("b")}, lambda: syncs.append(1), rounds=3,
                                       round_s=0.001)
    assert set(medians) == {"a", "b"} and all(ms > 0 for ms in medians.values())
    assert calls["a"][0] == calls["b"][0] == 4  # once for the warm-up, then once per round
    assert calls["a"][1] >= 2 + 3 and syncs
    spread = {}
    module._time_interleaved({"a": entry("a"), "b": entry("b")}, lambda: None, rounds=3, round_s=0.001,
                             spread=spread)
    assert spread["a"] == 0.0 and spread["b"] >= 0.0  # the reference against itself does not stray


# --- cuda_graphs: the chosen result replayed from CUDA graphs where that is faster
def graphs_timed(monkeypatch, graph_times):
    """Makes optimize's CUDA-graph check use a fake timer returning ``graph_times``; returns what it was shown."""
    module = _model_pass()
    real_choose = module._choose_graphs
    shown = []

    def timer(entries, sync):
        shown.append(list(entries))
        if isinstance(graph_times, Exception):
            raise graph_times
        return dict(graph_times)

    monkeypatch.setattr(module, "_choose_graphs",
                        lambda chosen, example_inputs: real_choose(chosen, example_inputs, timer=timer))
    return shown


@pytest.mark.parametrize("graph_times,kept", [({"plain": 1.0, "graphed": 0.5}, True),
                                              ({"plain": 1.0, "graphed": 0.91}, False)])  # within 10%: not kept
def test_cuda_graphs_keeps_the_replay_only_when_it_is_faster(monkeypatch, tmp_path, graph_times, kept):
    from pycutlass.torch import CUDAGraphed

    model = Tower().eval()
    x = torch.randn(4, 16)
    shown = graphs_timed(monkeypatch, graph_times)
    times = {"eager": 1.0, "tuned": 0.8, "selective": 0.9, "torch": 1.05, "traced": 1.0}
    optimized, _ = tuned_on_cuda(monkeypatch, model, x, times, cuda_graphs=True)
    assert shown == [["plain", "graphed"]]
    assert isinstance(optimized, CUDAGraphed) is kept
    found = report(optimized)
    assert found.end_to_end["chosen"] == "tuned"
    assert found.end_to_end["graphs"] == {"plain_ms": graph_times["plain"], "graphed_ms": graph_times["graphed"],
                                          "kept": kept}
    assert found.notes[-1].startswith("cuda_graphs: replayed")
    with torch.no_grad():  # CPU tensors: the graphed module runs the tuned model itself
        assert_close(optimized(x), model(x))
    inner = optimized.module if kept else optimized
    assert eager_layers(inner) == {"fc4"}  # the placement the end-to-end check chose is what gets replayed
    save(optimized, tmp_path, dispatch=FakeDispatch())  # a graphed model saves without its graphs
    loaded = load(tmp_path, dispatch=FakeDispatch())
    assert isinstance(loaded, CUDAGraphed) is kept and report(loaded).end_to_end == found.end_to_end
    with torch.no_grad():
        assert_close(loaded(x), model(x))


def test_cuda_graphs_not_tried_for_training_mode_failed_captures_or_untuned_models(monkeypatch):
    from pycutlass.torch import CUDAGraphed

    x = torch.randn(4, 16)
    times = {"eager": 1.0, "tuned": 0.8, "selective": 0.9, "torch": 1.05, "traced": 1.0}
    shown = graphs_timed(monkeypatch, RuntimeError("operation not permitted when stream is capturing"))
    with monkeypatch.context() as patched:
        optimized, _ = tuned_on_cuda(patched, Tower().eval(), x, times, cuda_graphs=True)
    assert shown and not isinstance(optimized, CUDAGraphed)
    graphs = report(optimized).end_to_end["graphs"]
    assert not graphs["kept"] and "capture failed (RuntimeError: operation not permitted" in graphs["why"]
    shown.clear()
    with monkeypatch.context() as patched:
        optimized, _ = tuned_on_cuda(patched, Tower().train(), x, times, cuda_graphs=True)
    assert not shown and report(optimized).end_to_end["graphs"]["why"] == "the model is in training mode"
    untuned = optimize(Tower().eval(), x, tune=False, cuda_graphs=True)
    assert not isinstance(untuned, CUDAGraphed) and "cuda_graphs: not tried" in report(untuned).notes[-1]
    with pytest.raises(ArgumentError, match="cuda_graphs must be True or False"):
        optimize(Tower().eval(), x, tune=False, cuda_graphs="yes")


def test_functional_tanh_gelu_fuses_as_gelu_taylor():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

        def forward(self, x):
            return F.gelu(self.fc2(F.gelu(self.fc1(x), approximate="tanh")))

    model = Net().eval()
    x = torch.randn(4, 16)
    optimized = optimize(model, (x,), tune=False)
    assert fused(optimized) == {"fc1": "linear+gelu_taylor", "fc2": "linear+gelu"}
    assert_close(optimized(x), model(x))


@pytest.mark.parametrize("inference", [False, True])
def test_end_to_end_is_timed_in_the_callers_grad_mode(monkeypatch, inference):
    """Optimized under torch.inference_mode(), placements are timed there too (calls dispatch differently in it);
    otherwise under no_grad."""
    module = _model_pass()
    modes = []

    def timer(entries, sync):
        modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return {name: 1.0 for name in entries}

    sites = []
    with (torch.inference_mode() if inference else contextlib.nullcontext()):
        module._choose_end_to_end(nn.Identity(), nn.Identity(), (torch.randn(2, 8),), sites, timer=timer)
    assert modes == [(inference, False)]


def test_candidates_compile_on_every_core_unless_jobs_says_otherwise(monkeypatch):
    """The model pass compiles the candidates it lacks as a sweep does: one process per core that memory allows (an
    add_module without jobs would compile one unit after another)."""
    from pycutlass.torch import tuning
    from pycutlass.tune.sweep import default_jobs

    asked = []

    class Compiler:
        def add_module(self, operations, *, jobs, errors):
            asked.append(jobs)
            return types.SimpleNamespace(failures=[])

    assert tuning._compile(Compiler(), ["op"], None) == set() and asked == [default_jobs()]
    assert tuning._compile(Compiler(), ["op"], 3) == set() and asked[-1] == 3
    assert tuning._compile(Compiler(), [], None) == set() and len(asked) == 2  # nothing to compile: no call
