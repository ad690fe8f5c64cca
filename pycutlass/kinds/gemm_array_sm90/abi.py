"""The Array-mode SM90 GEMM runs the grouped kind's pointer-array kernel and builder, so its argument struct is the
grouped one: per-entry sizes (all equal here), pointers and leading dimensions live on the device."""
from __future__ import annotations

from ..gemm_grouped_sm90.abi import Sm90GroupedGemmArgs

__all__ = ["Sm90GroupedGemmArgs"]
