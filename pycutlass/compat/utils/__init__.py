"""``pycutlass.utils``: PyCUTLASS 2.11's utilities: ``device.device_cc`` and the host references of
``reference_model`` (``ReferenceModule``, ``Conv2dReferenceModule``), which ``from pycutlass import *`` also gives.
Light to import: numpy only (torch only when a torch tensor is passed)."""
from __future__ import annotations

from .device import device_cc
from .reference_model import Conv2dReferenceModule, ReferenceModule

__all__ = ["Conv2dReferenceModule", "ReferenceModule", "device_cc"]
