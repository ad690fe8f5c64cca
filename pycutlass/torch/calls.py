"""What the dispatch records and reports: the calls collected for tuning and the choices tuning made."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

TORCH = "torch"  # the choice "run torch's implementation"
# How far a candidate kernel's result may stray from the float reference (relative to its largest value).
TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 5e-2, torch.float64: 1e-9}


@dataclass
class OpCall:
    """One call seen while collecting: enough to rebuild inputs of the same shapes and layouts."""

    op: str  # gemm, conv2d, conv2d_dgrad, conv2d_wgrad
    layer: str
    key: str  # the tuning key (device, class, shape bucket)
    specs: tuple  # (shape, stride, dtype) per tensor argument, None for absent ones
    scalars: tuple
    device: int
    cls: object = field(repr=False, default=None)
    problem: tuple = ()

    def describe(self) -> str:
        if self.op == "gemm":
            m, n, k = self.problem
            return f"{m}x{n}x{k}"
        n, h, w, c, k, r, s = self.problem[:7]
        return f"N{n} {h}x{w}x{c} -> K{k} {r}x{s}"


@dataclass
class Choice:
    call: OpCall
    kernel: str  # an operation's name, "torch", or "-" (nothing tuned: no kernel serves this class)
    cutlass_us: float | None
    torch_us: float | None

    @property
    def speedup(self) -> float | None:
        if self.cutlass_us and self.torch_us:
            return self.torch_us / self.cutlass_us
        return None


class Collector:
    def __init__(self):
        self.layer = ""
        self.calls: list[OpCall] = []
