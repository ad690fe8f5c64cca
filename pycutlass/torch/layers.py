"""The layers the model pass puts in a model: :class:`CutlassLinear` and :class:`CutlassConv2d`, each one fused
pycutlass op (module-level classes, so an optimized model pickles)."""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from . import ops, reference


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
