"""PyCUTLASS 2.11's ``pycutlass.reduction_operation``: the module :mod:`pycutlass.compat.reduction_operation` under its old path."""
from .compat import reduction_operation as _module
from .compat.support import alias

alias(__name__, _module)
