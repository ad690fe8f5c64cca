"""Kernel kinds. Each folder owns one kind: its description (``operation.py``), template (``*.cu.j2``), ABI struct
(``abi.py``), and arguments with launch planning (``arguments.py``); the runtime runs every kind through
``runtime.arguments.OperationArguments``. Adding a kind is a new folder plus its name in ``REGISTERED``.
"""
from __future__ import annotations

import importlib

REGISTERED = ("gemm", "gemm_grouped", "conv2d", "reduction", "gemm_evt", "gemm_sm90", "gemm_grouped_sm90", "gemm_array_sm90",
              "conv2d_sm90")

KINDS = tuple(importlib.import_module(f"{__name__}.{name}") for name in REGISTERED)
__all__ = [name for kind in KINDS for name in kind.__all__]
globals().update({name: getattr(kind, name) for kind in KINDS for name in kind.__all__})
