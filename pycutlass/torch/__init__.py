"""pycutlass inside PyTorch: ``torch.ops.pycutlass.*`` operators, kernel dispatch through the tuning cache, and a
model pass that swaps a model's linear and convolution layers (with their bias, batch norm and activation) for
fused CUTLASS kernels. The only part of pycutlass that imports torch (docs/torch.md).

    import pycutlass.torch as pct
    y = pct.linear(x, weight, bias, activation="gelu")        # one fused GEMM
    fast = pct.optimize(model.eval(), (example,))             # find, tune and swap the layers
    print(pct.report(fast))
"""
from __future__ import annotations

from .dispatch import Choice, Dispatch, OpCall
from .ops import ACTIVATIONS, bmm, conv2d, gemm, grouped_gemm, linear


def current_dispatch() -> Dispatch:
    """The current pycutlass session's dispatch (settings, tuned choices, bound launches)."""
    return Dispatch.current()


def configure(**settings) -> Dispatch:
    """Settings of the current session's dispatch: tune, fallback, policy, db, prefer_faster, family, pdl."""
    return Dispatch.current().configure(**settings)


def use_pack(*packs) -> Dispatch:
    """Serve the torch ops (and models ``optimize`` rewrote) from kernel packs: each a ``.pack`` path, an installed
    pack's name (``pycutlass.packs()``) or a loaded ``Pack``, searched in order. A call whose class no pack covers
    runs torch, counted in ``current_dispatch().fallbacks``; nothing is tuned or compiled. ``use_pack()`` with no
    pack returns to tuning."""
    from ..pack import load_pack

    dispatch = Dispatch.current()
    dispatch.use_packs([load_pack(pack, session=dispatch.session) for pack in packs])
    return dispatch


from .graphs import CUDAGraphed, cuda_graphed
from .model_pass import load, optimize, report, save

__all__ = ["ACTIVATIONS", "CUDAGraphed", "Choice", "Dispatch", "OpCall", "bmm", "configure", "conv2d", "cuda_graphed",
           "current_dispatch", "gemm", "grouped_gemm", "linear", "optimize", "report", "save", "load", "use_pack"]
