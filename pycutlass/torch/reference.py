"""What each pycutlass operator computes, written with torch: the CPU implementation, the fallback for inputs no
kernel supports, and what the GPU tests compare against (in float64)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = ("identity", "relu", "gelu", "gelu_taylor", "silu", "hardswish", "sigmoid", "tanh", "leaky_relu")


_ACTIVATION_FUNCTIONS = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu, "hardswish": F.hardswish,
                         "sigmoid": torch.sigmoid, "tanh": torch.tanh}


def activate(x: torch.Tensor, activation: str, activation_arg: float = 0.0) -> torch.Tensor:
    """CUTLASS's epilogue activations (gelu is the exact erf form, gelu_taylor torch's tanh form; leaky_relu's slope
    is ``activation_arg``). Float64 tensors get float64 results on every device (hardswish by CUTLASS's formula)."""
    if activation == "identity":
        return x
    if activation == "gelu_taylor":
        return F.gelu(x, approximate="tanh")
    if activation == "leaky_relu":
        return F.leaky_relu(x, activation_arg)
    if activation == "hardswish" and x.dtype is torch.float64:
        # CUTLASS's HardSwish<double>: x * relu6(x + 3) / 6 in float64. torch's CUDA kernel multiplies by
        # 1.0f / 6.0f, a float32 constant, which puts every float64 result 2^-25 (3e-8) high. The constant ends of
        # relu6 are constants here so that the gradient is F.hardswish's at the kinks too (0 at -3, 1 at 3).
        relu6 = torch.where((x > -3.0) & (x < 3.0), x + 3.0, torch.where(x >= 3.0, 6.0, 0.0))
        return x * relu6 / 6.0
    function = _ACTIVATION_FUNCTIONS.get(activation)
    if function is None:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    return function(x)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # The kernels accumulate 16-bit types in float32 and apply the epilogue there; so does the reference.
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def gemm(a, b, bias=None, c=None, alpha=1.0, beta=0.0, activation="identity", activation_arg=0.0):
    wide = _compute_dtype(a.dtype)
    acc = torch.matmul(a.to(wide), b.to(wide)) * alpha
    if c is not None and beta != 0:
        acc = acc + beta * c.to(wide)
    if bias is not None:
        acc = acc + bias.to(wide)
    return activate(acc, activation, activation_arg).to(a.dtype).contiguous()


def bmm(a, b, bias=None, alpha=1.0, activation="identity", activation_arg=0.0):
    wide = _compute_dtype(a.dtype)
    acc = torch.bmm(a.to(wide), b.to(wide)) * alpha
    if bias is not None:
        acc = acc + (bias.to(wide) if bias.dim() == 1 else bias.to(wide)[:, None, :])
    return activate(acc, activation, activation_arg).to(a.dtype).contiguous()


def conv2d(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), activation="identity",
           activation_arg=0.0):
    wide = _compute_dtype(x.dtype)
    if x.device.type == "cuda" and wide is torch.float32 and x.dtype is not torch.float32:
        out = F.conv2d(x, weight, None, stride, padding, dilation).to(wide)  # cuDNN accumulates in float32
    else:
        out = F.conv2d(x.to(wide), weight.to(wide), None, stride, padding, dilation)
    if bias is not None:
        out = out + bias.to(wide)[None, :, None, None]
    out = activate(out, activation, activation_arg).to(x.dtype)
    return out.contiguous(memory_format=torch.channels_last)


def conv2d_output_size(x_shape, w_shape, stride, padding, dilation) -> list[int]:
    n, _, h, w = x_shape
    k, _, r, s = w_shape
    p = (h + 2 * padding[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (w + 2 * padding[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
    return [n, k, p, q]


# --- what eager torch runs for the same layer: the fallback and the "torch is faster" choice -----------------------
# (in the tensors' own dtype: the float32 forms above are references, far slower for 16-bit GEMMs on the GPU)
def eager_gemm(a, b, bias=None, c=None, alpha=1.0, beta=0.0, activation="identity", activation_arg=0.0):
    if c is not None and beta != 0:
        out = torch.addmm(c, a, b, beta=beta, alpha=alpha)
        if bias is not None:
            out += bias
    elif bias is not None:
        out = torch.addmm(bias, a, b, alpha=alpha)
    else:
        out = torch.mm(a, b) if alpha == 1 else torch.mm(a, b) * alpha
    return activate(out, activation, activation_arg)


def eager_conv2d(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), activation="identity",
                 activation_arg=0.0):
    out = activate(F.conv2d(x, weight, bias, stride, padding, dilation), activation, activation_arg)
    return out.contiguous(memory_format=torch.channels_last)


def conv2d_dgrad(grad, weight, input_size, stride, padding, dilation):
    """The input gradient, channels_last like the kernels' (torch's own implementation)."""
    out = torch.nn.grad.conv2d_input(list(input_size), weight, grad, stride, padding, dilation)
    return out.contiguous(memory_format=torch.channels_last)


def conv2d_wgrad(grad, x, weight_size, stride, padding, dilation):
    """The weight gradient, channels_last like the kernels' (torch's own implementation)."""
    out = torch.nn.grad.conv2d_weight(x, list(weight_size), grad, stride, padding, dilation)
    return out.contiguous(memory_format=torch.channels_last)
