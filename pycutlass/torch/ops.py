"""pycutlass's operators in torch's registry (``torch.ops.pycutlass.*``), through ``torch.library.Library``.

``Library.define`` + ``impl`` is the direct route: a call goes from the dispatcher straight to our CUDA function.
(``torch.library.custom_op`` wraps the same registration in a Python layer that costs more per call; the benchmark
``benchmarks/torch_models.py --overhead`` measures both.) Each operator has:

- a CUDA implementation: the kernel chosen by the session's :class:`~pycutlass.torch.dispatch.Dispatch`, on torch's
  current stream, output from torch's allocator; inputs no kernel supports fall back to torch (``fallback=True``);
- a CPU implementation (torch's math, ``reference.py``), so a model built with the ops runs anywhere;
- a fake implementation (shapes, dtypes and strides only) for ``torch.compile`` and ``FakeTensorMode``;
- autograd for ``gemm`` (two GEMMs) and ``conv2d`` (dgrad + wgrad operators).

Registration happens once per process on import: torch's operator registry is itself process-wide.
"""
from __future__ import annotations

import torch

from ..session import current
from . import reference
from .dispatch import TORCH, Dispatch
from .reference import ACTIVATIONS

_NAMESPACE = "pycutlass"
# (not "kernel": Inductor's FallbackKernel.create takes a parameter of that name, and the keywords would collide)
_EPILOGUE = "str activation='identity', float activation_arg=0.0, str kernel_name=''"
SCHEMAS = {
    "gemm": f"gemm(Tensor a, Tensor b, Tensor? bias=None, Tensor? c=None, float alpha=1.0, float beta=0.0, "
            f"{_EPILOGUE}) -> Tensor",
    "bmm": f"bmm(Tensor a, Tensor b, Tensor? bias=None, float alpha=1.0, {_EPILOGUE}) -> Tensor",
    "grouped_gemm": f"grouped_gemm(Tensor[] a, Tensor[] b, Tensor?[]? bias=None, float alpha=1.0, {_EPILOGUE}) "
                    f"-> Tensor[]",
    "conv2d": f"conv2d(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=[1, 1], int[2] padding=[0, 0], "
              f"int[2] dilation=[1, 1], {_EPILOGUE}) -> Tensor",
    "conv2d_dgrad": "conv2d_dgrad(Tensor grad, Tensor weight, int[] input_size, int[2] stride, int[2] padding, "
                    "int[2] dilation, str kernel_name='') -> Tensor",
    "conv2d_wgrad": "conv2d_wgrad(Tensor grad, Tensor x, int[] weight_size, int[2] stride, int[2] padding, "
                    "int[2] dilation, str kernel_name='') -> Tensor",
}


_engine = Dispatch.current


# --- CPU: torch's math ----------------------------------------------------------------------------------------------
def _gemm_cpu(a, b, bias=None, c=None, alpha=1.0, beta=0.0, activation="identity", activation_arg=0.0,
              kernel_name=""):
    return reference.gemm(a, b, bias, c, alpha, beta, activation, activation_arg)


def _bmm_cpu(a, b, bias=None, alpha=1.0, activation="identity", activation_arg=0.0, kernel_name=""):
    return reference.bmm(a, b, bias, alpha, activation, activation_arg)


def _grouped_cpu(a, b, bias=None, alpha=1.0, activation="identity", activation_arg=0.0, kernel_name=""):
    biases = bias if bias is not None else [None] * len(a)
    return [reference.gemm(x, y, z, None, alpha, 0.0, activation, activation_arg) for x, y, z in zip(a, b, biases)]


def _conv2d_cpu(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), activation="identity",
                activation_arg=0.0, kernel_name=""):
    return reference.conv2d(x, weight, bias, stride, padding, dilation, activation, activation_arg)


def _dgrad_cpu(grad, weight, input_size, stride, padding, dilation, kernel_name=""):
    return reference.conv2d_dgrad(grad, weight, input_size, stride, padding, dilation)


def _wgrad_cpu(grad, x, weight_size, stride, padding, dilation, kernel_name=""):
    return reference.conv2d_wgrad(grad, x, weight_size, stride, padding, dilation)


# --- CUDA: the dispatcher picks a kernel ----------------------------------------------------------------------------
def _gemm_cuda(a, b, bias=None, c=None, alpha=1.0, beta=0.0, activation="identity", activation_arg=0.0,
               kernel_name=""):
    return _engine().gemm(a, b, bias, c, alpha, beta, activation, activation_arg, kernel_name)


def _bmm_cuda(a, b, bias=None, alpha=1.0, activation="identity", activation_arg=0.0, kernel_name=""):
    return _engine().bmm(a, b, bias, alpha, activation, activation_arg, kernel_name)


def _grouped_cuda(a, b, bias=None, alpha=1.0, activation="identity", activation_arg=0.0, kernel_name=""):
    return _engine().grouped_gemm(list(a), list(b), None if bias is None else list(bias), alpha, activation,
                                  activation_arg, kernel_name)


def _conv2d_cuda(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), activation="identity",
                 activation_arg=0.0, kernel_name=""):
    return _engine().conv2d(x, weight, bias, tuple(stride), tuple(padding), tuple(dilation), activation,
                            activation_arg, kernel_name)


def _dgrad_cuda(grad, weight, input_size, stride, padding, dilation, kernel_name=""):
    return _engine().conv2d_dgrad(grad, weight, tuple(input_size), tuple(stride), tuple(padding), tuple(dilation),
                                  kernel_name)


def _wgrad_cuda(grad, x, weight_size, stride, padding, dilation, kernel_name=""):
    return _engine().conv2d_wgrad(grad, x, tuple(weight_size), tuple(stride), tuple(padding), tuple(dilation),
                                  kernel_name)


# --- fake (meta): shapes only ---------------------------------------------------------------------------------------
def _gemm_fake(a, b, bias=None, c=None, alpha=1.0, beta=0.0, activation="identity", activation_arg=0.0,
               kernel_name=""):
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: "pycutlass.gemm takes 2-D a (M x K) and b (K x N)")
    torch._check(a.shape[1] == b.shape[0], lambda: f"pycutlass.gemm: a is {tuple(a.shape)}, b {tuple(b.shape)}")
    return a.new_empty((a.shape[0], b.shape[1]))


def _bmm_fake(a, b, bias=None, alpha=1.0, activation="identity", activation_arg=0.0, kernel_name=""):
    torch._check(a.dim() == 3 and b.dim() == 3, lambda: "pycutlass.bmm takes 3-D a (L x M x K) and b (L x K x N)")
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))


def _grouped_fake(a, b, bias=None, alpha=1.0, activation="identity", activation_arg=0.0, kernel_name=""):
    return [x.new_empty((x.shape[0], y.shape[1])) for x, y in zip(a, b)]


def _conv2d_fake(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), activation="identity",
                 activation_arg=0.0, kernel_name=""):
    size = reference.conv2d_output_size(x.shape, weight.shape, stride, padding, dilation)
    return x.new_empty(size).contiguous(memory_format=torch.channels_last)


def _dgrad_fake(grad, weight, input_size, stride, padding, dilation, kernel_name=""):
    return grad.new_empty(list(input_size)).contiguous(memory_format=torch.channels_last)


def _wgrad_fake(grad, x, weight_size, stride, padding, dilation, kernel_name=""):
    return grad.new_empty(list(weight_size)).contiguous(memory_format=torch.channels_last)


# --- autograd -------------------------------------------------------------------------------------------------------
def _pre_activation_grad(z, grad, activation, activation_arg):
    """d activation(z) / dz applied to ``grad`` (identity passes ``grad`` through)."""
    if activation == "identity":
        return grad
    with torch.enable_grad():
        z = z.detach().requires_grad_(True)
        (out,) = torch.autograd.grad(reference.activate(z, activation, activation_arg), z, grad)
    return out


def _gemm_setup(ctx, inputs, output):
    a, b, bias, c, alpha, beta, activation, activation_arg, kernel = inputs
    ctx.save_for_backward(a, b, bias, c)
    ctx.alpha, ctx.beta, ctx.activation, ctx.activation_arg = alpha, beta, activation, activation_arg
    ctx.session = current()  # autograd runs the backward on its own threads: the forward's session serves it


def _gemm_backward(ctx, grad):
    with ctx.session.activate():
        return _gemm_grads(ctx, grad)


def _gemm_grads(ctx, grad):
    a, b, bias, c = ctx.saved_tensors
    gemm = torch.ops.pycutlass.gemm
    if ctx.activation != "identity":  # the pre-activation value: recomputed rather than kept (one more GEMM)
        z = gemm(a, b, bias, c, ctx.alpha, ctx.beta)
        grad = _pre_activation_grad(z, grad, ctx.activation, ctx.activation_arg)
    grad = grad.contiguous()
    grad_a = gemm(grad, b.t(), alpha=ctx.alpha) if ctx.needs_input_grad[0] else None
    grad_b = gemm(a.t(), grad, alpha=ctx.alpha) if ctx.needs_input_grad[1] else None
    grad_bias = grad.sum(0).to(bias.dtype) if bias is not None and ctx.needs_input_grad[2] else None
    grad_c = (grad * ctx.beta).to(c.dtype) if c is not None and ctx.needs_input_grad[3] else None
    return grad_a, grad_b, grad_bias, grad_c, None, None, None, None, None


def _conv2d_setup(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, activation, activation_arg, kernel = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.geometry = (list(stride), list(padding), list(dilation))
    ctx.activation, ctx.activation_arg = activation, activation_arg
    ctx.session = current()


def _conv2d_backward(ctx, grad):
    with ctx.session.activate():
        return _conv2d_grads(ctx, grad)


def _conv2d_grads(ctx, grad):
    x, weight, bias = ctx.saved_tensors
    stride, padding, dilation = ctx.geometry
    ops = torch.ops.pycutlass
    if ctx.activation != "identity":
        z = ops.conv2d(x, weight, bias, stride, padding, dilation)
        grad = _pre_activation_grad(z, grad, ctx.activation, ctx.activation_arg)
    grad = grad.contiguous(memory_format=torch.channels_last)
    grad_x = ops.conv2d_dgrad(grad, weight, list(x.shape), stride, padding, dilation) \
        if ctx.needs_input_grad[0] else None
    grad_w = ops.conv2d_wgrad(grad, x, list(weight.shape), stride, padding, dilation) \
        if ctx.needs_input_grad[1] else None
    grad_bias = grad.sum((0, 2, 3)).to(bias.dtype) if bias is not None and ctx.needs_input_grad[2] else None
    return grad_x, grad_w, grad_bias, None, None, None, None, None, None


def _register() -> torch.library.Library:
    library = torch.library.Library(_NAMESPACE, "DEF")
    implementations = {
        "gemm": (_gemm_cpu, _gemm_cuda, _gemm_fake), "bmm": (_bmm_cpu, _bmm_cuda, _bmm_fake),
        "grouped_gemm": (_grouped_cpu, _grouped_cuda, _grouped_fake),
        "conv2d": (_conv2d_cpu, _conv2d_cuda, _conv2d_fake),
        "conv2d_dgrad": (_dgrad_cpu, _dgrad_cuda, _dgrad_fake), "conv2d_wgrad": (_wgrad_cpu, _wgrad_cuda, _wgrad_fake),
    }
    for name, schema in SCHEMAS.items():
        library.define(schema)
        cpu, cuda, fake = implementations[name]
        library.impl(name, cpu, "CPU")
        library.impl(name, cuda, "CUDA")
        torch.library.register_fake(f"{_NAMESPACE}::{name}", fake, lib=library)
    torch.library.register_autograd(f"{_NAMESPACE}::gemm", _gemm_backward, setup_context=_gemm_setup, lib=library)
    torch.library.register_autograd(f"{_NAMESPACE}::conv2d", _conv2d_backward, setup_context=_conv2d_setup,
                                    lib=library)
    return library


_LIBRARY = _register()  # torch keeps the registrations for as long as this object lives
_GEMM, _CONV2D = torch.ops.pycutlass.gemm.default, torch.ops.pycutlass.conv2d.default


# --- the Python API -------------------------------------------------------------------------------------------------
# In plain eager code (CUDA tensors, no autograd to record, nothing tracing) the Python API calls the dispatch
# directly: torch's dispatcher would only route the call back to the same Python function, at several microseconds
# per call. Everything else (torch.compile, FakeTensor, autograd, CPU tensors) goes through torch.ops.pycutlass.
_ACTIVATIONS = frozenset(ACTIVATIONS)


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # subclasses (fake, functional, ...) need the dispatcher


def _direct(*tensors) -> bool:
    if torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled() or \
            torch._C._len_torch_dispatch_stack() or torch._C._are_functorch_transforms_active():
        return False  # (is_compiling first: dynamo folds it and stops there; vmap/grad wrap plain-looking tensors)
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or not t.is_cuda or (grad and t.requires_grad)):
            return False
    return True


def _check_activation(activation: str) -> None:
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")


def gemm(a, b, bias=None, c=None, alpha=1.0, beta=0.0, activation="identity", activation_arg=0.0, kernel=""):
    """``activation(alpha * a @ b + beta * c + bias)``: a (M x K), b (K x N), bias (N), c (M x N) -> (M x N)."""
    _check_activation(activation)
    kernel = _kernel_name(kernel) if kernel else ""
    if _direct(a, b, bias, c):
        return _engine().gemm(a, b, bias, c, float(alpha), float(beta), activation, float(activation_arg), kernel)
    return _GEMM(a, b, bias, c, float(alpha), float(beta), activation, float(activation_arg), kernel)


def linear(x, weight, bias=None, activation="identity", activation_arg=0.0, kernel="", residual=None):
    """``activation(F.linear(x, weight, bias) + residual)`` for x (..., K) and weight (N x K), as one fused GEMM;
    ``residual`` (optional, the output's shape) is the GEMM's C operand, added in the epilogue."""
    _check_activation(activation)
    kernel = _kernel_name(kernel) if kernel else ""
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    c, beta = None, 0.0
    if residual is not None:
        shape = (*x.shape[:-1], weight.shape[0])
        if tuple(residual.shape) != shape:
            raise ValueError(f"residual must have the output's shape {shape}, got {tuple(residual.shape)}")
        c, beta = residual.reshape(-1, weight.shape[0]), 1.0
    if _direct(rows, weight, bias, c):
        out = _engine().gemm(rows, weight.t(), bias, c, 1.0, beta, activation, float(activation_arg), kernel)
    else:
        out = _GEMM(rows, weight.t(), bias, c, 1.0, beta, activation, float(activation_arg), kernel)
    return out if x.dim() == 2 else out.reshape(*x.shape[:-1], weight.shape[0])


def eager_linear(x, weight, bias=None, activation="identity", activation_arg=0.0, residual=None):
    """What ``linear`` computes where the dispatch binds the call to torch (``reference.eager_gemm`` on the same
    2-D views, so the same torch calls in the same order: ``addmm`` with the residual as C, then ``+= bias``)."""
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    c = None if residual is None else residual.reshape(-1, weight.shape[0])
    out = reference.eager_gemm(rows, weight.t(), bias, c, 1.0, 0.0 if c is None else 1.0, activation,
                               float(activation_arg))
    return out if x.dim() == 2 else out.reshape(*x.shape[:-1], weight.shape[0])


class LinearPlan:
    """One ``linear`` call signature (input shape, strides, dtype, device; residual or not) bound to its kernel: a
    later call with new tensors of that signature costs a few attribute checks, one output allocation and one
    launch, without the operator's argument handling or the dispatch's signature lookup. Valid while the dispatch
    that made it is the current one and has not dropped its bindings (``generation``); ``launch`` returns None
    whenever it does not apply, and the caller takes the full path. A plan without a launch (``bound`` None)
    records that the signature is bound to torch: the caller runs ``eager_linear`` itself (``runs_torch``) and does
    not look for a plan again until the bindings change."""

    __slots__ = ("dispatch", "generation", "bound", "shape", "stride", "dtype", "device", "weight", "bias",
                 "residual_stride", "out_shape", "device_index")

    def __init__(self, dispatch, bound, x, weight, bias, residual):
        self.dispatch, self.generation, self.bound = dispatch, dispatch.generation, bound
        self.shape, self.stride, self.dtype, self.device = x.shape, x.stride(), x.dtype, x.device
        self.weight, self.bias = weight, bias
        self.residual_stride = None if residual is None else residual.stride()
        self.out_shape = (*x.shape[:-1], weight.shape[0])
        self.device_index = x.device.index

    @classmethod
    def after_call(cls, x, weight, bias, activation, activation_arg, kernel, residual) -> "LinearPlan | None":
        """The plan for a call that just ran directly on a kernel (None where it went to torch or is not plain)."""
        if not x.is_contiguous() or (residual is not None and not residual.is_contiguous()) or \
                not _direct(x, weight, bias, residual):
            return None
        dispatch = _engine()
        rows = x.reshape(-1, x.shape[-1])
        c = None if residual is None else residual.reshape(-1, weight.shape[0])
        bound = dispatch.bound_gemm(rows, weight.t(), bias, c, 1.0, 0.0 if c is None else 1.0, activation,
                                    float(activation_arg), kernel)
        if bound is None:
            return None  # not bound yet (an unaligned view, say): a later call may bind it
        return cls(dispatch, None if bound is TORCH else bound, x, weight, bias, residual)

    def current(self) -> bool:
        """Whether the dispatch that made this plan is the current one and still holds the binding it read."""
        dispatch = _engine()
        return dispatch is self.dispatch and dispatch.generation == self.generation

    def _applies(self, x, weight, bias, residual) -> bool:
        """The call has this plan's signature, and the binding the plan read still holds."""
        if weight is not self.weight or bias is not self.bias or x.shape != self.shape or \
                x.stride() != self.stride or x.dtype != self.dtype or x.device != self.device or \
                (None if residual is None else residual.stride()) != self.residual_stride:
            return False
        if residual is not None and (residual.shape != self.out_shape or residual.dtype != self.dtype or
                                     residual.device != self.device):
            return False
        return self.current() and self.dispatch._collector is None  # (a collecting dispatch records every call)

    def runs_torch(self, x, weight, bias, residual) -> bool:
        """Whether the dispatch binds this call to torch, so the caller may run ``eager_linear`` itself: the same
        torch calls ``linear`` would make, without its argument handling and signature lookup. (No ``_direct``
        check: the torch calls are right under autograd and tracing too, as the layer's ``eager_shapes`` are.)"""
        return self.bound is None and self._applies(x, weight, bias, residual)

    def launch(self, x, weight, bias, residual):
        if self.bound is None or not self._applies(x, weight, bias, residual) or \
                not _direct(x, weight, bias, residual):
            return None
        out = x.new_empty(self.out_shape)
        pointers = (x.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr(),
                    0 if residual is None else residual.data_ptr(), out.data_ptr())
        if self.bound.launch_pointers(pointers, torch._C._cuda_getCurrentRawStream(self.device_index)):
            return out
        return None


def bmm(a, b, bias=None, alpha=1.0, activation="identity", activation_arg=0.0, kernel=""):
    """``activation(alpha * a @ b + bias)`` for a (L x M x K), b (L x K x N); bias (N) or (L x N)."""
    _check_activation(activation)
    return torch.ops.pycutlass.bmm(a, b, bias, float(alpha), activation, float(activation_arg), _kernel_name(kernel))


def grouped_gemm(a, b, bias=None, alpha=1.0, activation="identity", activation_arg=0.0, kernel=""):
    """One call for many GEMMs: ``[activation(alpha * a[i] @ b[i] + bias[i])]``."""
    _check_activation(activation)
    return torch.ops.pycutlass.grouped_gemm(list(a), list(b), None if bias is None else list(bias), float(alpha),
                                            activation, float(activation_arg), _kernel_name(kernel))


def _pair(value, name: str) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value, value]
    value = list(value)
    if len(value) != 2:
        raise ValueError(f"{name} must be an int or a pair, got {value!r}")
    return [int(v) for v in value]


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, activation="identity", activation_arg=0.0,
           kernel=""):
    """``activation(F.conv2d(x, weight, bias, stride, padding, dilation))``; the result is channels_last."""
    _check_activation(activation)
    geometry = (_pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation"))
    kernel = _kernel_name(kernel) if kernel else ""
    if _direct(x, weight, bias):
        return _engine().conv2d(x, weight, bias, *(tuple(g) for g in geometry), activation, float(activation_arg),
                                kernel)
    return _CONV2D(x, weight, bias, *geometry, activation, float(activation_arg), kernel)


def _kernel_name(kernel) -> str:
    """An override: an operation (registered with the current dispatch) or its name; '' lets the dispatch pick."""
    if not kernel:
        return ""
    if isinstance(kernel, str):
        return kernel
    return _engine().register_kernel(kernel)
