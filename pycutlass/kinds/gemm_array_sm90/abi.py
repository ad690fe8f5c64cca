"""The Array-mode SM90 GEMM runs the pointer-array kernel and builder of the grouped kind, so its argument struct is
the grouped one (kinds/families/sm90_ptr_array.py): per-entry sizes (all equal here), pointers and leading
dimensions live on the device."""
from __future__ import annotations

from ..families.sm90_ptr_array import Sm90GroupedGemmArgs

__all__ = ["Sm90GroupedGemmArgs"]
