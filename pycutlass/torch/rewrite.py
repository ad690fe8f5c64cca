"""Rewriting the traced model: each match becomes one call of its fused layer (:mod:`.layers`), installed in the
original layer's place where every call of it fuses alike, else next to it."""
from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn as nn

from .layers import CutlassConv2d, CutlassLinear
from .match import _first_argument, _Match


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
