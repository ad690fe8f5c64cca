"""PyCUTLASS 2.11's ``pycutlass.gemm_operation``: the module :mod:`pycutlass.compat.gemm_operation` under its old path."""
from .compat import gemm_operation as _module
from .compat.support import alias

alias(__name__, _module)
