"""The model pass: TVM's CUTLASS BYOC flow (partition -> tune -> build) for a ``torch.nn.Module``.

``optimize(model, example_inputs)`` traces the model with ``torch.fx``, replaces every Linear and Conv2d (module or
functional call) together with a following eval-mode BatchNorm2d (folded into the weights) and activation by one
fused :class:`CutlassLinear` / :class:`CutlassConv2d`, and, on a GPU, tunes each call the model makes on the example
inputs. ``save`` / ``load`` keep the model together with the tuning decisions, so a new process does not re-tune.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import json
import math
import operator
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ArgumentError, NoGpuError
from . import ops, reference
from .dispatch import TORCH
from .graphs import CUDAGraphed

__all__ = ["optimize", "report", "save", "load", "OptimizeReport", "CutlassLinear", "CutlassConv2d"]

MODEL_FILE = "model.pt"
STATE_FILE = "pycutlass-torch.json"
_FORMAT_VERSION = 1


# --- the replacement modules (module-level classes, so an optimized model pickles) ----------------------------------
_MAX_PLANS = 16  # input shapes per layer with a launch plan (dynamic batch sizes beyond that take the full path)


class CutlassLinear(nn.Module):
    """``activation(F.linear(x, weight, bias) + residual)`` as one ``torch.ops.pycutlass.gemm``; ``residual``
    (optional, the output's shape) is the GEMM's C operand. The pass fuses a following ``+`` only where there is no
    activation (the epilogue adds C before the activation)."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, activation: str = "identity",
                 activation_arg: float = 0.0, layer: str = "", pattern: str = "linear", kernel: str = ""):
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.activation, self.activation_arg = activation, float(activation_arg)
        self.layer, self.pattern = layer, pattern
        self.kernel = kernel  # an override: '' lets the dispatch pick (its tuned choice, if any)
        self.eager_shapes: set[tuple] = set()  # input shapes tuned to torch: its own call, without the dispatch
        self._plans: dict = {}  # (input shape, residual?, epilogue) -> ops.LinearPlan: the hot path of a bound call

    def forward(self, x, residual=None):
        if x.shape in self.eager_shapes:
            out = F.linear(x, self.weight, self.bias)
            return reference.activate(out if residual is None else out + residual, self.activation,
                                      self.activation_arg)
        key = (x.shape, residual is None, self.kernel, self.activation, self.activation_arg)
        plan = self._plans.get(key)
        if plan is not None:
            if plan.bound is None:  # the dispatch binds this signature to torch: call it without the dispatch
                if plan.runs_torch(x, self.weight, self.bias, residual):
                    return ops.eager_linear(x, self.weight, self.bias, self.activation, self.activation_arg,
                                            residual)
            else:
                out = plan.launch(x, self.weight, self.bias, residual)
                if out is not None:
                    return out
        out = ops.linear(x, self.weight, self.bias, self.activation, self.activation_arg, self.kernel,
                         residual=residual)
        # look for a plan only when there is none for this signature or the bindings changed since it was made
        if (plan is None or not plan.current()) and (len(self._plans) < _MAX_PLANS or key in self._plans):
            plan = ops.LinearPlan.after_call(x, self.weight, self.bias, self.activation, self.activation_arg,
                                             self.kernel, residual)
            if plan is not None:
                self._plans[key] = plan
        return out

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_plans"] = {}  # launch plans hold loaded kernels of this process: never saved or copied
        return state

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"activation={self.activation!r}, layer={self.layer!r}")


class CutlassConv2d(nn.Module):
    """``activation(F.conv2d(x, weight, bias, ...))`` as one ``torch.ops.pycutlass.conv2d``; channels_last out."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, stride=(1, 1), padding=(0, 0),
                 dilation=(1, 1), activation: str = "identity", activation_arg: float = 0.0, layer: str = "",
                 pattern: str = "conv2d", kernel: str = ""):
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.stride, self.padding, self.dilation = tuple(stride), tuple(padding), tuple(dilation)
        self.activation, self.activation_arg = activation, float(activation_arg)
        self.layer, self.pattern = layer, pattern
        self.kernel = kernel
        self.eager_shapes: set[tuple] = set()  # input shapes tuned to torch: its own call, without the dispatch

    def forward(self, x):
        if x.shape in self.eager_shapes:
            return reference.eager_conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                                          self.activation, self.activation_arg)
        return ops.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.activation,
                          self.activation_arg, self.kernel)

    def extra_repr(self) -> str:
        k, c, r, s = self.weight.shape
        return (f"{c}, {k}, kernel_size={(r, s)}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, bias={self.bias is not None}, activation={self.activation!r}, "
                f"layer={self.layer!r}")


# --- the report -----------------------------------------------------------------------------------------------------
_COLUMNS = ("layer", "op", "pattern", "shape", "kernel", "cutlass_us", "torch_us", "speedup")


@dataclass
class OptimizeReport:
    """What ``optimize`` did: one row per replaced call, the candidates it left alone and why, and notes.

    ``speedup`` is ``torch_us / cutlass_us`` (above 1: the CUTLASS kernel beat torch); ``kernel`` is the chosen
    operation's name, ``"torch"`` where torch was kept, ``"torch (end-to-end)"`` where the end-to-end check moved
    the layer to torch (``tuned_kernel`` keeps the kernel tuning chose), or ``"-"`` where nothing was tuned.
    ``end_to_end``: the end-to-end check's record (``{"eager_ms", "candidates": {name: ms}, "chosen"}``, median ms
    per forward on the example inputs), None where it did not run.
    """

    rows: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # {"layer", "op", "reason"}
    notes: list[str] = field(default_factory=list)
    end_to_end: dict | None = None

    def table(self) -> str:
        cells = [[_cell(row.get(c)) for c in _COLUMNS] for row in self.rows]
        try:
            from tabulate import tabulate
        except ImportError:
            return _plain_table(list(_COLUMNS), cells)
        return tabulate(cells, headers=list(_COLUMNS), tablefmt="simple", disable_numparse=True)

    def __str__(self) -> str:
        lines = [self.table()] if self.rows else ["no layer was replaced"]
        lines += [f"not replaced: {s['layer']} ({s['op']}): {s['reason']}" for s in self.skipped]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"rows": [dict(r) for r in self.rows], "skipped": [dict(s) for s in self.skipped],
                "notes": list(self.notes), "end_to_end": copy.deepcopy(self.end_to_end)}

    @classmethod
    def from_dict(cls, data: dict) -> "OptimizeReport":
        return cls(list(data.get("rows", [])), list(data.get("skipped", [])), list(data.get("notes", [])),
                   copy.deepcopy(data.get("end_to_end")))


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def _plain_table(headers: list[str], cells: list[list[str]]) -> str:
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


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


# --- rewriting ------------------------------------------------------------------------------------------------------
def _as_parameter(tensor: torch.Tensor, requires_grad: bool) -> nn.Parameter:
    return tensor if isinstance(tensor, nn.Parameter) else nn.Parameter(tensor.detach(), requires_grad=requires_grad)


def _fold(weight: torch.Tensor, bias: torch.Tensor | None, bn: nn.BatchNorm2d):
    """Conv weights and bias with an eval-mode BatchNorm2d folded in (computed in float64)."""
    scale = torch.rsqrt(bn.running_var.detach().double() + bn.eps)
    shift = -bn.running_mean.detach().double() * scale
    if bn.weight is not None:
        scale, shift = scale * bn.weight.detach().double(), shift * bn.weight.detach().double()
    if bn.bias is not None:
        shift = shift + bn.bias.detach().double()
    folded_bias = shift if bias is None else bias.detach().double() * scale + shift
    folded_weight = weight.detach().double() * scale[:, None, None, None]
    return folded_weight.to(weight.dtype), folded_bias.to(weight.dtype if bias is None else bias.dtype)


def _build(match: _Match) -> nn.Module:
    common = dict(activation=match.activation, activation_arg=match.activation_arg, layer=match.layer,
                  pattern=match.pattern)
    requires_grad = match.weight.requires_grad
    if match.op == "linear":  # the Linear's own Parameters: tied weights stay tied
        bias = None if match.bias is None else _as_parameter(match.bias, requires_grad)
        return CutlassLinear(_as_parameter(match.weight, requires_grad), bias, **common)
    weight, bias = match.weight, match.bias
    if match.bn is not None:
        weight, bias = _fold(weight, bias, match.bn)
    if not weight.is_contiguous(memory_format=torch.channels_last):  # what the NHWC kernels read
        weight = weight.detach().contiguous(memory_format=torch.channels_last)
    stride, padding, dilation = match.geometry
    return CutlassConv2d(_as_parameter(weight, requires_grad),
                         None if bias is None else _as_parameter(bias, requires_grad),
                         stride, padding, dilation, **common)


def _shared(gm: fx.GraphModule, original: nn.Module, path: str) -> bool:
    """Whether ``path`` in ``gm`` is the original model's own module (so setting attributes on it would change the
    user's model). Containers fx made while tracing are fresh; leaf modules it called are the model's."""
    try:
        return gm.get_submodule(path) is original.get_submodule(path)
    except AttributeError:
        return False


def _place(gm: fx.GraphModule, original: nn.Module, path: str, module: nn.Module, in_place: bool) -> str:
    """Installs ``module`` at ``path`` (replacing the original layer there) when ``in_place``, else next to it under
    a fresh name; at the root where the parent is one of the model's own modules (setting it would change the
    model)."""
    parent, _, name = path.rpartition(".")
    if parent and _shared(gm, original, parent):
        parent, name, in_place = "", path.replace(".", "_"), False
    if not in_place:
        owner = gm.get_submodule(parent)
        name = _fresh(owner, f"{name}_cutlass" if hasattr(owner, name) else name)
    target = f"{parent}.{name}" if parent else name
    gm.add_submodule(target, module)
    return target


def _fresh(owner: nn.Module, base: str) -> str:
    name, i = base, 1
    while hasattr(owner, name):
        name, i = f"{base}_{i}", i + 1
    return name


def _first_argument(node: fx.Node):
    return node.args[0] if node.args else node.kwargs["input"]


def _rewrite(gm: fx.GraphModule, original: nn.Module, matches: list[_Match]) -> list[fx.Node]:
    """Replaces each match by a call of its fused module; returns the new conv nodes."""
    calls: dict[str, int] = {}  # call_module nodes per module path
    for node in gm.graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    keys: dict[str, list[tuple]] = {}
    for match in matches:
        if match.module_target is not None:
            keys.setdefault(match.module_target, []).append(match.key())

    def in_place(path: str) -> bool:
        """Every call of the module becomes the same fused module: it can take the original's place."""
        return len(keys[path]) == calls[path] and len(set(keys[path])) == 1

    placed: dict[tuple, str] = {}
    conv_nodes = []
    for match in matches:
        path = match.module_target
        key = match.key() if path is not None else ("call", match.anchor.name)
        if key not in placed:
            if path is not None:
                placed[key] = _place(gm, original, path, _build(match), in_place(path))
            else:
                placed[key] = _place(gm, original, f"cutlass_{match.anchor.name}", _build(match), False)
        with gm.graph.inserting_before(match.tail):
            # the anchor's input as it is now: an earlier replacement may have rewired it (and the residual's: the
            # ``+`` reads it, so it is defined before the tail)
            inputs = (_first_argument(match.anchor),)
            if match.residual_node is not None:
                fused = match.act_node or match.bn_node or match.bias_node or match.anchor
                first, second = match.residual_node.args
                inputs += (second if first is fused else first,)
            new = gm.graph.call_module(placed[key], inputs)
        new.meta.update(match.tail.meta)
        match.tail.replace_all_uses_with(new)
        for old in (match.residual_node, match.act_node, match.bn_node, match.bias_node, match.anchor):
            if old is not None:
                gm.graph.erase_node(old)
        if match.op == "conv2d":
            conv_nodes.append(new)
    return conv_nodes


def _keep_views_working(graph: fx.Graph, conv_nodes: list[fx.Node]) -> None:
    """A fused conv returns channels_last, on which ``x.view(...)`` of NCHW code fails; ``.contiguous()`` first
    (free where the tensor already is contiguous) on every view downstream of a fused conv."""
    downstream = set(conv_nodes)
    for node in graph.nodes:
        if node in downstream:
            continue
        if any(inp in downstream for inp in node.all_input_nodes):
            downstream.add(node)
            if node.op == "call_method" and node.target == "view":
                source = node.args[0]
                with graph.inserting_before(node):
                    contiguous = graph.call_method("contiguous", (source,))
                node.replace_input_with(source, contiguous)


def _remove_orphans(gm: fx.GraphModule, original: nn.Module, before: set[str]) -> None:
    """Drops the parameters that only the replaced functional calls read (their get_attr nodes are gone), unless
    they live in one of the model's own modules."""
    still = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for target in before - still:
        owner_path, _, name = target.rpartition(".")
        if owner_path and _shared(gm, original, owner_path):
            continue
        try:
            owner = gm.get_submodule(owner_path)
        except AttributeError:
            continue
        if hasattr(owner, name):
            delattr(owner, name)


# --- tracing, tuning ------------------------------------------------------------------------------------------------
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


def _tuple(example_inputs) -> tuple:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (list, tuple)):
        return tuple(example_inputs)
    raise ArgumentError(f"example_inputs must be a tensor or a tuple of the model's positional arguments, "
                        f"got {type(example_inputs).__name__}")


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _on_cuda(gm: fx.GraphModule, example_inputs: tuple) -> bool:
    return any(t.device.type == "cuda" for t in _tensors(example_inputs) + list(gm.parameters()))


def _dispatch(dispatch):
    if dispatch is not None:
        return dispatch
    from .dispatch import Dispatch

    return Dispatch.current()


@dataclass(frozen=True, eq=False)
class _Site:
    """A tuned call of a fused module: the module, its input shape on the example inputs, and the tuning's choice."""
    module: nn.Module
    shape: tuple
    choice: Any

    @property
    def on_torch(self) -> tuple:
        """What putting this call on torch adds to a candidate: (module, shape), the module's ``eager_shapes`` key."""
        return (self.module, self.shape)


def _tune(gm: fx.GraphModule, example_inputs: tuple, dispatch, jobs, progress: bool,
          prefer_faster: bool) -> tuple[list, list[_Site]]:
    """Runs the model once, recording each op call with the layer it came from, and tunes the recorded calls;
    returns the choices and the calls of fused modules among them."""
    fused = [m for m in gm.modules() if isinstance(m, (CutlassLinear, CutlassConv2d))]
    owners: dict[int, tuple] = {}  # id(call) -> (module, input shape), to give torch's layers torch's own call
    first_call: dict[int, int] = {}  # id(module) -> index of its first call in collector.calls
    with dispatch.collecting() as collector:
        def enter(module, args):
            collector.layer = module.layer
            first_call[id(module)] = len(collector.calls)

        def leave(module, args, output):  # ops the model calls itself belong to no layer
            collector.layer = ""
            for call in collector.calls[first_call.pop(id(module)):]:
                owners[id(call)] = (module, tuple(args[0].shape))

        hooks = [h for m in fused for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
        try:
            with _Evaluating(gm), torch.no_grad():
                gm(*example_inputs)
        finally:
            for hook in hooks:
                hook.remove()
    choices = dispatch.tune_calls(collector.calls, jobs=jobs, progress=progress, prefer_faster=prefer_faster)
    sites = [_Site(*owners[id(choice.call)], choice) for choice in choices if id(choice.call) in owners]
    # A host-bound model feels every microsecond: where torch won, the layer calls torch itself for that shape
    # (other shapes still go through the dispatch and its tuning table).
    for site in sites:
        if site.choice.kernel == TORCH:
            site.module.eager_shapes.add(site.shape)
    return choices, sites


def _fill_rows(report: OptimizeReport, choices: list) -> dict[int, dict]:
    """Puts each tuned call's choice on its row: calls come in execution order, which for fx is graph order.
    Returns id(call) -> its row."""
    pending: dict[str, list[dict]] = {}
    by_call: dict[int, dict] = {}
    for row in report.rows:
        pending.setdefault(row["layer"], []).append(row)
    for choice in choices:
        call = choice.call
        rows = pending.get(call.layer or "")
        if rows:
            row = rows.pop(0)
        else:  # a pycutlass op the model calls itself
            row = {"layer": call.layer or "-", "op": call.op, "pattern": call.op, "shape": call.describe()}
            report.rows.append(row)
        cutlass_us, torch_us = getattr(choice, "cutlass_us", None), getattr(choice, "torch_us", None)
        row.update(kernel=choice.kernel, cutlass_us=cutlass_us, torch_us=torch_us,
                   speedup=torch_us / cutlass_us if cutlass_us and torch_us else None)
        by_call[id(call)] = row
    return by_call


# --- the end-to-end check -------------------------------------------------------------------------------------------
# Tuning times each kernel's GPU time; a host-bound model (small inputs) is paced by the host instead, where a
# pycutlass call costs a few microseconds more than torch's. So the pass times whole forwards of a few placements
# (which layers call torch directly) and keeps the fastest.
_E2E_MIN_GAIN = 1.10  # "selective": a kernel this much faster than torch (GPU time) is worth its host cost
_E2E_TUNED, _E2E_SELECTIVE, _E2E_TORCH, _E2E_EAGER = "tuned", "selective", "torch", "eager"
# The pure-torch fallbacks: "eager" (the model itself, returned as a shallow copy) and "traced" (the model as
# torch.fx traced it: no per-layer dispatch check, nested modules' calls flattened, but fx's call wrapper costs a few
# microseconds). Each step away from eager must win by _E2E_MARGIN, the check's own timing noise on a busy host
# (traced by _E2E_TRACED_MARGIN), and a kernel placement must beat the better of the two. Ties go to torch.
_E2E_TRACED = "traced"
_E2E_MARGIN = 0.02
# An A/A control: eager timed a second time in the same rounds. Its per-round deviation from eager (the median of
# |control / eager - 1|) is what this host's noise does to one round; a kernel placement must lead by
# _E2E_NOISE_FACTOR times that too. On a host-bound model a round is one or two forwards: on the H100 host, the
# benchmark timing eager against itself read 0.91-1.16x; a 4% lead in the check became 0.88x a minute later (GPT-2
# 1x128), and with a margin of once the noise, a 2.4% lead at 2.4% noise became 0.93x (MLP 1x128). GPU-bound rows
# led by 5-65% at 0.2-4.9% noise in the same runs.
_E2E_CONTROL = "eager (control)"
_E2E_NOISE_FACTOR = 2.0
# The trace runs the same torch calls as eager: where it timed faster, that was mostly the host's noise (paired
# per-call latencies on the H100 host put it 3-8% behind eager on GPT-2 at 1x128 and 8x512), so it must win clearly.
_E2E_TRACED_MARGIN = 0.10
_E2E_MOVED = "torch (end-to-end)"
# A CUDA-graph replay changes how the result behaves (autograd calls bypass it, a new input shape captures again),
# and its own cost (input copy, replay, output copy) is host time that varies from round to round as much as a tiny
# model's: it must win clearly. Where it matters (many layers, small inputs) it wins by 2x or more.
_GRAPHS_MARGIN = 0.10


def _saves_a_launch(module: nn.Module) -> bool:
    """The fused module does in one call what its torch path does in two: an activation or a residual add."""
    return module.activation != "identity" or "residual" in module.pattern


def _end_to_end_candidates(sites: list[_Site]) -> dict[str, frozenset]:
    """Placements to time, each the set of (module, shape) calls that go to torch directly: ``tuned``, ``selective``
    where it differs from both others, ``torch`` where it differs from ``tuned``. Each contains the tuned one's: no
    candidate puts a layer torch won back on a kernel."""
    def placement(keep_kernel: Callable[[_Site], bool]) -> frozenset:
        return frozenset(site.on_torch for site in sites if not keep_kernel(site))

    def worth_it(site: _Site) -> bool:
        choice = site.choice
        if choice.kernel in (TORCH, "-"):  # ("-": no kernel serves the call, the dispatch falls back to torch)
            return False
        gain = choice.torch_us / choice.cutlass_us if choice.cutlass_us and choice.torch_us else 0.0
        return gain >= _E2E_MIN_GAIN or _saves_a_launch(site.module)

    tuned = placement(lambda site: site.choice.kernel != TORCH)
    selective, everything = placement(worth_it), placement(lambda site: False)
    found = {_E2E_TUNED: tuned}
    if selective not in (tuned, everything):
        found[_E2E_SELECTIVE] = selective
    if everything != tuned:
        found[_E2E_TORCH] = everything
    return found


def _place_calls(sites: list[_Site], on_torch: frozenset) -> None:
    """Sets every tuned module's ``eager_shapes`` for the shapes it was tuned on to ``on_torch``'s (other shapes
    keep theirs)."""
    for site in sites:
        if site.on_torch in on_torch:
            site.module.eager_shapes.add(site.shape)
        else:
            site.module.eager_shapes.discard(site.shape)


def _time_interleaved(entries: dict[str, tuple[Callable, Callable]], sync: Callable[[], None], *, rounds: int = 41,
                      round_s: float = 0.005, budget_s: float = 3.0,
                      spread: dict[str, float] | None = None) -> dict[str, float]:
    """Ms per forward of each entry (``(prepare, forward)``), paired with the first entry (the reference): the
    reference's median over rounds times the median over rounds of each entry's time over the reference's time in
    the same round. A host's speed drifts by tens of percent within a second; short interleaved rounds in
    alternating order (none always runs first) put every entry in the same moments, and the per-round ratio cancels
    the drift that a ratio of medians keeps. A round runs ``prepare`` then as many forwards as last about
    ``round_s`` (at least one), synchronized (``sync``) so the GPU's time counts too. Rounds stop early once
    ``budget_s`` is spent (after three at least). ``spread``, if given, receives each entry's median over rounds of
    |its time / the reference's - 1|: how far one round strays."""
    per_round = {}
    for name, (prepare, forward) in entries.items():
        prepare()
        forward()  # warm-up: binds kernels and launch plans
        sync()
        start = time.perf_counter()
        forward()
        sync()
        per_round[name] = max(1, min(1000, int(round_s / max(time.perf_counter() - start, 1e-6))))
    samples: dict[str, list[float]] = {name: [] for name in entries}
    deadline = time.perf_counter() + budget_s
    names = list(entries)
    for index in range(rounds):
        for name in names if index % 2 == 0 else reversed(names):  # alternating: no entry always runs first
            prepare, forward = entries[name]
            prepare()
            sync()
            start = time.perf_counter()
            for _ in range(per_round[name]):
                forward()
            sync()
            samples[name].append((time.perf_counter() - start) * 1e3 / per_round[name])
        if index >= 2 and time.perf_counter() > deadline:
            break
    reference = samples[names[0]]
    base = statistics.median(reference)
    if spread is not None:
        spread.update({name: statistics.median(abs(mine / theirs - 1) for mine, theirs in zip(values, reference))
                       for name, values in samples.items()})
    return {name: base * statistics.median(mine / theirs for mine, theirs in zip(values, reference))
            for name, values in samples.items()}


def _cuda_sync(example_inputs: tuple, gm: nn.Module) -> Callable[[], None]:
    devices = {t.device for t in _tensors(example_inputs) + list(gm.parameters()) if t.device.type == "cuda"}

    def sync():
        for device in devices:
            torch.cuda.synchronize(device)
    return sync


def _choose_end_to_end(gm: fx.GraphModule, model: nn.Module, example_inputs: tuple, sites: list[_Site], *,
                       traced: fx.GraphModule | None = None, timer: Callable | None = None) -> tuple[dict, frozenset]:
    """Times ``model`` (eager), ``traced`` (the untouched trace, if given) and ``gm`` under each candidate placement
    on ``example_inputs`` and leaves ``gm`` with the fastest placement; returns the record
    (``OptimizeReport.end_to_end``; ``chosen == "traced"`` means the caller should return ``traced``) and the calls
    the choice moved to torch (every call for "traced"). ``timer(entries, sync) -> {name: ms}`` (default
    ``_time_interleaved``) is injectable for tests."""
    candidates = _end_to_end_candidates(sites)
    tuned = candidates[_E2E_TUNED]
    entries: dict[str, tuple[Callable, Callable]] = {_E2E_EAGER: (lambda: None, lambda: model(*example_inputs))}
    for name, on_torch in candidates.items():
        entries[name] = (lambda on_torch=on_torch: _place_calls(sites, on_torch), lambda: gm(*example_inputs))
    if traced is not None:
        entries[_E2E_TRACED] = (lambda: None, lambda: traced(*example_inputs))
    entries[_E2E_CONTROL] = entries[_E2E_EAGER]
    chosen, spread, margin = _E2E_TUNED, {}, _E2E_MARGIN
    try:
        with _Evaluating(model), _Evaluating(gm), torch.no_grad(), \
                (_Evaluating(traced) if traced is not None else contextlib.nullcontext()):
            sync = _cuda_sync(example_inputs, gm)
            medians = timer(entries, sync) if timer else _time_interleaved(entries, sync, spread=spread)
        margin = max(_E2E_MARGIN, _E2E_NOISE_FACTOR * spread.get(_E2E_CONTROL, 0.0))
        fallback = _E2E_EAGER
        if traced is not None and medians[_E2E_TRACED] < medians[_E2E_EAGER] * (1 - max(_E2E_TRACED_MARGIN, margin)):
            fallback = _E2E_TRACED
        chosen = min(candidates, key=lambda name: medians[name])  # ties: the earlier (fewer layers moved)
        if medians[chosen] >= medians[fallback] * (1 - margin):
            chosen = fallback
    finally:  # (also on Ctrl-C: the model is left as tuned)
        _place_calls(sites, candidates.get(chosen, tuned))
    timed = list(candidates) + ([_E2E_TRACED] if traced is not None else [])
    record = {"eager_ms": medians[_E2E_EAGER], "candidates": {name: medians[name] for name in timed},
              "chosen": chosen, "margin": margin}
    if _E2E_CONTROL in spread:
        record["noise"] = spread[_E2E_CONTROL]
    if chosen in (_E2E_TRACED, _E2E_EAGER):
        return record, frozenset(site.on_torch for site in sites) - tuned
    return record, candidates[chosen] - tuned


def _choose_graphs(chosen: nn.Module, example_inputs: tuple, *, timer: Callable | None = None
                   ) -> tuple[nn.Module, dict]:
    """``chosen`` or, where replaying it from a CUDA graph (:class:`CUDAGraphed`) was ``_GRAPHS_MARGIN`` faster on
    ``example_inputs``, the graphed module; and the record (``OptimizeReport.end_to_end["graphs"]``). A module that
    cannot be captured stays as it is (the record says why)."""
    graphed = CUDAGraphed(chosen)
    entries = {"plain": (lambda: None, lambda: chosen(*example_inputs)),
               "graphed": (lambda: None, lambda: graphed(*example_inputs))}
    try:
        with _Evaluating(chosen), torch.no_grad():
            medians = (timer or _time_interleaved)(entries, _cuda_sync(example_inputs, chosen))
    except Exception as exc:  # not capturable (a host sync, a CPU tensor made inside, ...): keep it unreplayed
        return chosen, {"kept": False, "why": f"capture failed ({type(exc).__name__}: {str(exc)[:200]})"}
    kept = medians["graphed"] < medians["plain"] * (1 - _GRAPHS_MARGIN)
    record = {"plain_ms": medians["plain"], "graphed_ms": medians["graphed"], "kept": kept}
    if not kept:
        graphed.reset()  # frees the captured graph's memory
        return chosen, record
    return graphed, record


def _shallow_copy(model: nn.Module) -> nn.Module:
    """A new module of ``model``'s class sharing its layers, parameters and buffers (so it costs what ``model`` costs
    per call), whose own attributes (a report, added or replaced submodules, hooks) do not touch ``model``."""
    twin = copy.copy(model)
    for name, value in vars(model).items():
        if isinstance(value, (dict, set, list)):  # _modules, _parameters, _buffers, the hook tables, ...
            twin.__dict__[name] = copy.copy(value)
    return twin


def _record_end_to_end(report: OptimizeReport, rows: dict[int, dict], sites: list[_Site], record: dict,
                       moved: frozenset) -> None:
    report.end_to_end = record
    for site in sites:
        row = rows.get(id(site.choice.call))
        if row is not None and site.on_torch in moved:
            row.update(kernel=_E2E_MOVED, tuned_kernel=site.choice.kernel)
    eager, times = record["eager_ms"], record["candidates"]
    chosen = eager if record["chosen"] == _E2E_EAGER else times[record["chosen"]]
    report.notes.append("end-to-end check (ms per forward on the example inputs, paired with eager): eager " + f"{eager:.3f}, " +
                        ", ".join(f"{name} {ms:.3f}" for name, ms in times.items()) +
                        f"; kept {record['chosen']!r} ({eager / chosen:.2f}x eager" +
                        (f", {len(moved)} more call(s) on torch)" if moved else ")") +
                        (f"; control: eager against itself strays {record['noise']:.1%} a round" if "noise" in record
                         else "") +
                        (f"; no placement of the kernels beat torch by {record.get('margin', _E2E_MARGIN):.1%}, so "
                         "the result runs torch "
                         "only" + (" (the model itself)" if record["chosen"] == _E2E_EAGER else " (fx-traced)")
                         if record["chosen"] in (_E2E_TRACED, _E2E_EAGER) else ""))


def _graph_if_faster(gm: nn.Module, model: nn.Module, example_inputs: tuple, report: OptimizeReport) -> nn.Module:
    if model.training:
        report.end_to_end["graphs"] = {"kept": False, "why": "the model is in training mode"}
    else:
        gm, report.end_to_end["graphs"] = _choose_graphs(gm, example_inputs)
    graphs = report.end_to_end["graphs"]
    if "why" in graphs:
        report.notes.append(f"cuda_graphs: not replayed from CUDA graphs: {graphs['why']}")
    else:
        report.notes.append(f"cuda_graphs: replayed {graphs['graphed_ms']:.3f} ms vs {graphs['plain_ms']:.3f} ms per "
                            "forward; " + ("kept the CUDA-graph replay" if graphs["kept"] else
                                           f"not {_GRAPHS_MARGIN:.0%} faster, kept the plain module"))
    return gm


# --- the public API -------------------------------------------------------------------------------------------------
def optimize(model: nn.Module, example_inputs, *, tune: bool = True, fold_batchnorm: bool = True,
             prefer_faster: bool = True, jobs: int | None = None, progress: bool = True,
             dispatch=None, end_to_end: bool = True, cuda_graphs: bool = False) -> nn.Module:
    """Traces ``model``, fuses its Linear/Conv2d (+ BatchNorm2d) (+ activation) into pycutlass ops and tunes them.

    Returns a ``torch.fx.GraphModule`` computing what ``model`` computes; ``report(result)`` (also
    ``result.pycutlass_report``) says what was replaced and tuned. ``model`` itself is not changed; the result
    shares the parameters of the layers it kept and of the Linear layers it fused. ``example_inputs``: the model's
    positional arguments (a tensor or a tuple), run once to learn shapes and, with ``tune``, to record the calls to
    tune. Tuning needs a GPU and happens only for a model on CUDA; a CPU model runs torch's math and is not tuned.
    ``dispatch``: the :class:`~pycutlass.torch.dispatch.Dispatch` to tune with (default: the current session's).
    ``end_to_end`` (after tuning on CUDA): time whole forwards of ``model`` and of the result with a few placements
    of its layers (as tuned, only clear wins on kernels, all on torch) on ``example_inputs`` and keep the fastest,
    so a host-bound model is not slower than torch's; the report's ``end_to_end`` records the times. When no
    placement beats torch by 2%, the result runs torch only: ``model`` itself as a shallow copy (a module of its
    class sharing its layers; ``end_to_end["chosen"] == "eager"``) or, where that was 10% faster, its plain
    ``torch.fx`` trace (``"traced"``).
    ``cuda_graphs`` (with ``end_to_end``, an eval-mode model on CUDA): also time the chosen result replayed from CUDA
    graphs (:func:`~pycutlass.torch.cuda_graphed`: one capture per input signature, inputs copied in, outputs
    copied out) and return that :class:`~pycutlass.torch.CUDAGraphed` where it was 10% faster (a host-bound model:
    small batches, many layers); ``end_to_end["graphs"]`` records both times. The graphs replay only for calls
    without autograd (``torch.no_grad()`` / ``torch.inference_mode()``); other calls run the module directly.
    """
    for name, value in (("end_to_end", end_to_end), ("cuda_graphs", cuda_graphs)):
        if not isinstance(value, bool):
            raise ArgumentError(f"{name} must be True or False, got {value!r}")
    example_inputs = _tuple(example_inputs)
    gm = _trace(model)
    shapes = _Shapes(gm)
    try:
        with _Evaluating(gm), torch.no_grad():
            shapes.run(*example_inputs)
    except Exception as exc:
        where = f" at {shapes.node.format_node()}" if shapes.node is not None else ""
        raise ArgumentError(f"the traced model failed on example_inputs{where} ({type(exc).__name__}: {exc}); pass "
                            "the model's positional arguments, as a tensor or a tuple") from exc

    report = OptimizeReport()
    matches = _find(gm, fold_batchnorm, model.training, report)
    attrs_before = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    conv_nodes = _rewrite(gm, model, matches)
    _keep_views_working(gm.graph, conv_nodes)
    gm.graph.eliminate_dead_code()
    _remove_orphans(gm, model, attrs_before)
    gm.delete_all_unused_submodules()
    gm.graph.lint()
    gm.recompile()
    report.rows = [{"layer": m.layer, "op": m.op, "pattern": m.pattern, "shape": m.shape, "kernel": "-",
                    "cutlass_us": None, "torch_us": None, "speedup": None} for m in matches]

    if tune and not matches:
        report.notes.append("nothing to tune: no layer was replaced")
    elif tune and not _on_cuda(gm, example_inputs):
        report.notes.append("not tuned: the model and its inputs are on the CPU, where the ops run torch's math "
                            "(move both to CUDA to tune)")
    elif tune:
        if not torch.cuda.is_available():
            raise NoGpuError("tuning needs a GPU: the model is on CUDA but torch sees no usable GPU")
        choices, sites = _tune(gm, example_inputs, _dispatch(dispatch), jobs, progress, prefer_faster)
        rows = _fill_rows(report, choices)
        if end_to_end and sites:
            traced = _trace(model)
            record, moved = _choose_end_to_end(gm, model, example_inputs, sites, traced=traced)
            _record_end_to_end(report, rows, sites, record, moved)
            if record["chosen"] == _E2E_TRACED:
                gm = traced
            elif record["chosen"] == _E2E_EAGER:
                gm = _shallow_copy(model)
            if cuda_graphs:
                gm = _graph_if_faster(gm, model, example_inputs, report)
    if cuda_graphs and not isinstance(gm, CUDAGraphed) and not (report.end_to_end or {}).get("graphs"):
        report.notes.append("cuda_graphs: not tried (it needs the end-to-end check: a tuned model on CUDA with "
                            "end_to_end=True)")
    gm.pycutlass_report = report
    return gm


def report(model: nn.Module) -> OptimizeReport:
    """The :class:`OptimizeReport` of a model ``optimize`` (or ``load``) returned."""
    found = getattr(model, "pycutlass_report", None)
    if not isinstance(found, OptimizeReport):
        raise ArgumentError(f"{type(model).__name__} has no pycutlass report: pass a model returned by "
                            "pycutlass.torch.optimize or pycutlass.torch.load")
    return found


def save(model: nn.Module, directory, *, dispatch=None) -> Path:
    """Writes ``model.pt`` (the whole optimized model) and ``pycutlass-torch.json`` (the dispatch's tuning decisions
    and the report) into ``directory``; returns the directory."""
    if not isinstance(model, nn.Module):
        raise ArgumentError(f"save takes the torch.nn.Module optimize returned, got {type(model).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    found = getattr(model, "pycutlass_report", None)
    state = {"format": "pycutlass-torch", "version": _FORMAT_VERSION,
             "dispatch": _dispatch(dispatch).export_state(),
             "report": found.to_dict() if isinstance(found, OptimizeReport) else None}
    text = json.dumps(state, indent=1)  # before writing anything: a state that is not JSON fails here
    torch.save(model, directory / MODEL_FILE)
    (directory / STATE_FILE).write_text(text)
    return directory


def load(directory, map_location=None, *, dispatch=None) -> nn.Module:
    """The model ``save`` wrote, with its tuning decisions given to the dispatch (default: the current session's),
    so this process does not tune again."""
    directory = Path(directory)
    missing = [name for name in (MODEL_FILE, STATE_FILE) if not (directory / name).is_file()]
    if missing:
        raise ArgumentError(f"{directory} lacks {', '.join(missing)}: load reads a directory written by "
                            f"pycutlass.torch.save ({MODEL_FILE} and {STATE_FILE})")
    state = json.loads((directory / STATE_FILE).read_text())
    if state.get("format") != "pycutlass-torch" or state.get("version") != _FORMAT_VERSION:
        raise ArgumentError(f"{directory / STATE_FILE} is not a pycutlass-torch state of version {_FORMAT_VERSION} "
                            f"(format {state.get('format')!r}, version {state.get('version')!r})")
    # weights_only=False: the file holds a whole GraphModule (code and module classes), not only tensors.
    model = torch.load(directory / MODEL_FILE, map_location=map_location, weights_only=False)
    _dispatch(dispatch).import_state(state["dispatch"])
    if not isinstance(getattr(model, "pycutlass_report", None), OptimizeReport) and state.get("report"):
        model.pycutlass_report = OptimizeReport.from_dict(state["report"])
    return model
