"""PyCUTLASS 2.11's ``pycutlass.gemm_operation``: the same module as
:mod:`pycutlass.compat.gemm_operation`."""
from .compat import gemm_operation as _module
from .compat.support import alias

alias(__name__, _module)
