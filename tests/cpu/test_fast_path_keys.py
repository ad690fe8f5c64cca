"""The fast path's keys for new Arguments of a seen problem: what makes two calls the same problem, and what never
takes the fast path (the full path validates those every time). Correctness of the fast path itself is checked on
the GPU (tests/gpu/test_runtime.py, with PYCUTLASS_VERIFY_PARAMS=1 comparing patched Params to built ones)."""
from __future__ import annotations

import numpy as np

import pycutlass as cutlass
from pycutlass.runtime.arguments import memo_key, torch_signatures


class Tensor:
    """Enough of a CUDA torch tensor for the signature (the real class is torch.Tensor)."""

    is_cuda = True

    def __init__(self, shape, strides, dtype="float16", device=0):
        self.shape, self._strides, self.dtype, self._device = tuple(shape), tuple(strides), dtype, device

    def stride(self):
        return self._strides

    def get_device(self):
        return self._device

    def is_neg(self):  # torch's negative bit: a lazily negated view
        return getattr(self, "negated", False)


Tensor.__module__ = "torch"


def key(*tensors, output_op=None, stream=None, session=None):
    return memo_key("op", (64, 64, 64), output_op, tensors=tensors, stream=stream, session=session)


def test_same_problem_same_key_other_problem_other_key():
    a, b = Tensor((64, 64), (64, 1)), Tensor((64, 64), (1, 64))
    base = key(a, b, None)
    assert base is not None and base == key(Tensor((64, 64), (64, 1)), Tensor((64, 64), (1, 64)), None)
    others = [key(Tensor((64, 64), (128, 1)), b, None),  # other leading dimension
              key(Tensor((64, 64), (64, 1), dtype="bfloat16"), b, None),
              key(Tensor((64, 64), (64, 1), device=1), b, None),  # other device
              key(a, b, a),  # C given
              key(a, b, None, output_op=cutlass.epilogue.EpilogueArguments(1.0, 0.5)),
              key(a, b, None, stream=7),
              key(a, b, None, session=cutlass.Session())]
    assert all(k is not None for k in others)
    assert len({base, *others}) == len(others) + 1


def test_what_never_takes_the_fast_path():
    a = Tensor((64, 64), (64, 1))
    assert key(a, np.zeros((64, 64), np.float16)) is None  # host arrays are copied: the full path
    cpu = Tensor((64, 64), (64, 1))
    cpu.is_cuda = False
    assert key(a, cpu) is None
    negated = Tensor((64, 64), (64, 1))
    negated.negated = True
    assert key(a, negated) is None  # its memory holds the negated values: the full path refuses it
    assert key(a, a, output_op=[1.0, 0.5]) is None  # unhashable: the full path coerces it
    assert key(a, a, stream=object()) is None  # an odd stream: the full path says what is wrong

    class Parameter(Tensor):  # subclasses (e.g. torch.nn.Parameter) take the full path
        pass

    assert torch_signatures([Parameter((1,), (1,))]) is None
