"""CUTLASS 2.x (Sm80-family) GEMM with an epilogue visitor tree (PyCUTLASS 2.11's ``visitor=True``)."""
from .arguments import GemmEvtArguments
from .operation import GemmOperationEvt

__all__ = ["GemmEvtArguments", "GemmOperationEvt"]
