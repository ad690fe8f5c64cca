"""Replaying a model from CUDA graphs: no Python, dispatcher or launch cost per layer.

A model with small inputs (one sequence, a few images) spends most of its time on the host: enqueuing each layer
costs more than the GPU's work for it. ``cuda_graphed(model)`` captures the model's forward once per input
signature (each tensor argument's shape, strides, dtype and device; the other arguments' values) and later calls
copy the inputs into the captured ones, replay the graph and return a copy of its outputs. It is what
``torch.compile(mode="reduce-overhead")`` does for compiled code, for any module, pycutlass's fused layers
included (their kernels launch from Params bound on the first call, so they capture like torch's own).

Inference only: with gradients enabled, the wrapped module is simply called. The module must be capturable: no
host synchronization, no data-dependent Python control flow, and its parameters must stay where they are (updating
them in place is fine; replacing them is not: the graph keeps reading the old memory).
"""
from __future__ import annotations

import collections

import torch
from torch import nn

from ..errors import ArgumentError


class CUDAGraphed(nn.Module):
    """``module``'s forward replayed from one CUDA graph per input signature (at most ``max_graphs``, the least
    recently used one is dropped); ``warmup`` eager calls on a side stream precede each capture (first calls bind
    pycutlass's kernels and let libraries allocate their workspaces outside the graph)."""

    def __init__(self, module: nn.Module, *, max_graphs: int = 8, warmup: int = 2):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise ArgumentError(f"cuda_graphed takes a torch.nn.Module, got {type(module).__name__}")
        for name, value in (("max_graphs", max_graphs), ("warmup", warmup)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "max_graphs" else 0):
                raise ArgumentError(f"{name} must be an integer >= {1 if name == 'max_graphs' else 0}, got {value!r}")
        self.module = module
        self.max_graphs, self.warmup = max_graphs, warmup
        self._graphs: collections.OrderedDict = collections.OrderedDict()  # signature -> _Captured
        self._pool = None  # one memory pool for all of this module's graphs
        self.captures = 0  # how many graphs were captured (for tests and reports)

    def forward(self, *args):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors or not all(t.is_cuda for t in tensors) or (torch.is_grad_enabled() and any(
                t.requires_grad for t in [*tensors, *self.module.parameters()])) or \
                torch.cuda.is_current_stream_capturing():
            return self.module(*args)
        key = tuple((a.shape, a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else ("value", a)
                    for a in args)
        captured = self._graphs.get(key)
        if captured is None:
            captured = self._capture(args, key)
        else:
            self._graphs.move_to_end(key)
        for static, value in zip(captured.inputs, args):
            if isinstance(static, torch.Tensor):
                static.copy_(value)
        captured.graph.replay()
        return _map_tensors(captured.outputs, lambda t: t.clone())

    def _capture(self, args, key):
        device = next(a for a in args if isinstance(a, torch.Tensor)).device
        inputs = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.module(*inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(device), torch.cuda.graph(graph, pool=self._pool):
            outputs = self.module(*inputs)
        captured = _Captured(graph, inputs, outputs)
        self._graphs[key] = captured
        self.captures += 1
        while len(self._graphs) > self.max_graphs:
            self._graphs.popitem(last=False)
        return captured

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_graphs"], state["_pool"] = collections.OrderedDict(), None  # graphs live in this process only
        return state

    def reset(self) -> None:
        """Drop every captured graph (after replacing parameters, say); the next calls capture again."""
        self._graphs.clear()


class _Captured:
    __slots__ = ("graph", "inputs", "outputs")

    def __init__(self, graph, inputs, outputs):
        self.graph, self.inputs, self.outputs = graph, inputs, outputs


def _map_tensors(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value


def cuda_graphed(module: nn.Module, *, max_graphs: int = 8, warmup: int = 2) -> CUDAGraphed:
    """``module`` (e.g. what ``optimize`` returned) replayed from CUDA graphs, one per input signature."""
    return CUDAGraphed(module, max_graphs=max_graphs, warmup=warmup)
