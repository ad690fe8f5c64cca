"""Finding what the model pass fuses: the model traced with ``torch.fx`` (each value's shape recorded on the
example inputs), then each Linear / Conv2d (module or functional call) with what follows it and can join its
epilogue: a ``+ bias``, an eval-mode BatchNorm2d (folded), an activation, or (Linear) a residual ``+``."""
from __future__ import annotations

import copy
import inspect
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ArgumentError
from .optimize_report import OptimizeReport


# --- tracing ---------------------------------------------------------------------------------------------------------
def _trace(model: nn.Module) -> fx.GraphModule:
    if not isinstance(model, nn.Module):
        raise ArgumentError(f"optimize takes a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, fx.GraphModule):  # rewrite a copy of its graph, not the caller's
        gm = fx.GraphModule(model, copy.deepcopy(model.graph), class_name=type(model).__name__)
    else:
        try:
            gm = fx.symbolic_trace(model)
        except Exception as exc:  # fx raises TraceError, TypeError, ... for untraceable Python
            raise ArgumentError(f"torch.fx could not trace {type(model).__name__} ({type(exc).__name__}: {exc}). "
                                "optimize needs a model torch.fx.symbolic_trace can trace (no control flow on "
                                "tensor values); trace it yourself (a custom Tracer with leaf modules) and pass the "
                                "GraphModule") from exc
    gm.training = model.training  # the root's mode only: submodules keep their own
    return gm


_SHAPE = "pycutlass_shape"


class _Shapes(fx.Interpreter):
    """Records each tensor value's shape and dtype in ``node.meta``. (torch's ShapeProp does too, but on an error both
    it and the Interpreter's extra traceback import torch._dynamo, which takes seconds.)"""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.extra_traceback = False
        self.node: fx.Node | None = None  # the one running, for the error message

    def run_node(self, n: fx.Node):
        self.node = n
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            n.meta[_SHAPE] = _TensorShape(tuple(result.shape), result.dtype)
        return result


@dataclass(frozen=True)
class _TensorShape:
    shape: tuple
    dtype: torch.dtype


class _Evaluating:
    """Eval mode for a forward the pass runs itself: a train-mode BatchNorm would update its statistics."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.modes: dict[nn.Module, bool] = {}

    def __enter__(self):
        self.modes = {m: m.training for m in self.model.modules()}
        self.model.eval()
        return self

    def __exit__(self, *exc):
        for module, mode in self.modes.items():
            module.training = mode


# --- matching -------------------------------------------------------------------------------------------------------
# Signatures to bind a call_function node's args/kwargs by name (torch's builtins have no inspectable signature).
def _linear_signature(input, weight, bias=None): ...
def _conv2d_signature(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1): ...
def _unary_signature(input, inplace=False): ...
def _gelu_signature(input, approximate="none"): ...
def _leaky_relu_signature(input, negative_slope=0.01, inplace=False): ...


# target -> (activation, signature). F.sigmoid and F.tanh trace to the methods below.
_FUNCTION_ACTIVATIONS: dict[Callable, tuple[str, Callable]] = {
    F.relu: ("relu", _unary_signature), torch.relu: ("relu", _unary_signature),
    torch.relu_: ("relu", _unary_signature),
    F.gelu: ("gelu", _gelu_signature),
    F.silu: ("silu", _unary_signature),
    F.hardswish: ("hardswish", _unary_signature),
    torch.sigmoid: ("sigmoid", _unary_signature), torch.sigmoid_: ("sigmoid", _unary_signature),
    torch.tanh: ("tanh", _unary_signature), torch.tanh_: ("tanh", _unary_signature),
    F.leaky_relu: ("leaky_relu", _leaky_relu_signature), F.leaky_relu_: ("leaky_relu", _leaky_relu_signature),
}
_METHOD_ACTIVATIONS = {"relu": "relu", "relu_": "relu", "sigmoid": "sigmoid", "sigmoid_": "sigmoid",
                       "tanh": "tanh", "tanh_": "tanh"}
_MODULE_ACTIVATIONS = {nn.ReLU: "relu", nn.GELU: "gelu", nn.SiLU: "silu", nn.Hardswish: "hardswish",
                       nn.Sigmoid: "sigmoid", nn.Tanh: "tanh", nn.LeakyReLU: "leaky_relu"}
_GELU_FORMS = {"none": "gelu", "tanh": "gelu_taylor"}  # torch's approximate= -> the CUTLASS functor


@dataclass
class _Match:
    op: str                      # "linear" or "conv2d"
    anchor: fx.Node              # the Linear / Conv2d node
    input: fx.Node               # as traced (for its shape); rewiring reads the anchor's argument again
    weight: torch.Tensor
    bias: torch.Tensor | None
    layer: str                   # the original qualified name (the report's and the tuner's name for it)
    module_target: str | None    # the anchor's module path; None for a functional call
    shape: str
    geometry: tuple = ()         # conv: (stride, padding, dilation)
    bias_node: fx.Node | None = None  # a following ``+ bias`` (when the layer itself has none)
    bn: nn.BatchNorm2d | None = None
    bn_node: fx.Node | None = None
    activation: str = "identity"
    activation_arg: float = 0.0
    act_node: fx.Node | None = None
    residual: fx.Node | None = None       # linear: the other operand of a following ``+`` (added in the epilogue)
    residual_node: fx.Node | None = None  # that ``+``

    @property
    def tail(self) -> fx.Node:
        return self.residual_node or self.act_node or self.bn_node or self.bias_node or self.anchor

    @property
    def pattern(self) -> str:
        return "+".join([self.op] + (["bias"] if self.bias_node is not None else []) +
                        (["bn"] if self.bn is not None else []) +
                        ([self.activation] if self.act_node is not None else []) +
                        (["residual"] if self.residual_node is not None else []))

    def key(self) -> tuple:
        """Calls of one module with the same fusion can share one replacement."""
        return (self.module_target, id(self.bn), self.activation, self.activation_arg, self.act_node is not None,
                None if self.bias_node is None else self.bias_node.args, self.residual_node is not None)


class _Skip(Exception):
    """A Linear/Conv2d the pass leaves to torch; the message says why (it goes to the report)."""


def _bind(node: fx.Node, signature: Callable) -> inspect.BoundArguments:
    try:
        bound = inspect.signature(signature).bind(*node.args, **node.kwargs)
    except TypeError as exc:
        raise _Skip(f"unexpected arguments ({exc})") from None
    bound.apply_defaults()
    return bound.arguments


def _same_forward(module: nn.Module, cls: type) -> bool:
    """``module`` computes what ``cls`` does (a subclass that overrides forward may compute something else)."""
    return isinstance(module, cls) and type(module).forward is cls.forward


def _attr(gm: fx.GraphModule, node: Any, what: str) -> torch.Tensor | None:
    """The tensor a get_attr node reads; a weight computed in the graph cannot be baked into a module."""
    if node is None:
        return None
    if not (isinstance(node, fx.Node) and node.op == "get_attr"):
        raise _Skip(f"its {what} is computed in the graph, not a parameter or buffer")
    value = gm
    for part in node.target.split("."):
        value = getattr(value, part)
    return value


def _constant(value: Any, what: str) -> Any:
    if isinstance(value, fx.Node) or (isinstance(value, (list, tuple)) and any(isinstance(v, fx.Node) for v in value)):
        raise _Skip(f"its {what} is computed in the graph")
    return value


def _pair(value, what: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) == 1:
        pair = pair * 2
    if len(pair) != 2 or not all(isinstance(v, int) for v in pair):
        raise _Skip(f"{what}={value!r} (an int or a pair of ints is supported)")
    return pair


def _resolve_padding(padding, weight: torch.Tensor, stride, dilation) -> tuple[int, int]:
    if padding == "valid":
        return (0, 0)
    if padding == "same":
        total = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
        if any(t % 2 for t in total) or stride != (1, 1):
            raise _Skip("padding='same' that pads asymmetrically (the kernels pad both sides equally)")
        return (total[0] // 2, total[1] // 2)
    if isinstance(padding, str):
        raise _Skip(f"padding={padding!r}")
    return _pair(padding, "padding")


def _source_module(gm: fx.GraphModule, node: fx.Node) -> str:
    """The layer a functional call belongs to: the owner of its weight (e.g. 'head' for 'head.weight')."""
    weight = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
    if isinstance(weight, fx.Node) and weight.op == "get_attr" and "." in weight.target:
        return weight.target.rpartition(".")[0]
    return node.name


def _anchor(gm: fx.GraphModule, node: fx.Node) -> dict | None:
    """The Linear/Conv2d a node computes (weights, geometry), None when it is neither; raises _Skip when unsupported."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        if _same_forward(module, nn.Linear):
            return dict(op="linear", input=_first_argument(node), weight=module.weight, bias=module.bias,
                        layer=node.target, module_target=node.target)
        if _same_forward(module, nn.Conv2d):
            if module.groups != 1:
                raise _Skip(f"groups={module.groups} (only groups=1 is supported)")
            if module.padding_mode != "zeros":
                raise _Skip(f"padding_mode={module.padding_mode!r} (only 'zeros' is supported)")
            stride, dilation = _pair(module.stride, "stride"), _pair(module.dilation, "dilation")
            padding = _resolve_padding(module.padding, module.weight, stride, dilation)
            return dict(op="conv2d", input=_first_argument(node), weight=module.weight, bias=module.bias,
                        layer=node.target, module_target=node.target, geometry=(stride, padding, dilation))
        return None
    if node.op != "call_function":
        return None
    if node.target is F.linear:
        args = _bind(node, _linear_signature)
        return dict(op="linear", input=args["input"], weight=_attr(gm, args["weight"], "weight"),
                    bias=_attr(gm, args["bias"], "bias"), layer=_source_module(gm, node), module_target=None)
    if node.target is F.conv2d:
        args = _bind(node, _conv2d_signature)
        weight = _attr(gm, args["weight"], "weight")
        groups = _constant(args["groups"], "groups")
        if groups != 1:
            raise _Skip(f"groups={groups!r} (only groups=1 is supported)")
        stride = _pair(_constant(args["stride"], "stride"), "stride")
        dilation = _pair(_constant(args["dilation"], "dilation"), "dilation")
        padding = _resolve_padding(_constant(args["padding"], "padding"), weight, stride, dilation)
        return dict(op="conv2d", input=args["input"], weight=weight, bias=_attr(gm, args["bias"], "bias"),
                    layer=_source_module(gm, node), module_target=None, geometry=(stride, padding, dilation))
    return None


def _shape(found: dict) -> str:
    """The problem as the report shows it, from the shapes recorded on the example inputs."""
    meta = found["input"].meta.get(_SHAPE) if isinstance(found["input"], fx.Node) else None
    if meta is None:
        raise _Skip("its input is not a tensor")
    if not meta.dtype.is_floating_point or not found["weight"].dtype.is_floating_point:
        raise _Skip(f"dtype {meta.dtype} (floating-point tensors only)")
    dtype = str(meta.dtype).removeprefix("torch.")
    weight = found["weight"]
    if found["op"] == "linear":
        if len(meta.shape) < 1:
            raise _Skip("its input is a scalar")
        k = meta.shape[-1]
        return f"M={math.prod(meta.shape[:-1])} N={weight.shape[0]} K={k} {dtype}"
    if len(meta.shape) != 4:
        raise _Skip(f"its input is {len(meta.shape)}-D (NCHW batches only)")
    stride, padding, dilation = found["geometry"]
    extra = "".join(f" {name}{v[0] if v[0] == v[1] else v}" for name, v, default in
                    (("s", stride, (1, 1)), ("p", padding, (0, 0)), ("d", dilation, (1, 1))) if v != default)
    return f"{'x'.join(map(str, meta.shape))} * {'x'.join(map(str, weight.shape))}{extra} {dtype}"


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _batchnorm(gm: fx.GraphModule, node: fx.Node | None, source: fx.Node) -> nn.BatchNorm2d | None:
    if node is None or node.op != "call_module" or node.args[:1] != (source,) or len(node.args) != 1 or node.kwargs:
        return None
    module = gm.get_submodule(node.target)
    return module if _same_forward(module, nn.BatchNorm2d) else None


def _activation(gm: fx.GraphModule, node: fx.Node | None, source: fx.Node) -> tuple[str, float] | None:
    """(activation, arg) when ``node`` applies a supported activation to ``source``; GELU's tanh form
    (``approximate="tanh"``) becomes gelu_taylor, CUTLASS's GELU_taylor."""
    if node is None:
        return None
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        name = _MODULE_ACTIVATIONS.get(type(module))
        if name is None or node.args != (source,) or node.kwargs:
            return None
        if name == "gelu":
            name = _GELU_FORMS.get(module.approximate)
            if name is None:
                return None
        return name, float(module.negative_slope) if name == "leaky_relu" else 0.0
    if node.op == "call_method":
        name = _METHOD_ACTIVATIONS.get(node.target)
        return (name, 0.0) if name is not None and node.args == (source,) and not node.kwargs else None
    if node.op != "call_function" or node.target not in _FUNCTION_ACTIVATIONS:
        return None
    name, signature = _FUNCTION_ACTIVATIONS[node.target]
    try:
        args = _bind(node, signature)
    except _Skip:
        return None
    if args.pop("input") is not source or any(isinstance(v, fx.Node) for v in args.values()):
        return None
    if name == "gelu":
        name = _GELU_FORMS.get(args["approximate"])
        if name is None:
            return None
    return name, float(args["negative_slope"]) if name == "leaky_relu" else 0.0


def _bias_add(gm: fx.GraphModule, node: fx.Node | None, source: fx.Node, match: "_Match") -> torch.Tensor | None:
    """The vector when ``node`` is ``source + bias`` with a parameter or buffer holding one value per output feature
    (linear: shape (N,); conv: (K, 1, 1) or (1, K, 1, 1), since a (K,) vector would broadcast along W), in the
    weight's dtype; else None."""
    if node is None or node.op != "call_function" or node.target not in (operator.add, torch.add) or node.kwargs \
            or len(node.args) != 2 or source not in node.args:
        return None
    other = node.args[1] if node.args[0] is source else node.args[0]
    if not (isinstance(other, fx.Node) and other.op == "get_attr"):
        return None
    try:
        vector = _attr(gm, other, "bias")
    except _Skip:
        return None
    outputs = match.weight.shape[0]
    shapes = ((outputs,),) if match.op == "linear" else ((outputs, 1, 1), (1, outputs, 1, 1))
    if not isinstance(vector, torch.Tensor) or tuple(vector.shape) not in shapes or vector.dtype != match.weight.dtype:
        return None
    return vector if vector.dim() == 1 else vector.reshape(outputs)


def _residual_add(node: fx.Node | None, source: fx.Node) -> fx.Node | None:
    """The other operand when ``node`` is ``source + other`` with ``other`` a tensor of exactly the output's shape and
    dtype (no broadcast: the epilogue reads it as the GEMM's C, one value per output element); else None."""
    if node is None or node.op != "call_function" or node.target not in (operator.add, torch.add) or node.kwargs \
            or len(node.args) != 2 or source not in node.args or node.args[0] is node.args[1]:
        return None
    other = node.args[1] if node.args[0] is source else node.args[0]
    if not isinstance(other, fx.Node) or other.op == "get_attr":
        return None
    mine, theirs, out = source.meta.get(_SHAPE), other.meta.get(_SHAPE), node.meta.get(_SHAPE)
    if mine is None or theirs is None or out is None or not (mine.shape == theirs.shape == out.shape) or \
            not (mine.dtype == theirs.dtype == out.dtype) or len(mine.shape) < 1:
        return None
    return other


def _find(gm: fx.GraphModule, fold_batchnorm: bool, training: bool, report: OptimizeReport) -> list[_Match]:
    matches = []
    for node in list(gm.graph.nodes):
        try:
            found = _anchor(gm, node)
            if found is None:
                continue
            shape = _shape(found)
        except _Skip as why:
            report.skipped.append({"layer": _layer_name(gm, node), "op": _op_name(gm, node), "reason": str(why)})
            continue
        match = _Match(shape=shape, anchor=node, **found)
        tail = node
        if match.bias is None:
            bias = _bias_add(gm, _only_user(node), node, match)
            if bias is not None:
                match.bias, match.bias_node = bias, _only_user(node)
                tail = match.bias_node
        if match.op == "conv2d":
            bn = _batchnorm(gm, _only_user(tail), tail)
            if bn is not None:
                why_not = _why_not_fold(bn, fold_batchnorm, training)
                if why_not:  # the BN stays, so nothing after it can join the conv
                    report.notes.append(f"{match.layer}: the BatchNorm2d after it is not folded ({why_not})")
                    matches.append(match)
                    continue
                match.bn, match.bn_node = bn, _only_user(tail)
                tail = match.bn_node
        act_node = _only_user(tail)
        activation = _activation(gm, act_node, tail)
        if activation is not None:
            match.activation, match.activation_arg = activation
            match.act_node = act_node
        elif match.op == "linear":
            residual = _residual_add(_only_user(tail), tail)
            if residual is not None:
                match.residual, match.residual_node = residual, _only_user(tail)
        matches.append(match)
    return matches


def _layer_name(gm: fx.GraphModule, node: fx.Node) -> str:
    return node.target if node.op == "call_module" else _source_module(gm, node)


def _op_name(gm: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "call_module":
        return "linear" if isinstance(gm.get_submodule(node.target), nn.Linear) else "conv2d"
    return "linear" if node.target is F.linear else "conv2d"


def _why_not_fold(bn: nn.BatchNorm2d, fold_batchnorm: bool, training: bool) -> str:
    if not fold_batchnorm:
        return "fold_batchnorm=False"
    if training or bn.training:
        return "training mode: BatchNorm normalizes with the batch's statistics"
    if bn.running_mean is None or bn.running_var is None:
        return "track_running_stats=False"
    return ""


def _first_argument(node: fx.Node):
    return node.args[0] if node.args else node.kwargs["input"]
