"""PyCUTLASS 2.11's ``pycutlass.reduction_operation``: the same module as
:mod:`pycutlass.compat.reduction_operation`."""
from .compat import reduction_operation as _module
from .compat.support import alias

alias(__name__, _module)
