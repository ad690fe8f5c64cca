"""Elementwise activations for LinearCombinationGeneric: ``relu(pycutlass.float32)`` and friends.

Each activation names the CUTLASS functor template it emits and how many runtime arguments it takes
(``leaky_relu`` takes its negative slope). ``reference`` is the float64 formula tests compare against; as in
PyCUTLASS, each activation also offers it as ``numpy``: ``relu.numpy(x)`` on the factory (PyCUTLASS's static
method) and ``relu(float32).numpy(x)`` on the object, ``leaky_relu.numpy(x, leaky_alpha)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..description.types import DataType
from ..errors import DescriptionError


@dataclass(frozen=True)
class Activation:
    name: str
    cpp_template: str
    element: DataType
    argument_names: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.element, DataType) or self.element.is_integer:
            raise DescriptionError(f"activation {self.name} computes in a floating-point type, got {self.element!r}",
                                   rule="epilogue.activation_type")

    @property
    def num_arguments(self) -> int:
        return len(self.argument_names)

    def numpy(self, x, *args):
        """This activation on ``x`` in float64 (CUTLASS's formula); ``args`` are its runtime arguments."""
        return _numpy(self.name, self.argument_names, x, args)


def _factory(name: str, cpp_template: str, argument_names: tuple[str, ...] = ()):
    def make(element: DataType = DataType.float32) -> Activation:
        return Activation(name, cpp_template, element, argument_names)

    def numpy(x, *args):
        return _numpy(name, argument_names, x, args)

    make.__name__ = name
    make.__doc__ = f"The {name} activation computed in ``element``."
    numpy.__name__ = "numpy"
    numpy.__qualname__ = f"{name}.numpy"
    numpy.__doc__ = (f"{name}(x{''.join(', ' + a for a in argument_names)}) in float64 on a numpy array "
                     f"(PyCUTLASS's ``{name}.numpy``).")
    make.numpy = numpy
    return make


def _numpy(name: str, argument_names: tuple[str, ...], x, args: tuple):
    if len(args) != len(argument_names):
        raise TypeError(f"{name}.numpy takes x and {len(argument_names)} argument(s) {list(argument_names)}, "
                        f"got {len(args)}")
    if hasattr(x, "__evt_node__"):  # a value traced by an EpilogueVisitTree (epilogue/visitor.py)
        return x._evt_activation(name, args)
    return reference(name, x, *args)


identity = _factory("identity", "cutlass::epilogue::thread::Identity")
relu = _factory("relu", "cutlass::epilogue::thread::ReLu")
leaky_relu = _factory("leaky_relu", "cutlass::epilogue::thread::LeakyReLU", ("leaky_alpha",))
tanh = _factory("tanh", "cutlass::epilogue::thread::Tanh")
sigmoid = _factory("sigmoid", "cutlass::epilogue::thread::Sigmoid")
silu = _factory("silu", "cutlass::epilogue::thread::SiLu")
hardswish = _factory("hardswish", "cutlass::epilogue::thread::HardSwish")
gelu = _factory("gelu", "cutlass::epilogue::thread::GELU")
# GELU's tanh form (torch's ``gelu(approximate="tanh")``), through the hardware tanh: fused after a bias into a
# 4096^3 f16 SM90 GEMM it added about 1% to the kernel where gelu's erf added about 5.5% (H100).
gelu_taylor = _factory("gelu_taylor", "cutlass::epilogue::thread::GELU_taylor")

ACTIVATIONS = {f.__name__: f for f in (identity, relu, leaky_relu, tanh, sigmoid, silu, hardswish, gelu, gelu_taylor)}


def reference(name: str, x, *args):
    """Float64 reference of an activation on a numpy array (used by tests and examples)."""
    import numpy as np

    x = np.asarray(x, dtype=np.float64)
    if name == "identity":
        return x
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "leaky_relu":
        return np.where(x > 0, x, x * args[0])
    if name == "tanh":
        return np.tanh(x)
    if name in ("sigmoid", "silu"):
        with np.errstate(over="ignore"):  # exp(-x) overflows to inf for x < -709: the limit, 0, is the answer
            sigmoid = 1.0 / (1.0 + np.exp(-x))
        return sigmoid if name == "sigmoid" else x * sigmoid
    if name == "hardswish":
        return x * np.clip(x + 3.0, 0.0, 6.0) / 6.0
    if name == "gelu":
        erf = np.vectorize(math.erf, otypes=[np.float64])  # otypes: empty inputs (a group with M = 0) work too
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    if name == "gelu_taylor":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    raise KeyError(name)
