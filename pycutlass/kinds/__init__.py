"""Kernel kinds. Each folder owns one kind: its description (``operation.py``), template (``*.cu.j2``), ABI struct
(``abi.py``), and arguments with launch planning (``arguments.py``); the runtime runs every kind through
``runtime.arguments.OperationArguments``. ``registry.KINDS`` lists the kinds and says which one each public
constructor builds: adding a kind is a new folder plus one line there.
"""
from __future__ import annotations

import importlib

from .registry import KINDS as _TABLE

REGISTERED = tuple(kind.name for kind in _TABLE)

KINDS = tuple(importlib.import_module(f"{__name__}.{name}") for name in REGISTERED)
__all__ = [name for kind in KINDS for name in kind.__all__]
globals().update({name: getattr(kind, name) for kind in KINDS for name in kind.__all__})
